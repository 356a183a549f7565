"""`parplan serve`: the best serving plans of a problem, or why there are none, found by the
exhaustive oracle (solver.serve.enumerate).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from solver.serve.constraints import build_serve_constraints
from solver.serve.enumerate import enumerate_serving, rank_serving
from solver.serve.explain import explain_serving, find_serve_conflicts, suggest_serve_fixes
from solver.serve.job import ServeProblem
from solver.serve.disagg import DisaggResult, search_disaggregated
from solver.serve.pareto import ParetoPoint, build_pareto_front
from solver.serve.plan import ServePlan, build_plans
from solver.spec import GpuSpec


@dataclass(frozen=True)
class ServeResult:
    """status (optimal | infeasible), the plans best first, why the winner won, and when
    infeasible the clashing constraints (with their rules) and the fixes. engine: always
    "enumerate" (the answer's JSON head, shared with optimize, names it)."""

    problem: ServeProblem
    status: str
    engine: str
    solve_seconds: float
    num_feasible: int
    plans: tuple[ServePlan, ...]
    why: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    rules: dict[str, str] = field(default_factory=dict)
    fixes: tuple[str, ...] = ()
    pareto: tuple[ParetoPoint, ...] | None = None
    disaggregated: DisaggResult | None = None
    # `--price-per-gpu-hour` of this cluster: the answer then prices every plan and Pareto
    # point (solver.cost.serving.price); None: no cost shown.
    price_per_gpu_hour: float | None = None


def solve_serving(problem: ServeProblem, top: int = 5,
                  other_gpus: Sequence[GpuSpec] = (), pareto: bool = False,
                  disaggregated: bool = False) -> ServeResult:
    """Rank the feasible serving plans and explain the winner, or the infeasibility.
    `other_gpus` (the GPU catalog) lets a fix propose a GPU with more memory; `pareto` adds
    the tokens/s/user vs tokens/s/GPU front (solver.serve.pareto), `disaggregated` the
    search over prefill and decode pools (solver.serve.disagg), whose plans then join the front."""
    split = search_disaggregated(problem, top) if disaggregated else None
    front = build_pareto_front(problem, split) if pareto else None
    start = time.perf_counter()
    candidates = enumerate_serving(problem)
    ranked = rank_serving(problem, candidates, top) if len(candidates) else None
    seconds = time.perf_counter() - start
    if ranked is None or len(ranked.candidates) == 0:
        conflicts = tuple(find_serve_conflicts(problem))
        rules = {c.name: c.rule for c in build_serve_constraints(problem)
                 if c.name in conflicts}
        return ServeResult(problem=problem, status="infeasible", engine="enumerate",
                           solve_seconds=seconds, num_feasible=0, plans=(),
                           conflicts=conflicts, rules=rules,
                           fixes=tuple(suggest_serve_fixes(problem, conflicts, other_gpus)),
                           pareto=front, disaggregated=split)
    return ServeResult(problem=problem, status="optimal", engine="enumerate",
                       solve_seconds=seconds, num_feasible=ranked.num_feasible,
                       plans=build_plans(problem, ranked),
                       why=tuple(explain_serving(problem, ranked)), pareto=front,
                       disaggregated=split)
