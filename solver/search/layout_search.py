"""The search over meshes and layouts: exhaustive over the mesh and schedule (numpy), the layout
program (CP-SAT) where a layout can still beat the incumbent.

1. Every candidate meeting the rules is costed with its even split (solver.search.enumerate);
   the `top` fastest that fit are the incumbents, the slowest of them the bar.
2. For every candidate, a lower bound of its step time over all layouts
   (estimate_layout_lower_bound_s, with the fewest recomputed layers any layout that fits
   needs, _stage_capacities), and whether any layout can fit at all; the
   candidates whose bounds can still beat the bar and fit are handed to the layout program,
   lowest bound first, each asked for a layout strictly faster than the bar (and than its own
   even split); an answer replaces the slowest incumbent and lowers the bar. The search stops
   when the next bound reaches the bar: every candidate left cannot enter the top, ties
   included, so the top is proven over layouts too (unless a program met the time limit).

Rank by memory (objective "memory") keeps the even split: the layout program minimises time.
"""

from __future__ import annotations

import time

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.layout_terms import estimate_layout_coefficients, estimate_layout_lower_bound_s
from solver.cost.memory.layout import build_even_layout, estimate_in_flight, layer_kinds
from solver.cost.memory.terms import (
    KINDS,
    StageContent,
    compose_stage_memory,
    estimate_memory_terms,
)
from solver.cost.steptime import estimate_layout_step_time, estimate_time_terms
from solver.search.constraints import memory_capacity_bytes
from solver.search.enumerate import (
    Ranked,
    enumerate_feasible,
    fastest_that_fit,
    rules_but_memory,
    solve_by_enumeration,
)
from solver.search.layout_program import LayoutRules, solve_layout
from solver.search.space import VARIABLES, Problem
from solver.spec import ParallelConfig, PipelineLayout

# Frameworks that recompute one count of layers in every chunk (--recompute-num-layers).
UNIFORM_RECOMPUTE_FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")


def layout_rules(problem: Problem, config: ParallelConfig) -> LayoutRules:
    """What the layout of `config` may choose under the problem's framework."""
    mtp = problem.model_spec.num_nextn_predict_layers if problem.memory_options.include_mtp \
        else 0
    return LayoutRules(recompute=config.recompute == "full",
                       uniform_recompute=problem.framework in UNIFORM_RECOMPUTE_FRAMEWORKS,
                       mtp_layers=mtp)


def even_layout(problem: Problem, config: ParallelConfig) -> PipelineLayout:
    """The even split of `config` under the problem's memory options."""
    options = problem.memory_options
    mtp = problem.model_spec.num_nextn_predict_layers if options.include_mtp else 0
    return build_even_layout(problem.model_spec, config.pp, config.vpp,
                             config.recompute == "full",
                             options.account_for_embedding_in_pipeline_split, mtp)


def solve_with_layouts(problem: Problem, top: int = 5, time_limit_s: float = 10.0
                       ) -> tuple[Ranked | None, bool]:
    """The `top` best (configuration, layout) pairs, and whether they are proven (no layout
    program stopped at the time limit). Module docstring."""
    start = time.perf_counter()
    if problem.objective != "time":
        return solve_by_enumeration(problem, top), True
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    if len(candidates) == 0:
        return None, True
    model_spec = problem.model_spec
    terms = estimate_time_terms(model_spec, problem.cluster, problem.job, candidates,
                                problem.time_constants)
    even = fastest_that_fit(problem, candidates, top, terms)
    # row -> (order key: step, worst-stage memory, degrees; its layout, None for the even split)
    best: dict[int, tuple[tuple, PipelineLayout | None]] = {}

    def key(row: int, seconds: float, memory_bytes: float) -> tuple:
        return (seconds, memory_bytes, *(int(getattr(candidates, n)[row]) for n in VARIABLES))

    if even is not None:
        for row, seconds, memory in zip(even.rows, even.step_time.step_s, even.memory_bytes):
            best[int(row)] = (key(int(row), float(seconds), float(memory)), None)

    def bar() -> float:
        if len(best) < top:
            return np.inf
        return sorted(order for order, _ in best.values())[top - 1][0]

    full = candidates.recompute == RECOMPUTE_FULL
    bound = estimate_layout_lower_bound_s(model_spec, terms, candidates.pp, full.astype(float),
                                          above_s=bar())
    capacity = memory_capacity_bytes(problem)
    hopeful = np.flatnonzero(bound <= bar())
    fits, recomputed = _stage_capacities(problem, candidates.take(hopeful))
    hopeful, recomputed = hopeful[fits], recomputed[fits]
    # One recompute count for every chunk (--recompute-num-layers >= 1) recomputes a layer in
    # every chunk that holds one: all but the first and last at least.
    if problem.framework in UNIFORM_RECOMPUTE_FRAMEWORKS:
        chunks = candidates.pp[hopeful] * candidates.vpp[hopeful]
        recomputed = np.maximum(recomputed, np.where(full[hopeful], chunks - 2, 0))
    bound[hopeful] = estimate_layout_lower_bound_s(
        model_spec, terms.take(hopeful), candidates.pp[hopeful],
        np.maximum(full[hopeful], recomputed))
    hopeful = hopeful[np.lexsort((hopeful, bound[hopeful]))]
    proven = True
    for row in hopeful:
        limit = bar()
        if bound[row] > limit:
            break
        remaining = time_limit_s - (time.perf_counter() - start)
        if remaining <= 0:
            proven = False
            break
        config = candidates.config(int(row))
        below = min(limit, best[int(row)][0][0] if int(row) in best else np.inf)
        coefficients = estimate_layout_coefficients(
            model_spec, problem.cluster, problem.job, config, problem.memory_options,
            problem.time_constants, terms.take(np.array([row])))
        answer, complete = solve_layout(
            config, coefficients, capacity, layout_rules(problem, config),
            below_s=None if np.isinf(below) else below, time_limit_s=remaining,
            hint=even_layout(problem, config))
        proven = proven and complete
        if answer is None:
            continue
        order = key(int(row), answer.step_s, float(answer.memory_bytes.max()))
        if int(row) in best and best[int(row)][0] <= order:
            continue
        best[int(row)] = (order, answer.layout)
        if len(best) > top:
            del best[max(best, key=lambda r: best[r][0])]
    if not best:
        return None, proven
    return _ranked(problem, candidates, best, top), proven


