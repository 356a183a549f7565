"""Serving under the load a benchmark client offers (issue 38): the closed loop at fixed
concurrency (solver.cost.serving.closed: synchronised waves, never more requests than users),
open Poisson and gamma arrivals (solver.cost.serving.queueing), and the properties the issue asks for:
for one plan TTFT and TPOT never fall when the concurrency or the request rate rises, and
throughput never falls when a scheduler limit is raised."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cost.serving.queueing import (
    estimate_gig1_wait_s,
    estimate_mg1_wait_s,
    gamma_arrival_scv,
)
from solver.cost.serving.closed import estimate_wave_ttft_s
from solver.cost.serving.ttft_quantile import GRID_PASSES, GRID_POINTS
from solver.cost.serving.load import estimate_load_point, interpolate_curve, largest_stable_rate
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.serve.load import estimate_load_curves, estimate_serving_load
from solver.serve.workload import ServeLoadSpec


def problem_of(model: str, cluster: str, gpus: int, precision: str = "bf16",
               input_len: int = 1024, output_len: int = 1024, **settings_) -> ServeProblem:
    limits = {k: settings_.pop(k) for k in ("max_num_seqs", "max_num_batched_tokens")
              if k in settings_}
    job = ServeJob(context=8192, input_len=input_len, output_len=output_len,
                   precision=precision, load=ServeLoadSpec(**settings_), **limits)
    return ServeProblem(model_spec=load_model_spec(model),
                        cluster=load_calibrated_cluster(cluster, None, None), num_gpus=gpus,
                        job=job)


def test_gpt_oss_120b_at_four_users_does_not_queue_issue_38() -> None:
    """Issue 38's first defect: gpt-oss-120b (fp4 weights) on 2 H100s at tp 2, 4 users, was
    predicted at a p90 TTFT of 10,351 ms: the rate bisection of the old closed loop stopped
    where the fluid population jumps (a MoE round grows about linearly with its rows, so
    d / tau(d) is flat from 1 to 4 rows) and queued the 3 users it had not placed. Four users
    can never queue behind more than each other: their TTFT is at most the four prompts
    prefilled one after another on the idle engine."""
    problem = problem_of("gpt-oss-120b", "dgx-h100", 2, "fp4", concurrency=4)
    c = ServeCandidates(tp=[2, 2], pp=1, dp=1, ep=[1, 2], replicas=1)
    load = estimate_serving_load(problem, c)
    point = load.point
    assert np.all(point.stable)
    assert np.all(point.ttft_s <= 4 * load.ttft_idle_s)
    assert float(point.ttft_s[0]) < 1.0  # was 10.351 s
    assert np.allclose(point.concurrency, 4)
    # Little's law holds at the point: users = rate x (TTFT + output x TPOT).
    in_flight = point.rate_per_s * (point.ttft_mean_s + 1024 * point.tpot_mean_s)
    assert np.allclose(in_flight, 4, rtol=1e-6)


def test_deepseek_on_mi300x_grows_with_its_users_issue_38() -> None:
    """Issue 38: DeepSeek-R1 (DeepSeek-V3's architecture) on 8 MI300X was predicted at 2.9 s
    TTFT at 4 users, 138 s at 16 and 0.77 s at 64. One engine of 8 GPUs (tp 8), fp8 weights:
    TTFT and TPOT now grow with the users (the expert-parallel engine stays under 0.4 s)."""
    c = ServeCandidates(tp=[8, 8], pp=1, dp=1, ep=[1, 8], replicas=1)
    ttft, tpot = [], []
    for users in (4, 16, 64):
        point = estimate_serving_load(problem_of("deepseek-v3", "mi300x", 8, "fp8",
                                                 concurrency=users), c).point
        assert np.all(point.stable)
        ttft.append(point.ttft_s)
        tpot.append(point.tpot_s)
    assert np.all(np.diff(ttft, axis=0) >= 0) and np.all(np.diff(tpot, axis=0) >= 0)
    assert np.all(np.array(ttft)[:, 1] < 0.4) and np.all(np.array(ttft) < 2.0)


def test_one_closed_user_sees_the_idle_engine() -> None:
    """One user: nothing else runs, so TTFT is the idle prompt's and TPOT a round of one."""
    problem = problem_of("llama3.1-8b", "dgx-h100", 1, concurrency=1)
    c = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    load = estimate_serving_load(problem, c)
    assert float(load.point.ttft_mean_s[0]) == pytest.approx(float(load.ttft_idle_s[0]))
    assert float(load.point.tpot_mean_s[0]) == pytest.approx(float(load.tpot_idle_s[0]))


def test_a_wave_of_four_prompts_is_prefilled_in_one_round() -> None:
    """The worked number of solver.cost.serving.closed: 4 users of 1,024-token prompts under
    vLLM's 8,192-token budget come back together (g = 4) and share one round: each waits
    S(1,024) plus the 3,072 tokens of the others at c_p, the seconds a prefill token adds."""
    problem = problem_of("llama3.1-8b", "dgx-h100", 1, concurrency=4)
    curves = estimate_load_curves(problem, ServeCandidates(tp=1, pp=1, dp=1, ep=1,
                                                           replicas=1))
    assert float(curves.round_budget[0]) == 8192
    users, others = np.array([4.0]), np.array([0.0])
    mean, q = estimate_wave_ttft_s(curves, users, others, np.array([1.0]))
    service = interpolate_curve(curves, curves.service_mean_s, others)
    c_p = interpolate_curve(curves, curves.prefill_token_s, others)
    assert float(mean[0]) == pytest.approx(float(service[0] + 3072 * c_p[0]), rel=1e-12)
    assert float(q[0]) == pytest.approx(float(mean[0]), rel=1e-12)  # one length, one round
    # Nine users: the group is 8 prompts (8 x 1,024 = the budget), and the ninth user keeps
    # the engine busy, so a group waits out the round in progress and the built one.
    mean9, _ = estimate_wave_ttft_s(curves, np.array([9.0]), others, np.array([1.0]))
    round_now = interpolate_curve(curves, curves.round_s, others)
    wait = (curves.steps_per_schedule + curves.lag_rounds) * round_now
    assert float(mean9[0]) == pytest.approx(float(wait[0] + service[0] + 7168 * c_p[0]))


def test_users_past_the_engine_wait_for_a_slot() -> None:
    """--max-num-seqs 8 and 64 users: the engine decodes at most 8; the rest wait, so the
    point still holds its 64 users (Little's law) and TTFT carries the wait."""
    problem = problem_of("llama3.1-8b", "dgx-h100", 1, concurrency=64, max_num_seqs=8)
    point = estimate_serving_load(problem, ServeCandidates(tp=1, pp=1, dp=1, ep=1,
                                                           replicas=1)).point
    assert float(point.decoding[0]) <= 8
    in_flight = point.rate_per_s * (point.ttft_mean_s + 1024 * point.tpot_mean_s)
    assert float(in_flight[0]) == pytest.approx(64, rel=1e-6)
    assert float(point.ttft_mean_s[0]) > 56 * 1024 * float(point.tpot_mean_s[0]) / 8 * 0.9


def test_gamma_wait_is_allen_cunneen() -> None:
    """vLLM's gamma gaps of shape k have c_a^2 = 1 / k (vllm/benchmarks/serve.py get_request:
    np.random.gamma(shape=burstiness, scale=1 / (rate x burstiness))); M/D/1 at rho 0.5,
    s = 1 s waits 0.5 s, twice that at burstiness 0.5, nothing under evenly spaced gaps."""
    assert gamma_arrival_scv(0.5) == 2.0 and gamma_arrival_scv(float("inf")) == 0.0
    samples = np.random.default_rng(0).gamma(shape=0.5, scale=1.0 / (2.0 * 0.5), size=400_000)
    assert np.var(samples) / np.mean(samples) ** 2 == pytest.approx(2.0, rel=0.03)
    assert float(estimate_gig1_wait_s(0.5, 1.0, 1.0, 2.0)) == pytest.approx(1.0)
    assert float(estimate_gig1_wait_s(0.5, 1.0, 1.0, 0.0)) == 0.0


@given(st.floats(0.05, 0.95), st.floats(0.1, 10.0), st.floats(1.0, 3.0))
def test_gamma_wait_at_burstiness_one_is_pollaczek_khinchine(rho: float, mean: float,
                                                             spread: float) -> None:
    second = spread * mean ** 2
    lam = rho / mean
    assert float(estimate_gig1_wait_s(lam, mean, second, 1.0)) == pytest.approx(
        float(estimate_mg1_wait_s(lam, mean, second)), rel=1e-12)


def test_bursty_arrivals_wait_longer() -> None:
    """The same 4 requests/s of Llama-3.1-8B on one H100: gamma gaps of burstiness 0.25 give
    a longer TTFT than Poisson's, evenly spaced ones (burstiness 100) a shorter."""
    c = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    ttft = {}
    for client, k in (("poisson", None), ("gamma", 0.25), ("gamma", 100.0)):
        problem = problem_of("llama3.1-8b", "dgx-h100", 1, request_rate=4.0, client=client,
                             burstiness=k)
        ttft[k] = float(estimate_serving_load(problem, c).point.ttft_mean_s[0])
    assert ttft[0.25] > ttft[None] > ttft[100.0]


# MXFP4 experts on Hopper (no native kernel): the grouped dequantising path
# (solver.cost.serving.experts), in the users property since issue 38 item 4.
GPT_OSS_FP4_H100 = ("gpt-oss-120b", "dgx-h100", 2, "fp4",
                    dict(tp=2, pp=1, dp=1, ep=1, replicas=1))
PLANS = [("llama3.1-8b", "dgx-h100", 1, "bf16", dict(tp=1, pp=1, dp=1, ep=1, replicas=1)),
         ("llama3.1-70b", "dgx-h100", 8, "bf16", dict(tp=4, pp=2, dp=1, ep=1, replicas=1)),
         ("mixtral-8x7b", "dgx-h100", 2, "bf16", dict(tp=1, pp=1, dp=2, ep=2, replicas=1)),
         GPT_OSS_FP4_H100]


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(PLANS), st.integers(1, 2000), st.floats(1.01, 4.0),
       st.sampled_from([(1024, 1024), (128, 2048), (4000, 200)]))
