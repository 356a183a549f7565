"""The search over meshes and layouts: exhaustive over the mesh and schedule (numpy), the layout
program (CP-SAT) where a layout can still beat the incumbents.

0. Every candidate meeting the rules gets a lower bound of its step time over all its layouts
   from its layers' terms alone (the per-mesh DP, send and optimizer terms at 0), costed once
   per distinct (tp, cp, ep, etp, micro-batch); the `top` fastest even splits that fit among
   the least bounds set a first bar, and only candidates whose bound reaches it go on
   (solver.search.enumerate.may_enter_top).
1. Those candidates are costed with their even split (solver.search.enumerate); the `top`
   fastest that fit are the incumbents, the slowest of them the bar.
2. Every candidate gets a lower bound of its step time over all its layouts: the balanced
   bound (estimate_layout_lower_bound_s) and the memory-aware one (solver.search.layout_bounds:
   the least time of the slowest stage when each stage's memory limits the layers it can
   hold), and a test of whether any layout can fit at all.
3. The candidates whose bound can still reach the bar and that may fit go to the layout
   program, lowest bound first, each asked for a layout at least as fast as the bar (and as
   its own even split); an answer that comes before the last incumbent in the order (step
   time, then worst-stage memory, then the degrees) replaces it and lowers the bar. The search
   stops when the next bound passes the bar: no candidate left can enter the top, so the top
   is proven over layouts too, unless a program met its time limit (status "feasible").

The top counts distinct plans (solver.search.twins): `best` keeps every pair found, twins
included, and the bar is the step time of the top-th distinct one.

Rank by memory (objective "memory") keeps the even split: the layout program minimises time.
"""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, RECOMPUTE_NONE, Candidates
from solver.cost.step.layout_terms import (
    estimate_layout_coefficients,
    estimate_layer_time_coefficients,
    estimate_layout_lower_bound_s,
    take_times,
    time_coefficients,
)
from solver.cost.memory.layout import build_default_layout
from solver.cost.step.steptime import estimate_layout_step_time, estimate_time_terms
from solver.search.constraints import memory_capacity_bytes
from solver.search.enumerate import (
    FirstPass,
    Ranked,
    candidates_below,
    enumerate_feasible,
    fastest_that_fit,
    first_pass_size,
    may_enter_top,
    fold_twins,
    rules_but_memory,
    solve_by_enumeration,
)
from solver.search.limits import Deadline, never
from solver.search.feasible import any_even_split_fits, leanest_schedules
from solver.search.layout_bounds import UNIFORM_RECOMPUTE_FRAMEWORKS, estimate_memory_bounds
from solver.search.layout_program import LayoutRules
from solver.search.program_memo import SolvedPrograms, WorkBudget, solve_program
from solver.search.space import VARIABLES, Problem
from solver.search.twins import group_twins
from solver.spec import ParallelConfig, PipelineLayout



def layout_rules(problem: Problem, config: ParallelConfig) -> LayoutRules:
    """What the layout of `config` may choose under the problem's framework."""
    mtp = problem.model_spec.mtp_depths if problem.memory_options.include_mtp \
        else 0
    return LayoutRules(recompute=config.recompute == "full",
                       uniform_recompute=problem.framework in UNIFORM_RECOMPUTE_FRAMEWORKS,
                       mtp_layers=mtp)


def solve_with_layouts(problem: Problem, top: int = 5, time_limit_s: float | None = None,
                       cutoff_s: float = np.inf) -> tuple[Ranked | None, bool]:
    """The `top` best (configuration, layout) pairs, and whether they are proven (no layout
    program stopped at the work budget or the time limit; None: the safety net only). Module
    docstring. With `cutoff_s`, the step time of plans known from elsewhere
    (solver.search.module_variants), only pairs at least as fast are sought: the others may
    be left out, or kept."""
    return search_layouts(problem, top, time_limit_s, cutoff_s)[:2]


