"""Whether anything fits: the leanest schedules of each mesh (no other schedule of it needs
less memory), and any_feasible, which checks memory on those alone (the fixes of an
infeasible problem ask it once per change; solver.search.explain and the layout search's
fit test read the leanest schedules too).
"""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.distinct import distinct_rows
from solver.cost.memory import estimate_memory_total
from solver.search.constraints import memory_capacity_bytes
from solver.search.enumerate import enumerate_feasible, rules_but_memory
from solver.search.space import VARIABLES, Problem

# Candidates whose memory any_feasible checks first (then 4x, 16x, ... more at a time).
FEASIBILITY_CHUNK = 4096


LEAN_AXES = ("micro_batch", "recompute")


def leanest_schedules(candidates: Candidates,
                      along: tuple[str, ...] = LEAN_AXES) -> np.ndarray:
    """The rows whose memory no other row undercuts for certain among those that differ only
    in `along` (some of LEAN_AXES; default both: per mesh and ZeRO stage): memory never rises
    with the recompute level and never falls with the micro-batch
    (tests/test_memory_properties.py), so a row is dominated by one that recomputes at least
    as much with a micro-batch at most as large. Along both: per group and recompute level,
    the least micro-batch, kept where no higher level has one as small; along one: the highest
    recompute level, or the least micro-batch, of each group. The least memory over these rows
    is the least over all rows."""
    if len(candidates) == 0 or not along:
        return np.arange(len(candidates))
    names = tuple(n for n in VARIABLES if n not in along)
    _, group = distinct_rows({n: getattr(candidates, n) for n in names}, names)
    if len(along) == 1:
        value = getattr(candidates, along[0])
        sign = 1 if along[0] == "recompute" else -1
        best = np.full(int(group.max()) + 1, np.iinfo(np.int64).min)
        np.maximum.at(best, group, sign * value)
        return np.flatnonzero(sign * value == best[group])
    levels = int(candidates.recompute.max()) + 1
    least = np.full((int(group.max()) + 1, levels), np.iinfo(np.int64).max)
    np.minimum.at(least, (group, candidates.recompute), candidates.micro_batch)
    # The least micro-batch among the strictly higher levels of the same group.
    above = np.full_like(least, np.iinfo(np.int64).max)
    for level in range(levels - 2, -1, -1):
        above[:, level] = np.minimum(above[:, level + 1], least[:, level + 1])
    keep = ((candidates.micro_batch == least[group, candidates.recompute])
            & (candidates.micro_batch < above[group, candidates.recompute]))
    return np.flatnonzero(keep)


def any_feasible(problem: Problem) -> bool:
    """Whether some candidate meets every constraint: the structural and framework rules by
    enumeration, then memory on the leanest schedules of each mesh (leanest_schedules: if
    none of them fits, nothing does) in chunks that grow fourfold, the most sharded
    candidates (last in the enumeration order) first, stopping at the first that fits."""
    return any_even_split_fits(problem, enumerate_feasible(problem, rules_but_memory(problem)))


def any_even_split_fits(problem: Problem, candidates: Candidates) -> bool:
    """Whether the even split of some of `candidates` fits (any_feasible's memory check)."""
    candidates = candidates.take(leanest_schedules(candidates))
    capacity = memory_capacity_bytes(problem)
    end, chunk = len(candidates), FEASIBILITY_CHUNK
    while end > 0:
        rows = candidates.take(np.arange(max(end - chunk, 0), end))
        memory = estimate_memory_total(problem.model_spec, problem.job, rows,
                                 problem.memory_options)[0]
        if (memory <= capacity).any():
            return True
        end, chunk = end - chunk, chunk * 4
    return False
