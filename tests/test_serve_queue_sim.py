"""The load model's queueing approximations (solver/serve/load.py) against a discrete-event
simulation of the scheduler they describe: vLLM v1's continuous batching with chunked prefill
(vllm/v1/core/sched/scheduler.py: running requests first, one token each, then waiting prompts
first-come first-served into what is left of max_num_batched_tokens), Poisson arrivals, and a
round time linear in its decode rows and prefill tokens. The simulation is the oracle; the
model must hold its mean TTFT and mean TPOT at light to heavy load."""

from __future__ import annotations

import random

import numpy as np
import pytest

from solver.cost.serving.queueing import estimate_tpot_variance_coefficients
from solver.cost.serving.curves import LoadCurves
from solver.cost.serving.load import estimate_load_point, largest_stable_rate

FIXED_S, PER_DECODE_S, PER_PREFILL_TOKEN_S = 10e-3, 0.1e-3, 0.02e-3
BUDGET, INPUT, OUTPUT = 2048, 512, 64


def round_s(decode, prefill):
    return FIXED_S + PER_DECODE_S * decode + PER_PREFILL_TOKEN_S * prefill


def build_curves(d_max: float, points: int = 48, quantile: float = 0.5) -> LoadCurves:
    """The curves solver.cost.serving.curves.estimate_load_curves builds, from the linear
    round."""
    d = np.concatenate([[0.0], (d_max + 1) ** np.linspace(0, 1, points - 1)])
    chunk = np.maximum(BUDGET - d, 1)
    rounds = round_s(d, np.minimum(np.maximum(d - 1, 0) * INPUT / OUTPUT,
                                   np.maximum(BUDGET - d, 0)))
    full = np.floor((INPUT - 1) / chunk)
    service = full * round_s(d, chunk) + round_s(d, INPUT - full * chunk)
    work = INPUT / chunk * round_s(d, chunk)
    return LoadCurves(d_grid=d[None], round_s=rounds[None], service_s=work[None, :, None],
                      service_q_s=service[None], service_mean_s=service[None],
                      weights=np.array([1.0]), d_max=np.array([d_max]),
                      output_mean=float(OUTPUT), engines=np.array([1.0]),
                      num_gpus=np.array([1.0]), quantile=quantile, input_mean=float(INPUT),
                      decode_round_s=round_s(d, 0.0)[None],
                      prefill_token_s=np.full((1, points), PER_PREFILL_TOKEN_S),
                      tpot_variance=estimate_tpot_variance_coefficients(
                          [INPUT], [1.0], [OUTPUT], [1.0]))


def simulate(rate: float, requests: int = 4000, seed: int = 0) -> tuple[list, list]:
    """(TTFT, TPOT) of every request, in the order they finish, the first fifth dropped."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(requests):
        t += rng.expovariate(rate)
        arrivals.append(t)
    waiting: list[list[float]] = []  # [arrival, prompt tokens left]
    running: list[list[float]] = []  # [first token time, output tokens left]
    ttft, tpot = [], []
    now, k = 0.0, 0
    while len(tpot) < requests:
        while k < requests and arrivals[k] <= now:
            waiting.append([arrivals[k], INPUT])
            k += 1
        if not waiting and not running:
            now = arrivals[k]
            continue
        decode = len(running)
        budget, prefill, prefilled = BUDGET - decode, 0, []
        for request in waiting:
            if budget <= 0:
                break
            take = min(budget, request[1])
            request[1] -= take
            budget -= take
            prefill += take
            if request[1] == 0:
                prefilled.append(request)
        now += round_s(decode, prefill)
        for request in running:
            request[1] -= 1
        for request in [r for r in running if r[1] == 0]:
            tpot.append((now - request[0]) / (OUTPUT - 1))
            running.remove(request)
        for request in prefilled:
            waiting.remove(request)
            ttft.append(now - request[0])
            running.append([now, OUTPUT - 1])
    warm = requests // 5
    return ttft[warm:], tpot[warm:]


@pytest.mark.parametrize("load", [0.2, 0.5, 0.8])
def test_model_holds_the_simulated_means(load: float) -> None:
    curves = build_curves(200.0)
    rate = load * float(largest_stable_rate(curves)[0])
    point = estimate_load_point(curves, np.array([rate]))
    ttft, tpot = simulate(rate)
    assert float(point.tpot_mean_s[0]) == pytest.approx(np.mean(tpot), rel=0.10)
    assert float(point.ttft_mean_s[0]) == pytest.approx(np.mean(ttft), rel=0.15)


@pytest.mark.parametrize("load", [0.2, 0.5, 0.8])
def test_p90_tpot_and_ttft_hold_the_simulated_percentiles(load: float) -> None:
    """A request's TPOT averages its rounds: the model's p90 (Campbell's theorem over the
    request's window, widened by the loop gain of slower rounds; solver.cost.serving.queueing) is
    within 6% of the simulated p90 over requests, its spread above the mean within 25%; the
    p90 TTFT (the quantile of residual + wait + the prompts batched with it + service,
    solver.cost.serving.ttft_quantile) within 4%. Measured here: p90 TPOT -1.1%, -2.9%, -5.0%; p90
    TTFT -2.4%, -0.1%, 0.0% (the summed quantiles without the batched prompts: -11%, -6%,
    -7%)."""
    curves = build_curves(200.0, quantile=0.9)
    rate = load * float(largest_stable_rate(curves)[0])
    point = estimate_load_point(curves, np.array([rate]))
    ttft, tpot = simulate(rate, requests=8000)
    assert float(point.tpot_s[0]) == pytest.approx(np.quantile(tpot, 0.9), rel=0.06)
    spread = float(point.tpot_s[0] - point.tpot_mean_s[0])
    assert spread == pytest.approx(np.quantile(tpot, 0.9) - np.mean(tpot), rel=0.25)
    assert float(point.ttft_s[0]) == pytest.approx(np.quantile(ttft, 0.9), rel=0.04)