def search_layouts(problem: Problem, top: int = 5, time_limit_s: float | None = None,
                   cutoff_s: float = np.inf, prior: FirstPass | None = None,
                   budget: WorkBudget | None = None
                   ) -> tuple[Ranked | None, bool, FirstPass | None, float]:
    """solve_with_layouts, its first pass (every candidate's bound), and its floor: a lower
    bound of the step time of the best pair there is (within the cutoff; inf where there is
    none), the best pair's own where proven, else the least bound of the candidates whose
    programs were cut short or not run (an unproven answer's best pair is at most
    best / floor - 1 slower than the optimum). With `prior`, the
    first pass of the problem this one varies (solver.search.enumerate.candidates_below): its
    candidates that may reach the cutoff, not enumerated afresh. The layout programs' work
    comes from `budget` (default: the time limit's, WorkBudget.for_time_limit); where it runs
    out the answer is unproven, and the same on any machine; the time limit (None: the safety
    net, solver.search.limits) is a wall clock that may cut it shorter."""
    deadline = Deadline.for_time_limit(time_limit_s)
    budget = budget if budget is not None else WorkBudget.for_time_limit(time_limit_s)
    search = LayoutSearch(problem, top, cutoff_s, prior, deadline)
    while search.next_bound(np.inf) is not None:
        if deadline.passed() or budget.left <= 0:
            search.stop(np.inf, deadline)
        else:
            search.run_next(np.inf, budget, deadline)
    return search.result()


