"""NCCL's collective latency (solver.cost.comm.nccl_latency) and the DP collectives it is charged to
(solver.cost.step.data_parallel): pinned to NCCL's tuning.cc (NCCL 2.30.7, NVIDIA/nccl 5067397c,
src/graph/tuning.cc ncclTopoTuneModel, ncclTunerConstantsDefaults) and to measured nccl-tests
floors."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.comm.comm import estimate_group_nodes
from solver.cost.step.data_parallel import estimate_dp_calls, estimate_dp_collectives_s
from solver.cost.step.frameworks import framework_time_constants
from solver.cost.comm.nccl_latency import estimate_nccl_latency_s, estimate_nccl_time_s
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ParallelConfig

DATA = Path(__file__).parent / "data" / "kernels" / "h100_sxm_nccl_512b.csv"


def candidates(**degrees: int) -> Candidates:
    return Candidates.from_configs([ParallelConfig(**({"zero": 0, "recompute": "none"}
                                                      | degrees))])


def test_ring_latency_at_512_ranks_is_tuning_cc_arithmetic() -> None:
    """tuning.cc, ring all-gather over 512 ranks on 64 NVLink nodes (ppn 8): nsteps 511,
    nInterSteps 63; Simple base 8.4 + 448 x max(3.4 NVLink, 3 x 1.0 net overhead) + 63 x 14 NET
    = 2,413.6 us; LL128 14 + 448 x 1.9 + 63 x 4.0 = 1,117.2 us. At 128 ranks on 16 nodes
    LL128: 14 + 112 x 1.9 + 15 x 4.0 = 286.8 us."""
    assert estimate_nccl_latency_s("all_gather", "ring", "simple", 512, 64) == pytest.approx(
        2413.6e-6)
    assert estimate_nccl_latency_s("reduce_scatter", "ring", "ll128", 512, 64) == pytest.approx(
        1117.2e-6)
    assert estimate_nccl_latency_s("all_gather", "ring", "ll128", 128, 16) == pytest.approx(
        286.8e-6)
    # All-reduce: 2(n - 1) steps, 2(N - 1) across nodes, Simple x 1.4 across nodes (the ring's
    # "plateau effect"): (8.4 + (30 - 2) x 3.4 + 2 x 14) x 1.4 = 184.24 us on 2 nodes of 8.
    assert estimate_nccl_latency_s("all_reduce", "ring", "simple", 16, 2) == pytest.approx(
        184.24e-6)
    # ppn = 1 (TP 8 inside each node): every step is a network hop at the tree's NET latency,
    # 14 + 47 x 8.5 = 413.5 us for LL128 over 48 nodes.
    assert estimate_nccl_latency_s("all_gather", "ring", "ll128", 48, 48) == pytest.approx(
        413.5e-6)


def test_tree_all_reduce_latency_is_logarithmic_in_nodes() -> None:
    """tuning.cc tree: base + 2 ((ppn - 1) intra + log2i(nNodes) inter); Simple on 2 nodes of
    8: 8.4 + 2 (7 x 4.0 + 1 x 14) = 92.4 us; 64 nodes: 8.4 + 2 (28 + 6 x 14) = 232.4 us."""
    assert estimate_nccl_latency_s("all_reduce", "tree", "simple", 16, 2) == pytest.approx(
        92.4e-6)
    assert estimate_nccl_latency_s("all_reduce", "tree", "simple", 512, 64) == pytest.approx(
        232.4e-6)


def test_ll_ring_latency_matches_the_measured_small_message_floor() -> None:
    """AIConfigurator's nccl_perf (ai-dynamo/aiconfigurator 095f58a51, H100 SXM node; copied to
    tests/data/kernels/h100_sxm_nccl_512b.csv): at 512 B on 8 GPUs all_gather 10.14 us,
    reduce_scatter 10.24 us, all_reduce 15.59 us. NCCL sends such messages by ring LL:
    6.6 + 7 x 0.6 = 10.8 us and 6.6 + 14 x 0.6 = 15.0 us, within 7%."""
    rows = {(r["op"], int(r["num_gpus"])): float(r["latency_ms"]) * 1e-3
            for r in csv.DictReader(DATA.open())}
    for op in ("all_gather", "reduce_scatter", "all_reduce"):
        model = estimate_nccl_latency_s(op, "ring", "ll", 8, 1)
        assert model == pytest.approx(rows[(op, 8)], rel=0.07)
    # The measured floor grows with the ring's length, as the model's does.
    assert rows[("all_gather", 2)] < rows[("all_gather", 4)] < rows[("all_gather", 8)]


def test_nccl_picks_ll128_for_latency_bound_gathers_at_512_ranks() -> None:
    """48 all-gathers of 100 MB in all over 512 ranks (64 nodes) at 324 GB/s: Simple
    48 x 2,413.6 us + 0.308 ms = 116.2 ms; LL128 48 x 1,117.2 us + 0.308 / 0.92 ms = 53.96 ms:
    NCCL's choice is the faster."""
    seconds = estimate_nccl_time_s("all_gather", 100e6, 512, 64, 48, 324e9, 511 / 512)
    assert seconds == pytest.approx(48 * 1117.2e-6 + 100e6 * 511 / 512 / (0.92 * 324e9))