def _ranked(problem: Problem, candidates: Candidates,
            best: dict[int, tuple[tuple, PipelineLayout | None]], top: int) -> Ranked:
    """The chosen (row, layout) pairs as a Ranked, best first by their order keys (step time,
    worst-stage memory, degrees); the step time's breakdown through the layout composition."""
    rows = np.array(sorted(best, key=lambda r: best[r][0])[:top], dtype=np.int64)
    chosen = candidates.take(rows)
    configs = chosen.to_configs()
    layouts = tuple(best[int(r)][1] or even_layout(problem, c) for r, c in zip(rows, configs))
    step = estimate_layout_step_time(problem.model_spec, problem.cluster, problem.job, configs,
                                     layouts, problem.time_constants)
    return Ranked(candidates=chosen, step_time=step,
                  memory_bytes=np.array([best[int(r)][0][1] for r in rows]),
                  num_feasible=None, num_candidates=len(candidates), layouts=layouts,
                  rows=rows)


def _stage_capacities(problem: Problem, candidates: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """Per candidate, (fits, fewest recomputed layers): whether some layout can fit at all,
    and a lower bound of how many layers must recompute in full for one to fit.

    A relaxation of the layout program's memory rows: stage i holds its empty-stage bytes
    base_i plus, per layer, at least c_i (the cheapest layer kind on that stage, its in-flight
    micro-batches included); a layer recomputing saves at most d_i of it. Stage i then takes
    (capacity - base_i) / c_i layers free of recompute (/ (c_i - d_i) all recomputing); the
    layers beyond the free ones need at least min_i c_i / d_i recomputed layers each. The
    working set of a recompute only adds memory: leaving it out keeps the bound."""
    model_spec, job, n = problem.model_spec, problem.job, len(candidates)
    if n == 0:
        return np.zeros(0, dtype=bool), np.zeros(0)
    width = int(candidates.pp.max())
    row, stage = np.divmod(np.arange(n * width), width)
    exists = stage < candidates.pp[row]
    row, stage = row[exists], stage[exists]
    rows = candidates.take(row)
    terms = estimate_memory_terms(model_spec, job, rows, problem.memory_options)
    num_micro = np.maximum(job.global_batch // (rows.dp * rows.micro_batch), 1)
    in_flight = estimate_in_flight(rows, stage, num_micro)
    is_first, is_last = stage == 0, stage == rows.pp - 1
    none = np.zeros((len(row), len(KINDS)))

    def total(layers: np.ndarray, recompute: np.ndarray) -> np.ndarray:
        content = StageContent(layers=layers, recompute=recompute, is_first=is_first,
                               is_last=is_last, in_flight=in_flight)
        return sum(compose_stage_memory(terms, content).values())

    base = total(none, none)
    present = np.bincount(layer_kinds(model_spec), minlength=len(KINDS)) > 0
    cost, kept = np.full(len(row), np.inf), np.full(len(row), np.inf)
    ratio = np.full(len(row), np.inf)  # recomputed layers per layer beyond the free room
    for kind in np.flatnonzero(present):
        unit = np.zeros((len(row), len(KINDS)))
        unit[:, kind] = 1.0
        one = total(unit, none) - base
        recomputed = total(2 * unit, 2 * unit) - total(unit, unit)
        cost, kept = np.minimum(cost, one), np.minimum(kept, recomputed)
        saved = one - recomputed
        ratio = np.minimum(ratio, np.where(saved > 0, one / np.maximum(saved, 1e-30), np.inf))
    capacity = memory_capacity_bytes(problem) * (1 + 1e-9)
    room = np.maximum(capacity - base, 0.0)
    plain_layers = np.where(base <= capacity, room / np.maximum(cost, 1e-30), -np.inf)
    full_layers = np.where(base <= capacity, room / np.maximum(kept, 1e-30), -np.inf)
    free = np.zeros(n)
    most = np.zeros(n)
    cheapest = np.full(n, np.inf)
    np.add.at(free, row, plain_layers)
    np.add.at(most, row, full_layers)
    np.minimum.at(cheapest, row, ratio)
    num_layers = model_spec.num_hidden_layers
    full = candidates.recompute == RECOMPUTE_FULL
    fits = np.where(full, most, free) >= num_layers * (1 - 1e-9)
    needed = np.where(full & np.isfinite(cheapest),
                      np.maximum(num_layers - free, 0.0) * cheapest, 0.0)
    return fits, np.floor(needed * (1 - 1e-9))
