"""TTFT and TPOT under load: vLLM's continuous batching with chunked prefill, as a fluid
balance for the decoding population and an M/G/1 queue for the prefills, read off the rounds
of solver.cost.serving.curves. Each engine (DP rank) serves its share of the load.

Decoding (fluid balance and Little's law): at an arrival rate lam per engine, d sequences decode
at once with d = lam E[O] tau(d); the smallest fixed point is found on the grid. Mean TPOT is
the round at d + 1 (the request and the others). A request's TPOT averages its own rounds, so
its percentile is the mean plus z_q times the spread of that average: the others' prefills
and decode rounds inside its window, Poisson in number (Campbell's theorem,
solver.cost.serving.queueing.estimate_tpot_variance_coefficients), widened by the feedback of slower
rounds at a larger population (estimate_feedback_variance_ratio). Stable while d stays
within min(max_num_seqs, the KV cache's sequences of mean length, pp B / (1 + E[I] / E[O])).

Prefill (M/G/1, solver.cost.serving.queueing): the budget a round leaves beside the decodes is the
server; a prompt's work is its share of a full round, its own latency S(I) whole rounds.
Arrivals are Poisson (benchmark_serving.py --request-rate), so the wait is
Pollaczek-Khinchine's with the exponential tail; before its first chunk an arrival also waits
out the round in progress (a residual uniform over the round while the engine is busy:
renewal theory's residual life of constant intervals; under vLLM V0's multi-step scheduling
the interval is the n rounds the scheduler commits at once, vllm/engine/llm_engine.py
_has_remaining_steps), plus the round an overlapping scheduler has already built
(solver.cost.serving.overhead), plus the other prompts that arrive meanwhile and ride in its
round (Poisson in number, each adding E[I] prefill tokens to it). The SLO percentile of TTFT
is the quantile of that sum (solver.cost.serving.ttft_quantile), the mean
tau / 2 + E[W] + lam tau E[I] c_p + S(E[I]).
A discrete-event simulation of this scheduler (tests/test_serve_queue_sim.py) holds the means
and the p90 TPOT.

A closed concurrency C (C / engines users per engine, each sending its next request when the
last ends) is turned into the rate that Little's law gives, lam (E[TTFT] + E[O] TPOT) = C; past
the stable rate the extra users queue: TTFT grows by what N / X_max leaves (the asymptotic
bound of closed systems, Lazowska et al., Quantitative System Performance, 1984, §5.2).

Idle latency (one request alone): TTFT = S(E[I]) with nothing decoding, TPOT = tau(1).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from solver.cost.serving.queueing import (
    estimate_feedback_variance_ratio,
    estimate_gig1_wait_s,
    estimate_mg1_wait_s,
    estimate_wait_quantile_s,
)
from solver.cost.serving.curves import LoadCurves
from solver.cost.serving.ttft_quantile import estimate_ttft_quantile_s

BISECTION_STEPS = 40


@dataclass(frozen=True)
class LoadPoint:
    """Latency and throughput at one arrival rate (arrays over candidates, seconds)."""

    rate_per_s: np.ndarray          # requests/s of the deployment
    stable: np.ndarray
    decoding: np.ndarray            # mean decoding sequences per engine
    ttft_s: np.ndarray              # at the SLO percentile
    tpot_s: np.ndarray
    ttft_mean_s: np.ndarray
    tpot_mean_s: np.ndarray
    concurrency: np.ndarray         # requests in the deployment (Little's law)
    tokens_per_s: np.ndarray        # output tokens/s of the deployment
    tokens_per_s_per_gpu: np.ndarray
    tokens_per_s_per_user: np.ndarray


def _rows(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    return np.take_along_axis(values, index[:, None], axis=1)[:, 0]


def weighted_mean(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """sum_k values[..., k] weights[k], row by row: a row's mean must not depend on the rows
    batched with it (a BLAS matrix-vector product sums in an order that does), or a rate a
    bisection accepted can fail when evaluated again (largest_rate)."""
    return (values * weights).sum(axis=-1)


def interpolate_curve(curves: LoadCurves, values: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Row-wise linear interpolation of values[N, G] (or [N, G, K]) at populations d (N,)."""
    grid = curves.d_grid
    d = np.clip(d, grid[:, 0], grid[:, -1])
    j = np.clip((grid <= d[:, None]).sum(axis=1) - 1, 0, grid.shape[1] - 2)
    lo, hi = _rows(grid, j), _rows(grid, j + 1)
    t = np.where(hi > lo, (d - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    if values.ndim == 3:
        a = np.take_along_axis(values, j[:, None, None], axis=1)[:, 0]
        b = np.take_along_axis(values, (j + 1)[:, None, None], axis=1)[:, 0]
        return a + t[:, None] * (b - a)
    return _rows(values, j) + t * (_rows(values, j + 1) - _rows(values, j))


def estimate_tpot_std_s(curves: LoadCurves, decoding: np.ndarray) -> np.ndarray:
    """The spread of a request's TPOT over requests at a mean population `decoding`: Campbell's
    theorem over its decode window (solver.cost.serving.queueing), with c_d what one more decode row
    adds to a round the request already decodes in (the slope past decoding + 1 rows: the
    first row's fixed cost, the weights streamed once, is the request's own) and c_p the
    seconds a prefill token adds at the population, widened by the loop gain of slower rounds
    at a larger population (R(g), the linear noise approximation)."""
    a, b, c = curves.tpot_variance
    if curves.decode_round_s is None:
        decode_round, prefill = curves.round_s, np.zeros_like(curves.round_s)
    else:
        decode_round, prefill = curves.decode_round_s, curves.prefill_token_s
    c_d = np.maximum(interpolate_curve(curves, decode_round, decoding + 2.0)
                     - interpolate_curve(curves, decode_round, decoding + 1.0), 0.0)
    c_p = interpolate_curve(curves, prefill, decoding)
    tau = interpolate_curve(curves, curves.round_s, decoding)
    slope = (interpolate_curve(curves, curves.round_s, decoding + 1.0) - tau)
    gain = decoding * np.maximum(slope, 0.0) / np.maximum(tau, 1e-300)
    variance = np.maximum(decoding, 0.0) * (a * c_p ** 2 + b * c_p * c_d + c * c_d ** 2)
    return np.sqrt(variance * estimate_feedback_variance_ratio(gain))


def estimate_open_population(curves: LoadCurves, rate_per_engine: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
    """(decoding, found): the smallest fixed point of the fluid balance d = lam E[O] tau(d) at
    `rate_per_engine` (module docstring), and whether the grid holds one."""
    lam = np.maximum(np.asarray(rate_per_engine, dtype=float), 0.0)
    gap = curves.d_grid - lam[:, None] * curves.output_mean * curves.round_s
    above = (gap >= 0.0) & (np.arange(gap.shape[1]) > 0)[None, :]
    found = above.any(axis=1) & (lam > 0)
    j = np.where(found, np.argmax(above, axis=1), 1)
    g0, g1 = _rows(gap, j - 1), _rows(gap, j)
    x0, x1 = _rows(curves.d_grid, j - 1), _rows(curves.d_grid, j)
    decoding = np.where(found, x0 + (x1 - x0) * (-g0) / np.where(g1 > g0, g1 - g0, 1.0), 0.0)
    return np.where(lam > 0, decoding, 0.0), found


def estimate_load_point(curves: LoadCurves, rate_per_engine: np.ndarray) -> LoadPoint:
    """Latency at `rate_per_engine` requests/s on every engine (module docstring)."""
    lam = np.maximum(np.asarray(rate_per_engine, dtype=float), 0.0)
    decoding, found = estimate_open_population(curves, lam)
    stable = (lam == 0) | (found & (decoding <= curves.d_max))
    return compose_load_point(curves, lam, decoding, stable)


def compose_load_point(curves: LoadCurves, rate_per_engine: np.ndarray, decoding: np.ndarray,
                       stable: np.ndarray) -> LoadPoint:
    """TTFT, TPOT and throughput of open-loop arrivals at `rate_per_engine` with `decoding`
    sequences decoding on each engine (module docstring); the gaps between arrivals have the
    curves' c_a^2 (1: Poisson)."""
    q = curves.quantile
    lam = rate_per_engine
    out = curves.output_mean
    tpot_mean = interpolate_curve(curves, curves.round_s, decoding + 1.0)
    tpot = tpot_mean + NormalDist().inv_cdf(q) * estimate_tpot_std_s(curves, decoding)
    service = interpolate_curve(curves, curves.service_s, decoding)
    mean_s = weighted_mean(service, curves.weights)
    second = weighted_mean(service ** 2, curves.weights)
    rho = lam * mean_s
    wait = estimate_gig1_wait_s(lam, mean_s, second, curves.arrival_scv)
    # The frontend serves one request at a time (solver.cost.serving.curves).
    stable = stable & (rho < 1.0) & (lam * curves.frontend_s < 1.0)
    # The round in progress: its residual is uniform over it, when the engine is busy at all
    # (1 - P(empty), the Poisson occupancy of the requests in the system).
    round_now = interpolate_curve(curves, curves.round_s, decoding)
    in_system = lam * (interpolate_curve(curves, curves.service_mean_s, decoding)
                       + out * round_now)
    busy = 1.0 - np.exp(-in_system)
    window = curves.steps_per_schedule * round_now
    built = curves.lag_rounds * round_now  # the round an overlapping scheduler has built
    # The prompts that arrive while the tagged one waits for the round ride in its round.
    batched = busy * lam * window
    token_s = (np.zeros_like(lam) if curves.prefill_token_s is None
               else interpolate_curve(curves, curves.prefill_token_s, decoding))
    batched_s = curves.input_mean * token_s
    ttft = estimate_ttft_quantile_s(q, busy, window, built, rho, wait,
                                    interpolate_curve(curves, curves.service_q_s, decoding),
                                    batched, batched_s)
    ttft_mean = (busy * (window / 2.0 + built) + wait + batched * batched_s
                 + interpolate_curve(curves, curves.service_mean_s, decoding))
    inf = np.inf
    rate = lam * curves.engines
    tokens = rate * out
    return LoadPoint(
        rate_per_s=rate, stable=stable, decoding=decoding,
        ttft_s=np.where(stable, ttft, inf), tpot_s=np.where(stable, tpot, inf),
        ttft_mean_s=np.where(stable, ttft_mean, inf),
        tpot_mean_s=np.where(stable, tpot_mean, inf),
        concurrency=np.where(stable, rate * (ttft_mean + out * tpot_mean), inf),
        tokens_per_s=np.where(stable, tokens, 0.0),
        tokens_per_s_per_gpu=np.where(stable, tokens / curves.num_gpus, 0.0),
        tokens_per_s_per_user=np.where(stable, 1.0 / tpot_mean, 0.0))


def estimate_prefill_queue(curves: LoadCurves, rate_per_engine
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT at the SLO percentile, mean TTFT, stable) of a prefill-only engine at
    `rate_per_engine`: the M/G/1 prefill queue with nothing decoding beside the chunks."""
    lam = np.maximum(np.asarray(rate_per_engine, dtype=float), 0.0)
    service = curves.service_s[:, 0, :]
    mean_s = weighted_mean(service, curves.weights)
    second = weighted_mean(service ** 2, curves.weights)
    rho = lam * mean_s
    wait = estimate_mg1_wait_s(lam, mean_s, second)
    stable = rho < 1.0
    ttft = estimate_wait_quantile_s(wait, rho, curves.quantile) + curves.service_q_s[:, 0]
    ttft_mean = wait + curves.service_mean_s[:, 0]
    return (np.where(stable, ttft, np.inf), np.where(stable, ttft_mean, np.inf), stable)


def within_slo(point: LoadPoint, max_ttft_s: float | None, max_tpot_s: float | None
               ) -> np.ndarray:
    """Stable and within the TTFT and TPOT limits (None: no limit) at the SLO percentile."""
    ok = point.stable.copy()
    if max_ttft_s is not None:
        ok &= point.ttft_s <= max_ttft_s
    if max_tpot_s is not None:
        ok &= point.tpot_s <= max_tpot_s
    return ok


def largest_rate(curves: LoadCurves, accept) -> np.ndarray:
    """The largest rate per engine that `accept`(point) holds at (bisection; 0 if none)."""
    tau_one = interpolate_curve(curves, curves.round_s, np.ones(len(curves.d_max)))
    idle_service = weighted_mean(curves.service_s[:, 0, :], curves.weights)
    high = np.minimum(curves.d_max / (curves.output_mean * np.maximum(tau_one, 1e-12)),
                      1.0 / np.maximum(idle_service, 1e-12))
    high = np.where(curves.d_max >= 1, high, 0.0)
    low = np.zeros_like(high)
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        good = accept(estimate_load_point(curves, middle))
        low = np.where(good, middle, low)
        high = np.where(good, high, middle)
    return low


def largest_stable_rate(curves: LoadCurves) -> np.ndarray:
    """The most requests/s per engine the queues stay bounded at (no SLO)."""
    return largest_rate(curves, lambda p: p.stable)


def estimate_max_num_seqs(curves: LoadCurves, max_seqs: int, max_tpot_s: float | None
                          ) -> np.ndarray:
    """The --max-num-seqs to launch with: the largest batch whose round stays within the TPOT
    limit (so an overload queues prompts instead of slowing every user), at most the
    scheduler's limit and the KV cache's sequences; the scheduler's limit without a limit."""
    cap = np.floor(np.minimum(np.maximum(curves.d_max, 1.0) + 1.0, max_seqs))
    if max_tpot_s is None:
        return np.where(curves.d_max >= 1, max_seqs, 1).astype(np.int64)
    low, high = np.zeros_like(cap), cap
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        good = interpolate_curve(curves, curves.round_s, middle) <= max_tpot_s
        low, high = np.where(good, middle, low), np.where(good, high, middle)
    return np.maximum(np.floor(low), 1).astype(np.int64)