def test_group_nodes_follow_the_rank_order() -> None:
    """dgx-h100 (8 GPUs a node): a DP group of 512 with stride 1 touches 64 nodes over NVLink
    inside each; with stride 8 (TP 8 in each node) 512 nodes, one rank each."""
    cluster = load_cluster_spec("dgx-h100")
    nodes, nvlink = estimate_group_nodes(cluster, np.array([1, 8]), np.array([512, 512]))
    assert nodes.tolist() == [64, 512] and nvlink


def test_fsdp_issues_one_collective_per_unit_and_megatron_per_bucket() -> None:
    """LLM Foundry's FSDP wraps each block as a unit (and the root with the embedding):
    Llama-3.2-1B's 16 layers give 17 gathers a sync. Megatron's buckets hold
    max(40e6, 1e6 x dp_cp) parameters (training.py / distributed_data_parallel.py): dp 512
    buckets of 512e6, a 1.32e9 shard in 3; DeepSpeed's 5e8 (reduce_bucket_size)."""
    model = load_model_spec("llama3.2-1b")  # 16 layers
    c = candidates(dp=512, zero=2)
    local = np.array([1.32e9])
    fsdp = estimate_dp_calls(model, c, TimeConstants(), "params_all_gather", local,
                             2 * local, np.array([512]))
    assert fsdp.tolist() == [model.num_hidden_layers + 1]
    megatron = framework_time_constants("megatron")
    calls = estimate_dp_calls(model, c, megatron, "grads_reduce_scatter", local, 4 * local,
                              np.array([512]))
    assert calls.tolist() == [3]
    small = estimate_dp_calls(model, c, megatron, "grads_reduce_scatter", local, 4 * local,
                              np.array([8]))
    assert small.tolist() == [np.ceil(1.32e9 / 40e6)]
    deepspeed = framework_time_constants("deepspeed")
    assert estimate_dp_calls(model, c, deepspeed, "grads_reduce_scatter", local, 4 * local,
                             np.array([512])).tolist() == [3]


@given(st.sampled_from([1, 2, 4, 8]), st.integers(min_value=1, max_value=6))
def test_dp_latency_grows_with_the_dp_degree(tp: int, doublings: int) -> None:
    """Property: at fixed bytes per GPU, the time of the FSDP all-gathers never falls as the DP
    group grows (more ring steps, more nodes; the bus factor (n-1)/n grows too)."""
    model, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    dps = [2 ** k for k in range(doublings, doublings + 4)]
    c = Candidates.from_configs([ParallelConfig(tp=tp, dp=dp, zero=3, recompute="none")
                                 for dp in dps])
    gather = estimate_dp_collectives_s(model, cluster, c, TimeConstants())["params_all_gather"]
    assert np.all(np.diff(gather) >= -1e-12)


def test_calibrated_tiers_charge_each_call_on_the_measured_curve(tmp_path) -> None:
    """On a tier with measured curves (`parplan calibrate`, the DGX H100 NVLink log of
    tests/data/nccl: 13 us at 8 B) each DP call is a message on the curve: FSDP's 81 gathers
    (80 layers and the root of Llama-3.1-70B) cost at least 80 curve floors more than one
    gather of the same bytes."""
    import json

    from click.testing import CliRunner

    from solver.cli import cli
    from solver.optimize import build_problem

    data = Path(__file__).parent / "data" / "nccl"
    profile = tmp_path / "measured.json"
    result = CliRunner().invoke(cli, [
        "calibrate", "nccl-tests", str(data / "nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt"),
        "--cluster", "dgx-h100", "-o", str(profile)])
    assert result.exit_code == 0, result.output
    floor_s = min(curve["knots"][0]["time_us"]
                  for curve in json.loads(profile.read_text())["tiers"]["nvlink"].values()) * 1e-6
    problem = build_problem("llama3.1-70b", "dgx-h100", 8, seq_len=4096, global_batch=64,
                            calibration=str(profile), framework="generic")
    model, cluster = problem.model_spec, problem.cluster
    c = candidates(dp=8, zero=1)  # ZeRO 1-2: per unit under FSDP, per bucket elsewhere
    per_unit = estimate_dp_collectives_s(model, cluster, c, TimeConstants())
    one_call = estimate_dp_collectives_s(model, cluster, c, TimeConstants(dp_bucket_params=1e15))
    assert one_call["params_all_gather"][0] > 0
    assert per_unit["params_all_gather"][0] >= one_call["params_all_gather"][0] + 80 * floor_s
