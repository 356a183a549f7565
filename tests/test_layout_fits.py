"""The search's early answer for problems so tight that perhaps nothing fits
(solver.search.layout_search.any_layout_fits): it may say a problem fits when none does (a
relaxation), never the reverse. Checked against the layout program itself on every candidate
of small problems squeezed to a random memory capacity."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec
from solver.cost.step.layout_terms import (
    estimate_layer_time_coefficients,
    estimate_layout_coefficients,
)
from solver.search.constraints import memory_capacity_bytes
from solver.search.enumerate import enumerate_feasible, rules_but_memory
from solver.search.feasible import leanest_schedules
from solver.search.layout_program import solve_layout
from solver.search.layout_bounds import estimate_memory_bounds
from solver.search.layout_search import any_layout_fits, layout_rules
from solver.search.space import Problem
from solver.spec import JobSpec, ModelSpec

CLUSTER = load_cluster_spec("dgx-h100")


def small_model(num_layers: int, moe: bool) -> ModelSpec:
    extra = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024,
                 first_k_dense_layers=1) if moe else {}
    return ModelSpec(name="small", hidden_size=2048, intermediate_size=5632,
                     num_hidden_layers=num_layers, num_attention_heads=16,
                     num_key_value_heads=4, vocab_size=64000, **extra)


@st.composite
def tight_problems(draw) -> Problem:
    model = small_model(draw(st.integers(4, 8)), draw(st.booleans()))
    gpu = CLUSTER.gpu.model_copy(update={"memory_gib": draw(st.floats(0.5, 6.0))})
    return Problem(model_spec=model, cluster=CLUSTER.model_copy(update={"gpu": gpu}),
                   job=JobSpec(seq_len=4096, global_batch=8 * draw(st.sampled_from([1, 2]))),
                   num_gpus=draw(st.sampled_from([2, 4])),
                   framework=draw(st.sampled_from(["megatron", "generic"])))


@settings(max_examples=6, deadline=None)
@given(tight_problems())
def test_never_says_nothing_fits_when_a_layout_does(problem: Problem) -> None:
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    # The leanest schedules carry the relaxation's answer for every schedule of their mesh.
    times = estimate_layer_time_coefficients(problem.model_spec, problem.cluster, problem.job,
                                             candidates, problem.time_constants)
    every = estimate_memory_bounds(problem, candidates, times)[0]
    lean_rows = leanest_schedules(candidates)
    lean = estimate_memory_bounds(problem, candidates.take(lean_rows),
                          {k: v[lean_rows] for k, v in times.items()})[0]
    assert bool(every.any()) == bool(lean.any())
    assert np.all(every[lean_rows] == lean)
    if any_layout_fits(problem, candidates):
        return  # "may fit": the search goes on and finds out
    # "Nothing fits": no candidate has a layout that fits (the layout program, no time bar).
    capacity = memory_capacity_bytes(problem)
    for row in range(len(candidates)):
        config = candidates.config(row)
        coefficients = estimate_layout_coefficients(
            problem.model_spec, problem.cluster, problem.job, config, problem.memory_options,
            problem.time_constants)
        answer, proven = solve_layout(config, coefficients, capacity,
                                      layout_rules(problem, config))
        assert answer is None and proven, config


def test_replaying_twin_programs_gives_the_answers_of_solving_each() -> None:
    """The search solves each distinct layout program once and replays it for twins
    (solver.search.program_memo): the ranked plans are those of solving every program
    afresh. Llama-2-70B on 8 GB200s poses the same programs for ZeRO 0 and 1 at dp 1."""
    import solver.search.layout_search as search
    import solver.search.program_memo as memo
    from solver.optimize import build_problem

    problem = build_problem("llama2-70b", "gb200-nvl72", 8)
    replayed, proven = search.solve_with_layouts(problem, top=5)
    calls = []
    original = search.solve_program

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    real_replay = memo.replay
    search.solve_program = counting
    try:
        search.solve_with_layouts(problem, top=5)
        replays = len(calls)
        calls.clear()
        memo.replay = lambda runs, co, below_s: (None, None)
        afresh, proven_afresh = search.solve_with_layouts(problem, top=5)
    finally:
        search.solve_program = original
        memo.replay = real_replay
    assert proven and proven_afresh
    assert replays < len(calls)  # the twins were replayed, not solved
    assert replayed.candidates.to_configs() == afresh.candidates.to_configs()
    assert np.allclose(replayed.step_time.step_s, afresh.step_time.step_s, rtol=1e-9)
