"""Twin plans: plans of one mesh and schedule that differ only in recompute none vs selective
and take the same step time (FlashAttention keeps no attention scores, so selective recompute
adds no time; it saves a little memory or none). A top-K lists the first of such twins, in the
ranking's order, and names the others as equivalent settings, so that it holds K distinct plans.

The later twin is never better: same step time, and it comes later in the order (step time,
worst-stage memory, degrees), so it needs at least as much memory. Each plan has at most one
twin (the other of none / selective), so the 2K first plans of a ranking hold K distinct ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.search.space import VARIABLES

# Step times are compared to the nanosecond (a step takes milliseconds at least).
STEP_DECIMALS = 9
# Rows of a ranking that surely hold K distinct plans: TWINS_PER_PLAN x K.
TWINS_PER_PLAN = 2

assert VARIABLES[-1] == "recompute"
MESH = VARIABLES[:-1]


def group_twins(seconds: Sequence[float], meshes: Sequence[tuple[int, ...]],
                recompute: Sequence[int]) -> list[list[int]]:
    """Positions of a ranking (best first) grouped into distinct plans: each group starts with
    the plan kept and lists the later positions that are its twins."""
    groups: list[list[int]] = []
    where: dict[tuple, int] = {}
    for position, (step_s, mesh, code) in enumerate(zip(seconds, meshes, recompute)):
        key = (tuple(mesh), int(code) == RECOMPUTE_FULL, round(float(step_s), STEP_DECIMALS))
        if key in where:
            groups[where[key]].append(position)
        else:
            where[key] = len(groups)
            groups.append([position])
    return groups


def group_candidate_twins(candidates: Candidates, rows: np.ndarray,
                          seconds: np.ndarray) -> list[list[int]]:
    """group_twins of `rows` of `candidates` (best first), `seconds` their step times."""
    meshes = np.stack([getattr(candidates, n)[rows] for n in MESH], axis=1).tolist()
    return group_twins(seconds, meshes, candidates.recompute[rows])
