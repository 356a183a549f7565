"""What the units of a layout program (solver.search.layout_program) hold of each kind of
layer, as CP-SAT expressions: the layers of each kind from element lookups of the prefix counts
at the unit boundaries (add_kind_counts), and the tables of the count vectors each stage may
hold (add_stage_tables)."""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

# The most rows a stage's table of allowed count vectors may have (solve_layout's
# `stage_tables`); Nemotron-H 8B's hardest programs have a few hundred.
MAX_TABLE_ROWS = 20_000


def _prefix_counts(kinds: np.ndarray, kind: int) -> list[int]:
    """D_k(x) for x = 0..L: layers of kind `kind` among the first x."""
    return [0] + np.cumsum(kinds == kind).astype(int).tolist()


def _band(table: list[int]) -> tuple[int, int]:
    """The least and most of L D(x) - D(L) x over x = 0..L for a prefix count table D."""
    num_layers, total = len(table) - 1, table[-1]
    gaps = [num_layers * value - total * x for x, value in enumerate(table)]
    return min(gaps), max(gaps)


def add_kind_counts(program: cp_model.CpModel, kinds: np.ndarray, present: list[int],
                    n: list, bounds: list, r: list) -> tuple[dict, dict]:
    """c_kv and q_kv of solver.search.layout_program's docstring; with one kind of layer, n_v
    and r_v. From the layer where the kinds stop changing on, D_k is linear: a boundary that
    cannot fall before it (B_v >= v: every middle chunk holds a layer) needs no element
    lookup."""
    if len(present) == 1:
        return {present[0]: n}, {present[0]: r}
    num_layers = len(kinds)
    changes = np.flatnonzero(kinds[1:] != kinds[:-1])
    tail_from = int(changes[-1]) + 1 if len(changes) else 0
    tail_kind = int(kinds[-1])

    def prefix(kind: int, table: list[int], position, least: int, name: str):
        """D_kind(position) for an expression known to be >= least."""
        if least >= tail_from:
            slope = 1 if kind == tail_kind else 0
            return table[tail_from] + slope * (position - tail_from)
        value = program.new_int_var(0, num_layers, name)
        index = position
        if not isinstance(position, cp_model.IntVar):
            index = program.new_int_var(0, num_layers, f"i_{name}")
            program.add(index == position)
        program.add_element(index, table, value)
        # D_k stays within a band around the line through its ends: L D_k(x) - n_k x lies in
        # [low, high] for every x (n_k = D_k(L)). Exact, and it gives the LP a slope where
        # the element lookup gives none: interleaved kinds (hybrid models) then prove fast.
        low, high = _band(table)
        program.add(num_layers * value - table[-1] * index >= low)
        program.add(num_layers * value - table[-1] * index <= high)
        return value

    # Every layer is of some kind, so sum_k D_k(x) = x: the most common kind's counts follow
    # from the others' without lookups of their own (exact, fewer element constraints).
    derived = max(present, key=lambda k: int((kinds == k).sum()))
    looked_up = [kind for kind in present if kind != derived]
    ends: dict[int, list] = {}
    starts: dict[int, list] = {}  # D_k at each chunk's first layer past its recomputed ones
    for kind in looked_up:
        table = _prefix_counts(kinds, kind)
        ends[kind] = [prefix(kind, table, boundary, v, f"d{kind}_{v}")
                      for v, boundary in enumerate(bounds)]
        starts[kind] = [None if isinstance(r[v], int) else
                        prefix(kind, table, (bounds[v - 1] if v else 0) + r[v], max(v - 1, 0),
                               f"q{kind}_{v}")
                        for v in range(len(n))]
    ends[derived] = [bounds[v] - sum(ends[k][v] for k in looked_up) for v in range(len(n))]
    starts[derived] = [None if isinstance(r[v], int) else
                       (bounds[v - 1] if v else 0) + r[v] - sum(starts[k][v] for k in looked_up)
                       for v in range(len(n))]
    counts: dict[int, list] = {}
    recomputed: dict[int, list] = {}
    for kind in present:
        counts[kind] = [ends[kind][v] - (ends[kind][v - 1] if v else 0) for v in range(len(n))]
        recomputed[kind] = [0 if starts[kind][v] is None
                            else starts[kind][v] - (ends[kind][v - 1] if v else 0)
                            for v in range(len(n))]
    return counts, recomputed


def add_stage_tables(program: cp_model.CpModel, stages: list[int], counts: dict,
                     present: list[int], tables: list[np.ndarray]) -> None:
    """Each stage's layers of each kind (`counts`, add_kind_counts' first answer), one row of
    its table (solver.search.layout_program.solve_layout's `stage_tables`); a table past
    MAX_TABLE_ROWS is left out (the program stays exact without it). `stages`: each unit's
    stage."""
    for stage, table in enumerate(tables):
        if len(table) > MAX_TABLE_ROWS:
            continue
        held = [i for i, unit_stage in enumerate(stages) if unit_stage == stage]
        sums = []
        for column, kind in enumerate(present):
            total = program.new_int_var(int(table[:, column].min()),
                                        int(table[:, column].max()), f"s{stage}_{kind}")
            program.add(total == sum(counts[kind][i] for i in held))
            sums.append(total)
        program.add_allowed_assignments(sums, table.tolist())
