"""The search over Megatron's recompute module sets (Problem.recompute_module_sets,
solver.cost.recompute_modules): the problem's own search covers the first set; each other set
is searched apart, with recompute pinned to selective and that set in the framework profile,
and the plans of all of them are ranked together by the objective. Every plan that recomputes
selectively names its modules (Plan.recompute_modules), which `launch --plan` emits as
--recompute-modules.

Exact: a selective plan's step time and memory depend on its module set only through the
profile (the same cost model), so the union of the searches' top K holds the top K over every
(configuration, module set) pair.

Offloads to the host (Problem.offloads: optimizer, activations; solver.cost.offload) are
searched the same way: each combination apart under the first module set, with the framework's
rules on it as pins (activation offload with no full recompute, DeepSpeed's optimizer offload
from ZeRO-1 on), for the plans faster than the top-th found so far. An offload never shortens
a configuration's step, so an offloading plan enters the top only where its configuration does
not fit without it (at equal time the plan without offloads ranks first, and the same
configuration offloading is dropped). A plan names the offloads it uses, which `launch --plan`
turns on (Plan.offloads). Exact over the offloads for the first module set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from itertools import combinations

from solver.cost.candidates import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE
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


def offload_variant(problem: Problem, offloads: tuple[str, ...]) -> Problem | None:
    """`problem` with `offloads` on (time and memory) and the framework's rules on them as
    pins; None where the pins leave nothing."""
    domains = variable_domains(problem)
    pins = dict(problem.pins)
    if "activation_offload" in offloads:
        pins["recompute"] = tuple(level for level in pins.get("recompute", domains["recompute"])
                                  if level != RECOMPUTE_FULL)
    if "optimizer_offload" in offloads and problem.framework == "deepspeed":
        pins["zero"] = tuple(stage for stage in pins.get("zero", domains["zero"]) if stage)
    if any(not values for values in pins.values()):
        return None
    update = {name: True for name in offloads}
    return problem.model_copy(update={
        "pins": pins, "time_constants": problem.time_constants.model_copy(update=update),
        "memory_options": problem.memory_options.model_copy(update=update),
        "recompute_module_sets": (), "offloads": ()})


def name_offloads(plans: tuple[Plan, ...], offloads: tuple[str, ...]) -> tuple[Plan, ...]:
    """The plans, each naming `offloads` (Plan.offloads: what launch turns on)."""
    return tuple(plan.model_copy(update={"offloads": offloads}) for plan in plans)


Namer = Callable[[tuple[Plan, ...]], tuple[Plan, ...]]


def _module_variants(problem: Problem) -> list[tuple[Problem, Namer]]:
    """The searches of the other module sets, with how their plans are named."""
    found = [(module_variant(problem, modules),
              lambda plans, modules=modules: name_modules(plans, modules))
             for modules in problem.recompute_module_sets[1:]]
    return [(variant, namer) for variant, namer in found if variant is not None]


def _offload_variants(problem: Problem) -> list[tuple[Problem, Namer]]:
    """The searches of each combination of offloads under the first module set."""
    sets = problem.recompute_module_sets
    first = sets[0] if sets else ()
    found = [(offload_variant(problem, offloads),
              lambda plans, offloads=offloads: name_offloads(
                  name_modules(plans, first) if first else plans, offloads))
             for count in range(1, len(problem.offloads) + 1)
             for offloads in combinations(problem.offloads, count)]
    return [(variant, namer) for variant, namer in found if variant is not None]


def name_modules(plans: tuple[Plan, ...], modules: tuple[str, ...]) -> tuple[Plan, ...]:
    """The plans, each selective one naming `modules` (what it recomputes)."""
    return tuple(plan.model_copy(update={"recompute_modules": modules})
                 if plan.config.recompute == "selective" else plan for plan in plans)


def _rank_key(objective: str) -> Callable[[Plan], tuple[float, float, float]]:
    """By time (then fewer offloads: an offload that costs nothing still moves data, then
    memory) or by memory."""
    def key(plan: Plan) -> tuple[float, float, float]:
        seconds = plan.time.step_seconds if plan.time is not None else float("inf")
        memory = plan.worst_stage.total_bytes
        offloads = len(plan.offloads)
        return (seconds, offloads, memory) if objective == "time" else (memory, seconds, 0)
    return key


def _without_offloaded_twins(plans: list[tuple[Plan, Any]]) -> list[tuple[Plan, Any]]:
    """The ranked plans less those that offload where a plan ranked before has the same
    configuration and layout (the offload buys nothing there)."""
    seen: set[str] = set()
    kept = []
    for plan, answer in plans:
        twin = plan.config.model_dump_json() + (plan.layout.model_dump_json()
                                                if plan.layout is not None else "")
        if twin in seen and plan.offloads:
            continue
        seen.add(twin)
        kept.append((plan, answer))
    return kept


def search_module_sets(problem: Problem, result: Any,
                       solve_variant: Callable[[Problem, float], Any], top: int) -> Any:
    """`result` (an OptimizeResult of `problem`'s own search) with the plans of every other
    module set merged in, best `top` first by the objective (module docstring). `solve_variant`
    solves one variant problem for the plans at least as fast as its second argument, in
    seconds (inf: all); plans slower than the top-th found so far cannot enter the top. The
    status is optimal only where every search proved its answer (one that found nothing under
    its cutoff too); where only a variant finds plans, its answer (its explanation) stands."""
    sets = problem.recompute_module_sets
    if not sets and not problem.offloads:
        return result
    plans = [(plan, result) for plan in (name_modules(result.plans, sets[0]) if sets
                                         else result.plans)]
    seconds, proven, searched = result.solve_seconds, result.status != "feasible", False
    key = _rank_key(problem.objective)
    modules = _module_variants(problem)
    # Where nothing fits yet, the last set first: each set needs no more memory than the
    # sets before it, so where none of its plans fits (proven), none of theirs does.
    leanest_first = not plans and len(modules) > 1
    if leanest_first:
        modules = modules[-1:] + modules[:-1]
    for position, (variant, namer) in enumerate(modules + _offload_variants(problem)):
        if leanest_first and 0 < position < len(modules) and not plans and proven:
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
            plans.extend((plan, answer) for plan in namer(answer.plans))
    if not searched or not plans:
        return replace(result, plans=tuple(plan for plan, _ in plans), solve_seconds=seconds)
    ranked = _without_offloaded_twins(sorted(plans, key=lambda pair: key(pair[0])))[:top]
    # The winner's own search explains it; the counts are the problem's own search's (every
    # recompute level), except the feasible ones, which no search counted over the union.
    winner = ranked[0][1]
    return replace(winner, problem=problem, plans=tuple(plan for plan, _ in ranked),
                   solve_seconds=seconds, status="optimal" if proven else "feasible",
                   num_feasible=None,
                   num_candidates=result.num_candidates or winner.num_candidates,
                   num_memory_checked=None)
