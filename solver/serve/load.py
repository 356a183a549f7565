"""TTFT and TPOT under load: vLLM's continuous batching with chunked prefill, as a fluid
balance for the decoding population and an M/G/1 queue for the prefills.

Each DP rank (an **engine** here: dp x replicas of them share the load evenly) runs scheduler
rounds: every running sequence decodes one token, and the rest of the token budget
(max_num_batched_tokens B minus the decoding rows: vLLM v1 schedules running requests first,
then waiting ones, vllm/v1/core/sched/scheduler.py) goes to prefill chunks.

Decoding (fluid balance and Little's law): at an arrival rate lam per engine, d sequences decode
at once with d = lam E[O] tau(d), where tau(d) is the round with d decode rows and the prefill
tokens the arrivals bring per round, p = lam E[I] tau = d E[I] / E[O] (solver.serve.timing.
estimate_mixed_step_s, from the kernel tables where the GPU has them). The smallest fixed
point is found on a grid of d. A request's TPOT is the round time at the population it sees:
itself plus a Poisson count of others (M/G/inf occupancy, solver.cost.queueing), at its mean
(mean TPOT) or its quantile (the SLO percentile: conservative, since a request's TPOT averages
its rounds). Stable while d stays within min(max_num_seqs, the KV cache's sequences of mean
length, B / (1 + E[I] / E[O])).

Prefill (M/G/1, solver.cost.queueing): the B - d tokens a round leaves beside the decodes are
the server; a prompt of I tokens is I / (B - d) of a full-budget round of work (several short
prompts share one step), and once at the head it takes ceil(I / (B - d)) whole rounds: its
latency S(I). Arrivals are Poisson (benchmark_serving.py --request-rate), so the wait is
Pollaczek-Khinchine's with the exponential tail; before its first chunk an arrival also waits
out the round in progress (a residual uniform over the round while the engine is busy: renewal
theory's residual life of constant intervals). TTFT = residual + wait + S at the SLO percentile
of each (summing quantiles: conservative), TTFT mean = tau / 2 + E[W] + S(E[I]). A
discrete-event simulation of this scheduler (tests/test_serve_queue_sim.py) holds the means.

A closed concurrency C (C / engines users per engine, each sending its next request when the
last ends) is turned into the rate that Little's law gives, lam (E[TTFT] + E[O] TPOT) = C; past
the stable rate the extra users queue: TTFT grows by what N / X_max leaves (the asymptotic
bound of closed systems, Lazowska et al., Quantitative System Performance, 1984, §5.2).

Idle latency (one request alone): TTFT = S(E[I]) with nothing decoding, TPOT = tau(1).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.queueing import (
    estimate_mg1_wait_s,
    estimate_poisson_quantile,
    estimate_wait_quantile_s,
)
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, scheduler_limits
from solver.serve.memory import estimate_serving_memory
from solver.serve.timing import estimate_mixed_step_s, estimate_weights_and_links

GRID_POINTS = 24
BISECTION_STEPS = 40
# Loads the front samples, as fractions of the most each plan carries stably: up to 0.9 (the
# M/G/1 wait grows as 1 / (1 - rho) beyond, and no SLO is met there).
PARETO_FRACTIONS = tuple(float(x) for x in np.geomspace(0.02, 0.9, 12))


@dataclass(frozen=True)
class LoadCurves:
    """Per candidate (rows) and decode population (grid columns): the round time and the
    prefill service of each support length, the length distribution's weights, limits."""

    d_grid: np.ndarray        # (N, G) decoding sequences, 0 .. d_max + 1
    round_s: np.ndarray       # (N, G) tau(d)
    service_s: np.ndarray     # (N, G, K) the prefill queue's work of I_k at d
    service_q_s: np.ndarray   # (N, G) S(I at the SLO quantile): whole rounds
    service_mean_s: np.ndarray  # (N, G) S(E[I]): whole rounds
    weights: np.ndarray       # (K,)
    d_max: np.ndarray         # (N,)
    output_mean: float
    engines: np.ndarray       # (N,) DP ranks sharing the load
    num_gpus: np.ndarray      # (N,)


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


