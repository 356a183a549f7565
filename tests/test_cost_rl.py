"""The RL terms of the cost model (solver.cost.rl), each pinned to its source's number."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.comm.comm import GroupLink
from solver.cost.rl.generation import (
    estimate_generation_s,
    estimate_longest_response,
    tail_cells,
)
from solver.cost.rl.passes import estimate_forward_only_s
from solver.cost.rl.step import compose_rl_step
from solver.cost.rl.sync import (
    estimate_broadcast_s,
    estimate_gather_s,
    estimate_host_swap_s,
    estimate_shard_copy_s,
)
from solver.cost.serving.round import estimate_round_s
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeJob, ServeProblem
from solver.serve.timing import build_engine
from solver.serve.workload import LengthDistribution


def _link(bandwidth_gb_per_s: float) -> GroupLink:
    return GroupLink(bandwidth_bytes_per_s=np.array(bandwidth_gb_per_s * 1e9),
                     latency_s=np.array(0.0))


@pytest.fixture(scope="module")
def engine():
    """Llama-3.1-8B alone on an H100 (tp 1), the serving model's engine."""
    problem = ServeProblem(model_spec=load_model_spec("llama3.1-8b"),
                           cluster=load_cluster_spec("dgx-h100"), num_gpus=1,
                           job=ServeJob(context=1524, input_len=500, output_len=1000))
    return build_engine(problem, ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1))


def test_generation_worked_number_composes_the_serving_rounds(engine) -> None:
    """The module docstring's worked number: 64 prompts of 500 tokens, every response 1000
    tokens, maximum 1024, 256 slots, chunks of 8192: prefill 3 x 8192 + 7424 tokens, no
    queue, 125 cells of 8 tokens at batch 64, KV lengths 508 ... 1500."""
    starts, widths = tail_cells(1024, 1000.0)
    assert len(starts) == 125 and widths[-1] == pytest.approx(8.0)
    alive = (starts < 1000).astype(float)
    got = estimate_generation_s(engine, 64, 256, 500.0, 1000.0, 500.0, starts, widths, alive,
                                8192)
    prefill = (3 * estimate_round_s(engine, 0.0, 0.0, 8192.0, 500.0)
               + estimate_round_s(engine, 0.0, 0.0, 7424.0, 500.0))
    tail = sum(8.0 * estimate_round_s(engine, 64.0, 500.0 + 8.0 * (k + 1), 0.0, 500.0)
               for k in range(125))
    assert got.prefill_s[0] == pytest.approx(prefill[0])
    assert got.queued_s[0] == 0.0
    assert got.tail_s[0] == pytest.approx(float(tail[0]))
    assert got.decoded_tokens[0] == 64_000


def test_a_queue_decodes_at_full_slots_for_the_waiting_work(engine) -> None:
    """512 sequences on 256 slots: the 256 waiting ones take 256 x E[L] / 256 rounds at batch
    256 and the mean running age (fixed 1000: 500) before the last 256 decode to the end."""
    starts, widths = tail_cells(1000, 1000.0)
    got = estimate_generation_s(engine, 512, 256, 500.0, 1000.0, 500.0, starts, widths,
                                np.ones(len(starts)), 8192)
    assert got.queued_s[0] == pytest.approx(
        1000 * float(estimate_round_s(engine, 256.0, 1000.0, 0.0, 500.0)[0]))


def test_tail_cells_are_cut_at_the_longest_response() -> None:
    """1024 tokens in 128 cells of 8, longest 100: starts 0 ... 96, the last 4 tokens long."""
    starts, widths = tail_cells(1024, 100.0)
    assert starts.tolist() == [8.0 * k for k in range(13)]
    assert widths[-1] == 4.0 and widths[:-1].tolist() == [8.0] * 12


def test_longest_response_is_the_n_over_n_plus_one_quantile() -> None:
    """E[F(X_(n))] = n / (n + 1) (David and Nagaraja 2003, order statistics of n uniforms):
    3 draws of uniform 1..1000 reach the 0.75 quantile, 750; one draw, the median, 500;
    1023 draws the 0.99902 quantile, which only 1000 reaches (999's CDF is 0.999)."""
    lengths = LengthDistribution(kind="uniform", low=1, high=1000)
    assert estimate_longest_response(lengths.quantile, 3, 1000) == 750.0
    assert estimate_longest_response(lengths.quantile, 1023, 1000) == 1000.0
    assert estimate_longest_response(lengths.quantile, 1, 1000) == 500.0
    assert estimate_longest_response(lengths.quantile, 10**6, 900) == 900.0


