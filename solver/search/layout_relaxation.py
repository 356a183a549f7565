"""A relaxation of the layout program that can prove, before CP-SAT runs, that no layout fits
or beats the bar, and, below a layout CP-SAT found, that none beats it
(solver.search.layout_program).

Without recompute the step time and every stage's memory depend on a layout only through the
layers of each kind each stage holds, C_i (a count vector; solver.cost.step.layout_terms), and the
sum of the stage times is the same for every layout, so a layout at least as fast as the bar
keeps every stage's time under one M. Stage i's layers are its chunks', each chunk a run of
consecutive layers, whose counts are D(y) - D(x) (D the prefix counts by kind). So for every
layout

    C_i  in  S^(chunks of stage i)   (S the set of run counts, S^j its j-fold sums)
    a.C_i + stage_i <= M,  mem_i(C_i) <= capacity,  and  sum_i C_i = n (all the layers).

Where no choice of such C_i adds up to n, no layout exists: a proof, without search, that
CP-SAT took seconds to find or did not find at all. Interleaved block patterns (hybrid models)
over four stages or more are where it matters: kinds in the proportions of the model can be
spread in many ways, but runs of a 5:1 or alternating pattern cannot hold every mix, which is
what CP-SAT's linear relaxation does not see (Nemotron Nano 9B v2 on 8 H100s, pp 4 x vpp 3: the
bar was beaten by no mix of kinds; Nemotron-H 56B at pp 16 or 32: no mix fits the memory).

With full recompute a stage may also recompute some of its layers: its time may then grow
by their recompute time (the sum of stage times only grows, so M stays a bound) and its memory
shrink by what they save; the relaxation lets it recompute any of its layers, fractions
allowed, the most memory saved per unit of time first (a fractional knapsack), plus the working
memory recompute needs. Under one recompute count for every chunk (Megatron's
--recompute-num-layers >= 1) every middle chunk recomputes a layer at least.

The sets are boolean arrays over the lattice of count vectors (0..n_k per kind); sums of sets
are boolean convolutions done by FFT on 0/1 arrays (counts stay below the lattice size, far
inside float64's exact range, and every sum is thresholded back to 0/1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from solver.cost.step.layout_terms import LayoutCoefficients
from solver.search.layout_program import (
    MEMORY_UNIT_BYTES,
    TIME_UNIT_S,
    LayoutRules,
    objective_bound,
    to_units,
)
from solver.search.layout_units import KindTerms
from solver.spec import ParallelConfig

# The largest lattice (count vectors) the relaxation builds; past it the program goes to
# CP-SAT alone. Nemotron-H 56B (54, 54 and 10 layers of three kinds) needs 33,275.
MAX_LATTICE = 400_000
# The most lattice cells times stages whose sets are added up stage by stage (three FFTs of
# about 8 x the lattice each per stage: 100,000 is about 30 ms here); past it the sets are added
# up projected on fewer kinds only.
MAX_CHAINED = 100_000


def applies(config: ParallelConfig, coefficients: LayoutCoefficients) -> bool:
    """Whether the relaxation speaks to this program: two stages or more (two without
    recompute are solved exactly, solver.search.layout_two_stages), layers of more than one
    kind (with one kind CP-SAT's own bounds are exact), a small enough lattice."""
    counts = np.bincount(coefficients.kinds)
    counts = counts[counts > 0]
    return config.pp > 1 and len(counts) > 1 and float(np.prod(counts + 1)) <= MAX_LATTICE


def no_layout_can(config: ParallelConfig, coefficients: LayoutCoefficients,
                  capacity_bytes: float, rules: LayoutRules, below_s: float | None = None
                  ) -> bool:
    """True when the relaxation proves that no layout fits the memory or, with `below_s`, is
    as fast as it (to the time unit). False says nothing."""
    return allowed_stage_sets(config, coefficients, capacity_bytes, rules, below_s) is None


def allowed_stage_sets(config: ParallelConfig, coefficients: LayoutCoefficients,
                       capacity_bytes: float, rules: LayoutRules, below_s: float | None = None
                       ) -> StageSets | None:
    """stage_sets of the layouts that fit and, with `below_s`, are as fast as it; None where
    the relaxation proves there are none."""
    bound = None
    if below_s is not None:
        bound = objective_bound(coefficients, below_s)
        if bound is None:
            return None
    sets = stage_sets(config, coefficients, capacity_bytes, rules, bound)
    return sets if sets is not None and sums_reach_all(sets) else None


def no_layout_within(config: ParallelConfig, coefficients: LayoutCoefficients,
                     capacity_bytes: float, rules: LayoutRules, bound: int | None) -> bool:
    """no_layout_can for a bar in the layout program's objective units: True when no layout
    fits with an objective of at most `bound` (None: any)."""
    sets = stage_sets(config, coefficients, capacity_bytes, rules, bound)
    return sets is None or not sums_reach_all(sets)


@dataclass(frozen=True)
class StageSets:
    """What the relaxation allows each stage to hold: `allowed[i]` a boolean array over the
    lattice of count vectors (0..totals[k] layers of each kind in `present`)."""

    present: list[int]
    totals: np.ndarray
    allowed: list[np.ndarray]

    def vectors(self, stage: int) -> np.ndarray:
        """The count vectors stage `stage` may hold, (count, len(present))."""
        return np.argwhere(self.allowed[stage])


def stage_sets(config: ParallelConfig, coefficients: LayoutCoefficients, capacity_bytes: float,
               rules: LayoutRules, bound: int | None) -> StageSets | None:
    """Per stage, the count vectors it may hold in a layout that fits with an objective of at
    most `bound` (None: any): a sum of its chunks' runs, its time within the slowest stage the
    bound leaves, its memory under the capacity (module docstring); None when some stage may
    hold nothing, or the fixed terms alone pass the bound."""
    co = coefficients
    terms = KindTerms.of(co, capacity_bytes)
    present, totals, a = terms.present, terms.totals, terms.layer_s
    grid = np.indices(tuple(totals + 1)).reshape(len(present), -1).T  # every count vector
    pp, stage, last, capacity = len(terms.base), terms.stage, terms.last, terms.capacity
    num_virtual = pp * config.vpp
    # Under one recompute count for every chunk (>= 1) each middle chunk recomputes a layer.
    forced = rules.recompute and rules.uniform_recompute
    least_recompute_s = int(to_units(co.recompute_s, TIME_UNIT_S, "nearest")[present].min()) \
        if forced else 0
    slowest = np.inf
    if bound is not None:
        # objective = weight x max_i T_i + sum_i T_i, the sum at least its value without
        # recompute, the same for every layout
        total = int(a @ totals) + pp * stage + last + least_recompute_s * (num_virtual - 2)
        if total > bound:
            return None
        slowest = (bound - total) // terms.weight if terms.weight > 0 else np.inf
    kinds = tuple(int(k) for k in co.kinds)
    time_s = grid @ a + stage
    allowed = []
    for i in range(pp):
        chunks = [v for v in range(num_virtual) if v % pp == i]
        held = _run_sums(kinds, tuple(present), len(chunks)).reshape(-1)
        middle = sum(1 for v in chunks if 0 < v < num_virtual - 1) if forced else 0
        spare = slowest - (time_s + (last if i == pp - 1 else 0))
        memory = terms.base[i] + grid @ terms.layer_bytes[i]
        fits = np.zeros(len(grid), dtype=bool) if middle else memory <= capacity
        if rules.recompute:
            working = float(to_units(max(co.working_bytes[i], 0.0), MEMORY_UNIT_BYTES, "up"))
            fits |= memory - _most_saved(co, present, i, grid, spare) + working <= capacity
        mask = held & (spare >= middle * least_recompute_s) & fits
        if not mask.any():
            return None
        allowed.append(mask.reshape(tuple(totals + 1)))
    return StageSets(present=present, totals=totals, allowed=allowed)


def sums_reach_all(sets: StageSets) -> bool:
    """Whether one vector of each stage's set may add up to all the layers: the total layer
    count's least and most first (cheapest), then the sums of the sets projected on fewer
    kinds (a projection of a relaxation is one), the whole lattice last where it is small
    enough. False is a proof that no layout has such stages."""
    allowed, totals = sets.allowed, sets.totals
    pp = len(allowed)
    sizes = np.indices(allowed[0].shape).sum(axis=0)
    least = sum(int(sizes[mask].min()) for mask in allowed)
    most = sum(int(sizes[mask].max()) for mask in allowed)
    if not least <= int(totals.sum()) <= most:
        return False
    axes = range(len(totals))
    for width in range(1, len(totals) + 1):
        for kept in itertools.combinations(axes, width):
            if pp * float(np.prod(totals[list(kept)] + 1)) > MAX_CHAINED:
                continue
            dropped = tuple(k for k in axes if k not in kept)
            if not _sums_reach([mask.any(axis=dropped) for mask in allowed],
                               tuple(totals[list(kept)])):
                return False
    return True


def _most_saved(co: LayoutCoefficients, present: list[int], stage: int, grid: np.ndarray,
                spare: np.ndarray) -> np.ndarray:
    """The most memory stage `stage` can save by recomputing layers of its counts `grid`
    within `spare` time units (any layers, fractions allowed: a relaxation of the program's
    first-r-of-each-chunk rule), in the program's units, before the working memory recompute
    needs."""
    cost = to_units(co.recompute_s, TIME_UNIT_S, "nearest")[present].astype(float)
    gain = -to_units(co.recompute_bytes[stage], MEMORY_UNIT_BYTES, "up")[present].astype(float)
    left = np.maximum(spare, 0).astype(float)
    saved = np.zeros(len(grid))
    # Fractional knapsack: the kinds that save most per unit of time first.
    for k in sorted(np.flatnonzero(gain > 0), key=lambda k: -gain[k] / max(cost[k], 1e-9)):
        layers = grid[:, k] if cost[k] <= 0 else np.minimum(grid[:, k], left / cost[k])
        saved += layers * gain[k]
        left = left - layers * max(cost[k], 0.0)
    return saved


def _sums_reach(sets: list[np.ndarray], target: tuple[int, ...]) -> bool:
    """Whether one vector of each set adds up to `target` (sets over one lattice)."""
    reached = np.zeros(sets[0].shape, dtype=bool)
    reached[(0,) * reached.ndim] = True
    for allowed in sets:
        reached = _sum_sets(reached, allowed)
        if not reached.any():
            return False
    return bool(reached[target])


@lru_cache(maxsize=64)
def _run_sums(kinds: tuple[int, ...], present: tuple[int, ...], parts: int) -> np.ndarray:
    """S^parts: the count vectors that `parts` runs of consecutive layers (empty allowed) can
    hold together, as a boolean array over the lattice."""
    order = np.asarray(kinds)
    prefix = np.zeros((len(order) + 1, len(present)), dtype=np.int64)
    for j, kind in enumerate(present):
        prefix[1:, j] = np.cumsum(order == kind)
    shape = tuple(int(n) + 1 for n in prefix[-1])
    starts, ends = np.triu_indices(len(order) + 1)
    runs = np.zeros(shape, dtype=bool)
    runs[tuple((prefix[ends] - prefix[starts]).T)] = True
    held = runs
    for _ in range(parts - 1):
        held = _sum_sets(held, runs)
    return held


def _sum_sets(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """{x + y : x in first, y in second} within the lattice (boolean arrays of one shape)."""
    shape = first.shape
    size, axes = tuple(2 * n - 1 for n in shape), tuple(range(first.ndim))
    product = np.fft.irfftn(np.fft.rfftn(first.astype(float), size, axes)
                            * np.fft.rfftn(second.astype(float), size, axes), size, axes)
    return product[tuple(slice(0, n) for n in shape)] > 0.5
