"""The layout programs a search has solved, so that twins are answered once.

Two configurations of one search pose the same layout program when their pp, vpp, recompute
level, layout rules and coefficients are equal (e.g. ZeRO stages at dp 1): the capacity and the
model are the problem's. A program asked again below another bar is answered from what its
earlier runs proved (SolvedPrograms.replay), else solved.
"""

from __future__ import annotations

from collections.abc import Callable

from solver.cost.layout_terms import LayoutCoefficients
from solver.search.layout_program import LayoutAnswer, LayoutRules, objective_bound
from solver.spec import ParallelConfig

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
    None where one came for a bar at least as high (a lower bar admits fewer layouts); else
    (None, None): solve it."""
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