def test_forward_pass_is_a_third_of_compute_and_half_of_tp() -> None:
    """Narayanan et al. 2021 §3.5: the backward pass is twice the forward's FLOPs, so forward
    is 2 of 6 N per token; TP's collectives run once each way (Korthikanti et al. 2022
    Table 2). The docstring's worked number: compute 3.0, tp 0.4, bubble 0.3, dp 0.2,
    optimizer 0.1 s: 1.0 + 0.2 + 0.1 = 1.3 s."""
    parts = {"compute": 3.0, "recompute": 0.5, "tp": 0.4, "cp": 0.0, "ep": 0.0,
             "offload": 0.0, "dp": 0.2, "pp": 0.0, "bubble": 0.3, "optimizer": 0.1}
    assert float(estimate_forward_only_s(parts)) == pytest.approx(1.3)


def test_weight_sync_terms() -> None:
    """Llama-3.1-8B in bf16 (8.03e9 parameters, 16.06 GB): gathered over tp 2 at 360 GB/s,
    16.06 x 0.5 / 360 = 22.3 ms (all-gather's (n-1)/n, nccl-tests PERFORMANCE.md); copied into
    a tp-1 vLLM at 3350 x 0.8 GB/s, 2 x 16.06 / 2680 = 12.0 ms; broadcast to 7 rollout GPUs at
    40 GB/s, bus factor 1 (PERFORMANCE.md: broadcast busBw = algBw): 0.4015 s; 16 GB to the
    host and back at 51 GB/s (H100, nvbandwidth): 0.627 s."""
    weight = 2.0 * load_model_spec("llama3.1-8b").total_params
    assert weight == pytest.approx(16.06e9, rel=2e-3)
    assert float(estimate_gather_s(weight, 2, _link(360.0))) == pytest.approx(
        weight * 0.5 / 360e9)
    assert float(estimate_gather_s(weight, 2, _link(360.0))) == pytest.approx(0.0223, rel=5e-3)
    assert float(estimate_shard_copy_s(weight, 1, 3350e9 * 0.8)) == pytest.approx(0.0120,
                                                                                 rel=5e-3)
    assert float(estimate_broadcast_s(weight, 7, _link(40.0))) == pytest.approx(weight / 40e9)
    assert float(estimate_host_swap_s(16e9, 51e9)) == pytest.approx(0.627, rel=1e-3)
    assert float(estimate_gather_s(weight, 1, _link(360.0))) == 0.0


def test_step_composition_matches_verls_one_step_off_page() -> None:
    """verl docs/advance/one_step_off.md (Megatron rows, Qwen2.5-Math-7B DAPO): "colocate sync:
    step ≈ gen + old_log_prob + update_actor", 162 + 119 + 344 = 625 s; "one-step-overlap
    async: step ≈ wait_prev_gen + old_log_prob + update_actor", with generation shorter than
    training nothing is waited for: 463 s."""
    sync = compose_rl_step(False, 0, 162.0, 119.0, 344.0, 0.0, 0.0)
    assert float(sync.step_s) == 625.0
    split_async = compose_rl_step(True, 1, 162.0, 119.0, 344.0, 0.0, 0.0)
    assert float(split_async.step_s) == 463.0
    assert float(split_async.rollout_idle_s) == 301.0
    assert float(split_async.training_idle_s) == 0.0
    assert float(compose_rl_step(False, 1, 162.0, 119.0, 344.0, 0.0, 0.0).step_s) == 625.0


seconds = st.floats(0.0, 1e4, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(split=st.booleans(), k=st.integers(1, 8), gen=seconds, logp=seconds, train=seconds,
       sync=seconds, swap=seconds)
def test_off_policy_is_never_slower_than_on_policy(split, k, gen, logp, train, sync,
                                                   swap) -> None:
    """Property (issue 41): asynchronous (k >= 1) is never slower than synchronous under the
    same plan; idle times are never negative."""
    on = compose_rl_step(split, 0, gen, logp, train, sync, swap)
    off = compose_rl_step(split, k, gen, logp, train, sync, swap)
    assert float(off.step_s) <= float(on.step_s)
    assert float(off.rollout_idle_s) >= -1e-9 and float(off.training_idle_s) >= -1e-9
