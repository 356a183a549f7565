"""The layout programs' work budget (solver.search.program_memo.WorkBudget): CP-SAT's own count
of work (deterministic seconds), shared by a solve's searches. A search whose programs spend it
stops there, unproven, with an answer that does not depend on how fast the machine runs."""

from __future__ import annotations

import time

import pytest

from solver.optimize import build_problem
from solver.search import layout_search
from solver.search.limits import Deadline
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
    ranked, proven, _, _ = layout_search.search_layouts(problem, 3, 600.0, budget=budget)
    assert not proven and ranked is not None
    assert budget.left <= 0  # what CP-SAT reported was taken from it


def test_the_answer_does_not_depend_on_the_machines_speed(problem, monkeypatch) -> None:
    """The same budget on a machine whose clock runs three times as fast (a slower machine,
    or a busy one) gives the same plans, layouts and step times."""
    first, proven, _, _ = layout_search.search_layouts(problem, 3, 600.0, budget=WorkBudget(0.5))
    real = time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: 3 * real())
    again, proven_again, _, _ = layout_search.search_layouts(problem, 3, 600.0,
                                                          budget=WorkBudget(0.5))
    assert not proven and not proven_again
    assert _answer(first) == _answer(again)


def test_a_passed_time_limit_returns_the_even_splits_found_unproven(monkeypatch) -> None:
    """The wall-clock limit is a backstop beside the budget: where it passes before the
    layouts (a large problem's numpy phases take seconds: Nemotron 3 Ultra on 1,024 H100s
    took 4.8 s under a 2 s limit), the search answers with the even splits it found, unproven,
    instead of working out its memory-aware bounds first. A limit every machine passes at
    once stands in for it here."""
    problem = build_problem("llama3.1-8b", "dgx-h100", 64, seq_len=4096, global_batch=256)
    whole, whole_proven, _, _ = layout_search.search_layouts(problem, 3, 600.0)

    def no_bounds(*args, **kwargs):
        raise AssertionError("the memory-aware bounds were worked out past the time limit")

    monkeypatch.setattr(layout_search, "estimate_memory_bounds", no_bounds)
    ranked, proven, _, _ = layout_search.search_layouts(problem, 3, 1e-9)
    assert not proven and whole_proven
    assert ranked is not None and ranked.layouts is not None
    assert len(ranked.candidates) >= 3
    # Even splits only (the default layout of each), never faster than the proven answer.
    from solver.cost.memory.layout import build_default_layout
    assert list(ranked.layouts) == [
        build_default_layout(problem.model_spec, config, problem.memory_options)
        for config in ranked.candidates.to_configs()]
    assert ranked.step_time.step_s[0] >= whole.step_time.step_s[0] * (1 - 1e-12)


def test_memory_bounds_past_their_deadline_are_looser_bounds() -> None:
    """estimate_memory_bounds stops its bisections at the deadline: the same fit test, a bound
    never above the full one (still a lower bound of every layout that fits)."""
    from solver.cost.step.layout_terms import estimate_layer_time_coefficients
    from solver.search.enumerate import enumerate_feasible, rules_but_memory
    from solver.search.layout_bounds import estimate_memory_bounds

    problem = build_problem("llama3.1-70b", "dgx-h100", 64, seq_len=4096, global_batch=256)
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    times = estimate_layer_time_coefficients(problem.model_spec, problem.cluster, problem.job,
                                             candidates, problem.time_constants)
    fits, spent, bound = estimate_memory_bounds(problem, candidates, times)
    passed = Deadline(0.0)
    fits_now, spent_now, bound_now = estimate_memory_bounds(problem, candidates, times,
                                                            deadline=passed)
    assert passed.fired
    assert (fits == fits_now).all() and (spent == spent_now).all()
    assert (bound_now <= bound * (1 + 1e-12)).all() and (bound_now < bound).any()


