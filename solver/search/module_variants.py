"""The search over Megatron's recompute module sets (Problem.recompute_module_sets,
solver.cost.step.recompute_modules): the problem's own search covers the first set; each other set
is searched apart, with recompute pinned to selective and that set in the framework profile,
and the plans of all of them are ranked together by the objective. Every plan that recomputes
selectively names its modules (Plan.recompute_modules), which `launch --plan` emits as
--recompute-modules.

Exact: a selective plan's step time and memory depend on its module set only through the
profile (the same cost model), so the union of the searches' top K holds the top K over every
(configuration, module set) pair.

Offloads to the host (Problem.offloads: optimizer, activations; solver.cost.step.offload) are
searched the same way: each combination apart under each module set, with the framework's
rules on it as pins (activation offload with no full recompute, DeepSpeed's optimizer offload
from ZeRO-1 on), for the plans faster than the top-th found so far. An offload never shortens
a configuration's step, so an offloading plan enters the top only where its configuration does
not fit without it (at equal time the plan without offloads ranks first, and the same
configuration offloading is dropped). A plan names the offloads it uses, which `launch --plan`
turns on (Plan.offloads). Exact over every (module set, offloads) pair.

The searches run as one (search_module_sets): each opened, and each of their layout programs
run, in order of bound under one bar, so that the work budget goes where the best plans may
be, whichever search holds them (Nemotron-H 56B on 8 H100s: an offload's even split, 22%
faster than the own search's best, lowers the bar its programs run under). Each search after
the first starts from the first pass of the search it varies
(solver.search.enumerate.candidates_below): an offload under a later module set from that
set's, every other from the problem's own. They are merged on their rankings (Searched): only
the merged top becomes plans (solver.optimize), each through its own search's problem.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from itertools import combinations

import numpy as np

from solver.cost.candidates import RECOMPUTE_SELECTIVE, Candidates
from solver.cost.step.offload import activation_offload_levels
from solver.cost.step.steptime import StepTime
from solver.search.twins import STEP_DECIMALS
from solver.search.enumerate import FirstPass, Ranked, least_bound
from solver.search.layout_search import LayoutSearch, ranked_keys, ranking_floor
from solver.search.limits import Deadline, never
from solver.search.program_memo import WorkBudget
from solver.search.space import Problem, variable_domains
from solver.spec import RECOMPUTE_LEVELS
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
        codes = pins.get("recompute", domains["recompute"])
        runs = activation_offload_levels(problem.model_spec,
                                         problem.memory_options.recompute_modules,
                                         tuple(RECOMPUTE_LEVELS[code] for code in codes))
        pins["recompute"] = tuple(RECOMPUTE_LEVELS.index(level) for level in runs)
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
    found none), `optimal` or `feasible` (stopped at the time limit or the work budget); how
    its plans are named (the module set and offloads they use), how many offloads they use,
    and its floor: a lower bound of the step time of the best plan of its space
    (solver.search.layout_search.search_layouts; 0 where unknown)."""

    problem: Problem
    ranked: Ranked | None
    status: str
    namer: Namer = _unnamed
    offloads: int = 0
    floor_s: float = 0.0

    def __len__(self) -> int:
        return 0 if self.ranked is None else len(self.ranked.candidates)


