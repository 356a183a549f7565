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
searched the same way: each combination apart under each module set, with the framework's
rules on it as pins (activation offload with no full recompute, DeepSpeed's optimizer offload
from ZeRO-1 on), for the plans faster than the top-th found so far. An offload never shortens
a configuration's step, so an offloading plan enters the top only where its configuration does
not fit without it (at equal time the plan without offloads ranks first, and the same
configuration offloading is dropped). A plan names the offloads it uses, which `launch --plan`
turns on (Plan.offloads). Exact over every (module set, offloads) pair.

The searches are merged on their rankings (Searched): only the merged top becomes plans
(solver.optimize), each through its own search's problem. Each search after the first starts
from the first pass of the search it varies (solver.search.enumerate.candidates_below): an
offload under a later module set from that set's, every other from the problem's own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from itertools import combinations

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, RECOMPUTE_SELECTIVE, Candidates
from solver.cost.steptime import StepTime
from solver.search.enumerate import FirstPass, Ranked
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


Namer = Callable[[tuple[Plan, ...]], tuple[Plan, ...]]

# The relative widening of a variant search's cutoff (search_module_sets): bounds and times
# are composed differently and may differ in the last bits where the bound is exact.
TIE_SLACK = 1e-9


def _unnamed(plans: tuple[Plan, ...]) -> tuple[Plan, ...]:
    return plans


@dataclass(frozen=True)
class Searched:
    """One search's answer: its problem, its distinct plans ranked best first (None where it
    found none), `optimal` or `feasible` (stopped at the time limit), its seconds; how its
    plans are named (the module set and offloads they use), how many offloads they use, its
    first pass (every candidate's bound, which bounds the variants' too:
    solver.search.enumerate.candidates_below), and its floor: a lower bound of the step time
    of the best plan of its space (solver.search.layout_search.search_layouts; 0 where
    unknown)."""

    problem: Problem
    ranked: Ranked | None
    status: str
    seconds: float
    namer: Namer = _unnamed
    offloads: int = 0
    first: FirstPass | None = None
    floor_s: float = 0.0

    def __len__(self) -> int:
        return 0 if self.ranked is None else len(self.ranked.candidates)


@dataclass(frozen=True)
class Merged:
    """The merged ranking: (search, position in its ranking) best first, whether every search
    proved its answer (`optimal`, else `feasible`), the searches' seconds, whether any
    search beyond the problem's own ran, and the least of the searches' floors (a lower bound
    of the best plan's step time over all of them)."""

    chosen: tuple[tuple[Searched, int], ...]
    status: str
    seconds: float
    searched: bool
    floor_s: float = 0.0


def name_offloads(plans: tuple[Plan, ...], offloads: tuple[str, ...]) -> tuple[Plan, ...]:
    """The plans, each naming `offloads` (Plan.offloads: what launch turns on)."""
    return tuple(plan.model_copy(update={"offloads": offloads}) for plan in plans)


# A further search: its problem, how its plans are named, how many offloads they use, and the
# index of the module set whose search's first pass bounds it (0: the problem's own).
Variant = tuple[Problem, Namer, int, int]


def _module_variants(problem: Problem) -> list[Variant]:
    """The searches of the other module sets, with how their plans are named."""
    found = [(module_variant(problem, modules),
              lambda plans, modules=modules: name_modules(plans, modules), 0, 0)
             for modules in problem.recompute_module_sets[1:]]
    return [entry for entry in found if entry[0] is not None]


def _offload_variants(problem: Problem) -> list[Variant]:
    """The searches of each combination of offloads under each module set."""
    sets = problem.recompute_module_sets or ((),)
    found = []
    for index, modules in enumerate(sets):
        base = problem if index == 0 else module_variant(problem, modules)
        if base is None:
            continue
        found += [(offload_variant(base, offloads),
                   lambda plans, modules=modules, offloads=offloads: name_offloads(
                       name_modules(plans, modules) if modules else plans, offloads),
                   len(offloads), index)
                  for count in range(1, len(problem.offloads) + 1)
                  for offloads in combinations(problem.offloads, count)]
    return [entry for entry in found if entry[0] is not None]


def name_modules(plans: tuple[Plan, ...], modules: tuple[str, ...]) -> tuple[Plan, ...]:
    """The plans, each selective one naming `modules` (what it recomputes)."""
    return tuple(plan.model_copy(update={"recompute_modules": modules})
                 if plan.config.recompute == "selective" else plan for plan in plans)


def _rank_key(objective: str) -> Callable[[tuple[Searched, int]], tuple[float, float, float]]:
    """By time (then fewer offloads: an offload that costs nothing still moves data, then
    worst-stage memory) or by memory."""
    def key(entry: tuple[Searched, int]) -> tuple[float, float, float]:
        searched, position = entry
        assert searched.ranked is not None
        seconds = float(searched.ranked.step_time.step_s[position])
        memory = float(searched.ranked.memory_bytes[position])
        return (seconds, searched.offloads, memory) if objective == "time" else (
            memory, seconds, 0)
    return key