def test_latency_never_falls_as_users_rise(plan, users: int, more: float, lengths) -> None:
    model, cluster, gpus, precision, degrees = plan
    c = ServeCandidates(**degrees)
    points = [estimate_serving_load(problem_of(model, cluster, gpus, precision, *lengths,
                                               concurrency=n), c).point
              for n in (users, int(np.ceil(users * more)))]
    # The percentile's grid resolution (see test_latency_never_falls_as_the_rate_rises).
    assert float(points[1].ttft_s[0]) >= float(points[0].ttft_s[0]) * (
        1 - 20 * GRID_POINTS ** -GRID_PASSES)
    assert float(points[1].tpot_s[0]) >= float(points[0].tpot_s[0]) * (1 - 1e-9)
    assert float(points[1].ttft_mean_s[0]) >= float(points[0].ttft_mean_s[0]) * (1 - 1e-9)
    assert float(points[1].tpot_mean_s[0]) >= float(points[0].tpot_mean_s[0]) * (1 - 1e-9)


@settings(max_examples=15, deadline=None)
@given(st.sampled_from(PLANS), st.floats(0.0, 0.98), st.floats(1.0, 1.5),
       st.sampled_from([1.0, 4.0, 0.5]), st.sampled_from([(1024, 1024), (4000, 200)]))
