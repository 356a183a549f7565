"""The layout program's coefficients per kind of layer present, in its integer units
(solver.search.layout_program: time to the microsecond rounded to nearest, memory in KiB rounded
up against a capacity rounded down), for the solvers that work on count vectors of those kinds
(solver.search.layout_two_stages, solver.search.layout_relaxation)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.step.layout_terms import LayoutCoefficients
from solver.search.layout_program import MEMORY_UNIT_BYTES, TIME_UNIT_S, to_units


@dataclass(frozen=True)
class KindTerms:
    """`present`: the kinds the model has; `totals`: its layers of each; `layer_s` (kinds,) and
    `layer_bytes` (pp, kinds) per layer; `base` (pp,); `stage`, `last` time of every stage and
    of the last one; `weight` = m x vpp - 1, so that a layout's objective is
    weight x max_i T_i + sum_i T_i."""

    present: list[int]
    totals: np.ndarray
    layer_s: np.ndarray
    layer_bytes: np.ndarray
    base: np.ndarray
    capacity: int
    stage: int
    last: int
    weight: int

    @classmethod
    def of(cls, co: LayoutCoefficients, capacity_bytes: float) -> KindTerms:
        present = [k for k in range(len(co.layer_s)) if (co.kinds == k).any()]
        return cls(present=present,
                   totals=np.array([(co.kinds == k).sum() for k in present], dtype=np.int64),
                   layer_s=to_units(co.layer_s, TIME_UNIT_S, "nearest")[present],
                   layer_bytes=to_units(co.layer_bytes, MEMORY_UNIT_BYTES, "up")[:, present],
                   base=to_units(co.base_bytes, MEMORY_UNIT_BYTES, "up"),
                   capacity=int(to_units(capacity_bytes, MEMORY_UNIT_BYTES, "down")),
                   stage=int(to_units(co.stage_s, TIME_UNIT_S, "nearest")),
                   last=int(to_units(co.last_s, TIME_UNIT_S, "nearest")),
                   weight=int(round(co.num_micro)) * co.vpp - 1)
