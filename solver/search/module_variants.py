"""The search over Megatron's recompute module sets (Problem.recompute_module_sets,
solver.cost.recompute_modules): the problem's own search covers the first set; each other set
is searched apart, with recompute pinned to selective and that set in the framework profile,
and the plans of all of them are ranked together by the objective. Every plan that recomputes
selectively names its modules (Plan.recompute_modules), which `launch --plan` emits as
--recompute-modules.

Exact: a selective plan's step time and memory depend on its module set only through the
profile (the same cost model), so the union of the searches' top K holds the top K over every
(configuration, module set) pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from solver.cost.candidates import RECOMPUTE_SELECTIVE
from solver.search.space import Problem, variable_domains
from solver.spec.plan import Plan


def module_variant(problem: Problem, modules: tuple[str, ...]) -> Problem | None:
    """`problem` with `modules` as what selective recomputes and recompute pinned to
    selective; None where the problem's pins leave selective out."""
    allowed = problem.pins.get("recompute", variable_domains(problem)["recompute"])
    if RECOMPUTE_SELECTIVE not in allowed:
        return None
    constants = problem.time_constants.model_copy(update={"recompute_modules": modules})
    options = problem.memory_options.model_copy(update={"recompute_modules": modules})
    return problem.model_copy(update={
        "pins": {**problem.pins, "recompute": (RECOMPUTE_SELECTIVE,)},
        "time_constants": constants, "memory_options": options, "recompute_module_sets": ()})


def name_modules(plans: tuple[Plan, ...], modules: tuple[str, ...]) -> tuple[Plan, ...]:
    """The plans, each selective one naming `modules` (what it recomputes)."""
    return tuple(plan.model_copy(update={"recompute_modules": modules})
                 if plan.config.recompute == "selective" else plan for plan in plans)


def _rank_key(objective: str) -> Callable[[Plan], tuple[float, float]]:
    def key(plan: Plan) -> tuple[float, float]:
        seconds = plan.time.step_seconds if plan.time is not None else float("inf")
        memory = plan.worst_stage.total_bytes
        return (seconds, memory) if objective == "time" else (memory, seconds)
    return key


def search_module_sets(problem: Problem, result: Any,
                       solve_variant: Callable[[Problem, float], Any], top: int) -> Any:
    """`result` (an OptimizeResult of `problem`'s own search) with the plans of every other
    module set merged in, best `top` first by the objective (module docstring). `solve_variant`
    solves one variant problem for the plans at least as fast as its second argument, in
    seconds (inf: all); plans slower than the top-th found so far cannot enter the top. The
    status is optimal only where every search proved its answer (one that found nothing under
    its cutoff too); where only a variant finds plans, its answer (its explanation) stands."""
    sets = problem.recompute_module_sets
    if not sets:
        return result
    plans = [(plan, result) for plan in name_modules(result.plans, sets[0])]
    seconds, proven, searched = result.solve_seconds, result.status != "feasible", False
    key = _rank_key(problem.objective)
    for modules in sets[1:]:
        variant = module_variant(problem, modules)
        if variant is None:
            continue
        # A plan slower than the top-th of those found so far cannot enter the top: the
        # variant's search need not look for it (by time; memory ranks are searched whole).
        found = sorted(key(plan) for plan, _ in plans)
        cutoff = found[top - 1][0] if problem.objective == "time" and len(found) >= top \
            else float("inf")
        answer = solve_variant(variant, cutoff)
        seconds += answer.solve_seconds
        searched = True
        # A search stopped by the time limit may have missed plans under its cutoff.
        proven = proven and answer.status != "feasible"
        if answer.plans:
            plans.extend((plan, answer) for plan in name_modules(answer.plans, modules))
    if not searched or not plans:
        return replace(result, plans=tuple(plan for plan, _ in plans), solve_seconds=seconds)
    ranked = sorted(plans, key=lambda pair: key(pair[0]))[:top]
    # The winner's own search explains it; the counts are the problem's own search's (every
    # recompute level), except the feasible ones, which no search counted over the union.
    winner = ranked[0][1]
    return replace(winner, problem=problem, plans=tuple(plan for plan, _ in ranked),
                   solve_seconds=seconds, status="optimal" if proven else "feasible",
                   num_feasible=None,
                   num_candidates=result.num_candidates or winner.num_candidates,
                   num_memory_checked=None)