def _without_offloaded_twins(entries: list[tuple[Searched, int]]
                             ) -> list[tuple[Searched, int]]:
    """The ranked entries less those that offload where an entry ranked before has the same
    configuration and, if it recomputes selectively, the same module set: the offload buys
    nothing there, whatever the layouts (the one before is at least as fast). Plans of two
    module sets are two plans, even with one layout (DeepSeek-V3 on 1,024 GB200s: the 'mlp'
    set's 3rd-fastest plan was dropped as a twin of the 'mla_up_proj' set's fastest)."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    kept = []
    for searched, position in entries:
        ranked = searched.ranked
        assert ranked is not None
        config = ranked.candidates.config(position)
        modules = searched.problem.time_constants.recompute_modules \
            if config.recompute == "selective" else ()
        twin = (config.model_dump_json(), tuple(modules))
        if twin in seen and searched.offloads:
            continue
        seen.add(twin)
        kept.append((searched, position))
    return kept


def search_module_sets(problem: Problem, own: Searched,
                       search_variant: Callable[[Problem, float, FirstPass | None], Searched],
                       top: int) -> Merged:
    """`own` (the problem's own search) merged with the searches of every other module set
    and offload, best `top` first by the objective (module docstring). `search_variant`
    searches one variant problem for the plans at least as fast as its second argument, in
    seconds (inf: all), from the first pass of the search it varies (its third);
    plans slower than the top-th found so far cannot enter the top. The
    status is optimal only where every search proved its answer (one that found nothing under
    its cutoff too)."""
    sets = problem.recompute_module_sets
    if sets:
        own = replace(own, namer=lambda plans: name_modules(plans, sets[0]))
    entries = [(own, position) for position in range(len(own))]
    seconds, proven, searched = own.seconds, own.status != "feasible", False
    floor = own.floor_s
    key = _rank_key(problem.objective)
    modules = _module_variants(problem) if sets or problem.offloads else []
    offloads = _offload_variants(problem) if sets or problem.offloads else []
    # Where nothing fits yet, the last set first: each set needs no more memory than the
    # sets before it, so where none of its plans fits (proven), none of theirs does.
    leanest_first = not entries and len(modules) > 1
    if leanest_first:
        modules = modules[-1:] + modules[:-1]
    firsts = {0: own.first}  # each module set's search's first pass, by the set's index
    for position, (variant, namer, count, base) in enumerate(modules + offloads):
        if leanest_first and 0 < position < len(modules) and not entries and proven:
            continue
        # A plan slower than the top-th of those found so far cannot enter the top: the
        # variant's search need not look for it (by time; memory ranks are searched whole).
        # The top-th of the distinct entries, offloading twins dropped: it never rises as
        # entries come (a twin dropped later makes way for one ranked before it). Ties may
        # still enter (fewer offloads, less memory), and a bound may sit an ulp above the
        # time it bounds: the cutoff is widened by TIE_SLACK.
        found = _without_offloaded_twins(sorted(entries, key=key))
        cutoff = key(found[top - 1])[0] * (1 + TIE_SLACK) \
            if problem.objective == "time" and len(found) >= top else float("inf")
        answer = replace(search_variant(variant, cutoff, firsts.get(base, own.first)),
                         namer=namer, offloads=count)
        if count == 0:  # a module set's search
            index = problem.recompute_module_sets.index(variant.time_constants.recompute_modules)
            firsts[index] = answer.first
        seconds += answer.seconds
        searched = True
        # A search stopped by the time limit may have missed plans under its cutoff.
        proven = proven and answer.status != "feasible"
        floor = min(floor, answer.floor_s)
        entries.extend((answer, p) for p in range(len(answer)))
    chosen = _without_offloaded_twins(sorted(entries, key=key))[:top] if searched \
        else entries[:top]
    return Merged(chosen=tuple(chosen), status="optimal" if proven else "feasible",
                  seconds=seconds, searched=searched, floor_s=floor)


def take_ranked(ranked: Ranked, positions: list[int]) -> Ranked:
    """The plans of a (folded) ranking at `positions`, in that order."""
    rows = np.array(positions, dtype=np.int64)
    return replace(ranked, candidates=ranked.candidates.take(rows),
                   step_time=ranked.step_time.take(rows), memory_bytes=ranked.memory_bytes[rows],
                   layouts=None if ranked.layouts is None else tuple(ranked.layouts[p]
                                                                     for p in positions),
                   rows=None if ranked.rows is None else ranked.rows[rows],
                   twins=None if ranked.twins is None else tuple(ranked.twins[p]
                                                                 for p in positions))


def merged_ranking(chosen: tuple[tuple[Searched, int], ...]) -> Ranked:
    """The merged top as one ranking, best first: the plans as listed, for the explanation
    (its runner-up and '#k listed' read this order); the counts are the first search's."""
    parts = [take_ranked(searched.ranked, [position]) for searched, position in chosen
             if searched.ranked is not None]

    def joined(kind, of):  # one dataclass of arrays from the parts' `of`
        return kind(**{f.name: np.concatenate([getattr(of(r), f.name) for r in parts])
                       for f in fields(kind)})

    layouts = None if any(r.layouts is None for r in parts) else tuple(
        r.layouts[0] for r in parts)
    twins = None if any(r.twins is None for r in parts) else tuple(r.twins[0] for r in parts)
    return replace(parts[0], candidates=joined(Candidates, lambda r: r.candidates),
                   step_time=joined(StepTime, lambda r: r.step_time),
                   memory_bytes=np.concatenate([r.memory_bytes for r in parts]),
                   layouts=layouts, rows=None, twins=twins)
