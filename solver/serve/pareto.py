"""The throughput-interactivity front: output tokens/s per user (1 / mean TPOT) against output
tokens/s per GPU, over every plan that fits and every load up to the most it carries stably
(solver.cost.serve_load), as AIConfigurator and the InferenceMAX charts draw it. A point is on the
front when no other point is at least as good on both axes and better on one; each point says
whether it meets the SLO at its load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.serve.candidates import SERVE_VARIABLES
from solver.serve.constraints import build_serve_constraints
from solver.serve.enumerate import enumerate_serving
from solver.serve.job import ServeProblem
from solver.cost.serve_load import estimate_load_point, largest_stable_rate
from solver.serve.load import PARETO_FRACTIONS, estimate_load_curves, meets_slo

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


def build_pareto_front(problem: ServeProblem) -> tuple[ParetoPoint, ...]:
    """The front over every candidate that fits (the load and SLO constraints lifted), from
    most tokens/s per user to most tokens/s per GPU."""
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
    front = _non_dominated(np.where(valid, user, -1.0).ravel(), np.where(valid, gpu, -1.0).ravel())
    front = [i for i in front if valid.ravel()[i]]
    result = []
    for flat in front:
        row, column = divmod(int(flat), len(points))
        point, ok = points[column]
        result.append(ParetoPoint(
            degrees={n: int(getattr(candidates, n)[row]) for n in SERVE_VARIABLES},
            num_gpus=int(candidates.num_gpus[row]), request_rate=float(point.rate_per_s[row]),
            tokens_per_s_per_user=float(point.tokens_per_s_per_user[row]),
            tokens_per_s_per_gpu=float(point.tokens_per_s_per_gpu[row]),
            ttft_s=float(point.ttft_s[row]), tpot_s=float(point.tpot_s[row]),
            meets_slo=bool(ok[row])))
    return tuple(sorted(result, key=lambda p: (-p.tokens_per_s_per_user,
                                               p.tokens_per_s_per_gpu)))


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