class LayoutSearch:
    """One problem's search (module docstring) in its two phases: made, the numpy phase (steps
    0-2: the candidates, their first pass, even splits and bounds, and the rows left for
    layout programs in order of bound); then its layout programs one at a time, the row of
    least bound first (next_bound, run_next), under the search's own bar and an outer one
    (plans known from the searches beside it: solver.search.module_variants), until the next
    bound passes the bar or the caller stops it (stop: the time limit or the work budget).
    `deadline`: the wall-clock limit (solver.search.limits) past which the numpy phase
    answers with the even splits found, unproven."""

    def __init__(self, problem: Problem, top: int, cutoff_s: float = np.inf,
                 prior: FirstPass | None = None, deadline: Deadline | None = None) -> None:
        deadline = deadline if deadline is not None else never()
        self.problem, self.top, self.cutoff_s = problem, top, cutoff_s
        self.first: FirstPass | None = None
        self.proven, self.open_low = True, np.inf  # open_low: least bound of rows unproven
        self.best: dict[int, tuple[tuple, PipelineLayout | None]] = {}
        # The rows for layout programs, in order of bound (next: the first not yet run), and
        # those waiting for their memory-aware bounds, in order of balanced bound.
        self.queue, self.next = np.zeros(0, dtype=np.int64), 0
        self.waiting = self.queue
        self.fixed: Ranked | None = None  # the answer of a search by memory
        if problem.objective != "time":
            self.fixed = solve_by_enumeration(problem, top)
            return
        candidates = enumerate_feasible(problem, rules_but_memory(problem)) if prior is None \
            else candidates_below(prior, problem, cutoff_s)
        self.num_candidates = len(candidates)
        if len(candidates) == 0:
            return
        kept, low = may_enter_top(problem, candidates, top, cutoff_s)
        self.first = FirstPass(candidates=candidates, low=low)
        # The first pass keeps every row of many where none of the rows of least bound fits:
        # a problem so tight that perhaps nothing fits. Ask that first (cheaper than costing
        # every row). Fewer rows than a head are all kept whatever their memory: costed
        # directly.
        if (len(kept) == len(candidates) > first_pass_size(top)
                and not any_layout_fits(problem, candidates)):
            return
        if len(kept) == 0:  # nothing can beat the cutoff
            return
        self.candidates = candidates = candidates.take(kept)
        model_spec = problem.model_spec
        self.terms = terms = estimate_time_terms(model_spec, problem.cluster, problem.job,
                                                 candidates, problem.time_constants)
        # An even split slower than the cutoff cannot enter the top: not costed for memory.
        even = fastest_that_fit(problem, candidates, top, terms, cutoff_s)
        if even is not None:
            for row, seconds, memory in zip(even.rows, even.step_time.step_s,
                                            even.memory_bytes):
                self.best[int(row)] = (self._key(int(row), float(seconds), float(memory)), None)
        if self.best and deadline.passed():
            # The time limit passed before the layouts (large problems' numpy phases take
            # seconds): the even splits found, unproven, rather than seconds more of bounds.
            self.proven, self.open_low = False, float(low[kept].min())
            return
        full = candidates.recompute == RECOMPUTE_FULL
        self.times = time_coefficients(terms)
        bound = estimate_layout_lower_bound_s(model_spec, self.times, candidates.pp,
                                              full.astype(float), above_s=self.bar())
        # This bound holds for every layout whatever its memory, so it bounds the variants'
        # step too (module_variants): their first pass keeps it where it is the tighter.
        self.first = FirstPass(candidates=self.first.candidates, low=low.copy())
        self.first.low[kept] = np.maximum(low[kept], bound)
        self.capacity = memory_capacity_bytes(problem)
        self.bound = bound
        # The rows that may still reach the bar, by balanced bound, until their memory-aware
        # bounds are worked out (bound_memory: in order, a growing chunk at a time, when the
        # least of them comes up, under the bar of then).
        hopeful = np.flatnonzero(bound <= self.bar())
        self.waiting = hopeful[np.argsort(bound[hopeful], kind="stable")]
        self.chunk = MEMORY_CHUNK
        self.beaten: set[tuple[int, ...]] = set()  # meshes whose selective program found none
        self.programs = SolvedPrograms()

    def bound_memory(self, outer_s: float, deadline: Deadline) -> None:
        """The memory-aware bounds (step 2) of the next chunk of the rows waiting (those of
        least balanced bound, a chunk twice the last), of those that may still reach the bar;
        the rows that may fit join the queue, in order of bound: the lowest first; of equal
        bounds, selective before none (see next_bound)."""
        candidates, problem, times = self.candidates, self.problem, self.times
        full = candidates.recompute == RECOMPUTE_FULL
        hopeful, self.waiting = self.waiting[:self.chunk], self.waiting[self.chunk:]
        self.chunk *= 2
        hopeful = np.sort(hopeful[self.bound[hopeful] <= self.bar(outer_s)])
        fits, recomputed, memory_bound = estimate_memory_bounds(
            problem, candidates.take(hopeful), take_times(times, hopeful), self.bar(outer_s),
            deadline=deadline)
        hopeful, recomputed, memory_bound = hopeful[fits], recomputed[fits], memory_bound[fits]
        # One recompute count for every chunk (--recompute-num-layers >= 1) recomputes a
        # layer in every chunk that holds one: all but the first and last at least.
        if problem.framework in UNIFORM_RECOMPUTE_FRAMEWORKS:
            chunks = candidates.pp[hopeful] * candidates.vpp[hopeful]
            recomputed = np.maximum(recomputed, np.where(full[hopeful], chunks - 2, 0))
        bound = self.bound
        bound[hopeful] = np.maximum(memory_bound, estimate_layout_lower_bound_s(
            problem.model_spec, take_times(times, hopeful), candidates.pp[hopeful],
            np.maximum(full[hopeful], recomputed)))
        queue = np.concatenate([self.queue[self.next:], hopeful[np.isfinite(bound[hopeful])]])
        self.queue = queue[np.lexsort((queue, -candidates.recompute[queue], bound[queue]))]
        self.next = 0

    def _key(self, row: int, seconds: float, memory_bytes: float) -> tuple:
        """A row's order key: step time, worst-stage memory, degrees."""
        return (seconds, memory_bytes,
                *(int(getattr(self.candidates, n)[row]) for n in VARIABLES))

    def bar(self, outer_s: float = np.inf) -> float:
        """The step time a pair must reach to enter the top: the top-th distinct pair's, the
        cutoff's, or `outer_s` (plans known beside this search), the least."""
        limit = min(self.cutoff_s, outer_s)
        groups = _distinct(self.best)
        if len(groups) < self.top:
            return limit
        return min(self.best[groups[self.top - 1][0]][0][0], limit)

    def _mesh(self, row: int) -> tuple[int, ...]:
        return tuple(int(getattr(self.candidates, n)[row]) for n in VARIABLES
                     if n != "recompute")

    def next_bound(self, outer_s: float) -> float | None:
        """The bound of the next row a layout program may answer below the bar, or of the
        rows waiting for their memory-aware bounds where theirs is less (their balanced
        bound: a bound of those); None: no row left that may enter the top."""
        queued = self._next_queued()
        least = min(queued, self._next_waiting())
        return least if least <= self.bar(outer_s) and least < np.inf else None

    def _next_waiting(self) -> float:
        return float(self.bound[self.waiting[0]]) if len(self.waiting) else np.inf

    def _next_queued(self) -> float:
        while self.next < len(self.queue):
            row = int(self.queue[self.next])
            # The step time reads only whether a configuration recomputes in full (selective
            # recompute adds no time: FlashAttention keeps no scores to recompute), so a mesh
            # without recompute has its selective twin's times and no less memory: if no
            # layout of the twin reached the bar, none of its own can (the bar only falls).
            # Where the twin's program stopped at its work limit without a layout, the twin's
            # is skipped too: the search is unproven already, and the twin's program is the
            # same one with less room.
            if self.candidates.recompute[row] == RECOMPUTE_NONE \
                    and self._mesh(row) in self.beaten:
                self.next += 1
                continue
            return float(self.bound[row])
        return np.inf

    def stop(self, outer_s: float, deadline: Deadline) -> None:
        """No more programs (the time limit or the work budget): the rows left come in order
        of bound, the next one's the least; unproven where it may enter the top. Before the
        deadline, the memory-aware bounds of the rows waiting that come first are worked out
        (the tighter floor)."""
        while self.next_bound(outer_s) is not None and not deadline.passed() \
                and self._next_waiting() <= self._next_queued():
            self.bound_memory(outer_s, deadline)
        bound = self.next_bound(outer_s)
        if bound is not None:
            self.proven, self.open_low = False, min(self.open_low, bound)
        self.next, self.waiting = len(self.queue), self.waiting[:0]

    def run_next(self, outer_s: float, budget: WorkBudget, deadline: Deadline) -> None:
        """The layout program of the next row (next_bound), asked for a layout at least as
        fast as the bar and as the row's own even split; an answer that comes before the
        last incumbent in the order replaces it and lowers the bar. Where rows waiting for
        their memory-aware bounds come first, those are worked out instead (bound_memory)."""
        if self.next_bound(outer_s) is None:
            return
        if self._next_waiting() <= self._next_queued():
            self.bound_memory(outer_s, deadline)
            return
        row = int(self.queue[self.next])
        self.next += 1
        problem, best = self.problem, self.best
        config = self.candidates.config(row)
        below = min(self.bar(outer_s), best[row][0][0] if row in best else np.inf)
        coefficients = estimate_layout_coefficients(
            problem.model_spec, problem.cluster, problem.job, config, problem.memory_options,
            problem.time_constants, self.terms.take(np.array([row])))
        rules = layout_rules(problem, config)
        below_s = None if np.isinf(below) else below
        remaining = deadline.remaining_s()
        # Twins (e.g. ZeRO stages at dp 1) pose the same program: answer it once.
        lows = [float(self.bound[row])]  # and CP-SAT's, where it ran and proved nothing
        answer, complete = self.programs.answer(
            config, rules, coefficients, below_s, lambda: solve_program(
                config, coefficients, self.capacity, rules, below_s, remaining,
                lambda: build_default_layout(problem.model_spec, config,
                                             problem.memory_options),
                budget, lows.append))
        self.proven = self.proven and complete
        if not complete:
            deadline.passed()  # where CP-SAT stopped at the wall clock, it fired
            # A none twin this mesh skips has no fewer seconds and no less memory: the bound
            # of this row bounds it too.
            self.open_low = min(self.open_low, max(lows))
        if answer is None:
            if config.recompute == "selective" and row not in best:
                self.beaten.add(self._mesh(row))
            return
        order = self._key(row, answer.step_s, float(answer.memory_bytes.max()))
        if row in best and best[row][0] <= order:
            return
        best[row] = (order, answer.layout)
        for group in _distinct(best)[self.top:]:
            for dropped in group:
                del best[dropped]

    def distinct(self) -> list[tuple]:
        """The order keys (step, memory, *VARIABLES) of the distinct pairs found, best
        first."""
        if self.fixed is not None:
            return ranked_keys(self.fixed)
        return [self.best[group[0]][0] for group in _distinct(self.best)]

    def result(self) -> tuple[Ranked | None, bool, FirstPass | None, float]:
        """search_layouts' answer: the ranking, whether proven, the first pass, the floor."""
        if self.problem.objective != "time":
            return self.fixed, True, None, ranking_floor(self.fixed, np.inf)
        if not self.best:
            return None, self.proven, self.first, self.open_low
        ranked = _ranked(self.problem, self.candidates, self.best, self.top,
                         self.num_candidates)
        return ranked, self.proven, self.first, ranking_floor(ranked, self.open_low)


