"""The serving oracle: every (tp, pp, dp, ep, replicas) the rules allow, costed by the numpy
model and ranked. The space is small (divisor tuples of the GPU count), so exhaustive search
is the engine of `parplan serve`.

Space. Objectives throughput and latency use all the GPUs: tp, pp, dp are divisors of N, a
dense model's dp takes the rest (replicas = 1: its DP ranks are independent already), a MoE's
replicas take the rest. Objective gpus searches every engine of at most N GPUs and scales it
out (dense: dp, MoE: replicas) to the fewest copies that reach --min-tokens-per-s (one copy
without a target). ep is 1 or tp x dp (--enable-expert-parallel) for a MoE, 1 for a dense
model. Each constraint prunes as soon as the degrees it reads are bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver.cost.serving.price import estimate_dollars_per_million_tokens
from solver.search.constraints import Constraint
from solver.search.space import divisors
from solver.serve.candidates import SERVE_VARIABLES, ServeCandidates
from solver.serve.constraints import build_serve_constraints
from solver.serve.estimate import ServeEstimate, estimate_serving
from solver.serve.job import ServeProblem
from solver.serve.load import ServeLoad, estimate_serving_load

ENGINE_DEGREES = ("tp", "pp", "dp", "ep")


def enumerate_serving(problem: ServeProblem, constraints: Sequence[Constraint] | None = None
                      ) -> ServeCandidates:
    """Every candidate meeting `constraints` (default: all of the problem's), in a fixed order."""
    constraints = build_serve_constraints(problem) if constraints is None else constraints
    pending = list(constraints)
    values = _engines(problem, pending)
    values = _scale_out(problem, values)
    values, pending = _apply_ready(values, pending)
    assert not pending
    return ServeCandidates.from_values(values)


def _engines(problem: ServeProblem, pending: list[Constraint]) -> dict[str, np.ndarray]:
    n, moe = problem.num_gpus, problem.model_spec.is_moe
    exact = problem.job.objective != "gpus"
    domain = np.array(divisors(n) if exact else range(1, n + 1), dtype=np.int64)
    values = {"tp": domain.copy()}
    values, pending[:] = _apply_ready(values, pending)
    if exact:  # products divide n
        values = _expand(values, "pp", domain)
        values = _keep(values, n % (values["tp"] * values["pp"]) == 0)
    else:  # products at most n
        values = _expand_up_to(values, "pp", n // values["tp"])
    values, pending[:] = _apply_ready(values, pending)
    if moe and exact:
        values = _expand(values, "dp", domain)
        values = _keep(values, n % (values["tp"] * values["pp"] * values["dp"]) == 0)
    elif moe:
        values = _expand_up_to(values, "dp", n // (values["tp"] * values["pp"]))
    else:
        values["dp"] = np.ones_like(values["tp"])
    values = _expand(values, "ep_on", np.array([0, 1] if moe else [0]))
    values["ep"] = np.where(values.pop("ep_on") == 1, values["tp"] * values["dp"], 1)
    if moe:  # ep = tp x dp = 1 is the same engine as ep = 1
        values = _dedupe(values)
    values, pending[:] = _apply_ready(values, pending)
    return values


def _scale_out(problem: ServeProblem, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Add the copies: the rest of the GPUs (throughput, latency) or the fewest that reach the
    throughput target (gpus)."""
    n, moe = problem.num_gpus, problem.model_spec.is_moe
    engine = values["tp"] * values["pp"] * values["dp"]
    if problem.job.objective != "gpus":
        rest = n // np.maximum(engine, 1)
        if moe:
            values["replicas"] = rest
        else:
            values["dp"], values["replicas"] = rest, np.ones_like(rest)
        return values
    values["replicas"] = np.ones_like(engine)
    target = problem.job.min_tokens_per_s
    rate = problem.job.load.request_rate
    if (target is None and rate is None) or len(engine) == 0:
        return values
    if rate is not None:  # copies that carry the rate within the SLO (solver.cost.serving.load)
        unit = estimate_serving_load(problem, ServeCandidates.from_values(values)).max_rate_per_s
        target = rate
    else:
        unit = estimate_serving(problem, ServeCandidates.from_values(values)).tokens_per_s
    needed = np.ceil(target / np.where(unit > 0, unit, 1.0) - 1e-12)
    # More than n copies can never fit; capping at n + 1 keeps gpus_at_most able to say so.
    copies = np.clip(np.where(unit > 0, needed, n + 1), 1, n + 1).astype(np.int64)
    if moe:
        values["replicas"] = copies
    else:
        values["dp"] = copies
    return values


def _expand(values: dict[str, np.ndarray], name: str, domain: np.ndarray
            ) -> dict[str, np.ndarray]:
    size = len(next(iter(values.values())))
    expanded = {k: np.repeat(v, len(domain)) for k, v in values.items()}
    expanded[name] = np.tile(domain, size)
    return expanded


def _expand_up_to(values: dict[str, np.ndarray], name: str, limits: np.ndarray
                  ) -> dict[str, np.ndarray]:
    """Each row repeated once per value 1..limit of `name` (its own limit per row)."""
    limits = np.maximum(np.asarray(limits, dtype=np.int64), 0)
    expanded = {k: np.repeat(v, limits) for k, v in values.items()}
    starts = np.repeat(np.cumsum(limits) - limits, limits)
    expanded[name] = np.arange(int(limits.sum()), dtype=np.int64) - starts + 1
    return expanded


def _keep(values: dict[str, np.ndarray], mask: np.ndarray) -> dict[str, np.ndarray]:
    return {k: v[mask] for k, v in values.items()}


def _dedupe(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    keys = np.stack([values[k] for k in values], axis=1)
    _, first = np.unique(keys, axis=0, return_index=True)
    order = np.sort(first)
    return {k: v[order] for k, v in values.items()}


def _apply_ready(values: dict[str, np.ndarray], pending: Sequence[Constraint]
                 ) -> tuple[dict[str, np.ndarray], list[Constraint]]:
    waiting = []
    for constraint in pending:
        if not set(constraint.variables) <= set(values):
            waiting.append(constraint)
            continue
        size = len(values["tp"])
        if size == 0:
            continue
        mask = np.broadcast_to(np.asarray(constraint.check(values), dtype=bool), (size,))
        values = _keep(values, mask)
    return values, waiting


@dataclass(frozen=True)
class RankedServe:
    """Feasible candidates sorted best first, with the model's estimate of each."""

    candidates: ServeCandidates
    estimate: ServeEstimate
    num_feasible: int
    load: ServeLoad


def load_is_active(problem: ServeProblem) -> bool:
    """A request rate or a concurrency was given: the load model ranks and constrains."""
    return problem.job.load.kind != "none"


def objective_keys(problem: ServeProblem, estimate: ServeEstimate,
                   load: ServeLoad | None = None) -> list[np.ndarray]:
    """Sort keys, most significant first, smaller is better: the objective, then the other
    measures, so ties order the same way everywhere. Under a load (`load`): the most requests/s
    within the SLO, and the mean request latency at the offered load."""
    throughput, latency = -estimate.tokens_per_s, estimate.latency_s
    if load is not None:
        point = load.point
        throughput = -load.max_rate_per_s
        latency = point.ttft_mean_s + load.curves.output_mean * point.tpot_mean_s
    gpus = estimate.num_gpus.astype(float)
    if problem.job.objective == "latency":
        return [latency, throughput, gpus]
    if problem.job.objective == "gpus":
        return [gpus, throughput, latency]
    if problem.job.objective in ("cost", "energy"):
        # $ and kWh per token of one cluster are its price and board power times GPU-hours
        # per token (solver.cost.serving.price at $1 per GPU-hour): the same order for both.
        return [estimate_dollars_per_million_tokens(gpus, -throughput), throughput, latency]
    return [throughput, latency, gpus]


def rank_serving(problem: ServeProblem, candidates: ServeCandidates, top: int | None = None
                 ) -> RankedServe:
    """Sort by the objective, ties by the other measures, then by the degrees (fewest
    replicas, no EP, smallest dp, pp, tp first), so the order is deterministic."""
    estimate = estimate_serving(problem, candidates)
    load = estimate_serving_load(problem, candidates) if load_is_active(problem) else None
    degrees = [getattr(candidates, n) for n in ("tp", "pp", "dp", "ep", "replicas")]
    order = np.lexsort(degrees + list(reversed(objective_keys(problem, estimate, load))))
    if top is not None:
        order = order[:top]
    chosen = candidates.take(order)
    return RankedServe(candidates=chosen, estimate=estimate_serving(problem, chosen),
                       num_feasible=len(candidates), load=estimate_serving_load(problem, chosen))


def solve_serving_by_enumeration(problem: ServeProblem, top: int = 5) -> RankedServe:
    """The oracle's answer: the `top` best feasible candidates."""
    return rank_serving(problem, enumerate_serving(problem), top)


__all__ = ["ENGINE_DEGREES", "SERVE_VARIABLES", "RankedServe", "enumerate_serving",
           "objective_keys", "rank_serving", "solve_serving_by_enumeration"]
