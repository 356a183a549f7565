"""The layout of two pipeline stages without recompute, exactly, by dynamic programming.

With pp = 2 and no layer recomputing, the step time and both stages' memory depend on the
layout only through the layers of each kind that stage 0 holds, a count vector c (stage 1
holds the rest, n - c): T_0 = a.c + stage, T_1 = a.(n - c) + stage + last, mem_i affine in
the same counts (solver.cost.step.layout_terms). So the layout question splits in two:

1. which count vectors some layout realises: the V = 2 vpp chunks cut the layers in model
   order, chunk v runs on stage v % 2, the first and last chunks may be empty and the others
   hold a layer at least. The sets f_v(B) of stage 0's counts over chunks 0..v, with chunk v
   ending at layer boundary B, follow chunk by chunk: a chunk of stage 1 carries the set over
   (f_v(B) = union of f_{v-1}(B') for B' <= B - low_v), a chunk of stage 0 adds its layers,
   D(B) - D(B') (D the prefix counts by kind), done for every B at once by anchoring the sets
   at D(B');
2. which realisable vector is best: every vector is costed at once (numpy), in the layout
   program's integer units and objective (solver.search.layout_program), so the answer, its
   objective and its bar test are the program's; of equal objectives the one whose fuller
   stage needs less memory, then the least vector, wins.

The layout is read back from the stored sets, each boundary as near the even split as the
chosen vector allows. This answers, in milliseconds and proven, the programs CP-SAT found
hardest: interleaved block patterns (hybrid models) over two stages with many virtual stages,
where proving that no other mix of kinds balances the stages better took it seconds
(Nemotron-H 8B, pp 2 x vpp 3: 3.5 deterministic seconds).
"""

from __future__ import annotations

import numpy as np

from solver.cost.step.layout_terms import LayoutCoefficients
from solver.cost.memory.layout import layout_layer_counts
from solver.search.layout_program import (
    LayoutAnswer,
    LayoutRules,
    build_layout,
    objective_bound,
)
from solver.search.layout_units import KindTerms
from solver.spec import ParallelConfig

# The most booleans one chunk's sets may take ((L + 1) x the anchored lattice of counts); a
# program past it goes to CP-SAT. Nemotron-H 56B (118 layers, three kinds) needs 3e7.
MAX_CELLS = 60_000_000


def answers_two_stages(config: ParallelConfig, coefficients: LayoutCoefficients,
                       rules: LayoutRules) -> bool:
    """Whether solve_two_stages answers this program (two stages, no recompute, small enough
    sets)."""
    if config.pp != 2 or rules.recompute:
        return False
    counts = np.bincount(coefficients.kinds)
    counts = counts[counts > 0]
    return (len(coefficients.kinds) + 1) * float(np.prod(2 * counts + 1)) <= MAX_CELLS


def solve_two_stages(config: ParallelConfig, coefficients: LayoutCoefficients,
                     capacity_bytes: float, rules: LayoutRules, below_s: float | None = None
                     ) -> LayoutAnswer | None:
    """The best layout (module docstring), or None when none fits the memory or, with
    `below_s`, none is as fast (to the time unit). Always proven."""
    co = coefficients
    present = [k for k in range(len(co.layer_s)) if (co.kinds == k).any()]
    num_layers, num_virtual = len(co.kinds), 2 * config.vpp
    prefix = np.zeros((num_layers + 1, len(present)), dtype=np.int64)
    for j, kind in enumerate(present):
        prefix[1:, j] = np.cumsum(co.kinds == kind)
    totals = prefix[-1]
    sets = _realisable(prefix, num_virtual)
    chosen = _best_counts(co, totals, sets[-1][num_layers], capacity_bytes, below_s)
    if chosen is None:
        return None
    counts, objective = chosen
    layers = _read_back(prefix, sets, counts)
    layout = build_layout(config, layers, [0] * num_virtual, rules.mtp_layers)
    stage_layers, stage_recompute = layout_layer_counts(co.kinds, layout, len(co.layer_s))
    return LayoutAnswer(layout=layout, step_s=co.step_s(stage_layers, stage_recompute),
                        memory_bytes=co.memory_bytes(stage_layers, stage_recompute),
                        status="optimal", objective=objective)


def _low(v: int, num_virtual: int) -> int:
    """The fewest layers chunk v holds."""
    return 0 if v in (0, num_virtual - 1) else 1


