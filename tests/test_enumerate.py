"""The oracle's shortcuts give what the plain enumeration gives: solve_by_enumeration (memory
computed once, applied after the other rules; the top K sorted from a partition) and
any_feasible (memory in chunks, stopping at the first plan that fits)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_cluster_spec, load_model_spec
from solver.search import enumerate as enumerate_module
from solver.search.enumerate import (
    enumerate_feasible,
    fold_twins,
    rank,
    solve_by_enumeration,
)
from solver.search.feasible import any_feasible
from solver.search.space import Problem
from solver.spec import JobSpec

CASES = [
    ("llama3.1-8b", "dgx-h100", 8, {}),
    ("llama3.1-405b", "dgx-h100", 8, {}),            # does not fit anywhere
    ("llama3.1-405b", "dgx-h100", 64, {}),
    ("mixtral-8x7b", "dgx-a100-80gb", 16, {"pins": {"tp": (1,), "pp": (1,)}}),
    ("deepseek-v2-lite", "l40s-pcie", 8, {}),
    ("qwen3-30b-a3b", "dgx-h100", 32, {"job": JobSpec(seq_len=32768, global_batch=64)}),
]


@pytest.mark.parametrize("first_batch", [1, 2048])
@pytest.mark.parametrize("model, cluster, num_gpus, options", CASES)
def test_shortcuts_agree_with_the_plain_enumeration(model, cluster, num_gpus, options,
                                                    first_batch, monkeypatch) -> None:
    """first_batch 1: memory checked in batches of 20, 80, 320, ... (several rounds)."""
    monkeypatch.setattr(enumerate_module, "FIRST_MEMORY_BATCH", first_batch)
    options = dict(options)
    job = options.pop("job", JobSpec())
    problem = Problem(model_spec=load_model_spec(model), cluster=load_cluster_spec(cluster),
                      job=job, num_gpus=num_gpus, **options)
    feasible = enumerate_feasible(problem)
    assert any_feasible(problem) == (len(feasible) > 0)
    ranked = solve_by_enumeration(problem, 5)
    if len(feasible) == 0:
        assert ranked is None
        return
    # Every plan, fully sorted (no partition shortcut), one row per distinct plan.
    plain = fold_twins(rank(problem, feasible))
    # Memory is checked fastest first, only as far as the top 5 need.
    assert ranked.num_feasible in (None, len(feasible))
    assert ranked.num_candidates >= ranked.num_memory_checked >= len(ranked.candidates)
    assert (ranked.num_feasible is None) == (ranked.num_memory_checked < ranked.num_candidates)
    assert ranked.candidates.to_configs() == plain.candidates.to_configs()[:5]
    np.testing.assert_allclose(ranked.step_time.step_s, plain.step_time.step_s[:5], rtol=1e-12)
    np.testing.assert_allclose(ranked.memory_bytes, plain.memory_bytes[:5], rtol=1e-12)
    assert ranked.twins == plain.twins[:5]


def test_worst_stage_on_a_large_candidate_set() -> None:
    """Llama-3.1-70B (80 layers) on 512 GPUs: every pp up to 64 with its virtual stages, so
    the stage-layout shortcut looks at more than a thousand (pp, vpp, position) triples at
    once (estimate_stage_layers reduces such arrays to their distinct triples); sampled rows
    agree with evaluating every stage of the configuration alone."""
    from solver.cost.memory import estimate_all_stages, estimate_memory
    from solver.search.constraints import MEMORY_CONSTRAINT, build_constraints

    problem = Problem(model_spec=load_model_spec("llama3.1-70b"),
                      cluster=load_cluster_spec("dgx-h100"), job=JobSpec(), num_gpus=512)
    rules = [c for c in build_constraints(problem) if c.name != MEMORY_CONSTRAINT]
    candidates = enumerate_feasible(problem, rules)
    pairs = {(int(p), int(v)) for p, v in zip(candidates.pp, candidates.vpp)}
    assert len(pairs) * int(candidates.pp.max()) > 1024
    worst = estimate_memory(problem.model_spec, problem.job, candidates).total
    for row in np.linspace(0, len(candidates) - 1, 25).astype(int):
        config = candidates.config(int(row))
        stages = estimate_all_stages(problem.model_spec, problem.job, config)
        assert worst[row] == pytest.approx(stages.total.max(), rel=1e-12), config


@pytest.mark.parametrize("model, cluster, num_gpus, options", CASES)
def test_depth_first_chunks_give_the_same_rows(model, cluster, num_gpus, options,
                                               monkeypatch) -> None:
    """A binding step larger than MAX_ROWS is enumerated depth first over chunks: with a tiny
    MAX_ROWS (500) most steps are chunked, and the rows (and their order) are those of one pass;
    the existence test finds a row exactly when there is one."""
    options = dict(options)
    job = options.pop("job", JobSpec())
    problem = Problem(model_spec=load_model_spec(model), cluster=load_cluster_spec(cluster),
                      job=job, num_gpus=num_gpus, **options)
    whole = enumerate_feasible(problem)
    monkeypatch.setattr(enumerate_module, "MAX_ROWS", 500)
    chunked = enumerate_feasible(problem)
    assert chunked.to_configs() == whole.to_configs()
    assert len(enumerate_feasible(problem, stop_at_first=True)) == min(len(whole), 1)


def test_conflicts_of_a_gpu_count_with_many_divisors_stay_small() -> None:
    """DBRX on 23,040 GPUs (2^9 x 3^2 x 5) with a global batch of 1,024: no split works. The
    deletion filter drops one rule at a time; without the depth-first chunks, dropping
    `tp_divides_heads` let the product of 60 tp x 60 cp x 60 etp ... values grow to 24 GB.
    Under Megatron, tp may be a multiple of the 8 KV heads (tp_kv_heads_compatible), so tp 24
    and pp 5 would split the GPUs, but sequence parallelism cannot scatter 4,096 tokens over 24
    ranks (megatron_sequence_parallel_split, issue 43): that one rule explains it. Where the
    framework splits whole KV heads (DeepSpeed), the odd factor 45 must go to tp or cp, and
    neither takes it; a nearby round count is proposed."""
    from solver.optimize import build_problem, solve

    result = solve(build_problem("dbrx", "dgx-h100", 23040))
    assert result.status == "infeasible"
    assert set(result.conflicts) == {"megatron_sequence_parallel_split"}
    result = solve(build_problem("dbrx", "dgx-h100", 23040, framework="deepspeed"))
    assert result.status == "infeasible"
    assert {"cp_splits_sequence", "batch_divides", "tp_divides_kv_heads"} <= set(
        result.conflicts)
    # The fix: the nearest round count (3 x 2^13) that splits evenly.
    assert "--gpus 24576 (a count that splits evenly)" in result.fixes


@pytest.mark.parametrize("model, cluster, num_gpus, options", CASES)
def test_leanest_schedules_hold_the_least_memory(model, cluster, num_gpus, options) -> None:
    """any_feasible checks only each mesh's leanest schedules (feasible.leanest_schedules):
    sound because memory never rises with the recompute level and never falls with the
    micro-batch (tests/test_memory_properties.py); so the least memory over them is the
    least over every candidate, and they are far fewer."""
    from solver.cost.memory import estimate_memory_total
    from solver.search.enumerate import rules_but_memory
    from solver.search.feasible import leanest_schedules

    options = dict(options)
    job = options.pop("job", JobSpec())
    problem = Problem(model_spec=load_model_spec(model), cluster=load_cluster_spec(cluster),
                      job=job, num_gpus=num_gpus, **options)
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    lean = leanest_schedules(candidates)
    memory = estimate_memory_total(problem.model_spec, problem.job, candidates,
                                   problem.memory_options)[0]
    assert len(lean) < len(candidates)
    assert memory[lean].min() == memory.min()
    # Every row left out is dominated by a kept row of its mesh.
    kept = candidates.take(lean)
    for row in np.setdiff1d(np.arange(len(candidates)), lean)[::97]:
        same = np.ones(len(kept), dtype=bool)
        for name in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero"):
            same &= getattr(kept, name) == getattr(candidates, name)[row]
        assert np.any(same & (kept.recompute >= candidates.recompute[row])
                      & (kept.micro_batch <= candidates.micro_batch[row]))