@example(PLANS[0], 1e-5, 1.2, 1.0, (1024, 1024))  # CI's draw: a 1.1e-7 dip, the grid's
def test_latency_never_falls_as_the_rate_rises(plan, fraction: float, more: float,
                                               arrival_scv: float, lengths) -> None:
    """Open loop at a share of the plan's largest stable rate, Poisson or gamma gaps: TTFT
    (mean and percentile) and mean TPOT. The TPOT percentile is not held: see below."""
    model, cluster, gpus, precision, degrees = plan
    low, high = _open_points(plan, lengths, arrival_scv, fraction, min(fraction * more, 0.999))
    for name in ("ttft_s", "ttft_mean_s", "tpot_mean_s"):
        # The percentile is read off a grid refined to GRID_POINTS^-GRID_PASSES (6e-8) of its
        # bracket, which is a few times the quantile and grows with the rate: a dip of 1e-7
        # of the TTFT is the grid's resolution (llama3.1-8b at 1e-5 of the stable rate:
        # 26.2373094 -> 26.2373066 ms), not a queue that shrinks.
        tolerance = 1e-9 if name != "ttft_s" else 20 * GRID_POINTS ** -GRID_PASSES
        assert float(getattr(high, name)[0]) >= float(getattr(low, name)[0]) * (1 - tolerance), name


