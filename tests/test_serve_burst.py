"""The finite batch of N prompts sent at once (solver.cost.serving.burst): the hand-worked rounds
of its docstring, vllm bench serve's metric definitions (vllm/benchmarks/serve.py
calculate_metrics: TPOT excludes the first token), the serial frontend, preemption, and the
properties issue 38 asks for."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost.serving.burst import simulate_burst

ROOT = Path(__file__).resolve().parent.parent


def linear_round(fixed_s: float, per_decode_s: float, per_prefill_s: float):
    """A round of fixed seconds (weights streamed once), plus per decode row and prefill token."""
    def round_s(d: float, p: float, _dc: float, _pc: float) -> float:
        return fixed_s + per_decode_s * d + per_prefill_s * p
    return round_s


def test_worked_number_of_the_docstring() -> None:
    """4 requests of 100 + 3 tokens, B = 256, rounds of 10 ms + 0.1 ms a prefill token: rounds
    end at 35.6, 60, 70, 80 ms (solver/cost/serving/burst.py docstring, worked by hand)."""
    r = simulate_burst(linear_round(0.010, 0.0, 1e-4), 4, 100, 3, budget=256, max_seqs=16,
                       kv_tokens=1e9)
    assert r.rounds == 4 and r.preemptions == 0 and r.most_running == 4
    assert r.duration_s == pytest.approx(0.080)
    assert r.ttft_mean_s == pytest.approx((0.0356 * 2 + 0.060 * 2) / 4)  # 47.8 ms
    assert r.tpot_mean_s == pytest.approx(((0.070 - 0.0356) / 2 * 2 + 0.010 * 2) / 4)  # 13.6
    assert r.request_rate_per_s == pytest.approx(50.0)
    assert r.output_tokens_per_s == pytest.approx(150.0)


def test_one_request_is_its_prefill_then_its_decodes() -> None:
    """vllm bench serve: TTFT is the prefill's round (its token sampled there), TPOT =
    (latency - TTFT) / (output - 1): 100 tokens at 10 ms + 0.1 ms each = 20 ms, then 9 decode
    rounds of 10 + 1 ms: TPOT 11 ms, the whole request 119 ms."""
    r = simulate_burst(linear_round(0.010, 0.001, 1e-4), 1, 100, 10, budget=8192,
                       max_seqs=256, kv_tokens=1e6)
    assert r.ttft_mean_s == pytest.approx(0.020)
    assert r.tpot_mean_s == pytest.approx(0.011)
    assert r.duration_s == pytest.approx(0.119)


def test_the_serial_frontend_hands_requests_over_one_at_a_time() -> None:
    """The k-th of N requests reaches the engine after k x frontend_s: 1,000 prompts at 4.0 ms
    each (vLLM's 3.855 ms a request + 1.338 us x 128 tokens, solver.cost.serving.overhead) take
    at least 4.0 s, however fast the GPU: at most 250 requests/s (GPUStack measured 129.5 for
    gpt-oss-120b's 128 + 4 tokens on one H100)."""
    frontend = 3.855e-3 + 1.338e-6 * 128
    r = simulate_burst(linear_round(1e-6, 0.0, 0.0), 1000, 128, 4, budget=8192,
                       max_seqs=1024, kv_tokens=1e7, frontend_s=frontend)
    assert r.duration_s == pytest.approx(1000 * frontend, rel=1e-3)
    assert r.request_rate_per_s <= 1.0 / frontend


def test_a_full_kv_cache_preempts_and_slows_the_batch() -> None:
    """Two requests of 10 + 5 tokens hold 20 tokens after their prefill and 24 after their last
    decode; a cache of 21 tokens cannot hold both past the first decode, so the last admitted
    is preempted and recomputes its prompt and its token (vLLM V1 _preempt_request)."""
    args = dict(requests=2, input_len=10, output_len=5, budget=64, max_seqs=8)
    roomy = simulate_burst(linear_round(0.01, 0.0, 0.001), kv_tokens=100, **args)
    tight = simulate_burst(linear_round(0.01, 0.0, 0.001), kv_tokens=21, **args)
    assert roomy.preemptions == 0 and tight.preemptions >= 1
    assert tight.duration_s > roomy.duration_s
    with pytest.raises(ValueError, match="does not fit"):
        simulate_burst(linear_round(0.01, 0.0, 0.001), kv_tokens=14, **args)


def test_lengths_per_request() -> None:
    """Per-request lengths: the batch lasts until its longest request ends: one of 1 + 50
    tokens beside nine of 1 + 2, rounds of 1 ms: 50 rounds."""
    r = simulate_burst(linear_round(0.001, 0.0, 0.0), 10, 1, [50] + [2] * 9, budget=64,
                       max_seqs=64, kv_tokens=1e4)
    assert r.rounds == 50 and r.duration_s == pytest.approx(0.050)
    assert r.output_len == pytest.approx((50 + 18) / 10)


BURSTS = dict(fixed=st.floats(1e-3, 3e-2), per_decode=st.floats(0.0, 1e-4),
              per_prefill=st.floats(1e-6, 1e-4), requests=st.integers(1, 60),
              prompt=st.integers(1, 600), output=st.integers(1, 60),
              budget=st.integers(256, 4096), seqs=st.integers(1, 128))


@settings(max_examples=60, deadline=None)
@given(**BURSTS, more=st.integers(1, 256))
def test_raising_a_limit_never_lowers_throughput(fixed, per_decode, per_prefill, requests,
                                                 prompt, output, budget, seqs, more) -> None:
    """Issue 38: throughput never falls when max-num-seqs or the token budget rises (a KV
    cache that holds every request: preemption is its own subject)."""
    def run(b: int, s: int) -> float:
        return simulate_burst(linear_round(fixed, per_decode, per_prefill), requests, prompt,
                              output, budget=b, max_seqs=s, kv_tokens=1e9).output_tokens_per_s
    base = run(budget, seqs)
    assert run(budget, seqs + more) >= base * (1 - 1e-9)
    assert run(budget + more, seqs) >= base * (1 - 1e-9)


@settings(max_examples=60, deadline=None)
@given(**BURSTS, more=st.integers(1, 60), kv=st.sampled_from([1e9, 3000.0]))
def test_more_requests_never_shorten_ttft_or_tpot(fixed, per_decode, per_prefill, requests,
                                                  prompt, output, budget, seqs, more,
                                                  kv) -> None:
    """Issue 38: TTFT and TPOT never fall when N rises: requests sent after the first N never
    make one of those faster (first come first served: they take only what is left), the mean
    TTFT and the duration never fall."""
    if prompt + output > kv:
        return

    def run(n: int):
        return simulate_burst(linear_round(fixed, per_decode, per_prefill), n, prompt, output,
                              budget=budget, max_seqs=seqs, kv_tokens=kv, frontend_s=1e-4)
    small, large = run(requests), run(requests + more)
    tol = 1 + 1e-9
    assert (large.ttft_s[:requests] * tol >= small.ttft_s).all()
    assert (large.tpot_s[:requests] * tol >= small.tpot_s).all()
    assert large.ttft_mean_s * tol >= small.ttft_mean_s
    assert large.duration_s * tol >= small.duration_s


def test_the_batch_mean_tpot_can_dip_by_a_newcomer_in_the_drain() -> None:
    """What the property above leaves out, on purpose: a request added at the end can decode in
    the drain's lighter rounds, so the batch's mean TPOT may fall a little while no request's
    own TPOT does (found by hypothesis: 5 -> 6 requests of 1 + 2 tokens, 4 seats, rounds of
    15.625 ms + 61 us a prefill token: 15.698 -> 15.696 ms)."""
    def run(n: int):
        return simulate_burst(linear_round(0.015625, 0.0, 6.103515625e-05), n, 1, 2,
                              budget=256, max_seqs=4, kv_tokens=1e9, frontend_s=1e-4)
    small, large = run(5), run(6)
    assert large.tpot_mean_s < small.tpot_mean_s
    assert (large.tpot_s[:5] >= small.tpot_s).all()


def test_serve_accuracy_predicts_bursts_with_the_finite_batch() -> None:
    """benchmarks/serve_accuracy.py reads a row with load {"burst": N} through
    solver.serve.burst: N / the batch's duration, finite and positive."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from serve_accuracy import build_problem, load_rows, predict

    from solver.serve.burst import estimate_burst
    row = next(r for r in load_rows() if r["id"] == "gpustack-gptoss120b-h100-short-tp1")
    problem, engine = build_problem(row, {})
    result = estimate_burst(problem, engine, row["load"]["burst"])[0]
    assert result is not None and result.requests == 1000
    assert predict(row) == pytest.approx(result.request_rate_per_s)
    assert math.isfinite(result.ttft_mean_s) and result.duration_s > 0
