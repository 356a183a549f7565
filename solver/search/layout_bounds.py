"""The memory-aware lower bound of the layout search (solver.search.layout_search, step 2):
for each candidate, whether some layout of its layers can fit at all, the fewest layers that
must then recompute in full, and a lower bound of the step time of a layout that fits, from a
relaxation of the layout program's memory rows (estimate_memory_bounds).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.step.layout_terms import estimate_stage_memory_coefficients
from solver.cost.memory.layout import layer_kinds, num_layer_kinds
from solver.search.constraints import memory_capacity_bytes
from solver.search.limits import Deadline
from solver.search.space import Problem

# Frameworks that recompute one count of layers in every chunk (--recompute-num-layers).
UNIFORM_RECOMPUTE_FRAMEWORKS = ("megatron", "torchtitan", "deepspeed")


def estimate_memory_bounds(problem: Problem, candidates: Candidates, times: dict[str, np.ndarray],
                           below_s: float = np.inf, deadline: Deadline | None = None
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per candidate: whether some layout can fit at all, the fewest layers that must then
    recompute in full, and a lower bound of the step time of a layout that fits, inf where
    no layout can be as fast as `below_s` (the bound times 1 - 1e-9 above it: only the others
    are bisected). Past `deadline` (solver.search.limits) the bisections stop where they
    are: the bound is looser, still a bound.

    A relaxation of the layout program's memory rows: stage i holds its empty-stage bytes
    base_i plus, per layer of kind k, c_ik (its in-flight micro-batches included), or e_ik when
    the layer recomputes in full; the working set of a recompute only adds memory, so leaving
    it out keeps the bounds.
    - fits: the room the stages leave, sum_i (capacity - base_i), holds every layer at the
      least it costs anywhere (recomputing where the configuration may), and the stages hold
      every layer however long the slowest takes (sum_i n_i(infinity) >= L, below).
    - recomputed: the layers that do not fit that way without recompute need recomputed layers
      that each save at most max (c - e).
    - time: with the layers of the model's last kind at their costs (a seconds, b more to
      recompute, c and e bytes) and its D layers of other kinds free, stage i within M seconds
      holds at most n_i(M) = min(room_i / c_i, (M - x_i) / a) layers of the last kind, or
      with recompute min(room_i / e_i, (M - x_i + b room_i / (c_i - e_i)) / (a + b c_i /
      (c_i - e_i))) beyond room_i / c_i; the slowest stage M is at least the least M with
      D + sum_i floor(n_i(M)) >= L (bisection; a stage holds whole layers), x_i the stage's
      own seconds (its share, the head).
      Under one recompute count R for every chunk (the framework's rule), a stage of n layers
      recomputes at least min(R, n) of them (time) and at most min(n, vpp R) (memory), the
      same R on every stage: n_i(M) for each R, and the best R."""
    model_spec, job, n = problem.model_spec, problem.job, len(candidates)
    if n == 0:
        return np.zeros(0, dtype=bool), np.zeros(0), np.zeros(0)
    # One row per (candidate, stage), candidate by candidate (no n x max(pp) intermediate).
    row = np.repeat(np.arange(n), candidates.pp)
    starts = np.cumsum(candidates.pp) - candidates.pp
    stage = np.arange(len(row)) - starts[row]
    rows = candidates.take(row)
    memory = estimate_stage_memory_coefficients(model_spec, job, rows, stage,
                                                problem.memory_options)
    is_last = stage == rows.pp - 1
    base = memory.base_bytes
    # A layer of kind k costs layer_bytes (plain) or layer_bytes + recompute_bytes (recomputed).
    counts = np.bincount(layer_kinds(model_spec),
                         minlength=num_layer_kinds(model_spec)).astype(float)
    full = (candidates.recompute == RECOMPUTE_FULL)[row]
    least_plain, least_any, saving = np.zeros(n), np.zeros(n), np.zeros(n)
    for kind in np.flatnonzero(counts):
        plain = memory.layer_bytes[:, kind]
        recomputed = plain + memory.recompute_bytes[:, kind]
        cheapest_plain = np.full(n, np.inf)
        cheapest_any = np.full(n, np.inf)
        np.minimum.at(cheapest_plain, row, plain)
        np.minimum.at(cheapest_any, row, np.where(full, np.minimum(plain, recomputed), plain))
        least_plain += counts[kind] * cheapest_plain
        least_any += counts[kind] * cheapest_any
        np.maximum.at(saving, row, np.where(full, plain - recomputed, 0.0))
    capacity = memory_capacity_bytes(problem) * (1 + 1e-9)
    room = np.maximum(capacity - base, 0.0)
    total_room = np.bincount(row, weights=room, minlength=n)
    over = np.bincount(row, weights=(base > capacity).astype(float), minlength=n) > 0
    fits = ~over & (total_room >= least_any * (1 - 1e-9))
    recompute_count = np.where(saving > 0, np.maximum(least_plain - total_room, 0.0)
                               / np.maximum(saving, 1e-30), 0.0)

    # The model's last kind of layer at its own costs, the D layers of other kinds for free.
    tail = int(layer_kinds(model_spec)[-1])
    others = float(counts.sum() - counts[tail])
    cost = memory.layer_bytes[:, tail]
    kept = cost + memory.recompute_bytes[:, tail]
    a = times["layer_s"][row, tail]
    b = times["recompute_s"][row, tail]
    own = times["stage_s"][row] + np.where(is_last, times["last_s"][row], 0.0)
    free = room / np.maximum(cost, 1e-30)  # layers that fit without recompute
    gain = np.maximum(cost - kept, 0.0)
    most = np.where(full & (gain > 0), room / np.maximum(kept, 1e-30), free)
    slope = np.where(gain > 0, a + b * cost / np.maximum(gain, 1e-30), np.inf)
    num_layers = model_spec.num_hidden_layers

    counts_r = np.arange(1, num_layers + 1, dtype=float)[None, :]  # R = 1 .. L

    def plain_held(idx: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """held(slowest): per candidate, the layers the stage rows `idx` (whole candidates)
        hold with the slowest stage within `slowest` (per candidate), each stage recomputing
        as it needs; the other kinds' D layers included (others)."""
        r, own_i, free_i, a_i = row[idx], own[idx], free[idx], a[idx]
        most_i, slope_i = most[idx], slope[idx]
        recomputing = full[idx] & (gain[idx] > 0)
        extra = b[idx] * room[idx] / np.maximum(gain[idx], 1e-30)

        def held(slowest: np.ndarray) -> np.ndarray:
            budget = np.maximum(slowest[r] - own_i, 0.0)
            layers = np.where(recomputing & (budget > a_i * free_i),
                              np.minimum(most_i, (budget + extra) / slope_i),
                              np.minimum(free_i, budget / a_i))
            layers = np.floor(layers + 1e-9)  # a stage holds whole layers
            return np.bincount(r, weights=layers, minlength=n) + others
        return held

    def uniform_held(idx: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
        """plain_held under one recompute count R for every chunk, the best R: a stage of n
        layers then recomputes at least min(R, n) of them (time) and at most min(n, vpp R)
        (memory)."""
        r, own_i = row[idx], own[idx]
        chunks_r = candidates.vpp[r][:, None] * counts_r
        plain_cost, kept_cost = cost[idx][:, None], np.maximum(kept[idx], 1e-30)[:, None]
        room_i, gain_i = room[idx][:, None], gain[idx][:, None]
        by_memory = np.where(kept_cost * chunks_r >= room_i, room_i / kept_cost,
                             chunks_r + (room_i + gain_i * chunks_r - plain_cost * chunks_r)
                             / np.maximum(plain_cost, 1e-30))
        step, extra = a[idx][:, None], b[idx][:, None]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])

        def held(slowest: np.ndarray) -> np.ndarray:
            left = np.maximum(slowest[r] - own_i, 0.0)[:, None]
            by_time = np.where((step + extra) * counts_r >= left, left / (step + extra),
                               counts_r + (left - (step + extra) * counts_r) / step)
            layers = np.floor(np.minimum(by_memory, by_time) + 1e-9)  # whole layers per stage
            totals = np.full(n, others)
            totals[r[starts]] += np.add.reduceat(layers, starts, axis=0).max(axis=1)
            return totals
        return held

    top = np.full(n, float(num_layers)) * (times["layer_s"].max(axis=1)
                                           + times["recompute_s"].max(axis=1)) \
        + times["stage_s"] + times["last_s"]
    # However long the slowest stage: the stages' room must hold every layer.
    fits &= plain_held(np.arange(len(row)))(top) >= num_layers * (1 - 1e-9)

    spent = np.maximum(candidates.recompute == RECOMPUTE_FULL,
                       np.floor(recompute_count * (1 - 1e-9)))
    pp = candidates.pp
    layer_s = times["layer_s"] @ counts
    cheapest_recompute = np.where(counts[None, :] > 0, times["recompute_s"], np.inf).min(axis=1)
    total_s = layer_s + pp * times["stage_s"] + times["last_s"] + spent * cheapest_recompute
    weight = times["num_micro"] - 1 / times["vpp"]

    def bound_s(least: np.ndarray) -> np.ndarray:
        slowest = np.maximum(least, total_s / pp)
        return times["num_micro"] * slowest + (total_s - slowest) / times["vpp"] + times["fixed_s"]

    # The slowest stage at which the bound reaches the bar (the bound is (m - 1/v) M + ... from
    # M = total / pp on; as the caller tests it: times 1 - 1e-9). A candidate whose stages
    # cannot hold the layers within it cannot reach the bar: only the others are bisected,
    # below it.
    with np.errstate(divide="ignore", invalid="ignore"):
        reach = below_s / (1 - 1e-9) - times["fixed_s"] - total_s / times["vpp"]
        at_bar = np.where(weight > 0, reach / weight, np.where(reach >= 0, np.inf, -np.inf))
    at_bar = np.where(at_bar >= total_s / pp, np.minimum(at_bar, top), -np.inf)

    def least_slowest(held: Callable[[np.ndarray], np.ndarray], chosen: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
        """The bisection of the least slowest stage of the `chosen` candidates (0 for the
        others), and which chosen ones cannot reach the bar."""
        beaten = chosen & (at_bar < 0)
        if np.isfinite(below_s):
            beaten |= chosen & (held(np.maximum(at_bar, 0.0)) < num_layers)
        chosen = chosen & ~beaten
        low, high = np.zeros(n), np.where(chosen, at_bar, top)
        for _ in range(BISECTIONS):
            if deadline is not None and deadline.passed():
                break
            middle = (low + high) / 2
            enough = held(middle) >= num_layers
            high = np.where(chosen & enough, middle, high)
            low = np.where(chosen & ~enough, middle, low)
        return low, beaten

    low, beaten = least_slowest(plain_held(np.flatnonzero(fits[row])), fits)
    bound = np.where(beaten, np.inf, bound_s(low))
    if problem.framework in UNIFORM_RECOMPUTE_FRAMEWORKS and np.isfinite(below_s):
        # Where the bound above (each stage recomputing as it needs) still reaches the bar,
        # the one count R every chunk takes: a second bisection, on those rows only.
        pick = fits & (candidates.recompute == RECOMPUTE_FULL) & (bound <= below_s)
        if pick.any():
            low, beaten = least_slowest(uniform_held(np.flatnonzero(pick[row])), pick)
            bound = np.where(beaten, np.inf, np.maximum(bound, bound_s(low)))
    return fits, spent, bound * (1 - 1e-9)


# Halvings of the slowest stage's time range in estimate_memory_bounds (2^-24 of it: the time of
# the whole model on one stage, so about pp x 6e-8 of the bound).
BISECTIONS = 24
