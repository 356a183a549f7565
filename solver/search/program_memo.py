"""The layout programs of a search: how each is solved (solve_program), and the memo of those
solved, so that twins are answered once.

Two configurations of one search pose the same layout program when their pp, vpp, recompute
level, layout rules and coefficients are equal (e.g. ZeRO stages at dp 1): the capacity and the
model are the problem's. A program asked again below another bar is answered from what its
earlier runs proved (SolvedPrograms.replay), else solved.
"""

from __future__ import annotations

from collections.abc import Callable

from solver.cost.step.layout_terms import LayoutCoefficients
from solver.search.layout_program import (
    LayoutAnswer,
    LayoutRules,
    objective_bound,
    solve_layout,
)
from solver.search.layout_relaxation import allowed_stage_sets, applies, no_layout_within
from solver.search.layout_two_stages import answers_two_stages, solve_two_stages
from solver.search.limits import DEFAULT_WORK_S, WORK_PER_SECOND
from solver.spec import ParallelConfig, PipelineLayout

# The work one layout program may do, in CP-SAT's deterministic seconds (about 1.3 s of wall
# time each on this project's 2-core machine: 2.0 took 2.35-2.77 s on Nemotron-H 8B's hardest
# programs); past it the answer is the best layout found, not proven (the search's status is
# then "feasible"). A count of work, not of seconds, so that the answer does not depend on how
# busy the machine is. The hardest
# program of the plain-transformer zoo (DeepSeek-V3 on 1,024 A100s, pp 2 x vpp 7, proving no
# layout beats the bar) needs about 1.5 s.
PROGRAM_WORK_LIMIT = 1.5

class WorkBudget:
    """The layout programs' work left to one solve (its own search and the module-set and
    offload searches beside it), in CP-SAT's deterministic seconds."""

    def __init__(self, seconds: float) -> None:
        self.left = seconds

    @classmethod
    def for_time_limit(cls, time_limit_s: float | None) -> WorkBudget:
        """The budget of a solve under the user's time limit (None: none, DEFAULT_WORK_S)."""
        if time_limit_s is None:
            return cls(DEFAULT_WORK_S)
        return cls(WORK_PER_SECOND * time_limit_s)

    def spend(self, seconds: float) -> None:
        self.left -= seconds

Run = tuple[float | None, LayoutAnswer | None, bool]  # (below_s, answer, complete)


def program_key(config: ParallelConfig, rules: LayoutRules, co: LayoutCoefficients) -> tuple:
    """What defines a layout program within one search, exactly."""
    return (config.pp, config.vpp, config.recompute, rules, co.kinds.tobytes(),
            co.layer_s.tobytes(), co.recompute_s.tobytes(), co.stage_s, co.last_s,
            co.num_micro, co.vpp, co.fixed_s, co.base_bytes.tobytes(), co.layer_bytes.tobytes(),
            co.recompute_bytes.tobytes(), co.working_bytes.tobytes())


def replay(runs: list[Run], co: LayoutCoefficients, below_s: float | None
           ) -> tuple[LayoutAnswer | None, bool | None]:
    """The answer of a program solved before (`runs`), asked again below `below_s`: the same
    run's answer for the same bar; from a proven optimum, itself where it is at least as fast
    as the new bar (the program's objective in its units) and a proven None where not; a proven
    None where one came for a bar at least as high (a lower bar admits fewer layouts); from a
    run stopped at its work limit under a bar at least as high, its layout where it meets the
    new bar and None where not, unproven both (the same program with the same work: solving
    it again spent the solve's budget to find the same layout, GLM-4.5 on 8 GB200s: 3.8 of
    its 10 s); else (None, None): solve it."""
    bound = None if below_s is None else objective_bound(co, below_s)
    for earlier_below, answer, complete in runs:
        if earlier_below == below_s:
            return answer, complete
        if answer is not None and complete:
            if below_s is None or (bound is not None and answer.objective <= bound):
                return answer, True
            return None, True
        if answer is None and complete and (earlier_below is None or (
                below_s is not None and below_s <= earlier_below)):
            return None, True
    for earlier_below, answer, complete in runs:
        if not complete and (earlier_below is None or (
                below_s is not None and below_s <= earlier_below)):
            if answer is not None and (below_s is None or (
                    bound is not None and answer.objective <= bound)):
                return answer, False
            return None, False
    return None, None


class SolvedPrograms:
    """The programs of one search and their runs."""

    def __init__(self) -> None:
        self._runs: dict[tuple, list[Run]] = {}

    def answer(self, config: ParallelConfig, rules: LayoutRules, co: LayoutCoefficients,
               below_s: float | None,
               solve: Callable[[], tuple[LayoutAnswer | None, bool]]
               ) -> tuple[LayoutAnswer | None, bool]:
        """The program's answer below `below_s`: replayed where its runs settle it, else
        `solve()` (recorded)."""
        runs = self._runs.setdefault(program_key(config, rules, co), [])
        answer, complete = replay(runs, co, below_s)
        if complete is None:
            answer, complete = solve()
            runs.append((below_s, answer, complete))
        return answer, complete


def solve_program(config: ParallelConfig, coefficients: LayoutCoefficients, capacity: float,
                  rules: LayoutRules, below_s: float | None, remaining_s: float,
                  hint: Callable[[], PipelineLayout], budget: WorkBudget | None = None,
                  on_bound: Callable[[float], None] | None = None
                  ) -> tuple[LayoutAnswer | None, bool]:
    """One layout program below `below_s` (None: no bar), and whether its answer is proven:
    two stages without recompute by dynamic programming (solver.search.layout_two_stages,
    exact, milliseconds); others by CP-SAT within `remaining_s` and PROGRAM_WORK_LIMIT (and
    what is left of `budget`, which the program's work is taken from),
    hinted with the even split (`hint()`), unless the relaxation of
    solver.search.layout_relaxation proves first that no layout fits or beats the bar; else,
    where no layer recomputes, what the relaxation lets each stage hold goes to CP-SAT as a
    table (interleaved block patterns: Nemotron-H 8B on 8 GB200s, pp 4 x vpp 4, proven in
    0.9 s where 120 s of CP-SAT alone proved nothing), and it proves optimal a layout CP-SAT
    finds that no mix of kinds can beat. `on_bound`: solve_layout's, where CP-SAT ran."""
    if answers_two_stages(config, coefficients, rules):
        return solve_two_stages(config, coefficients, capacity, rules, below_s), True
    none_below, tables = None, None
    if applies(config, coefficients):
        sets = allowed_stage_sets(config, coefficients, capacity, rules, below_s)
        if sets is None:
            return None, True
        # With recompute a table holds the layer counts only, not the recomputed ones: on
        # every 8th sweep problem CP-SAT then found worse layouts within its work limit as
        # often as better ones (Nemotron 3 Super on 8 H100s: 205.07 -> 207.86 s, unproven).
        if not rules.recompute:
            tables = [sets.vectors(stage) for stage in range(config.pp)]
        # The same relaxation below each layout CP-SAT finds: one it cannot beat is optimal.
        def none_below(objective: int) -> bool:
            return no_layout_within(config, coefficients, capacity, rules, objective - 1)
    work_limit = PROGRAM_WORK_LIMIT if budget is None else min(PROGRAM_WORK_LIMIT,
                                                               max(budget.left, 0.0))
    return solve_layout(config, coefficients, capacity, rules, below_s=below_s,
                        time_limit_s=remaining_s, work_limit=work_limit, hint=hint(),
                        none_below=none_below, stage_tables=tables,
                        on_work=budget.spend if budget is not None else None,
                        on_bound=on_bound)
