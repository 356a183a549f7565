"""Twin plans: plans of one mesh and schedule that take the same step time and differ only in
- recompute none vs selective (FlashAttention keeps no attention scores, so selective
  recompute adds no time; it saves a little memory or none), or
- the ZeRO stage where the data-parallel group it shards over has one rank (dp x cp = 1:
  Megatron's distributed optimizer and FSDP shard over DP x CP, solver.cost.memory.states;
  issue 39: Llama 3.1 70B on 8 H100 listed zero 0 and zero 1 at pp 8, dp 1 as #1 and #2 with
  the same numbers).
A top-K lists the first of such twins, in the ranking's order, and names the others as
equivalent settings, so that it holds K distinct plans.

The later twin is never better: same step time, and it comes later in the order (step time,
worst-stage memory, degrees), so it needs at least as much memory. A plan has at most
TWINS_PER_PLAN - 1 twins (4 ZeRO stages x none / selective), so the TWINS_PER_PLAN x K first
plans of a ranking hold K distinct ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.search.space import VARIABLES

# Step times are compared to the nanosecond (a step takes milliseconds at least).
STEP_DECIMALS = 9
# Rows of a ranking that surely hold K distinct plans: TWINS_PER_PLAN x K (ZeRO 0-3 at
# dp x cp = 1, each with recompute none and selective).
TWINS_PER_PLAN = 8

assert VARIABLES[-1] == "recompute"
MESH = VARIABLES[:-1]
_CP, _DP, _ZERO = (MESH.index(name) for name in ("cp", "dp", "zero"))


def twin_mesh(mesh: Sequence[int]) -> tuple[int, ...]:
    """The mesh as twins share it: the ZeRO stage left out (-1) where dp x cp = 1, as it
    shards over a group of one rank."""
    key = tuple(int(v) for v in mesh)
    if key[_CP] * key[_DP] == 1:
        return key[:_ZERO] + (-1,) + key[_ZERO + 1:]
    return key


def group_twins(seconds: Sequence[float], meshes: Sequence[tuple[int, ...]],
                recompute: Sequence[int]) -> list[list[int]]:
    """Positions of a ranking (best first) grouped into distinct plans: each group starts with
    the plan kept and lists the later positions that are its twins."""
    groups: list[list[int]] = []
    where: dict[tuple, int] = {}
    for position, (step_s, mesh, code) in enumerate(zip(seconds, meshes, recompute)):
        key = (twin_mesh(mesh), int(code) == RECOMPUTE_FULL, round(float(step_s), STEP_DECIMALS))
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