@dataclass(frozen=True)
class Merged:
    """The merged ranking: (search, position in its ranking) best first, whether every search
    proved its answer (`optimal`, else `feasible`), the seconds of them all, whether the
    problem has searches beyond its own (module sets, offloads), the least of the searches'
    floors (a lower bound of the best plan's step time over all of them), and the problem's
    own search's answer."""

    chosen: tuple[tuple[Searched, int], ...]
    status: str
    seconds: float
    searched: bool
    floor_s: float = 0.0
    own: Searched | None = None


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
    set's 3rd-fastest plan was dropped as a twin of the 'mla_up_proj' set's fastest), unless
    they take the same step time and memory (issue 39: one plan, one row): the first listed
    stands for both."""
    seen: set[tuple[str, tuple[str, ...]]] = set()
    costs: set[tuple[str, float, float]] = set()
    kept = []
    for searched, position in entries:
        ranked = searched.ranked
        assert ranked is not None
        config = ranked.candidates.config(position)
        modules = searched.problem.time_constants.recompute_modules \
            if config.recompute == "selective" else ()
        twin = (config.model_dump_json(), tuple(modules))
        # Issue 39: two module sets of equal step time and memory are one plan.
        cost = (config.model_dump_json(), round(float(ranked.step_time.step_s[position]),
                                                STEP_DECIMALS),
                round(float(ranked.memory_bytes[position])))
        if (twin in seen and searched.offloads) or (modules and cost in costs):
            continue
        seen.add(twin)
        costs.add(cost)
        kept.append((searched, position))
    return kept


@dataclass
class RankedSearch:
    """A search answered whole: the even engine's exhaustive ranking (folded), or any given
    answer; `floor_s` None: its best plan's step (ranking_floor)."""

    problem: Problem
    ranked: Ranked | None
    proven: bool = True
    first: FirstPass | None = None
    floor_s: float | None = None
    cutoff_s: float = np.inf

    def next_bound(self, outer_s: float) -> float | None:
        return None

    def run_next(self, outer_s: float, budget: WorkBudget, deadline: Deadline) -> None:
        return None

    def stop(self, outer_s: float, deadline: Deadline) -> None:
        return None

    def distinct(self) -> list[tuple]:
        return ranked_keys(self.ranked)

    def result(self) -> tuple[Ranked | None, bool, FirstPass | None, float]:
        floor = ranking_floor(self.ranked, np.inf) if self.floor_s is None else self.floor_s
        return self.ranked, self.proven, self.first, floor


# A search the merged one runs (search_module_sets): next_bound, run_next and stop run its
# layout programs; distinct, the order keys of the plans it found; result, its answer.
Search = LayoutSearch | RankedSearch
# Opens one search: its problem, the step time its plans must reach (inf: all), the first
# pass of the search it varies (None: enumerate afresh), the wall-clock limit.
OpenSearch = Callable[[Problem, float, FirstPass | None, Deadline], Search]


