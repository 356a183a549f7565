"""Measured flex-dispatcher rates across nodes (ClusterSpec.dispatcher_rates,
solver.cost.comm.comm_ep.estimate_dispatcher_s): DeepEP's HybridEP backend on H100 with 400 Gb/s
InfiniBand, deepseek-ai/DeepEP docs/README_Hybrid-EP.md "H100 Platform" (41cad94), the "Torch
API" columns at 16 SMs: BF16 dispatch 54.47 / 47.36 / 41.24 GB/s, FP8 dispatch 48.26 / 42.10 /
35.01 GB/s and combine 53.35 / 52.53 / 46.57 GB/s at 16 / 32 / 64 ranks, over the bytes its
tests/test_hybrid_ep.py counts (a token once for every node one of its experts is on, its own
included; FP8 at (1 + 4/128) / 2 of BF16's)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from bad_input import ROOT, assert_one_line_error, invoke

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.comm.comm_ep import FP8_DISPATCH_BYTES, dispatcher_fit, estimate_dispatcher_s
from solver.cost.layers.layer_time import _estimate_ep_fwd_s, reached_domains
from solver.cost.step.steptime import TimeConstants, _degrees
from solver.spec import ParallelConfig
from solver.spec.hardware import DispatcherRates

H100_HYBRIDEP = {16: (54.47, 53.35), 32: (47.36, 52.53), 64: (41.24, 46.57)}
H100_HYBRIDEP_FP8 = {16: 48.26, 32: 42.10, 64: 35.01}


def _readme_bytes(ranks: int) -> float:
    """The README's own test: 4,096 tokens of 7,168 BF16 values, top-8 of 8 local experts
    per rank on nodes of 8, routing uniform: each token counted once per node it reaches."""
    nodes = ranks / 8
    return 4096 * float(reached_domains(np.array([nodes]), 8)[0]) * 7168 * 2


def test_the_h100_preset_carries_the_readme_table() -> None:
    rates = load_cluster_spec("dgx-h100").dispatcher_rate("hybridep")
    assert rates is not None and rates.num_sms == 16
    assert dict(zip(rates.ranks, zip(rates.dispatch_gb_per_s, rates.combine_gb_per_s))) == (
        H100_HYBRIDEP)
    assert dict(zip(rates.ranks, rates.dispatch_fp8_gb_per_s)) == H100_HYBRIDEP_FP8
    assert (rates.tokens_per_rank, rates.hidden_size, rates.topk, rates.ranks_per_node) == (
        4096, 7168, 8, 8)
    assert load_cluster_spec("dgx-h100").dispatcher_rate("deepep") is None
    assert load_cluster_spec("dgx-h200").dispatcher_rate("hybridep") is None


@pytest.mark.parametrize("ranks", sorted(H100_HYBRIDEP))
def test_the_readme_test_takes_its_measured_time(ranks: int) -> None:
    """At each measured group size the README's own test takes bytes / dispatch rate + bytes /
    combine rate (16 ranks: 117.0 MB counted, 2.148 + 2.193 ms), and its FP8 dispatch, at the
    fixed part plus the per-byte part, its FP8 time (1.250 ms)."""
    rates = load_cluster_spec("dgx-h100").dispatcher_rate("hybridep")
    sent = _readme_bytes(ranks)
    dispatch, combine = H100_HYBRIDEP[ranks]
    seconds = float(estimate_dispatcher_s(rates, sent, np.array([ranks]))[0])
    assert seconds == pytest.approx(sent / (dispatch * 1e9) + sent / (combine * 1e9))
    fixed, per_byte = dispatcher_fit(rates)
    index = rates.ranks.index(ranks)
    fp8 = FP8_DISPATCH_BYTES * sent
    assert fixed[index] + fp8 * per_byte[index] == pytest.approx(
        fp8 / (H100_HYBRIDEP_FP8[ranks] * 1e9))
    if ranks == 16:
        assert sent == pytest.approx(116.98e6, rel=1e-4)
        assert seconds * 1e3 == pytest.approx(2.148 + 2.193, abs=1e-3)
        assert fp8 / (H100_HYBRIDEP_FP8[ranks] * 1e9) * 1e3 == pytest.approx(1.250, abs=1e-3)


def test_a_dispatch_has_a_fixed_part() -> None:
    """The two dispatch columns give 0.294 / 0.594 / 1.416 ms a call beyond the bytes, which
    move at 63.1 / 54.6 / 50.9 GB/s; without an FP8 column the BF16 rate alone."""
    rates = load_cluster_spec("dgx-h100").dispatcher_rate("hybridep")
    fixed, per_byte = dispatcher_fit(rates)
    assert fixed * 1e3 == pytest.approx([0.294, 0.594, 1.416], abs=1e-3)
    assert 1e-9 / per_byte == pytest.approx([63.1, 54.6, 50.9], abs=0.1)
    bf16_only = rates.model_copy(update={"dispatch_fp8_gb_per_s": None})
    fixed, per_byte = dispatcher_fit(bf16_only)
    assert fixed.tolist() == [0.0, 0.0, 0.0]
    assert 1e-9 / per_byte == pytest.approx(list(rates.dispatch_gb_per_s))


def test_qwen3_30b_at_ep16_on_two_h100_nodes() -> None:
    """Megatron-Bridge 26.04's Qwen3-30B-A3B H100 recipe (ep 16, HybridEP, one 4,096-token
    sequence per micro-batch): each token of 2 x 2,048 B reaches 2 (1 - 2^-8) = 1.992 nodes,
    33.4 MB: 0.294 + 0.530 = 0.824 ms dispatch + 0.627 ms combine = 1.450 ms a forward,
    where the fabric tier's all-to-all (40 GB/s a GPU, S / 80 GB/s across two nodes) gave
    0.928 ms."""
    model = load_model_spec("qwen3-30b-a3b")
    cluster = load_cluster_spec("dgx-h100")
    d = _degrees(Candidates.from_configs([ParallelConfig(ep=16, dp=16)]))
    rows = np.array([4096.0])
    hybridep = TimeConstants(moe_dispatcher="hybridep")
    seconds = float(_estimate_ep_fwd_s(model, cluster, d, hybridep, rows)[0])
    assert seconds * 1e3 == pytest.approx(1.450, abs=1e-3)
    unmeasured = cluster.model_copy(update={"dispatcher_rates": ()})
    fabric = float(_estimate_ep_fwd_s(model, unmeasured, d, hybridep, rows)[0])
    assert fabric * 1e3 == pytest.approx(0.928, abs=1e-3)


def test_inside_one_node_the_tiers_model_stays() -> None:
    """The rates were measured across nodes: an EP group inside one NVLink domain keeps the
    NVLink all-to-all."""
    model = load_model_spec("qwen3-30b-a3b")
    cluster = load_cluster_spec("dgx-h100")
    d = _degrees(Candidates.from_configs([ParallelConfig(ep=8, dp=8)]))
    rows = np.array([4096.0])
    hybridep = TimeConstants(moe_dispatcher="hybridep")
    unmeasured = cluster.model_copy(update={"dispatcher_rates": ()})
    assert float(_estimate_ep_fwd_s(model, cluster, d, hybridep, rows)[0]) == pytest.approx(
        float(_estimate_ep_fwd_s(model, unmeasured, d, hybridep, rows)[0]))


@settings(max_examples=40, deadline=None)
@given(log_ranks=st.floats(0.5, 9.0), scale=st.floats(1e6, 1e9))
def test_rates_interpolate_between_and_hold_beyond(log_ranks: float, scale: float) -> None:
    """Between measured sizes the time lies between theirs; beyond them the end rate holds."""
    rates = load_cluster_spec("dgx-h100").dispatcher_rate("hybridep")
    ep = 2.0 ** log_ranks
    seconds = float(estimate_dispatcher_s(rates, scale, np.array([ep]))[0])
    ends = [float(estimate_dispatcher_s(rates, scale, np.array([r]))[0]) for r in rates.ranks]
    assert min(ends) - 1e-15 <= seconds <= max(ends) + 1e-15
    if ep <= rates.ranks[0]:
        assert seconds == pytest.approx(ends[0])
    if ep >= rates.ranks[-1]:
        assert seconds == pytest.approx(ends[-1])


@pytest.mark.parametrize("change, message", [
    ({"dispatch_gb_per_s": (54.47, 47.36)}, "2 rates for 3 ranks"),
    ({"combine_gb_per_s": (53.35, -1.0, 46.57)}, "must be positive"),
    ({"dispatch_fp8_gb_per_s": (48.26,)}, "1 rates for 3 ranks"),
    ({"ranks": (32, 16, 64)}, "ranks must ascend"),
    ({"ranks": (1, 32, 64)}, "ranks must ascend"),
])
def test_a_bad_rates_table_is_refused(change: dict, message: str) -> None:
    good = {"dispatcher": "hybridep", "ranks": (16, 32, 64),
            "dispatch_gb_per_s": (54.47, 47.36, 41.24),
            "combine_gb_per_s": (53.35, 52.53, 46.57), "tokens_per_rank": 4096,
            "hidden_size": 7168, "topk": 8, "ranks_per_node": 8, "num_sms": 16}
    with pytest.raises(ValidationError, match=message):
        DispatcherRates(**{**good, **change})


def test_a_dispatcher_listed_twice_is_refused() -> None:
    cluster = load_cluster_spec("dgx-h100")
    rates = cluster.dispatcher_rate("hybridep")
    with pytest.raises(ValidationError, match="lists a dispatcher twice"):
        type(cluster).model_validate({**cluster.model_dump(),
                                      "dispatcher_rates": [rates.model_dump()] * 2})


@pytest.mark.parametrize("old, new, field", [
    ("dispatch_gb_per_s = [54.47, 47.36, 41.24]", "dispatch_gb_per_s = [54.47, 47.36]",
     "dispatcher_rates"),
    ("combine_gb_per_s = [53.35, 52.53, 46.57]", "combine_gb_per_s = [53.35, -1.0, 46.57]",
     "dispatcher_rates"),
    ('dispatcher = "hybridep"', 'dispatcher = "carrier-pigeon"', "dispatcher"),
])
def test_a_bad_rates_table_in_a_cluster_file_is_one_line(tmp_path, old, new, field) -> None:
    """Through the CLI: a cluster file whose dispatcher_rates table is malformed gets one error
    line naming the file and the field, exit status 2, no traceback."""
    text = (ROOT / "clusters" / "presets" / "dgx-h100.toml").read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / "my-cluster.toml"
    path.write_text(text.replace(old, new), encoding="utf-8")
    result = invoke("estimate", "--model", "llama3.2-1b", "--cluster", path, "--gpus", "8")
    assert_one_line_error(result, "my-cluster.toml", field)
