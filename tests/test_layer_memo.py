"""The layer terms kept between calls (solver.cost.layer_memo) are the numbers a fresh
estimate_layer_terms gives, bit for bit, whatever rows were worked out before and in what
batches: the search's answer must not depend on what it costed first (deterministic output)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost import layer_memo
from solver.cost.distinct import distinct_rows
from solver.cost.layer_time import estimate_layer_terms, layer_degrees
from solver.optimize import build_problem
from solver.search.enumerate import enumerate_feasible, rules_but_memory
from solver.spec.job import PARALLEL_FIELDS

PROBLEMS = {name: build_problem(name, cluster, gpus, seq_len=4096, global_batch=512,
                                precision="bf16", framework="megatron")
            for name, cluster, gpus in (("mixtral-8x7b", "dgx-h100", 64),
                                        ("llama3.1-8b", "dgx-a100-80gb", 32))}


def distinct_degrees(problem) -> dict[str, np.ndarray]:
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    d = {n: np.asarray(getattr(candidates, n), dtype=np.int64) for n in PARALLEL_FIELDS}
    first, _ = distinct_rows(d, layer_degrees(problem.time_constants))
    return {n: v[first] for n, v in d.items()}


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(PROBLEMS)), data=st.data())
def test_kept_terms_equal_fresh_ones_bit_for_bit(name, data) -> None:
    problem = PROBLEMS[name]
    rows = distinct_degrees(problem)
    n = len(rows["tp"])
    names = layer_degrees(problem.time_constants)
    specs = (problem.model_spec, problem.cluster, problem.job, problem.time_constants)
    layer_memo._KEPT.clear()
    # Batches of rows asked for in turn (overlapping, in any order), then all of them.
    batches = data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=n,
                                          unique=True), min_size=1, max_size=4))
    for batch in [*batches, list(range(n))]:
        index = np.array(batch)
        chosen = {k: v[index] for k, v in rows.items()}
        kept = layer_memo.layer_terms(*specs[:3], chosen, specs[3], names)
        fresh = estimate_layer_terms(*specs[:3], chosen, specs[3])
        assert kept.keys() == fresh.keys()
        for key in fresh:
            assert np.array_equal(kept[key], fresh[key]), key
    assert len(layer_memo._KEPT) == 1 and len(layer_memo._KEPT[0].where) == n


def test_other_objects_are_not_mixed_up() -> None:
    """Entries are told apart by the identity of the specs and the degree names: another
    problem's terms are never taken, and only the last few problems' are kept."""
    layer_memo._KEPT.clear()
    answers = {}
    for name, problem in PROBLEMS.items():
        rows = distinct_degrees(problem)
        answers[name] = layer_memo.layer_terms(problem.model_spec, problem.cluster, problem.job,
                                               rows, problem.time_constants,
                                               layer_degrees(problem.time_constants))
    for name, problem in PROBLEMS.items():
        rows = distinct_degrees(problem)
        again = layer_memo.layer_terms(problem.model_spec, problem.cluster, problem.job, rows,
                                       problem.time_constants,
                                       layer_degrees(problem.time_constants))
        assert all(np.array_equal(again[k], answers[name][k]) for k in again)
    assert len(layer_memo._KEPT) == len(PROBLEMS)
    for _ in range(layer_memo.KEPT_PROBLEMS + 2):
        other = PROBLEMS["llama3.1-8b"].time_constants.model_copy()
        layer_memo.layer_terms(PROBLEMS["llama3.1-8b"].model_spec,
                               PROBLEMS["llama3.1-8b"].cluster, PROBLEMS["llama3.1-8b"].job,
                               distinct_degrees(PROBLEMS["llama3.1-8b"]), other,
                               layer_degrees(other))
    assert len(layer_memo._KEPT) == layer_memo.KEPT_PROBLEMS