def _open_points(plan, lengths, arrival_scv: float, *fractions: float):
    model, cluster, gpus, precision, degrees = plan
    curves = estimate_load_curves(problem_of(model, cluster, gpus, precision, *lengths),
                                  ServeCandidates(**degrees))
    curves = type(curves)(**{**curves.__dict__, "arrival_scv": arrival_scv})
    stable = largest_stable_rate(curves)
    return [estimate_load_point(curves, stable * f) for f in fractions]


@pytest.mark.xfail(strict=True, reason="open loop's TPOT percentile: mean + z sigma with "
                   "sigma linearised on the round's local slope, which falls where a MoE's "
                   "experts saturate (solver.cost.serving.load.estimate_tpot_std_s); known, "
                   "not fixed (issue 38)")
def test_open_loop_tpot_percentile_never_falls_as_the_rate_rises() -> None:
    """The counterexample: Mixtral-8x7B on 2 H100s (tp 1, dp 2, ep 2), 4,000 + 200 tokens,
    from 0.097 to 0.0992 of the largest stable rate the p90 TPOT falls by more than half
    (the fluid population jumps to where one more row adds little). A population that is
    stochastically larger under a round increasing in it cannot have a smaller percentile."""
    low, high = _open_points(PLANS[2], (4000, 200), 1.0, 0.0970, 0.0993)
    assert float(high.tpot_s[0]) >= float(low.tpot_s[0])


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(PLANS), st.integers(1, 512), st.integers(1, 1024), st.floats(1.0, 8.0),
       st.sampled_from(["max_num_seqs", "max_num_batched_tokens"]))
def test_throughput_never_falls_when_a_limit_rises(plan, users: int, limit: int, more: float,
                                                   name: str) -> None:
    """A larger --max-num-seqs or --max-num-batched-tokens never lowers the largest stable
    request rate, nor a larger --max-num-seqs the closed loop's tokens/s at a concurrency. (A
    larger budget can lower the closed loop's by a hair: it groups more prompts of a wave
    into one round, where they wait for each other: solver.cost.serving.closed.)"""
    model, cluster, gpus, precision, degrees = plan
    c = ServeCandidates(**degrees)
    if name == "max_num_batched_tokens":
        limit *= 16  # budgets from 16 tokens
    tokens, rates = [], []
    for value in (limit, int(limit * more)):
        problem = problem_of(model, cluster, gpus, precision, concurrency=users,
                             **{name: value})
        load = estimate_serving_load(problem, c)
        tokens.append(float(load.point.tokens_per_s[0]))
        rates.append(float(largest_stable_rate(load.curves)[0]))
    if name == "max_num_seqs":
        assert tokens[1] >= tokens[0] * (1 - 1e-6)
    assert rates[1] >= rates[0] * (1 - 1e-6)


def test_closed_ttft_of_mxfp4_experts_on_hopper_rises_with_users() -> None:
    """The counterexample CI's hypothesis draw found (issue 38 item 4): gpt-oss-120b fp4 on 2
    H100s, tp 2, 4,000 + 200 tokens, mean TTFT 0.3577 s at 10 users and 0.3449 s at 50,
    because MXFP4 experts on Hopper were charged two GEMM launches per touched expert (36 x 128
    x 2 x 8.5 us = 78 ms at 64 decodes), so the decode-only round grew with the decodes while
    the full round did not. As one grouped launch per projection (vLLM's matmul_ogs / Marlin
    MoE) the round of 64 decodes' experts is 11.1 ms and the TTFT rises: 0.0963 -> 0.1025 s,
    each plus the frontend's 3.855 ms + 4,000 x 1.338 us = 9.2 ms (issue 38 item 3)."""
    model, cluster, gpus, precision, degrees = GPT_OSS_FP4_H100
    c = ServeCandidates(**degrees)
    ttft = [float(estimate_serving_load(problem_of(model, cluster, gpus, precision, 4000, 200,
                                                   concurrency=n), c).point.ttft_mean_s[0])
            for n in (10, 50)]
    assert ttft[1] >= ttft[0] * (1 - 1e-9)
    assert ttft[0] == pytest.approx(0.0963 + 0.0092, rel=0.01)
