"""The two-stage layout by dynamic programming (solver.search.layout_two_stages) against brute
force and against the CP-SAT layout program, on small models whose layer kinds interleave
(windowed and full attention, dense and MoE MLPs: the hybrid patterns of issue 18) and on plain
ones (hypothesis):

- its optimum equals the brute-force enumeration of every layout;
- its objective, in the program's integer units, equals the CP-SAT program's, and both say
  "none" for the same bars;
- its layout holds every layer, fits every stage, and its step time is `estimate`'s.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st
from test_layout_program import CLUSTER, brute_force, tiny_model

from solver.cost.step.layout_terms import estimate_layout_coefficients
from solver.cost.memory import estimate_layout_memory
from solver.cost.memory.layout import build_even_layout, layout_layer_counts
from solver.cost.step.steptime import estimate_layout_step_time
from solver.search.layout_program import LayoutRules, solve_layout
from solver.search.layout_two_stages import answers_two_stages, solve_two_stages
from solver.spec import JobSpec, ModelSpec, ParallelConfig


def patterned(num_layers: int, mixers: list[str], mlps: list[str]) -> ModelSpec:
    """A tiny model with a per-layer pattern of mixers (full or 1K-windowed attention) and MLPs
    (dense or MoE)."""
    base = tiny_model(num_layers, moe="moe" in mlps)
    data = {**base.model_dump(), "name": "tiny-pattern", "layer_types": tuple(mixers),
            "mlp_layer_types": tuple(mlps), "first_k_dense_layers": 0}
    if "sliding_attention" in mixers:
        data["sliding_window"] = 1024
    return ModelSpec.model_validate(data)


@st.composite
def patterned_models(draw, fewest: int, most: int) -> ModelSpec:
    """A patterned() model of a random pattern."""
    num_layers = draw(st.integers(fewest, most))
    kinds = st.sampled_from(["full_attention", "sliding_attention"])
    mixers = draw(st.lists(kinds, min_size=num_layers, max_size=num_layers))
    mlps = draw(st.lists(st.sampled_from(["dense", "moe"]), min_size=num_layers,
                         max_size=num_layers))
    return patterned(num_layers, mixers, mlps)


@st.composite
def two_stage_problems(draw):
    model = draw(patterned_models(3, 11))
    num_layers = model.num_hidden_layers
    vpp = draw(st.sampled_from([1, 2, 3]))
    assume(2 * vpp <= num_layers + 2)
    micro = draw(st.sampled_from([1, 2]))
    config = ParallelConfig(tp=2, pp=2, vpp=vpp, dp=2, zero=1, micro_batch=micro,
                            recompute=draw(st.sampled_from(["none", "selective"])))
    job = JobSpec(seq_len=4096, global_batch=2 * micro * 2 * draw(st.integers(1, 4)))
    return model, job, config


def capacity_between(model, config, coefficients, squeeze: float) -> float:
    """Between the fullest empty stage and 130% of the even split's worst stage, so that the
    memory limit binds in some examples (tests/test_layout_program.py)."""
    even = build_even_layout(model, config.pp, config.vpp, False)
    layers, recomputed = layout_layer_counts(coefficients.kinds, even,
                                             len(coefficients.layer_s))
    even_memory = coefficients.memory_bytes(layers, recomputed).max()
    floor = coefficients.base_bytes.max()
    return floor + (0.3 + squeeze) * (even_memory - floor) + 2.0**20


@settings(max_examples=80, deadline=None)
@given(two_stage_problems(), st.floats(0.6, 1.2))
def test_two_stages_equal_brute_force_and_estimate(problem, squeeze) -> None:
    model, job, config = problem
    coefficients = estimate_layout_coefficients(model, CLUSTER, job, config)
    rules = LayoutRules(recompute=False, uniform_recompute=True)
    assert answers_two_stages(config, coefficients, rules)
    event(f"{len(set(coefficients.kinds.tolist()))} kinds")
    capacity = capacity_between(model, config, coefficients, squeeze)
    answer = solve_two_stages(config, coefficients, capacity, rules)
    expected = brute_force(model, config, coefficients, capacity, True)
    if np.isinf(expected):
        event("no layout fits")
        assert answer is None
        return
    assert answer is not None
    assert answer.step_s == pytest.approx(expected, rel=1e-4)  # time rounded to 1 us
    assert sum(s.layers for s in answer.layout.stages) == model.num_hidden_layers
    assert all(s.layers >= 1 for s in answer.layout.stages[1:-1])
    step = estimate_layout_step_time(model, CLUSTER, job, [config], [answer.layout]).step_s[0]
    memory = estimate_layout_memory(model, job, config, answer.layout).total
    assert answer.step_s == pytest.approx(step, rel=1e-12)
    assert np.all(memory <= capacity)


@settings(max_examples=60, deadline=None)
@given(two_stage_problems(), st.floats(0.6, 1.2), st.floats(0.98, 1.05))
def test_two_stages_equal_the_program_under_any_bar(problem, squeeze, bar) -> None:
    """The same objective as CP-SAT's proven optimum, and "none" for the same bars: asked to
    beat a bar near the optimum, both answer alike."""
    model, job, config = problem
    coefficients = estimate_layout_coefficients(model, CLUSTER, job, config)
    rules = LayoutRules(recompute=False, uniform_recompute=True)
    capacity = capacity_between(model, config, coefficients, squeeze)
    program, proven = solve_layout(config, coefficients, capacity, rules)
    assert proven
    assume(program is not None)
    below_s = program.step_s * bar
    ours = solve_two_stages(config, coefficients, capacity, rules, below_s)
    theirs, proven = solve_layout(config, coefficients, capacity, rules, below_s=below_s)
    assert proven
    event("beats the bar" if theirs is not None else "none beats the bar")
    assert (ours is None) == (theirs is None)
    if ours is not None:
        assert ours.objective == theirs.objective


def test_full_recompute_and_other_stage_counts_go_to_the_program() -> None:
    model = tiny_model(8, moe=False)
    job = JobSpec(seq_len=4096, global_batch=16)
    for config, expected in ((ParallelConfig(tp=2, pp=2, dp=2, recompute="full"), False),
                             (ParallelConfig(tp=2, pp=4, dp=1, recompute="none"), False),
                             (ParallelConfig(tp=2, pp=2, vpp=2, dp=2, recompute="none"), True)):
        coefficients = estimate_layout_coefficients(model, CLUSTER, job, config)
        rules = LayoutRules(recompute=config.recompute == "full", uniform_recompute=True)
        assert answers_two_stages(config, coefficients, rules) is expected
