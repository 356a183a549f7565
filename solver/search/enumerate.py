"""The exhaustive oracle: every candidate of the space that meets every constraint, costed by
the numpy model with its even split of layers and sorted (`optimize --engine even`, and the
incumbents of the layout search, solver.search.layout_search).

Candidates are built one variable at a time (cartesian product), and each constraint prunes as
soon as the variables it reads are bound, so the expensive memory check sees only candidates
that pass every structural and framework rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.step.layout_terms import (
    estimate_layer_time_coefficients,
    estimate_layout_lower_bound_s,
)
from solver.cost.memory import estimate_memory_total
from solver.cost.step.steptime import (
    StepTime,
    TimeTerms,
    estimate_step_seconds,
    estimate_step_time,
)
from solver.search.constraints import (
    MEMORY_CONSTRAINT,
    Constraint,
    build_constraints,
    memory_capacity_bytes,
)
from solver.search.space import VARIABLES, Problem, variable_domains
from solver.search.twins import TWINS_PER_PLAN, group_candidate_twins
from solver.spec import PipelineLayout

# Binding order: the GPU split first (dp is implied by the others), cheap rules early.
ORDER = ("tp", "cp", "pp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute")


# Rows a binding step may produce at once; a larger product is enumerated depth first, over
# chunks of the rows bound so far (same rows, same order, bounded memory).
MAX_ROWS = 1 << 21


def enumerate_feasible(problem: Problem, constraints: Sequence[Constraint] | None = None,
                       stop_at_first: bool = False) -> Candidates:
    """Every candidate meeting `constraints` (default: all of the problem's), in a fixed order;
    with `stop_at_first`, at most one (a test of existence)."""
    constraints = build_constraints(problem) if constraints is None else tuple(constraints)
    domains = {name: np.array(values, dtype=np.int64)
               for name, values in variable_domains(problem).items()}
    values = _bind(problem, {}, list(constraints), ORDER, domains, stop_at_first)
    if values is None or len(values["tp"]) == 0:
        return Candidates(**{n: np.zeros(0, dtype=np.int64) for n in VARIABLES})
    return Candidates(**{n: values[n] for n in VARIABLES})


def _bind(problem: Problem, values: dict[str, np.ndarray], pending: list[Constraint],
          names: Sequence[str], domains: dict[str, np.ndarray], stop_at_first: bool
          ) -> dict[str, np.ndarray] | None:
    """Bind `names` in turn to `values`, each constraint pruning as soon as its variables are
    bound; None when nothing is left. A step whose product would pass MAX_ROWS goes depth
    first over chunks of the rows so far (a dropped rule cannot blow the memory up)."""
    for position, name in enumerate(names):
        size = len(values["tp"]) if values else 1
        if size > 1 and size * len(domains[name]) > MAX_ROWS:
            step = max(MAX_ROWS // len(domains[name]), 1)
            parts = []
            for start in range(0, size, step):
                chunk = {k: v[start:start + step] for k, v in values.items()}
                found = _bind(problem, chunk, pending, names[position:], domains,
                              stop_at_first)
                if found is not None:
                    if stop_at_first:
                        return found
                    parts.append(found)
            if not parts:
                return None
            return {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
        values = _expand(values, name, domains[name])
        if name == "pp":
            split = values["tp"] * values["cp"] * values["pp"]
            keep = problem.num_gpus % split == 0
            values = {k: v[keep] for k, v in values.items()}
            values["dp"] = problem.num_gpus // (values["tp"] * values["cp"] * values["pp"])
        values, pending = _apply_ready(values, pending, stop_at_first)
        if len(values["tp"]) == 0:
            return None
    assert not pending
    return values


def _expand(values: dict[str, np.ndarray], name: str, domain: np.ndarray
            ) -> dict[str, np.ndarray]:
    if not values:
        return {name: domain.copy()}
    size = len(next(iter(values.values())))
    expanded = {k: np.repeat(v, len(domain)) for k, v in values.items()}
    expanded[name] = np.tile(domain, size)
    return expanded


def _apply_ready(values: dict[str, np.ndarray], pending: list[Constraint],
                 stop_at_first: bool) -> tuple[dict[str, np.ndarray], list[Constraint]]:
    bound = set(values)
    waiting = []
    keep = np.ones(values["tp"].shape, dtype=bool)
    for constraint in pending:
        if not set(constraint.variables) <= bound:
            waiting.append(constraint)
            continue
        # Every rule ready now reads the same rows; the rows are dropped once, at the end.
        keep &= np.asarray(constraint.check(values), dtype=bool)
    if not keep.all():
        values = {k: v[keep] for k, v in values.items()}
    if stop_at_first and not waiting and len(values["tp"]):
        values = {k: v[:1] for k, v in values.items()}
    return values, waiting


@dataclass(frozen=True)
class Ranked:
    """Feasible candidates sorted best first, with their step times and worst-stage memory.
    `num_feasible`: how many candidates were ranked (None where the oracle did not check
    every candidate's memory: it then says how many meet the other rules, `num_candidates`,
    and how many it checked, `num_memory_checked`). `layouts`: each candidate's pipeline
    layout (None: the even split); `rows`: where each sits in the candidates it was chosen
    from. `twins`: per plan, the (recompute code, ZeRO stage, worst-stage memory) of each plan
    folded into it (solver.search.twins); None before folding (fold_twins)."""

    candidates: Candidates
    step_time: StepTime
    memory_bytes: np.ndarray
    num_feasible: int | None
    num_candidates: int | None = None
    num_memory_checked: int | None = None
    layouts: tuple[PipelineLayout, ...] | None = None
    rows: np.ndarray | None = None
    twins: tuple[tuple[tuple[int, int, float], ...], ...] | None = None


def fold_twins(ranked: Ranked, top: int | None = None) -> Ranked:
    """The first `top` distinct plans of a ranking, each with its twins (solver.search.twins)
    folded into `twins`."""
    positions = np.arange(len(ranked.candidates))
    groups = group_candidate_twins(ranked.candidates, positions, ranked.step_time.step_s)
    groups = groups[:top] if top is not None else groups
    kept = np.array([g[0] for g in groups], dtype=np.int64)
    twins = tuple(tuple((int(ranked.candidates.recompute[p]), int(ranked.candidates.zero[p]),
                         float(ranked.memory_bytes[p])) for p in g[1:]) for g in groups)
    return replace(ranked, candidates=ranked.candidates.take(kept),
                   step_time=ranked.step_time.take(kept), memory_bytes=ranked.memory_bytes[kept],
                   layouts=None if ranked.layouts is None else tuple(ranked.layouts[p]
                                                                     for p in kept),
                   rows=None if ranked.rows is None else ranked.rows[kept], twins=twins)


def rank(problem: Problem, candidates: Candidates, top: int | None = None,
         memory_bytes: np.ndarray | None = None, seconds: np.ndarray | None = None) -> Ranked:
    """Sort candidates by the objective (step time or memory), ties broken by the other, then
    by the degrees, so the order is deterministic; with `top`, the first `top` distinct plans
    and their twins (solver.search.twins; fold_twins folds them). `memory_bytes`, `seconds`:
    the candidates' worst-stage memory and step time when the caller has them already. The
    step time's breakdown is worked out for the candidates kept only."""
    slots = problem.memory_options.account_for_embedding_in_pipeline_split
    if seconds is None:
        seconds = estimate_step_seconds(problem.model_spec, problem.cluster, problem.job,
                                        candidates, problem.time_constants, slots)
    memory = memory_bytes if memory_bytes is not None else estimate_memory_total(
        problem.model_spec, problem.job, candidates, problem.memory_options)[0]
    primary, secondary = (seconds, memory) if problem.objective == "time" else (
        memory, seconds)
    # Only rows whose primary value is at most the (TWINS_PER_PLAN top)-th smallest can be
    # among the top distinct plans (ties included): sort those.
    rows = np.arange(len(candidates))
    if top is not None and TWINS_PER_PLAN * top < len(candidates):
        bar = np.partition(primary, TWINS_PER_PLAN * top - 1)[TWINS_PER_PLAN * top - 1]
        rows = np.flatnonzero(primary <= bar)
    keys = [getattr(candidates, n)[rows] for n in reversed(VARIABLES)] + [secondary[rows],
                                                                         primary[rows]]
    order = rows[np.lexsort(keys)]
    if top is not None:
        groups = group_candidate_twins(candidates, order, seconds[order])[:top]
        order = order[np.sort(np.concatenate([np.array(g, dtype=np.int64) for g in groups]))]
    kept = candidates.take(order)
    return Ranked(
        candidates=kept,
        step_time=estimate_step_time(problem.model_spec, problem.cluster, problem.job, kept,
                                     problem.time_constants, slots),
        memory_bytes=memory[order],
        num_feasible=len(candidates),
        rows=order,
    )


def rules_but_memory(problem: Problem) -> list[Constraint]:
    """Every constraint of the problem except the memory one (checked apart: it is costly)."""
    constraints = build_constraints(problem)
    others = [c for c in constraints if c.name != MEMORY_CONSTRAINT]
    assert len(others) == len(constraints) - 1
    return others


def solve_by_enumeration(problem: Problem, top: int | None = 5) -> Ranked | None:
    """The oracle's answer: the `top` best feasible candidates (None if there are none).

    Every rule but memory is applied by enumeration. Ranking by step time, memory (the
    costliest term) is then checked fastest first, in batches that grow fourfold, until the
    `top` fastest plans that fit are known: every candidate left unchecked is strictly slower
    than the top-th fitting one, so none of them can enter the top K, ties included. Ranking
    by memory (or ranking everything, top None) checks every candidate's memory once, for
    the check and the ranking."""
    candidates = enumerate_feasible(problem, rules_but_memory(problem))
    if len(candidates) == 0:
        return None
    if problem.objective == "time" and top is not None:
        kept = may_enter_top(problem, candidates, top)[0]
        ranked = fastest_that_fit(problem, candidates.take(kept), top)
        if ranked is None:
            return None
        # Rows the first pass dropped were never checked: the count of feasible ones is unknown.
        pruned = len(kept) < len(candidates)
        return fold_twins(replace(ranked, num_candidates=len(candidates), rows=kept[ranked.rows],
                                  num_feasible=None if pruned else ranked.num_feasible), top)
    memory = estimate_memory_total(problem.model_spec, problem.job, candidates,
                             problem.memory_options)[0]
    fits = np.flatnonzero(memory <= memory_capacity_bytes(problem))
    if len(fits) == 0:
        return None
    ranked = rank(problem, candidates.take(fits), top, memory[fits])
    return fold_twins(replace(ranked, num_candidates=len(candidates),
                              num_memory_checked=len(candidates)), top)


# Candidates whose memory the oracle checks first (then 4x, 16x, ... more).
FIRST_MEMORY_BATCH = 2048


def fastest_that_fit(problem: Problem, candidates: Candidates, top: int,
                     terms: TimeTerms | None = None, below_s: float = np.inf
                     ) -> Ranked | None:
    """solve_by_enumeration for the time objective: memory checked fastest first (the even
    split of every candidate) until the `top` distinct plans are certain, returned with their
    twins (rank; fold_twins folds them); `rows` of the answer index `candidates`. `terms`:
    the candidates' TimeTerms when the caller has them. With `below_s`, only even splits at
    most that many seconds are looked at (the others are never checked)."""
    seconds = estimate_step_seconds(
        problem.model_spec, problem.cluster, problem.job, candidates, problem.time_constants,
        problem.memory_options.account_for_embedding_in_pipeline_split, terms)
    capacity = memory_capacity_bytes(problem)
    memory = np.full(len(candidates), np.inf)
    unchecked = np.flatnonzero(seconds <= below_s)
    skipped = len(candidates) - len(unchecked)
    batch = max(FIRST_MEMORY_BATCH, 4 * top)
    # The (TWINS_PER_PLAN top)-th fastest that fits is no faster than the top-th distinct plan.
    enough = TWINS_PER_PLAN * top
    while len(unchecked):
        if len(unchecked) > batch:
            bar = np.partition(seconds[unchecked], batch - 1)[batch - 1]
            chosen = unchecked[seconds[unchecked] <= bar]
            unchecked = unchecked[seconds[unchecked] > bar]
        else:
            chosen, unchecked = unchecked, unchecked[:0]
        memory[chosen] = estimate_memory_total(problem.model_spec, problem.job,
                                         candidates.take(chosen), problem.memory_options)[0]
        fits = np.flatnonzero(memory <= capacity)
        if len(fits) >= enough and len(unchecked):
            kth = np.partition(seconds[fits], enough - 1)[enough - 1]
            if seconds[unchecked].min() > kth:
                break
        batch *= 4
    fits = np.flatnonzero(memory <= capacity)
    if len(fits) == 0:
        return None
    ranked = rank(problem, candidates.take(fits), top, memory[fits], seconds[fits])
    checked = len(candidates) - len(unchecked) - skipped
    return replace(ranked, num_feasible=len(fits) if len(unchecked) + skipped == 0 else None,
                   num_candidates=len(candidates), num_memory_checked=checked,
                   rows=fits[ranked.rows])


# Candidates of least bound whose even splits may_enter_top costs first (then 8x more).
FIRST_PASS = 2048


def first_pass_size(top: int) -> int:
    """The rows of least bound whose even splits may_enter_top costs first."""
    return max(FIRST_PASS, 16 * top)


@dataclass(frozen=True)
class FirstPass:
    """A problem's candidates (every rule but memory) and a lower bound of each one's step
    time over all its layouts (may_enter_top)."""

    candidates: Candidates
    low: np.ndarray


def candidates_below(first: FirstPass, variant: Problem, cutoff_s: float) -> Candidates:
    """The candidates of `variant` whose step time may reach `cutoff_s`, from the first pass
    of the problem it varies: the same rules with tighter pins (its candidates are those of
    the first pass within its pins), and a step time never shorter for the same configuration
    and layout (a later recompute module set or an offload: solver.search.module_variants),
    so the first pass's bounds bound it too."""
    return first.candidates.take(np.flatnonzero(within_pins(first, variant)
                                                & (first.low <= cutoff_s)))


def least_bound(first: FirstPass, variant: Problem) -> float:
    """The least step time of any plan of `variant` (candidates_below), inf where it has
    no candidate."""
    low = first.low[within_pins(first, variant)]
    return float(low.min()) if len(low) else np.inf


def within_pins(first: FirstPass, variant: Problem) -> np.ndarray:
    """Which candidates of the first pass meet `variant`'s pins."""
    keep = np.ones(len(first.low), dtype=bool)
    for name, values in variant.pins.items():
        keep &= np.isin(getattr(first.candidates, name), values)
    return keep


def may_enter_top(problem: Problem, candidates: Candidates, top: int,
                  cutoff_s: float = np.inf) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `candidates` that may be among the `top` (configuration, layout) pairs:
    those whose lower bound over every layout, from the layers' terms alone
    (estimate_time_terms with layers_only), is at most `cutoff_s` (plans known from elsewhere)
    and, where more rows than FIRST_PASS are left, at most the step time of the top-th
    fastest even split that fits among the rows of least bound. Any other row is slower,
    whatever its layout, than `top` plans already known (ties kept). Returned with every
    row's lower bound."""
    light = estimate_layer_time_coefficients(problem.model_spec, problem.cluster, problem.job,
                                             candidates, problem.time_constants)
    full = (candidates.recompute == RECOMPUTE_FULL).astype(float)
    # The balanced bound orders the rows; the finer one (the last stage's head) then prunes.
    low = estimate_layout_lower_bound_s(problem.model_spec, light, candidates.pp, full,
                                        above_s=-np.inf)
    size = first_pass_size(top)
    # Where the cutoff alone leaves no more rows than a head would cost, they are the answer.
    if np.isfinite(cutoff_s) and np.count_nonzero(low <= cutoff_s) <= size:
        size = len(low)
    # Two tries at most: where memory is so tight that the least bounds hold fewer than
    # `top` plans that fit, costing ever larger heads would cost more than it saves.
    while size < len(low) and size <= 8 * first_pass_size(top):
        head = candidates.take(np.sort(np.argpartition(low, size - 1)[:size]))
        even = fastest_that_fit(problem, head, top)
        distinct = None if even is None else fold_twins(even, top)
        if distinct is not None and len(distinct.rows) >= top:
            bar = min(float(distinct.step_time.step_s[top - 1]), cutoff_s)
            low = estimate_layout_lower_bound_s(problem.model_spec, light, candidates.pp, full,
                                                above_s=bar)
            return np.flatnonzero(low <= bar), low
        size *= 8
    if np.isfinite(cutoff_s):
        low = estimate_layout_lower_bound_s(problem.model_spec, light, candidates.pp, full,
                                            above_s=cutoff_s)
        return np.flatnonzero(low <= cutoff_s), low
    return np.arange(len(candidates)), low