def test_a_program_stopped_at_its_work_limit_is_not_solved_again_below_a_lower_bar() -> None:
    """A twin asked below a lower bar gets the unproven run's layout where it meets that bar,
    and nothing where not, both unproven; a higher bar than the run's is solved afresh, and a
    proven run still answers proven."""
    from types import SimpleNamespace

    from solver.search.layout_program import objective_bound
    from solver.search.program_memo import replay

    co = SimpleNamespace(fixed_s=1.0, vpp=2)  # objective = vpp (step - fixed) / 1 us
    found = SimpleNamespace(objective=objective_bound(co, 9.0))  # a layout of step 9 s
    runs = [(10.0, found, False)]
    assert replay(runs, co, 9.5) == (found, False)
    assert replay(runs, co, 9.0) == (found, False)
    assert replay(runs, co, 8.5) == (None, False)
    assert replay(runs, co, 11.0) == (None, None)  # a higher bar: more layouts, solve it
    assert replay(runs, co, None) == (None, None)
    assert replay([(10.0, None, False)], co, 8.0) == (None, False)
    assert replay([(10.0, None, False), (8.0, None, True)], co, 8.0) == (None, True)
    proven = SimpleNamespace(objective=objective_bound(co, 8.0))
    assert replay(runs + [(None, proven, True)], co, 8.5) == (proven, True)


def test_one_recompute_count_for_every_stage_is_proven_within_the_work_limit() -> None:
    """Megatron's --recompute-num-layers (one count R, every stage recomputes min(R, its
    layers)): CP-SAT branches on R first. Llama-3.1-405B on 64 A100 80GB, tp 8 x pp 8, full
    recompute: the layout is proven optimal within one program's work limit (it was not:
    1.5 deterministic seconds spent, 5.8 s of wall time to prove without it)."""
    from solver.cost.step.layout_terms import estimate_layout_coefficients
    from solver.cost.memory.layout import build_default_layout
    from solver.search.constraints import memory_capacity_bytes
    from solver.search.layout_program import solve_layout
    from solver.search.program_memo import PROGRAM_WORK_LIMIT
    from solver.spec import ParallelConfig

    problem = build_problem("llama3.1-405b", "dgx-a100-80gb", 64, seq_len=4096,
                            global_batch=1024)
    config = ParallelConfig(tp=8, pp=8, dp=1, zero=0, micro_batch=1, recompute="full")
    coefficients = estimate_layout_coefficients(
        problem.model_spec, problem.cluster, problem.job, config, problem.memory_options,
        problem.time_constants)
    rules = layout_search.layout_rules(problem, config)
    assert rules.uniform_recompute
    # As the search asks it: below its bar then (1,023.3 s), hinted with the even split.
    even = build_default_layout(problem.model_spec, config, problem.memory_options)
    answer, proven = solve_layout(config, coefficients, memory_capacity_bytes(problem), rules,
                                  below_s=1023.3, time_limit_s=600.0, hint=even,
                                  work_limit=PROGRAM_WORK_LIMIT)
    assert proven and answer is not None
    assert min(s.recompute_layers for s in answer.layout.stages) >= 1


def test_the_budget_goes_to_the_least_bound_over_every_search() -> None:
    """The problem's own search and those of its module sets and offloads run as one, each
    layout program in order of bound (solver.search.module_variants.search_module_sets): the
    budget is not spent on the own search's programs of high bound while another search's
    even splits lower the bar. Gemma 3 27B on 8 H100s, 4K tokens, batch 1,024: proven within
    the default budget of a 10 s solve (3.5 deterministic seconds), the plans of ten times
    that budget. Searched one after another, its own search's programs spent the budget and
    the answer stayed unproven, 0.7% slower (166.39 s against 165.24 s)."""
    import numpy as np

    from solver.search.layout_search import LayoutSearch
    from solver.search.module_variants import search_module_sets

    problem = build_problem("gemma3-27b", "dgx-h100", 8, seq_len=4096, global_batch=1024)
    assert problem.offloads

    def open_search(variant, cutoff_s, prior, deadline):
        return LayoutSearch(variant, 5, cutoff_s, prior, deadline)

    default = search_module_sets(problem, open_search, 5, WorkBudget.for_time_limit(10.0))
    more = search_module_sets(problem, open_search, 5, WorkBudget.for_time_limit(100.0))
    assert default.status == more.status == "optimal"

    def plans(merged) -> list[tuple]:
        return [(s.ranked.candidates.config(p), s.ranked.layouts[p],
                 round(float(s.ranked.step_time.step_s[p]), 9)) for s, p in merged.chosen]

    assert plans(default) == plans(more)
    assert default.floor_s == more.floor_s == float(
        default.chosen[0][0].ranked.step_time.step_s[default.chosen[0][1]])
    assert np.isfinite(default.floor_s)
