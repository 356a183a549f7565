"""The layout programs' work budget (solver.search.program_memo.WorkBudget): CP-SAT's own count
of work (deterministic seconds), shared by a solve's searches. A search whose programs spend it
stops there, unproven, with an answer that does not depend on how fast the machine runs."""

from __future__ import annotations

import time

import pytest

from solver.optimize import build_problem
from solver.search import layout_search
from solver.search.program_memo import WorkBudget


def _answer(ranked) -> list[tuple]:
    return [(config, layout, round(float(seconds), 12)) for config, layout, seconds in zip(
        ranked.candidates.to_configs(), ranked.layouts, ranked.step_time.step_s)]


@pytest.fixture(scope="module")
def problem():
    # Gemma 3 27B's layout programs place five windowed layers per global one: proving its
    # best layouts on 8 H100s takes CP-SAT about 1.7 deterministic seconds.
    return build_problem("gemma3-27b", "dgx-h100", 8, seq_len=4096, global_batch=256)


def test_a_spent_budget_stops_the_search_unproven(problem) -> None:
    budget = WorkBudget(0.5)
    ranked, proven, _ = layout_search.search_layouts(problem, 3, 600.0, budget=budget)
    assert not proven and ranked is not None
    assert budget.left <= 0  # what CP-SAT reported was taken from it


def test_the_answer_does_not_depend_on_the_machines_speed(problem, monkeypatch) -> None:
    """The same budget on a machine whose clock runs three times as fast (a slower machine,
    or a busy one) gives the same plans, layouts and step times."""
    first, proven, _ = layout_search.search_layouts(problem, 3, 600.0, budget=WorkBudget(0.5))
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: 3 * real())
    again, proven_again, _ = layout_search.search_layouts(problem, 3, 600.0,
                                                          budget=WorkBudget(0.5))
    assert not proven and not proven_again
    assert _answer(first) == _answer(again)