def ranked_keys(ranked: Ranked | None) -> list[tuple]:
    """The order keys (step, memory, *VARIABLES) of a folded ranking's plans."""
    if ranked is None:
        return []
    columns = [getattr(ranked.candidates, n).tolist() for n in VARIABLES]
    return [(float(s), float(m), *values) for s, m, *values in zip(
        ranked.step_time.step_s.tolist(), ranked.memory_bytes.tolist(), *columns)]


# The rows of least balanced bound whose memory-aware bounds a search works out first (then
# twice as many each time: LayoutSearch.bound_memory). Nemotron 3 Ultra on 256 H100s has
# 211,094 rows below its first bar; their stage memory alone took 5 s.
MEMORY_CHUNK = 4096


def ranking_floor(ranked: Ranked | None, open_low: float) -> float:
    """The floor of a search (search_layouts) from its ranking and the least bound of the
    rows it left unproven (inf: none); an exhaustive search's is its best plan's step."""
    best = np.inf if ranked is None or len(ranked.candidates) == 0 \
        else float(ranked.step_time.step_s[0])
    return min(best, open_low)


def any_layout_fits(problem: Problem, candidates: Candidates) -> bool:
    """Whether some candidate may fit under some layout: an even split that fits ends it
    (any_even_split_fits); else the layout relaxation of estimate_memory_bounds (its `fits`:
    never False for a candidate with a layout that fits) on the leanest schedules, whose memory no
    other schedule of their mesh undercuts (leanest_schedules; the relaxation's stage
    coefficients, like the even split's memory, never rise with the recompute level and never
    fall with the micro-batch)."""
    if any_even_split_fits(problem, candidates):
        return True
    lean = candidates.take(leanest_schedules(candidates))
    times = estimate_layer_time_coefficients(problem.model_spec, problem.cluster, problem.job,
                                             lean, problem.time_constants)
    return bool(estimate_memory_bounds(problem, lean, times)[0].any())


