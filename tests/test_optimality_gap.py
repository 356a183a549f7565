"""Where a solve stops unproven (its layout programs' work or its time limit spent), it gives a
lower bound of the best plan's step time, and so how far from the optimum its best plan may be
(OptimizeResult.step_lower_bound_s, optimality_gap; `step_seconds_lower_bound` and
`optimality_gap` in the JSON). Checked here: CP-SAT's bound of a stopped program, turned into
seconds (solver.search.layout_program.seconds_at_least), never passes the step time of any
layout (brute force over every layout of small models, the rounding of the coefficients to
the time unit included); a stopped search's floor never passes the proven optimum; a proven
solve's gap is 0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from test_layout_program import CLUSTER, all_layouts, all_recomputes, layout_problems

from solver.cost.step.layout_terms import estimate_layout_coefficients
from solver.cost.memory.layout import layout_layer_counts
from solver.cost.step.steptime import estimate_layout_step_time
from solver.optimize import build_problem, solve
from solver.optimize_json import render_result_json
from solver.search import layout_search
from solver.search.layout_program import (
    TIME_UNIT_S,
    LayoutRules,
    build_layout,
    seconds_at_least,
    solve_layout,
    to_units,
)
from solver.search.program_memo import WorkBudget


def program_objective(co, config, layers: np.ndarray, recomputed: np.ndarray) -> int:
    """The layout program's objective of a layout in integer units, from its docstring:
    (m vpp - 1) max_i T_i + sum_i T_i, each coefficient rounded to the nearest unit."""
    a = to_units(co.layer_s, TIME_UNIT_S, "nearest")
    b = to_units(co.recompute_s, TIME_UNIT_S, "nearest")
    stage = int(to_units(co.stage_s, TIME_UNIT_S, "nearest"))
    last = int(to_units(co.last_s, TIME_UNIT_S, "nearest"))
    times = layers.astype(np.int64) @ a + recomputed.astype(np.int64) @ b + stage
    times[config.pp - 1] += last
    return int((round(co.num_micro) * config.vpp - 1) * times.max() + times.sum())


@settings(max_examples=60, deadline=None)
@given(layout_problems())
def test_a_bound_in_units_never_passes_a_layouts_step_time(problem) -> None:
    """The units objective of every layout, turned into seconds as a bound, is at most the
    layout's step time in floats: the slack covers the rounding (without it, layouts whose
    coefficients round up are below their own bound)."""
    model, job, config, uniform = problem
    co = estimate_layout_coefficients(model, CLUSTER, job, config)
    checked = 0
    for sizes in all_layouts(model.num_hidden_layers, config.pp * config.vpp):
        for recompute in all_recomputes(sizes, config.recompute == "full", uniform):
            layout = build_layout(config, list(sizes), list(recompute), 0)
            layers, recomputed = layout_layer_counts(co.kinds, layout, len(co.layer_s))
            objective = program_objective(co, config, layers, recomputed)
            assert seconds_at_least(co, config, objective, None) <= co.step_s(layers,
                                                                                recomputed)
            checked += 1
            if checked >= 400:
                return


@settings(max_examples=40, deadline=None)
@given(layout_problems())
def test_a_stopped_program_bounds_the_brute_force_optimum(problem) -> None:
    """solve_layout stopped before any work: what it tells `on_bound` is at most the step
    time of every layout that fits (brute force), and at most the bar."""
    model, job, config, uniform = problem
    assume(config.pp > 1)
    co = estimate_layout_coefficients(model, CLUSTER, job, config)
    rules = LayoutRules(recompute=config.recompute == "full", uniform_recompute=uniform)
    capacity = 80e9
    steps = []
    for sizes in all_layouts(model.num_hidden_layers, config.pp * config.vpp):
        for recompute in all_recomputes(sizes, rules.recompute, uniform):
            layout = build_layout(config, list(sizes), list(recompute), 0)
            layers, recomputed = layout_layer_counts(co.kinds, layout, len(co.layer_s))
            if co.memory_bytes(layers, recomputed).max() <= capacity:
                steps.append(co.step_s(layers, recomputed))
    assume(steps)
    below_s = max(steps)
    bounds: list[float] = []
    answer, proven = solve_layout(config, co, capacity, rules, below_s=below_s,
                                  work_limit=0.0, on_bound=bounds.append)
    event(f"proven: {proven}")
    if proven:
        assert not bounds
        return
    assert len(bounds) == 1
    assert bounds[0] <= min(steps) and bounds[0] <= below_s


@pytest.fixture(scope="module")
def gemma():
    # The problem of tests/test_work_budget.py: proving its best layouts takes CP-SAT about
    # 1.7 deterministic seconds, so a budget of 0.5 stops it.
    return build_problem("gemma3-27b", "dgx-h100", 8, seq_len=4096, global_batch=256)


def test_a_stopped_search_floor_is_below_the_proven_optimum(gemma) -> None:
    stopped, proven, _, floor = layout_search.search_layouts(gemma, 3, 600.0,
                                                             budget=WorkBudget(0.5))
    whole, whole_proven, _, whole_floor = layout_search.search_layouts(gemma, 3, 600.0)
    assert not proven and whole_proven
    best, found = float(whole.step_time.step_s[0]), float(stopped.step_time.step_s[0])
    assert whole_floor == best  # proven: the floor is the best pair's own step
    assert floor <= best <= found
    assert floor > 0.9 * best  # CP-SAT's bounds, not the first pass's alone


def test_the_gap_reaches_the_answer_and_its_json(gemma) -> None:
    proven = solve(gemma, top=3, time_limit_s=600.0, compare=False)
    assert proven.status == "optimal"
    assert proven.optimality_gap == 0.0
    line = render_result_json(proven)
    assert line["optimality_gap"] == 0.0
    assert line["step_seconds_lower_bound"] == line["plans"][0]["step_seconds"]
    stopped = solve(gemma, top=3, time_limit_s=1.0, compare=False)  # 0.35 of CP-SAT's work
    assert stopped.status == "feasible"
    # The floor bounds the steps as the search ranks them, without the memory savers; a plan
    # that needs them is listed with its own, shorter step (solver.ranked_plans), so the
    # optimum it bounds is the least saver-less step of the proven top (its #1 by that time).
    def plain(plan) -> float:  # its own search's profile: its modules and offloads
        update = {name: True for name in plan.offloads}
        if plan.recompute_modules:
            update["recompute_modules"] = plan.recompute_modules
        return float(estimate_layout_step_time(
            gemma.model_spec, gemma.cluster, gemma.job, [plan.config], [plan.layout],
            gemma.time_constants.model_copy(update=update)).step_s[0])

    best = min(plain(plan) for plan in proven.plans)
    assert best >= proven.plans[0].time.step_seconds
    assert stopped.step_lower_bound_s <= best * (1 + 1e-9)
    gap = stopped.optimality_gap
    assert gap is not None and gap >= 0
    assert stopped.plans[0].time.step_seconds <= stopped.step_lower_bound_s * (1 + gap) + 1e-9
    assert render_result_json(stopped)["optimality_gap"] == round(gap, 4)


def test_memory_ranked_answers_have_no_gap() -> None:
    problem = build_problem("llama3.1-8b", "dgx-h100", 8, seq_len=4096, global_batch=256,
                            objective="memory")
    result = solve(problem, top=2, compare=False)
    assert result.step_lower_bound_s is None and result.optimality_gap is None
    assert render_result_json(result)["optimality_gap"] is None


def test_the_table_title_says_how_far_from_the_optimum() -> None:
    from click.testing import CliRunner

    from solver.cli import cli

    result = CliRunner().invoke(cli, ["optimize", "--model", "gemma3-27b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--global-batch", "256",
                                      "--top", "3", "--work-limit", "0.35"])
    assert result.exit_code == 0, result.output
    title = " ".join(result.output.split())  # the title may wrap
    # Issue 40: the title names the limit that stopped the search (a count of work here).
    assert "(feasible, stopped by the work limit, the best within " in title
    assert "% of the optimum, layout" in title