def _interp(curves: LoadCurves, values: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Row-wise linear interpolation of values[..., G] (or [N, G, K]) at d (N,)."""
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


def estimate_load_curves(problem: ServeProblem, c: ServeCandidates,
                         phase: str = "both") -> LoadCurves:
    """Round and service times on a grid of decode populations for every candidate. `phase`
    "decode": a disaggregated decode engine (no prefill rounds, no prefill queue), "prefill":
    a prefill engine (read at d = 0 by estimate_prefill_queue), "both": an aggregated
    engine."""
    job = problem.job
    inputs, outputs = job.input_distribution, job.output_distribution
    lengths, weights = inputs.support()
    input_mean, output_mean = float(np.dot(lengths, weights)), outputs.mean
    budget, max_seqs = scheduler_limits(problem)
    memory = estimate_serving_memory(problem, c)
    n = len(c)
    kv_seqs = np.where(memory.fits, np.floor(memory.kv_tokens / (input_mean + output_mean)), 0)
    # vLLM keeps pp micro-batches in flight, each scheduled with the whole token budget: a
    # round (every sequence one token) has pp x B tokens, a prompt's chunk sits in one
    # micro-batch beside its d / pp decodes and crosses the pp stages in turn.
    pp = c.pp.astype(float)[:, None, None]
    round_budget = budget * pp
    tokens_per_decode = 1.0 + (0.0 if phase == "decode" else input_mean / output_mean)
    d_max = np.minimum(np.minimum(kv_seqs, max_seqs), round_budget[:, 0, 0] / tokens_per_decode)
    top = np.maximum(d_max, 1.0) + 1.0
    exponents = np.linspace(0.0, 1.0, GRID_POINTS - 1)
    d_grid = np.concatenate([np.zeros((n, 1)), top[:, None] ** exponents[None, :]], axis=1)
    # Columns: the round, the full round, the full chunk, one remainder per support length,
    # I_q and E[I].
    quantile_len = inputs.quantile(job.load.quantile)
    chunk_lengths = np.concatenate([lengths, [quantile_len, input_mean]])
    k = len(chunk_lengths)
    g = GRID_POINTS
    d = d_grid[:, :, None]
    chunk = np.maximum(budget - d / pp, 1.0)
    full = np.floor(np.maximum(chunk_lengths[None, None, :] - 1.0, 0.0) / chunk)
    remainder = chunk_lengths[None, None, :] - full * chunk
    share = 0.0 if phase == "decode" else input_mean / output_mean
    # The round a decoding request sees holds itself and d - 1 others, whose prompts bring
    # (d - 1) E[I] / E[O] prefill tokens a round (one alone decodes with no prefill beside it).
    prefill_round = np.minimum(np.maximum(d - 1.0, 0.0) * share,
                               np.maximum(round_budget - d, 0.0))
    free = np.maximum(round_budget - d, 1.0)
    context = np.full(d.shape, input_mean)
    columns = [  # (decode rows, prefill rows of the round, prefill context), (N, G, columns)
        (d, prefill_round, context),
        (d, free, context),
        (d, chunk * pp, context),
        (np.broadcast_to(d, remainder.shape), remainder * pp,
         np.broadcast_to(chunk_lengths[None, None, :], remainder.shape)),
    ]
    widths = (1, 1, 1, k)
    flat = [np.concatenate([np.broadcast_to(col[i], (n, g, w)).reshape(n, g * w)
                            for col, w in zip(columns, widths)], axis=1)
            for i in range(3)]
    width = flat[0].shape[1]
    repeated = c.take(np.repeat(np.arange(n), width))
    stage_weights, links = estimate_weights_and_links(problem, repeated)
    per_token = np.repeat(memory.kv_bytes_per_token, width)
    seconds = estimate_mixed_step_s(
        problem, repeated, stage_weights, links, per_token, flat[0].ravel(),
        input_mean + output_mean / 2.0, flat[1].ravel(), flat[2].ravel()).reshape(n, width)
    round_s = seconds[:, :g]
    free_s = seconds[:, g:2 * g]
    chunk_s = seconds[:, 2 * g:3 * g]
    last_s = seconds[:, 3 * g:].reshape(n, g, k)
    service = full * chunk_s[:, :, None] + last_s
    # The queue's work: the budget left beside the decodes is shared by every waiting prompt
    # (the scheduler packs several into one step), so a prompt occupies its share of a round
    # whose micro-batches are full; its own latency is the whole chunks of `service`.
    work = chunk_lengths[None, None, :] / free * free_s[:, :, None]
    if phase == "decode":  # the prompt arrived prefilled
        service, work = np.zeros_like(service), np.zeros_like(work)
    return LoadCurves(d_grid=d_grid, round_s=round_s, service_s=work[:, :, :k - 2],
                      service_q_s=service[:, :, k - 2], service_mean_s=service[:, :, k - 1],
                      weights=weights, d_max=d_max, output_mean=output_mean,
                      engines=(c.dp * c.replicas).astype(float),
                      num_gpus=c.num_gpus.astype(float))


def estimate_load_point(problem: ServeProblem, curves: LoadCurves, rate_per_engine: np.ndarray
                        ) -> LoadPoint:
    """Latency at `rate_per_engine` requests/s on every engine (module docstring)."""
    q = problem.job.load.quantile
    lam = np.maximum(np.asarray(rate_per_engine, dtype=float), 0.0)
    out = curves.output_mean
    # Smallest fixed point of d = lam E[O] tau(d) on the grid.
    gap = curves.d_grid - lam[:, None] * out * curves.round_s
    above = (gap >= 0.0) & (np.arange(gap.shape[1]) > 0)[None, :]
    found = above.any(axis=1) & (lam > 0)
    j = np.where(found, np.argmax(above, axis=1), 1)
    g0, g1 = _rows(gap, j - 1), _rows(gap, j)
    x0, x1 = _rows(curves.d_grid, j - 1), _rows(curves.d_grid, j)
    decoding = np.where(found, x0 + (x1 - x0) * (-g0) / np.where(g1 > g0, g1 - g0, 1.0), 0.0)
    decoding = np.where(lam > 0, decoding, 0.0)
    stable = (lam == 0) | (found & (decoding <= curves.d_max))
    tpot_mean = _interp(curves, curves.round_s, decoding + 1.0)
    seen = np.minimum(estimate_poisson_quantile(decoding, q), curves.d_max)
    tpot = _interp(curves, curves.round_s, np.maximum(seen, decoding) + 1.0)
    service = _interp(curves, curves.service_s, decoding)
    mean_s = service @ curves.weights
    second = (service ** 2) @ curves.weights
    rho = lam * mean_s
    wait = estimate_mg1_wait_s(lam, mean_s, second)
    wait_q = estimate_wait_quantile_s(wait, rho, q)
    stable = stable & (rho < 1.0)
    # An arrival first waits for the round in progress: the residual of a constant round is
    # uniform over it (mean tau / 2), when the engine is busy at all (1 - P(empty), the
    # Poisson occupancy of the requests in the system).
    round_now = _interp(curves, curves.round_s, decoding)
    in_system = lam * (_interp(curves, curves.service_mean_s, decoding) + out * round_now)
    busy = 1.0 - np.exp(-in_system)
    ttft = busy * q * round_now + wait_q + _interp(curves, curves.service_q_s, decoding)
    ttft_mean = (busy * round_now / 2.0 + wait
                 + _interp(curves, curves.service_mean_s, decoding))
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


def estimate_prefill_queue(problem: ServeProblem, curves: LoadCurves, rate_per_engine
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(TTFT at the SLO percentile, mean TTFT, stable) of a prefill-only engine at
    `rate_per_engine`: the M/G/1 prefill queue with nothing decoding beside the chunks."""
    q = problem.job.load.quantile
    lam = np.maximum(np.asarray(rate_per_engine, dtype=float), 0.0)
    service = curves.service_s[:, 0, :]
    mean_s = service @ curves.weights
    second = (service ** 2) @ curves.weights
    rho = lam * mean_s
    wait = estimate_mg1_wait_s(lam, mean_s, second)
    stable = rho < 1.0
    ttft = estimate_wait_quantile_s(wait, rho, q) + curves.service_q_s[:, 0]
    ttft_mean = wait + curves.service_mean_s[:, 0]
    return (np.where(stable, ttft, np.inf), np.where(stable, ttft_mean, np.inf), stable)


def meets_slo(problem: ServeProblem, point: LoadPoint) -> np.ndarray:
    """Stable and within --max-ttft-ms / --max-tpot-ms at the SLO percentile."""
    job = problem.job
    ok = point.stable.copy()
    if job.max_ttft_ms is not None:
        ok &= point.ttft_s <= job.max_ttft_ms * 1e-3
    if job.max_tpot_ms is not None:
        ok &= point.tpot_s <= job.max_tpot_ms * 1e-3
    return ok


def largest_rate(problem: ServeProblem, curves: LoadCurves, accept) -> np.ndarray:
    """The largest rate per engine that `accept`(point) holds at (bisection; 0 if none)."""
    tau_one = _interp(curves, curves.round_s, np.ones(len(curves.d_max)))
    idle_service = curves.service_s[:, 0, :] @ curves.weights
    high = np.minimum(curves.d_max / (curves.output_mean * np.maximum(tau_one, 1e-12)),
                      1.0 / np.maximum(idle_service, 1e-12))
    high = np.where(curves.d_max >= 1, high, 0.0)
    low = np.zeros_like(high)
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        good = accept(estimate_load_point(problem, curves, middle))
        low = np.where(good, middle, low)
        high = np.where(good, high, middle)
    return low


@dataclass(frozen=True)
class ServeLoad:
    """What the load model says about each candidate: idle latency, the operating point (the
    requested rate or concurrency; without one, the most load within the SLO), and the most
    load each carries within the SLO (deployment requests/s and concurrency)."""

    ttft_idle_s: np.ndarray
    tpot_idle_s: np.ndarray
    point: LoadPoint
    meets_slo: np.ndarray
    max_rate_per_s: np.ndarray
    max_concurrency: np.ndarray
    curves: LoadCurves


def estimate_serving_load(problem: ServeProblem, c: ServeCandidates) -> ServeLoad:
    """The load model for every candidate (module docstring)."""
    job = problem.job
    curves = estimate_load_curves(problem, c)
    feasible = largest_rate(problem, curves, lambda p: meets_slo(problem, p))
    best = estimate_load_point(problem, curves, feasible)
    ok_best = meets_slo(problem, best) & (feasible > 0)
    max_rate = np.where(ok_best, best.rate_per_s, 0.0)
    max_concurrency = np.where(ok_best, best.concurrency, 0.0)
    if job.load.request_rate is not None:
        point = estimate_load_point(problem, curves, job.load.request_rate / curves.engines)
    elif job.load.concurrency is not None:
        point = _closed_point(problem, curves, job.load.concurrency / curves.engines)
    else:
        point = best
    zero = np.zeros(len(c))
    return ServeLoad(ttft_idle_s=curves.service_mean_s[:, 0],
                     tpot_idle_s=_interp(curves, curves.round_s, zero + 1.0),
                     point=point, meets_slo=meets_slo(problem, point) & (point.rate_per_s > 0),
                     max_rate_per_s=max_rate, max_concurrency=max_concurrency, curves=curves)


def largest_stable_rate(problem: ServeProblem, curves: LoadCurves) -> np.ndarray:
    """The most requests/s per engine the queues stay bounded at (no SLO)."""
    return largest_rate(problem, curves, lambda p: p.stable)


def _closed_point(problem: ServeProblem, curves: LoadCurves, users: np.ndarray) -> LoadPoint:
    """The operating point of `users` closed-loop users per engine (module docstring)."""
    stable_max = largest_stable_rate(problem, curves)
    rate = largest_rate(problem, curves,
                         lambda p: p.stable & (p.concurrency / curves.engines <= users))
    rate = np.minimum(rate, stable_max)
    point = estimate_load_point(problem, curves, rate)
    in_system = point.concurrency / curves.engines
    saturated = np.isfinite(in_system) & (in_system < users * (1 - 1e-6)) & (rate > 0)
    extra = np.where(saturated, (users - in_system) / np.maximum(rate, 1e-300), 0.0)
    extra = np.where(rate > 0, extra, 0.0)
    return LoadPoint(
        rate_per_s=point.rate_per_s, stable=point.stable & (rate > 0),
        decoding=point.decoding, ttft_s=point.ttft_s + extra, tpot_s=point.tpot_s,
        ttft_mean_s=point.ttft_mean_s + extra, tpot_mean_s=point.tpot_mean_s,
        concurrency=np.where(rate > 0, users * curves.engines, 0.0),
        tokens_per_s=point.tokens_per_s, tokens_per_s_per_gpu=point.tokens_per_s_per_gpu,
        tokens_per_s_per_user=point.tokens_per_s_per_user)


def estimate_max_num_seqs(problem: ServeProblem, load: ServeLoad | LoadCurves) -> np.ndarray:
    """The --max-num-seqs to launch with: the largest batch whose round stays within
    --max-tpot-ms (so an overload queues prompts instead of slowing every user), at most the
    scheduler's limit and the KV cache's sequences; the scheduler's limit without a TPOT SLO."""
    _, max_seqs = scheduler_limits(problem)
    curves = load if isinstance(load, LoadCurves) else load.curves
    cap = np.floor(np.minimum(np.maximum(curves.d_max, 1.0) + 1.0, max_seqs))
    limit = problem.job.max_tpot_ms
    if limit is None:
        return np.where(curves.d_max >= 1, max_seqs, 1).astype(np.int64)
    low, high = np.zeros_like(cap), cap
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        good = _interp(curves, curves.round_s, middle) <= limit * 1e-3
        low, high = np.where(good, middle, low), np.where(good, high, middle)
    return np.maximum(np.floor(low), 1).astype(np.int64)