def _distinct(best: dict[int, tuple[tuple, PipelineLayout | None]]) -> list[list[int]]:
    """The rows of `best` grouped into distinct plans, best first (solver.search.twins): each
    group the row kept and its twins. An order key is (step, memory, *VARIABLES)."""
    rows = sorted(best, key=lambda r: best[r][0])
    orders = [best[r][0] for r in rows]
    groups = group_twins([o[0] for o in orders], [o[2:-1] for o in orders],
                         [o[-1] for o in orders])
    return [[rows[p] for p in group] for group in groups]


def _ranked(problem: Problem, candidates: Candidates,
            best: dict[int, tuple[tuple, PipelineLayout | None]], top: int,
            num_candidates: int) -> Ranked:
    """The chosen (row, layout) pairs as a Ranked, best first by their order keys (step time,
    worst-stage memory, degrees), the top distinct plans with their twins folded; the step
    time's breakdown through the layout composition."""
    rows = np.array([r for group in _distinct(best)[:top] for r in group], dtype=np.int64)
    chosen = candidates.take(rows)
    configs = chosen.to_configs()
    layouts = tuple(best[int(r)][1] or build_default_layout(problem.model_spec, c,
                                                            problem.memory_options)
                    for r, c in zip(rows, configs))
    step = estimate_layout_step_time(problem.model_spec, problem.cluster, problem.job, configs,
                                     layouts, problem.time_constants)
    return fold_twins(Ranked(candidates=chosen, step_time=step,
                             memory_bytes=np.array([best[int(r)][0][1] for r in rows]),
                             num_feasible=None, num_candidates=num_candidates,
                             layouts=layouts, rows=rows), top)
