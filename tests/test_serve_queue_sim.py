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

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.serve import ServeJob, ServeProblem
from solver.serve.load import LoadCurves, estimate_load_point, largest_stable_rate
from solver.serve.workload import ServeLoadSpec

FIXED_S, PER_DECODE_S, PER_PREFILL_TOKEN_S = 10e-3, 0.1e-3, 0.02e-3
BUDGET, INPUT, OUTPUT = 2048, 512, 64


def round_s(decode, prefill):
    return FIXED_S + PER_DECODE_S * decode + PER_PREFILL_TOKEN_S * prefill


def build_curves(d_max: float, points: int = 48) -> LoadCurves:
    """The curves solver.serve.load.estimate_load_curves builds, from the linear round."""
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
                      num_gpus=np.array([1.0]))


def simulate(rate: float, requests: int = 4000, seed: int = 0) -> tuple[float, float]:
    """(mean TTFT, mean TPOT) of the scheduler, the first fifth of the requests dropped."""
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
    return float(np.mean(ttft[warm:])), float(np.mean(tpot[warm:]))


@pytest.mark.parametrize("load", [0.2, 0.5, 0.8])
def test_model_holds_the_simulated_means(load: float) -> None:
    job = ServeJob(context=4096, input_len=INPUT, output_len=OUTPUT,
                   load=ServeLoadSpec(slo_percentile=50))
    problem = ServeProblem(model_spec=load_model_spec("llama3.1-8b"),
                           cluster=load_calibrated_cluster("dgx-h100", None, None), num_gpus=1,
                           job=job)
    curves = build_curves(200.0)
    rate = load * float(largest_stable_rate(problem, curves)[0])
    point = estimate_load_point(problem, curves, np.array([rate]))
    ttft, tpot = simulate(rate)
    assert float(point.tpot_mean_s[0]) == pytest.approx(tpot, rel=0.10)
    assert float(point.ttft_mean_s[0]) == pytest.approx(ttft, rel=0.15)
