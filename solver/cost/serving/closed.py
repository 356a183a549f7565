"""The closed loop of a benchmark client at fixed concurrency: `vllm bench serve
--max-concurrency N` (request rate inf: a semaphore of N sends the next request the moment one
ends, vllm/benchmarks/serve.py benchmark), sglang.bench_serving --max-concurrency, genai-perf
--concurrency. The engine never holds more than N requests, and batches all it holds.

Per engine (N = users / engines) the operating point is parametrised by d, the mean number of
sequences decoding, each decoding a fraction d / N of its cycle:

  TPOT   the round a decoding request sees, itself and the others that decode, (N - 1) d / N
         of them (the arrival theorem of closed networks: a request sees the time average of
         the system with N - 1 others; Reiser and Lavenberg, "Mean-value analysis of closed
         multichain queuing networks", J. ACM 27(2), 1980), tau of solver.cost.serving.curves;
         The percentile is the mean: the waves repeat every cycle, so every request's
         window holds each other user's prompt once and the same rounds (the open loop's
         spread, Poisson in the others' arrivals, is not there; with lengths that vary this
         leaves out the spread they bring);
  rate   X(d) = d / (E[O] TPOT) (Little's law on the decode stage);
  TTFT   the wave (below);
  users  N(d) = X(d) (TTFT + E[O] TPOT), N(0) = 0; the point solves N(d) = N for
         0 <= d <= min(N, d_max, d_f) (bisection). Where d_max (max_num_seqs, the KV cache, the
         token budget) or d_f, the population whose rate the serial frontend just feeds
         (1 / frontend_s, solver.cost.serving.curves), leaves users over, they wait for a slot: TTFT grows by
         (N - N(d_max)) / X(d_max), the asymptotic bound of closed systems (Lazowska et al.,
         Quantitative System Performance, 1984, §5.2).

Waves. The clients start at once, and prompts of one length end together: the first wave's
prompts are chunked first come first served into rounds of pp x B tokens, so the ones whose
prefill ends in the same round, g = clip(floor(pp B / E[I]), 1, N), end their decode in the
same round and come back together. After warm-up each group arrives just after the round that
ended its requests: when other users keep the engine busy (probability 1 - (1 - d / N)^(N - g))
it waits out the whole round in progress and those the scheduler already holds (V0's multi-step
window, an overlapping scheduler's built round: solver.cost.serving.overhead), then its prompts
are prefilled together. The k-th has its first token after its own rounds S(I) plus c_p (what a
prefill token adds to a round, solver.cost.serving.curves) for every token of the group ahead of
or beside it in its last round, and a decode round of the others for each round more it spans:

    TTFT_k = wait + S(I) + (n_k - n_1) tau_d + (min(g I, n_k F) - I) c_p,
    n_k = ceil(k I / F),  F = pp B - (N - 1) d / N  (the budget the decodes leave)

k is uniform over 1..g: the mean is taken on GROUP_POINTS positions, the SLO percentile at
k = ceil(q g) with the SLO quantile's prompt. Worked number: 4 users of 1,024-token prompts,
B 8,192: g = 4, the group's 4,096 tokens in one round, TTFT = S(1,024) + 3,072 c_p for each.
"""

from __future__ import annotations

import numpy as np

from solver.cost.serving.curves import LoadCurves
from solver.cost.serving.load import (
    BISECTION_STEPS,
    LoadPoint,
    interpolate_curve,
)

GROUP_POINTS = 64  # positions in a wave the mean TTFT is read on


def estimate_closed_point(curves: LoadCurves, users_per_engine) -> LoadPoint:
    """The operating point of `users_per_engine` closed-loop users on every engine (module
    docstring); unstable only where not one sequence fits (d_max < 1)."""
    users = np.broadcast_to(np.asarray(users_per_engine, dtype=float), curves.d_max.shape)
    top = np.minimum(np.minimum(users, curves.d_max), estimate_frontend_decoding(curves))
    low, high = np.zeros_like(top), top.copy()
    for _ in range(BISECTION_STEPS):
        middle = (low + high) / 2.0
        good = _closed_parts(curves, users, middle)["users"] <= users
        low, high = np.where(good, middle, low), np.where(good, high, middle)
    parts = _closed_parts(curves, users, low)
    rate = parts["rate"]
    # Users the engine cannot hold at once wait for a slot (module docstring).
    extra = np.where(rate > 0, np.maximum(users - parts["users"], 0.0)
                     / np.where(rate > 0, rate, 1.0), 0.0)
    stable = (curves.d_max >= 1.0) & (users > 0) & (rate > 0)
    inf = np.inf
    deployment = rate * curves.engines
    tokens = deployment * curves.output_mean
    ttft_mean, tpot_mean = parts["ttft_mean"] + extra, parts["tpot_mean"]
    return LoadPoint(
        rate_per_s=deployment, stable=stable, decoding=low,
        ttft_s=np.where(stable, parts["ttft"] + extra, inf),
        tpot_s=np.where(stable, parts["tpot"], inf),
        ttft_mean_s=np.where(stable, ttft_mean, inf),
        tpot_mean_s=np.where(stable, tpot_mean, inf),
        concurrency=np.where(stable, users * curves.engines, 0.0),
        tokens_per_s=np.where(stable, tokens, 0.0),
        tokens_per_s_per_gpu=np.where(stable, tokens / curves.num_gpus, 0.0),
        tokens_per_s_per_user=np.where(stable, 1.0 / tpot_mean, 0.0))


