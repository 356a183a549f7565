"""Phase 1 of solve_cpsat (solver.search.cpsat): good plans from the float model alone, to
set the threshold under which CP-SAT then enumerates. A grid of GPU splits under a few cheap
schedules, then a best-first neighbourhood search, each round one vectorised batch.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from solver.search.cpsat_program import Program
from solver.search.space import VARIABLES

if TYPE_CHECKING:
    from solver.search.cpsat import _Search

LOCAL_SEARCH_BEAM = 8


def neighbours(program: Program, config: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Configurations one step away: one variable changed (dp follows from the GPU count), or
    a prime factor moved between two of tp, cp, pp, dp."""
    domains, n_gpus = program.lattice.domains, program.problem.num_gpus
    base = dict(zip(VARIABLES, config))
    out = []

    def add(values: dict[str, int]) -> None:
        split = values["tp"] * values["cp"] * values["pp"]
        if n_gpus % split:
            return
        values = {**values, "dp": n_gpus // split}
        if all(values[v] in domains[v] for v in VARIABLES):
            out.append(tuple(values[v] for v in VARIABLES))

    for v in VARIABLES:
        if v == "dp":
            continue
        for value in domains[v]:
            if value != base[v]:
                add({**base, v: value})
    mesh = ("tp", "cp", "pp", "dp")
    for q in program.lattice.primes:
        for a in mesh:
            for b in mesh:
                if a != b and base[b] % q == 0:
                    moved = {**base, a: base[a] * q, b: base[b] // q}
                    if all(moved[v] in domains[v] for v in mesh):
                        out.append(tuple(moved[v] for v in VARIABLES))
    return out


SCHEDULE = ("vpp", "micro_batch", "zero", "recompute")


def schedules(program: Program, config: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The configuration with every combination of the schedule variables (vpp, micro-batch,
    ZeRO stage, recompute) on the same GPU split."""
    domains = program.lattice.domains
    base = dict(zip(VARIABLES, config))
    out = []
    for values in itertools.product(*(domains[v] for v in SCHEDULE)):
        row = {**base, **dict(zip(SCHEDULE, values))}
        out.append(tuple(row[v] for v in VARIABLES))
    return out


def local_search(program: Program, search: _Search, seeds: Sequence[tuple[int, ...]],
                  deadline: float) -> None:
    """Best-first neighbourhood search on the float objective: each round evaluates, in one
    batch, every neighbour of the best max(LOCAL_SEARCH_BEAM, 2K) plans not yet expanded
    and every schedule of the two best GPU splits, until the beam is expanded. Cheap, and the
    tighter threshold it gives shrinks phase 2 (top-K lists are often full of ties)."""
    beam = beam_width(search.top)
    expanded: set[tuple[int, ...]] = set()
    swept: set[tuple[int, ...]] = set()
    while time.perf_counter() < deadline:
        best = sorted(search.value, key=lambda c: (search.value[c], c))[:beam]
        if len(best) < beam:  # too few plans fit yet: also expand the solver's own
            best += [c for c in seeds if c not in search.value][:beam - len(best)]
        todo = [c for c in best if c not in expanded]
        meshes = [c for c in best[:2] if mesh_of(c) not in swept]
        if not todo and not meshes:
            return
        expanded.update(todo)
        swept.update(mesh_of(c) for c in meshes)
        batch = {n: None for c in todo for n in neighbours(program, c)}
        batch.update({n: None for c in meshes for n in schedules(program, c)})
        search.evaluate(batch, keep=beam)


def beam_width(top: int) -> int:
    return max(LOCAL_SEARCH_BEAM, 2 * top)


def seed_plans(program: Program) -> list[tuple[int, ...]]:
    """Starting plans for the local search: every (tp, pp) with the two smallest cp (long
    pipelines often fit only with the activations split), the smallest etp and vpp, dp taking
    the rest of the GPUs, and two expert splits (the largest ep that the ranks of a stage
    hold, and the largest whose group (etp x ep consecutive ranks, Megatron's expert rank
    order) stays inside the NVLink domain, as Megatron's MoE guide advises), under a few cheap
    schedules."""
    domains, n_gpus = program.lattice.domains, program.problem.num_gpus
    out = []
    if any(not domains[v] for v in VARIABLES):
        return out
    etp, vpp = min(domains["etp"]), min(domains["vpp"])
    domain_gpus = program.problem.cluster.scale_up_gpus
    for tp, pp, cp in itertools.product(domains["tp"], domains["pp"], sorted(domains["cp"])[:2]):
        if n_gpus % (tp * pp * cp):
            continue
        stage = n_gpus // pp  # tp x cp x dp: the ranks the experts of a stage spread over
        legal = [ep for ep in domains["ep"] if stage % (ep * etp) == 0]
        if not legal:
            continue
        inside = [ep for ep in legal if ep * etp <= domain_gpus] or legal[:1]
        for ep, mb, zero, recompute in itertools.product(
                sorted({max(legal), max(inside)}), domains["micro_batch"][:2],
                domains["zero"], domains["recompute"]):
            row = {"tp": tp, "cp": cp, "pp": pp, "dp": n_gpus // (tp * pp * cp), "ep": ep,
                   "etp": etp, "vpp": vpp, "zero": zero, "micro_batch": mb,
                   "recompute": recompute}
            if all(row[v] in domains[v] for v in VARIABLES):
                out.append(tuple(row[v] for v in VARIABLES))
    return out


def mesh_of(config: tuple[int, ...]) -> tuple[int, ...]:
    values = dict(zip(VARIABLES, config))
    return tuple(values[v] for v in VARIABLES if v not in SCHEDULE)
