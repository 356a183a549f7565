"""The throughput-interactivity front: output tokens/s per user (1 / mean TPOT) against output
tokens/s per GPU, over every plan that fits and every load up to the most it carries stably
(solver.cost.serving.load), as AIConfigurator and the InferenceMAX charts draw it. A point is on the
front when no other point is at least as good on both axes and better on one; each point says
whether it meets the SLO at its load. With the disaggregated search's plans
(solver.serve.disagg), each prefill and decode pair joins the front at the same load fractions
of the most it carries stably: tokens/s per user from its decode pool, TTFT from its prefill
queue plus the KV transfer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.serve.candidates import SERVE_VARIABLES
from solver.serve.constraints import build_serve_constraints
from solver.serve.enumerate import enumerate_serving
from solver.serve.job import ServeProblem
from solver.cost.comm.kv_transfer import estimate_prefill_kv_tokens
from solver.cost.serving.load import (
    estimate_load_point,
    estimate_prefill_queue,
    largest_stable_rate,
)
from solver.serve.disagg import DisaggResult
from solver.serve.load import PARETO_FRACTIONS, estimate_load_curves, meets_slo, slo_limits_s

LOAD_CONSTRAINTS = ("carries_load", "ttft_within_slo", "tpot_within_slo",
                    "throughput_meets_target")


@dataclass(frozen=True)
class ParetoPoint:
    """One plan at one load: degrees, the deployment's request rate, tokens/s per user and
    per GPU, latency at the SLO percentile (seconds) and whether it meets the SLO."""

    degrees: dict[str, int]
    num_gpus: int
    request_rate: float
    tokens_per_s_per_user: float
    tokens_per_s_per_gpu: float
    ttft_s: float
    tpot_s: float
    meets_slo: bool
    prefill: dict[str, int] | None = None  # a disaggregated point's prefill pool (degrees
    # and copies); `degrees` are then its decode pool's, with copies as replicas

    @property
    def kind(self) -> str:
        return "aggregated" if self.prefill is None else "disaggregated"


def build_pareto_front(problem: ServeProblem, split: DisaggResult | None = None
                       ) -> tuple[ParetoPoint, ...]:
    """The front over every candidate that fits (the load and SLO constraints lifted) and the
    disaggregated plans of `split`, from most tokens/s per user to most tokens/s per GPU."""
    kept = [c for c in build_serve_constraints(problem) if c.name not in LOAD_CONSTRAINTS]
    candidates = enumerate_serving(problem, kept)
    if len(candidates) == 0:
        return ()
    curves = estimate_load_curves(problem, candidates)
    stable = largest_stable_rate(curves)
    points = []
    for fraction in PARETO_FRACTIONS:
        point = estimate_load_point(curves, stable * fraction)
        ok = meets_slo(problem, point) & point.stable & (stable > 0)
        points.append((point, ok))
    user = np.stack([p.tokens_per_s_per_user for p, _ in points], axis=1)
    gpu = np.stack([p.tokens_per_s_per_gpu for p, _ in points], axis=1)
    valid = np.stack([p.stable for p, _ in points], axis=1) & (stable > 0)[:, None]
    result = []
    for row in range(len(candidates)):
        for column, (point, ok) in enumerate(points):
            if valid[row, column]:
                result.append(ParetoPoint(
                    degrees={n: int(getattr(candidates, n)[row]) for n in SERVE_VARIABLES},
                    num_gpus=int(candidates.num_gpus[row]),
                    request_rate=float(point.rate_per_s[row]),
                    tokens_per_s_per_user=float(user[row, column]),
                    tokens_per_s_per_gpu=float(gpu[row, column]),
                    ttft_s=float(point.ttft_s[row]), tpot_s=float(point.tpot_s[row]),
                    meets_slo=bool(ok[row])))
    if split is not None and split.candidates:
        result += _split_points(problem, split)
    front = _non_dominated(np.array([p.tokens_per_s_per_user for p in result]),
                           np.array([p.tokens_per_s_per_gpu for p in result]))
    return tuple(sorted((result[i] for i in front),
                        key=lambda p: (-p.tokens_per_s_per_user, p.tokens_per_s_per_gpu)))


def _split_points(problem: ServeProblem, split: DisaggResult) -> list[ParetoPoint]:
    """The disaggregated plans at PARETO_FRACTIONS of the most each carries stably: the
    smaller of its prefill pool's and its decode pool's stable rates; a point whose prefill
    ranks cannot hold the prompts they keep (solver.cost.comm.kv_transfer) is left out."""
    plans = split.candidates
    engines = split.engines
    i = np.array([p.prefill_index for p in plans])
    j = np.array([p.decode_index for p in plans])
    prefill = split.prefill_curves.take(i)
    decode = split.decode_curves.take(j)
    ranks_p = np.array([p.prefill.copies for p in plans]) * engines.dp[i]
    ranks_d = np.array([p.decode.copies for p in plans]) * engines.dp[j]
    idle_service = prefill.service_s[:, 0, :] @ prefill.weights
    stable = np.minimum(ranks_p / np.maximum(idle_service, 1e-300),
                        ranks_d * largest_stable_rate(decode))
    transfer = np.array([p.transfer_s for p in plans])
    gpus = np.array([p.num_gpus for p in plans], dtype=float)
    prompt = problem.job.input_distribution.mean
    limits = slo_limits_s(problem)
    out = []
    for fraction in PARETO_FRACTIONS:
        rate = stable * fraction
        ttft, ttft_mean, ok_prefill = estimate_prefill_queue(prefill, rate / ranks_p)
        point = estimate_load_point(decode, rate / ranks_d)
        held = estimate_prefill_kv_tokens(rate / ranks_p, prompt,
                                          np.where(ok_prefill, ttft_mean, 0.0), transfer)
        ttft = ttft + transfer
        ok = ok_prefill & point.stable & (stable > 0) & (held <= split.kv_tokens[i])
        meets = ok & ((limits[0] is None) | (ttft <= (limits[0] or 0.0)))
        meets &= (limits[1] is None) | (point.tpot_s <= (limits[1] or 0.0))
        for k, plan in enumerate(plans):
            if not ok[k]:
                continue
            out.append(ParetoPoint(
                degrees={**plan.decode.degrees, "replicas": plan.decode.copies},
                num_gpus=plan.num_gpus, request_rate=float(rate[k]),
                tokens_per_s_per_user=float(point.tokens_per_s_per_user[k]),
                tokens_per_s_per_gpu=float(rate[k] * decode.output_mean / gpus[k]),
                ttft_s=float(ttft[k]), tpot_s=float(point.tpot_s[k]), meets_slo=bool(meets[k]),
                prefill={**plan.prefill.degrees, "copies": plan.prefill.copies}))
    return out


def _non_dominated(x: np.ndarray, y: np.ndarray) -> list[int]:
    """Indices of the points no other point dominates (maximising both), ties kept once."""
    order = np.lexsort((-y, -x))  # x descending, then y descending
    front, best_y = [], -np.inf
    seen = set()
    for i in order:
        if y[i] > best_y:
            key = (x[i], y[i])
            if key not in seen:
                front.append(int(i))
                seen.add(key)
            best_y = y[i]
    return front
