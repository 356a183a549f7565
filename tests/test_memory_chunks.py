"""The memory-aware bounds of a search are worked out a growing chunk at a time, the rows of
least balanced bound first (solver.search.layout_search.LayoutSearch.bound_memory), under the
bar of then. Exact: the same plans, layouts, proofs and floors as with every row bounded at
once, whatever the first chunk's size."""

from __future__ import annotations

import pytest

from solver.optimize import build_problem
from solver.search import layout_search
from solver.search.program_memo import WorkBudget


def _answer(problem, budget: float) -> tuple:
    ranked, proven, _, floor = layout_search.search_layouts(problem, 5, 600.0,
                                                            budget=WorkBudget(budget))
    assert ranked is not None
    return ([(c, l, round(float(s), 12)) for c, l, s in zip(
        ranked.candidates.to_configs(), ranked.layouts, ranked.step_time.step_s)],
        proven, round(floor, 12))


@pytest.mark.parametrize(("model", "cluster", "gpus", "budget"), [
    ("llama3.1-70b", "dgx-h100", 64, 3.5),       # plain layers, proven
    ("gemma3-27b", "dgx-h100", 8, 0.5),         # windowed layers, stopped by the budget
    ("deepseek-v2-lite", "dgx-a100-80gb", 8, 3.5),  # dense first layer, MoE after
])
def test_chunks_of_any_size_give_the_same_answer(monkeypatch, model, cluster, gpus,
                                                 budget) -> None:
    problem = build_problem(model, cluster, gpus, seq_len=4096, global_batch=256)
    monkeypatch.setattr(layout_search, "MEMORY_CHUNK", 10**9)
    whole = _answer(problem, budget)
    for chunk in (1, 7):
        monkeypatch.setattr(layout_search, "MEMORY_CHUNK", chunk)
        assert _answer(problem, budget) == whole