def estimate_frontend_decoding(curves: LoadCurves) -> np.ndarray:
    """The most sequences decoding that the frontend keeps fed: where the decode stage's rate
    d / (E[O] tau(d)) reaches the frontend's 1 / frontend_s (solver.cost.serving.curves); the
    users beyond it wait for the frontend, as for a slot. Infinite without a frontend time."""
    if curves.frontend_s <= 0:
        return np.full(curves.d_max.shape, np.inf)
    d = curves.d_grid
    seconds = curves.output_mean * curves.round_s
    rate = np.maximum.accumulate(np.where(seconds > 0, d / np.where(seconds > 0, seconds, 1.0),
                                          0.0), axis=1)
    cap = 1.0 / curves.frontend_s
    return np.array([np.interp(cap, r, row, right=np.inf) for r, row in zip(rate, d)])


def _closed_parts(curves: LoadCurves, users: np.ndarray, decoding: np.ndarray
                  ) -> dict[str, np.ndarray]:
    """Rate, TPOT, TTFT and users N(d) at `decoding` sequences decoding (module docstring)."""
    fraction = np.where(users > 0, decoding / np.maximum(users, 1e-300), 0.0)
    others = np.maximum(users - 1.0, 0.0) * fraction
    tpot_mean = interpolate_curve(curves, curves.round_s, others + 1.0)
    rate = decoding / (curves.output_mean * tpot_mean)
    ttft_mean, ttft = estimate_wave_ttft_s(curves, users, others, fraction)
    return {"rate": rate, "tpot_mean": tpot_mean, "tpot": tpot_mean, "ttft_mean": ttft_mean,
            "ttft": ttft, "users": rate * (ttft_mean + curves.output_mean * tpot_mean)}


def estimate_wave_ttft_s(curves: LoadCurves, users: np.ndarray, others: np.ndarray,
                         fraction: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, SLO percentile) TTFT of a wave of closed-loop prompts (module docstring) with
    `others` sequences decoding beside it, each user decoding `fraction` of its cycle."""
    prompt = max(curves.input_mean, 1.0)
    budget = (np.full(users.shape, np.inf) if curves.round_budget is None
              else curves.round_budget.astype(float))
    group = np.clip(np.floor(budget / prompt), 1.0, np.maximum(users, 1.0))
    free = np.maximum(budget - others, 1.0)
    decode_s = interpolate_curve(curves, curves.round_s if curves.decode_round_s is None
                                 else curves.decode_round_s, others)
    token_s = (np.zeros_like(others) if curves.prefill_token_s is None
               else interpolate_curve(curves, curves.prefill_token_s, others))
    round_now = interpolate_curve(curves, curves.round_s, others)
    busy = 1.0 - (1.0 - np.clip(fraction, 0.0, 1.0)) ** np.maximum(users - group, 0.0)
    wait = busy * (curves.steps_per_schedule + curves.lag_rounds) * round_now

    def delay(position: np.ndarray) -> np.ndarray:  # (N, P) positions 1..g -> seconds
        rounds = np.ceil(position * prompt / free[:, None])
        own = np.ceil(prompt / free)[:, None]
        through = np.minimum(group[:, None] * prompt, rounds * free[:, None])
        return (np.maximum(rounds - own, 0.0) * decode_s[:, None]
                + np.maximum(through - prompt, 0.0) * token_s[:, None])

    points = (np.arange(GROUP_POINTS) + 0.5) / GROUP_POINTS
    positions = np.maximum(np.ceil(points[None, :] * group[:, None]), 1.0)
    mean = (wait + interpolate_curve(curves, curves.service_mean_s, others)
            + delay(positions).mean(axis=1))
    at_q = np.maximum(np.ceil(curves.quantile * group), 1.0)[:, None]
    quantile = (wait + interpolate_curve(curves, curves.service_q_s, others)
                + delay(at_q)[:, 0])
    return mean, quantile
