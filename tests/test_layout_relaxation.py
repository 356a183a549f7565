"""The layout relaxation (solver.search.layout_relaxation) is sound: it never says "no layout"
where one exists (brute force over every layout of small patterned models, two to four
stages, one and two chunks each, with and without full recompute of one count of layers per
chunk), whatever the memory and the bar; every stage of every layout that fits and meets the
bar holds a count vector its set allows (the tables the layout program is given); the
program with those tables (solver.search.program_memo.solve_program) finds the brute-force
optimum under the bar, proven; and the relaxation does refute, in the examples where nothing
fits or beats the bar, often enough to matter (hypothesis events)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from test_layout_program import CLUSTER, all_layouts, all_recomputes
from test_layout_two_stages import capacity_between, patterned_models

from solver.cost.step.layout_terms import estimate_layout_coefficients
from solver.cost.memory.layout import layout_layer_counts
from solver.search.layout_program import LayoutRules, build_layout
from solver.search.layout_program import objective_bound
from solver.search.layout_relaxation import applies, no_layout_can, stage_sets
from solver.search.program_memo import solve_program
from solver.spec import JobSpec, ParallelConfig


@st.composite
def staged_problems(draw):
    model = draw(patterned_models(4, 10))
    pp = draw(st.sampled_from([2, 3, 4]))
    vpp = draw(st.sampled_from([1, 2]))
    assume(pp * vpp <= model.num_hidden_layers + 2)
    micro = draw(st.sampled_from([1, 2]))
    config = ParallelConfig(tp=2, pp=pp, vpp=vpp, dp=1, zero=1, micro_batch=micro,
                            recompute=draw(st.sampled_from(["none", "selective", "full"])))
    job = JobSpec(seq_len=4096, global_batch=micro * pp * draw(st.integers(1, 3)))
    return model, job, config


@settings(max_examples=120, deadline=None)
@given(staged_problems(), st.floats(0.6, 1.2), st.floats(0.97, 1.1))
def test_relaxation_never_refutes_a_layout_that_exists(problem, squeeze, bar) -> None:
    model, job, config = problem
    coefficients = estimate_layout_coefficients(model, CLUSTER, job, config)
    full = config.recompute == "full"
    rules = LayoutRules(recompute=full, uniform_recompute=True)
    assume(applies(config, coefficients))
    event(f"recompute {config.recompute}")
    capacity = capacity_between(model, config, coefficients, squeeze)
    steps, contents = [], []
    for sizes in all_layouts(model.num_hidden_layers, config.pp * config.vpp):
        for recompute in all_recomputes(sizes, full, True):
            layout = build_layout(config, list(sizes), list(recompute), 0)
            layers, recomputed = layout_layer_counts(coefficients.kinds, layout,
                                                     len(coefficients.layer_s))
            if coefficients.memory_bytes(layers, recomputed).max() <= capacity:
                steps.append(coefficients.step_s(layers, recomputed))
                contents.append(layers)
    best = min(steps, default=np.inf)
    if np.isinf(best):
        event("no layout fits")
        below_s = None
    else:
        # A bar around the optimum: above it some layout beats it, below it none may.
        below_s = best * bar
    refuted = no_layout_can(config, coefficients, capacity, rules, below_s)
    exists = any(step <= below_s for step in steps) if below_s is not None else bool(steps)
    # Time is costed to 1 us in the relaxation, as in the program: each coefficient rounded to
    # the nearest, so a stage's time is off by up to (layers + 2) / 2 us and the step by
    # (micro-batches + chunks) times that; a layout within that of the bar may go either way.
    rounding_s = ((coefficients.num_micro + config.pp * config.vpp)
                  * (model.num_hidden_layers + 2) * 0.5e-6)
    assume(below_s is None or all(abs(step - below_s) > max(1e-5 * below_s, rounding_s)
                                  for step in steps))
    event(f"exists: {exists}, refuted: {refuted}")
    if exists:
        assert not refuted
    bound = None if below_s is None else objective_bound(coefficients, below_s)
    sets = stage_sets(config, coefficients, capacity, rules, bound)
    for step, layers in zip(steps, contents):
        if below_s is None or step <= below_s:
            assert sets is not None
            for stage, allowed in enumerate(sets.allowed):
                assert allowed[tuple(layers[stage, sets.present].astype(int))]
    answer, proven = solve_program(config, coefficients, capacity, rules, below_s, 30.0,
                                   lambda: None)
    assert proven
    if not exists:
        assert answer is None
        return
    assert answer is not None
    best_below = min(step for step in steps if below_s is None or step <= below_s)
    # Time coefficients are rounded to 1 us in the program: equal up to that.
    assert answer.step_s == pytest.approx(best_below, rel=1e-4)
    assert answer.memory_bytes.max() <= capacity
