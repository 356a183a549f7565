"""The rows kept between calls (solver.cost.row_memo): the numbers a fresh call gives (to the
last bits, which numpy's code paths for short arrays may change), each row worked out once and
read alike by every later call; the layer compute kept for one recompute module set serves the
others (it reads no module set); and a solve's answer does not depend on what was solved before
in the process (deterministic output)."""

from __future__ import annotations

import json
import re
from typing import get_args

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost.layers import layer_compute_kept
from solver.cost.step import steptime
from solver.cost.distinct import distinct_rows
from solver.cost.layers.layer_time import estimate_layer_terms, layer_degrees
from solver.cost.row_memo import RowMemo, forget_all
from solver.optimize import build_problem, solve
from solver.optimize_json import render_result_json
from solver.search.enumerate import enumerate_feasible, rules_but_memory
from solver.spec.framework import RecomputeModule
from solver.spec.job import PARALLEL_FIELDS

PROBLEMS = {name: build_problem(name, cluster, gpus, seq_len=4096, global_batch=512,
                                precision="bf16", framework="megatron")
            for name, cluster, gpus in (("deepseek-v2-lite", "dgx-h100", 64),
                                        ("llama3.1-8b", "dgx-a100-80gb", 32))}


def distinct_degrees(problem, names) -> dict[str, np.ndarray]:
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    d = {n: np.asarray(getattr(candidates, n), dtype=np.int64) for n in PARALLEL_FIELDS}
    first, _ = distinct_rows(d, names)
    return {n: v[first] for n, v in d.items()}


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(PROBLEMS)),
       modules=st.lists(st.sampled_from(get_args(RecomputeModule)), min_size=1, max_size=2,
                        unique=True),
       data=st.data())
def test_kept_layer_terms_are_fresh_ones_read_alike(name, modules, data) -> None:
    """Batches of rows asked for in turn (overlapping, any order, single rows too), under the
    problem's own constants and then another module set (sharing the kept compute): every
    answer is within 1e-12 of one fresh batch of all the rows, and a row reads the same bits
    in every answer."""
    problem = PROBLEMS[name]
    specs = (problem.model_spec, problem.cluster, problem.job)
    forget_all()
    other = problem.time_constants.model_copy(update={
        "recompute_modules": tuple(sorted(modules))})
    for constants in (problem.time_constants, other):
        names = layer_degrees(constants)
        rows = distinct_degrees(problem, names)
        n = len(rows["tp"])
        saved = list(layer_compute_kept._COMPUTE.kept)
        layer_compute_kept._COMPUTE.clear()
        whole = estimate_layer_terms(*specs, rows, constants)  # all rows, nothing kept
        layer_compute_kept._COMPUTE.kept[:] = saved
        batches = data.draw(st.lists(st.lists(st.integers(0, n - 1), min_size=1, max_size=n,
                                              unique=True), min_size=1, max_size=3))
        seen: dict[str, np.ndarray] = {}
        for batch in [*batches, list(range(n))]:
            index = np.array(batch)
            kept = steptime._LAYER_TERMS.rows(
                specs, constants, {k: v[index] for k, v in rows.items()}, names,
                lambda r: estimate_layer_terms(*specs, r, constants))
            for key, value in kept.items():
                assert np.allclose(value, whole[key][index], rtol=1e-12, atol=0.0), key
                known = seen.setdefault(key, np.full(whole[key].shape, np.nan))
                first = np.isnan(known[index])
                assert np.array_equal(value[~first], known[index][~first]), key
                known[index] = value
    # One compute entry serves both module sets.
    assert len(layer_compute_kept._COMPUTE.kept) == 1


def test_a_solve_does_not_depend_on_what_was_solved_before() -> None:
    """The same Problem object solved twice, and after another problem, gives the same bytes as
    a problem built afresh (solve forgets what the memos kept)."""
    problem = PROBLEMS["deepseek-v2-lite"]
    fresh = build_problem("deepseek-v2-lite", "dgx-h100", 64, seq_len=4096, global_batch=512,
                          precision="bf16", framework="megatron")
    answers = []
    for p in (problem, PROBLEMS["llama3.1-8b"], problem, fresh):
        answers.append(json.dumps(render_result_json(solve(p, top=3, compare=False)),
                                  sort_keys=True, default=str))
    # solve_seconds is the one field that is a measurement
    strip = [re.sub(r'"solve_seconds": [0-9.e-]+', "", a) for a in answers]
    assert strip[0] == strip[2] == strip[3]


def test_entries_are_told_apart() -> None:
    """By the identity of the specs, the value's equality and the names: another problem's
    rows are never taken, and only the last `keep` argument sets are kept."""
    memo = RowMemo(keep=2)
    calls = []

    def compute(rows):
        calls.append(len(rows["a"]))
        return {"twice": 2 * rows["a"] + rows["b"]}

    x, y = object(), object()
    rows = {"a": np.array([1, 2, 3]), "b": np.array([5, 6, 7])}
    first = memo.rows((x,), 1, rows, ("a", "b"), compute)
    assert np.array_equal(first["twice"], [7, 10, 13]) and calls == [3]
    again = memo.rows((x,), 1, {"a": np.array([3, 1]), "b": np.array([7, 5])}, ("a", "b"),
                      compute)
    assert np.array_equal(again["twice"], [13, 7]) and calls == [3]
    memo.rows((y,), 1, rows, ("a", "b"), compute)  # other specs
    memo.rows((x,), 2, rows, ("a", "b"), compute)  # another value
    assert calls == [3, 3, 3] and len(memo.kept) == 2
    memo.rows((x,), 1, rows, ("a", "b"), compute)  # pushed out by the last two
    assert calls == [3, 3, 3, 3]
    # Rows repeated in one call are worked out once.
    memo.clear()
    twice = memo.rows((x,), 1, {"a": np.array([4, 4]), "b": np.array([0, 0])}, ("a", "b"),
                      compute)
    assert np.array_equal(twice["twice"], [8, 8]) and calls[-1] == 1


def test_offloads_keep_their_layer_terms_exact() -> None:
    """Activation offload's host transfers are worked out per distinct (layer degrees,
    recompute) with the layer terms: the same as adding them to every row; optimizer offload
    leaves the layers alone and shares the problem's kept terms."""
    from solver.cost.step.offload import add_activation_offload_s
    from solver.cost.step.steptime import estimate_time_terms

    problem = PROBLEMS["llama3.1-8b"]
    specs = (problem.model_spec, problem.cluster, problem.job)
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    candidates = candidates.take(np.flatnonzero(candidates.recompute != 2))  # no full
    forget_all()
    plain = estimate_time_terms(*specs, candidates, problem.time_constants)
    active = problem.time_constants.model_copy(update={"activation_offload": True})
    offloaded = estimate_time_terms(*specs, candidates, active)
    d = {n: np.asarray(getattr(candidates, n), dtype=np.int64) for n in PARALLEL_FIELDS}
    every_row = add_activation_offload_s(*specs, d, active, plain.per_layer)
    assert np.allclose(offloaded.per_layer, every_row, rtol=1e-12, atol=0.0)
    assert (offloaded.per_layer >= plain.per_layer).all()
    entries = len(steptime._LAYER_TERMS.kept)
    optimizer = problem.time_constants.model_copy(update={"optimizer_offload": True})
    again = estimate_time_terms(*specs, candidates, optimizer)
    assert len(steptime._LAYER_TERMS.kept) == entries  # served from the problem's entry
    assert np.array_equal(again.per_layer, plain.per_layer)
