"""Tensor parallelism above the KV heads, by framework (solver.search.constraints module
docstring): Megatron-Core from core_v0.16.0 takes tp as a divisor or a multiple of
num_query_groups (transformer_config.py __post_init__) and then all-gathers linear_qkv's
output so each rank slices its group (attention.py get_query_key_value_tensors, PR #2565);
vLLM replicates KV heads (QKVParallelLinear); torchtitan and DeepSpeed split whole heads.
Qwen3-Next-80B-A3B has 2 KV heads, Nemotron 3 Super 2: NVIDIA's own Ultra pretraining script
runs --tensor-model-parallel-size 8 with --num-query-groups 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from solver.catalog.clusters import load_cluster_spec
from solver.catalog.zoo import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.cost.layers.layer_time import estimate_layer_terms
from solver.cost.memory.activations import estimate_layer_activation_bytes
from solver.cost.memory.options import MemoryOptions
from solver.cost.layers.time_constants import TimeConstants
from solver.optimize import build_problem
from solver.search.constraints import build_constraints
from solver.spec import JobSpec, ParallelConfig

H100 = load_cluster_spec("dgx-h100")


def kv_rule(framework: str, model: str = "qwen3-next-80b-a3b"):
    problem = build_problem(model, "dgx-h100", 64, framework=framework)
    names = {c.name: c for c in build_constraints(problem)}
    rule = names.get("tp_divides_kv_heads") or names["tp_kv_heads_compatible"]
    return lambda tp: bool(rule.check({"tp": np.array([tp])})[0]), set(names)


@pytest.mark.parametrize("framework", ["megatron", "generic"])
def test_megatron_takes_tp_as_a_multiple_of_the_kv_heads(framework: str) -> None:
    allowed, names = kv_rule(framework)
    assert "tp_divides_kv_heads" not in names
    assert [tp for tp in (1, 2, 3, 4, 6, 8, 16) if allowed(tp)] == [1, 2, 4, 6, 8, 16]


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_frameworks_that_split_whole_heads_refuse_it(framework: str) -> None:
    allowed, names = kv_rule(framework)
    assert {"tp_divides_kv_heads", "tp_kv_heads_compatible"} <= names
    assert [tp for tp in (1, 2, 4, 8) if allowed(tp)] == [1, 2]


def test_estimate_takes_qwen3_next_at_tp_8() -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", "qwen3-next-80b-a3b", "--cluster",
                                      "dgx-h100", "--gpus", "64", "--seq-len", "4096",
                                      "--global-batch", "256", "--tp", "8", "--ep", "8",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["plans"][0]["step_seconds"] > 0


def degrees(tp: int) -> dict[str, np.ndarray]:
    values = dict(tp=tp, pp=1, dp=64 // tp, cp=1, ep=8, etp=1, vpp=1, zero=1, micro_batch=1,
                  recompute=0)
    return {k: np.atleast_1d(v) for k, v in values.items()}


def test_the_qkv_gather_is_paid_only_above_the_kv_heads() -> None:
    """TP traffic of an attention layer: at tp 2 (= KV heads) the sequence-parallel pairs
    only; at tp 4 and 8 also the all-gather of q, gate, k, v, (16 + 16 + 4) x 256 values a
    token, and its reduce-scatter backward; a gated DeltaNet layer never pays it."""
    spec, job, constants = load_model_spec("qwen3-next-80b-a3b"), JobSpec(seq_len=4096), (
        TimeConstants(tp_comm_overlap=False))
    attention = spec.block_kinds.index(("full_attention", "moe"))
    linear = spec.block_kinds.index(("linear_attention", "moe"))
    tp_s = {tp: estimate_layer_terms(spec, H100, job, degrees(tp), constants)["per_layer"][0]
            for tp in (2, 4, 8)}
    plain = {tp: tp_s[tp][linear, 2] for tp in tp_s}  # the same SP pair, without attention
    assert tp_s[2][attention, 2] == pytest.approx(plain[2])
    for tp in (4, 8):
        link = estimate_group_link(H100, 1, np.array([tp]))
        gather = estimate_collective_s("all_gather", 4096 * 9_216 * 2.0, np.array([tp]), link)
        # forward and backward: the all-gather and its reduce-scatter, one each
        assert tp_s[tp][attention, 2] - plain[tp] == pytest.approx(2 * gather[0])


def test_each_rank_keeps_one_kv_head_above_the_kv_heads() -> None:
    """Saved K and V per rank: kv / tp heads while tp divides them, then one head (Megatron
    num_query_groups_per_partition = 1). Against the same model with 16 KV heads, Qwen3-Next
    (2 KV heads) saves 7 heads' K and V less per rank at tp 2 (1 against 8) and one less at
    tp 8 (1 against 2)."""
    spec, job = load_model_spec("qwen3-next-80b-a3b"), JobSpec(seq_len=4096)
    wide = spec.model_copy(update={"num_key_value_heads": 16})
    head_bytes = job.seq_len * 2 * spec.qk_head_dim * 2  # K and V of one head, bf16

    def saved(model, tp: int) -> float:
        config = ParallelConfig(tp=tp, pp=1, dp=64 // tp, ep=8, micro_batch=1,
                                recompute="none", zero=1)
        candidates = Candidates.from_configs([config])
        return float(estimate_layer_activation_bytes(model, job, candidates, MemoryOptions(),
                                                     moe=True)[0])

    assert saved(wide, 2) - saved(spec, 2) == pytest.approx(7 * head_bytes)
    assert saved(wide, 8) - saved(spec, 8) == pytest.approx(1 * head_bytes)


def test_a_tp_neither_dividing_nor_a_multiple_of_the_kv_heads_is_one_line() -> None:
    """Qwen2.5-7B (28 heads, 4 KV heads) at tp 14: the heads split, the KV heads neither split
    nor replicate evenly."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "qwen2.5-7b", "--cluster",
                                      "dgx-h100", "--gpus", "14", "--tp", "14"])
    assert result.exit_code == 2, result.output
    assert ("--tp 14: tp must divide num_key_value_heads (4) or be a multiple of it"
            in result.stderr)
    assert "[tp_kv_heads_compatible]" in result.stderr


@pytest.mark.parametrize(("fmt", "said"), [("torchtitan", "torchtitan splits whole KV heads"),
                                           ("deepspeed", "DeepSpeed AutoTP splits whole KV")])
def test_launch_for_a_whole_head_framework_warns(fmt: str, said: str) -> None:
    """Qwen3-30B-A3B (4 KV heads) at tp 8: a Megatron plan, written for a framework that
    cannot run it, says so."""
    result = CliRunner().invoke(cli, ["launch", "--model", "qwen3-30b-a3b", "--cluster",
                                      "dgx-h100", "--gpus", "16", "--seq-len", "4096",
                                      "--global-batch", "64", "--tp", "8", "--format", fmt])
    assert result.exit_code == 0, result.output
    assert said in result.output and "num_key_value_heads (4)" in result.output