def search_module_sets(problem: Problem, open_search: OpenSearch, top: int,
                       budget: WorkBudget | None = None, deadline: Deadline | None = None
                       ) -> Merged:
    """The problem's own search and those of every other module set and offload, merged best
    `top` first by the objective (module docstring), as one search: every search is opened
    (its numpy phase) and every layout program run in order of bound, the least first, under
    one bar, the top-th distinct plan found over all of them (by time; memory ranks are
    searched whole), until no bound left reaches it: proven over the union. A search is opened
    when the least bound of its candidates in the first pass of the search it varies
    (candidates_below) comes up: a plan slower than the top-th found so far cannot enter the
    top, so it looks only for plans at least as fast. The layout programs' work comes from
    `budget`: where it is spent, the programs left are not run (unproven), and the searches
    not yet opened still are (their even splits); past `deadline` nothing more is run. The
    status is optimal only where nothing was left unproven."""
    start = time.perf_counter()
    budget = budget if budget is not None else WorkBudget(np.inf)
    deadline = deadline if deadline is not None else never()
    own = open_search(problem, np.inf, None, deadline)
    sets = problem.recompute_module_sets
    own_namer = (lambda plans: name_modules(plans, sets[0])) if sets else _unnamed
    variants = _module_variants(problem) + _offload_variants(problem) \
        if sets or problem.offloads else []
    # (search, how its plans are named, its offloads, its place: -1 the own, else the variant's)
    runs: list[tuple[Search, Namer, int, int]] = [(own, own_namer, 0, -1)]
    pending = list(range(len(variants)))
    firsts = {0: own.first}  # each module set's search's first pass, by the set's index
    leanest = sum(1 for v in variants if v[2] == 0) - 1  # the last module set's variant
    # Where nothing fits yet, the last set first: each set needs no more memory than the
    # sets before it, so where none of its plans fits (proven), none of theirs does.
    leanest = leanest if leanest > 0 else None
    opened: dict[int, tuple[FirstPass | None, float]] = {}  # variant -> (its prior, bound)

    def prior(index: int) -> FirstPass | None:
        return firsts.get(variants[index][3]) or own.first

    def least(index: int) -> float:
        first = prior(index)
        if first is None:  # the even engine, or no first pass: opened in turn
            return -np.inf
        if index not in opened or opened[index][0] is not first:
            opened[index] = (first, least_bound(first, variants[index][0]))
        return opened[index][1]

    proven, floor = True, np.inf
    while True:
        bar = _merged_bar(problem.objective, runs, top)
        pending = [i for i in pending if least(i) < np.inf]  # no candidate: nothing to find
        lean = [(search, place) for search, _, _, place in runs if place == leanest]
        if lean and lean[0][0].cutoff_s == np.inf and lean[0][0].proven \
                and lean[0][0].next_bound(bar) is None and not lean[0][0].distinct():
            pending = [i for i in pending if variants[i][2] or i == leanest]
        programs = [(bound, k) for k, (search, *_) in enumerate(runs)
                    if (bound := search.next_bound(bar)) is not None]
        openings = [(least(i), i) for i in pending if least(i) <= bar]
        if leanest in pending and not any(search.distinct() for search, *_ in runs) \
                and not programs:
            openings = [(-np.inf, leanest)]
        if not programs and not openings:
            break
        if deadline.passed():
            for search, *_ in runs:
                search.stop(bar, deadline)
            if openings:  # the searches not opened: bounded by their first passes
                proven, floor = False, min(floor, min(openings)[0])
            break
        if openings and (not programs or min(openings)[0] <= min(programs)[0]):
            index = min(openings)[1]
            pending.remove(index)
            variant, namer, count, _ = variants[index]
            search = open_search(variant, bar, prior(index), deadline)
            runs.append((search, namer, count, index))
            if count == 0:  # a module set's search
                firsts[sets.index(variant.time_constants.recompute_modules)] = search.first
            continue
        search = runs[min(programs)[1]][0]
        if budget.left <= 0:
            search.stop(bar, deadline)
        else:
            search.run_next(bar, budget, deadline)
    searched = []
    for search, namer, count, place in sorted(runs, key=lambda run: run[3]):
        ranked, done, _, floor_s = search.result()
        ranked = None if ranked is not None and len(ranked.candidates) == 0 else ranked
        proven, floor = proven and done, min(floor, floor_s)
        searched.append(Searched(problem=search.problem, ranked=ranked,
                                 status="optimal" if done else "feasible", namer=namer,
                                 offloads=count, floor_s=floor_s))
    entries = [(answer, p) for answer in searched for p in range(len(answer))]
    chosen = _without_offloaded_twins(sorted(entries, key=_rank_key(problem.objective)))[:top]
    return Merged(chosen=tuple(chosen), status="optimal" if proven else "feasible",
                  seconds=time.perf_counter() - start, searched=bool(variants),
                  floor_s=floor, own=searched[0])


def _merged_bar(objective: str, runs: list[tuple[Search, Namer, int, int]], top: int
                ) -> float:
    """The step time of the top-th distinct plan found over every search, offloading twins
    dropped (_without_offloaded_twins), widened by TIE_SLACK: ties may still enter (fewer
    offloads, less memory), and a bound may sit an ulp above the time it bounds; inf where
    fewer than `top` are found or the objective is memory. It never rises as plans come (a
    twin dropped later makes way for one ranked before it)."""
    if objective != "time":
        return np.inf
    entries = []
    for search, _, count, place in runs:
        modules = tuple(search.problem.time_constants.recompute_modules)
        for seconds, memory, *values in search.distinct()[:top]:
            twin = (tuple(values), modules if values[-1] == RECOMPUTE_SELECTIVE else ())
            entries.append(((seconds, count, memory, place), twin, count))
    seen, found = set(), 0
    for (seconds, *_), twin, count in sorted(entries, key=lambda entry: entry[0]):
        if twin in seen and count:
            continue
        seen.add(twin)
        found += 1
        if found == top:
            return seconds * (1 + TIE_SLACK)
    return np.inf


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