def _realisable(prefix: np.ndarray, num_virtual: int) -> list[np.ndarray]:
    """f_v for v = 0..V-1 as boolean arrays (L + 1, *lattice): f_v[B][c] whether chunks 0..v,
    the last ending at boundary B, can give stage 0 the counts c."""
    num_layers, totals = len(prefix) - 1, prefix[-1]
    lattice = tuple(int(n) + 1 for n in totals)
    first = np.zeros((num_layers + 1, *lattice), dtype=bool)
    first[(np.arange(num_layers + 1), *prefix.T)] = True
    sets = [first]
    for v in range(1, num_virtual):
        low, previous = _low(v, num_virtual), sets[-1]
        current = np.zeros_like(previous)
        if v % 2:  # stage 1: stage 0's counts carry over
            carried = np.logical_or.accumulate(previous, axis=0)
            current[low:] = carried[:num_layers + 1 - low]
        else:      # stage 0: add D(B) - D(B'), anchored at D(B')
            anchored = np.zeros(tuple(2 * n - 1 for n in lattice), dtype=bool)
            for boundary in range(low, num_layers + 1):
                source = boundary - low
                anchored[_window(totals, prefix[source])] |= previous[source]
                current[boundary] = anchored[_window(totals, prefix[boundary])]
        sets.append(current)
    return sets


def _window(totals: np.ndarray, at: np.ndarray) -> tuple[slice, ...]:
    """The anchored lattice's cells of counts c (0 <= c <= totals) relative to D = `at`: cell
    c - at + totals."""
    return tuple(slice(int(n - d), int(2 * n - d + 1)) for n, d in zip(totals, at))


def _best_counts(co: LayoutCoefficients, totals: np.ndarray, realisable: np.ndarray,
                 capacity_bytes: float, below_s: float | None
                 ) -> tuple[np.ndarray, int] | None:
    """The best realisable count vector of stage 0 and its objective (module docstring)."""
    counts = np.argwhere(realisable).astype(np.int64)  # lexicographic order
    if len(counts) == 0:
        return None
    rest = totals - counts
    terms = KindTerms.of(co, capacity_bytes)
    first_s = counts @ terms.layer_s + terms.stage
    second_s = rest @ terms.layer_s + terms.stage + terms.last
    first_b = terms.base[0] + counts @ terms.layer_bytes[0]
    second_b = terms.base[1] + rest @ terms.layer_bytes[1]
    objective = terms.weight * np.maximum(first_s, second_s) + first_s + second_s
    capacity = terms.capacity
    allowed = (first_b <= capacity) & (second_b <= capacity)
    if below_s is not None:
        bound = objective_bound(co, below_s)
        if bound is None:
            return None
        allowed &= objective <= bound
    if not allowed.any():
        return None
    rows = np.flatnonzero(allowed)
    order = np.lexsort((rows, np.maximum(first_b, second_b)[rows], objective[rows]))
    best = rows[order[0]]
    return counts[best], int(objective[best])


def _read_back(prefix: np.ndarray, sets: list[np.ndarray], counts: np.ndarray) -> list[int]:
    """Layers per chunk of a layout giving stage 0 `counts`: from the last chunk back, each
    boundary the one nearest the even split whose set still holds the counts left."""
    num_layers, num_virtual = len(prefix) - 1, len(sets)
    boundaries = [num_layers] * num_virtual
    left = counts.copy()
    for v in range(num_virtual - 1, 0, -1):
        end, low = boundaries[v], _low(v, num_virtual)
        starts = np.arange(end - low + 1)
        if v % 2 == 0:  # chunk v on stage 0 held D(end) - D(start)
            needed = left[None, :] - (prefix[end] - prefix[starts])
            valid = (needed >= 0).all(axis=1)
        else:
            needed, valid = np.broadcast_to(left, (len(starts), len(left))), \
                np.ones(len(starts), dtype=bool)
        cells = np.clip(needed, 0, None)
        valid &= sets[v - 1][(starts, *cells.T)]
        ideal = num_layers * v / num_virtual
        start = int(min(starts[valid], key=lambda s: (abs(s - ideal), s)))
        boundaries[v - 1] = start
        left = needed[start].copy()
    edges = [0, *boundaries]
    return [edges[v + 1] - edges[v] for v in range(num_virtual)]
