"""Sequence lengths (issue 43, item 5): any length where nothing splits the sequence; a
divisibility rule only where one really splits it, named in the message.

  cp_splits_sequence            cp > 1: Megatron cuts each sequence in 2 x cp chunks
                                (megatron/training/utils.py get_batch_on_this_cp_rank, only
                                `if cp_size > 1`: val.view(..., 2 * cp_size,
                                val.shape[seq_dim] // (2 * cp_size), ...)).
  megatron_sequence_parallel_split  tp > 1 (sequence parallel): each CP rank's seq_len / cp
                                tokens are reduce-scattered over TP (megatron/core/
                                tensor_parallel/mappings.py _reduce_scatter_along_first_dim:
                                "First dimension of the tensor should be divisible by tensor
                                parallel size").
The issue's length: 1,079 = 13 x 83, odd.
"""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.api import build_parallel_config, load_problem_specs
from solver.cli import cli
from solver.emit.layout import build_rank_layout
from solver.emit.megatron import render_megatron
from solver.emit.target import LaunchTarget
from solver.optimize import build_problem, solve
from solver.search.constraints import structural_constraints

ODD_SEQ_LEN = 1079
COMMON = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
          "--seq-len", str(ODD_SEQ_LEN), "--global-batch", "64"]


def _cp_rule(seq_len: int):
    model_spec, _, job = load_problem_specs("llama3.1-8b", "dgx-h100", seq_len=seq_len,
                                            global_batch=64)
    rules = {rule.name: rule for rule in structural_constraints(model_spec, job, 8)}
    return rules["cp_splits_sequence"]


def test_odd_sequence_is_estimated_without_context_parallelism() -> None:
    """The issue's case: 1,079 tokens with cp = 1 (and tp = 1, no sequence parallelism) is a
    plan, not an error."""
    result = CliRunner().invoke(cli, ["estimate", *COMMON, "--tp", "1", "--cp", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert '"seq_len": 1079' in result.output


def test_odd_sequence_with_context_parallelism_is_one_line_naming_the_rule() -> None:
    result = CliRunner().invoke(cli, ["estimate", *COMMON, "--cp", "2"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "[cp_splits_sequence]" in lines[0] and "2 x cp" in lines[0]
    assert "1079" in lines[0]


@settings(max_examples=60, deadline=None)
@given(seq_len=st.integers(1, 1 << 20), cp=st.sampled_from([1, 2, 3, 4, 8, 16]))
def test_cp_rule_binds_only_when_cp_splits(seq_len: int, cp: int) -> None:
    """cp = 1 takes every length; cp > 1 exactly the multiples of 2 x cp."""
    ok = bool(_cp_rule(seq_len).check({"cp": np.array([cp])})[0])
    assert ok == (cp == 1 or seq_len % (2 * cp) == 0)


def test_megatron_sequence_parallel_refuses_an_odd_length_over_tp_2() -> None:
    """Under Megatron, tp 2 (sequence parallel) cannot split 1,079 tokens: the search answers
    infeasible naming the rule; tp 1 plans; the generic profile, which declares no such rule,
    plans tp 2."""
    pinned = build_problem("llama3.1-8b", "dgx-h100", 8, seq_len=ODD_SEQ_LEN, global_batch=64,
                           pins={"tp": (2,), "cp": (1,)})
    result = solve(pinned)
    assert result.status == "infeasible"
    assert "megatron_sequence_parallel_split" in result.conflicts
    tp1 = solve(build_problem("llama3.1-8b", "dgx-h100", 8, seq_len=ODD_SEQ_LEN,
                              global_batch=64, pins={"tp": (1,), "cp": (1,)}))
    assert tp1.status in ("optimal", "feasible")
    generic = solve(build_problem("llama3.1-8b", "dgx-h100", 8, seq_len=ODD_SEQ_LEN,
                                  global_batch=64, framework="generic",
                                  pins={"tp": (2,), "cp": (1,)}))
    assert generic.status in ("optimal", "feasible")


def test_megatron_launch_warns_where_sequence_parallel_cannot_split() -> None:
    model_spec, cluster_spec, job = load_problem_specs("llama3.1-8b", "dgx-h100",
                                                       seq_len=ODD_SEQ_LEN, global_batch=64)
    for tp, warned in ((2, True), (1, False)):
        config = build_parallel_config(8, tp=tp)
        target = LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job,
                              config=config, layout=build_rank_layout(config, False))
        warnings = render_megatron(target).warnings
        assert any("[megatron_sequence_parallel_split]" in w for w in warnings) == warned
