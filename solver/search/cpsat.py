"""The integer program: the best configurations of a problem, proved optimal under the float
cost model, and the constraints that conflict when there are none. Same space, constraints and
cost model as the exhaustive oracle (solver.search.enumerate), which the tests compare it with.

The program (solver.search.cpsat_program) bounds the float objective F(x) from below by an
integer I(x) (in units of `objective_units_per_unit` per second or byte), and the worst-stage
memory likewise. solve_cpsat:
  1. finds good plans with the float model alone (solver.search.cpsat_warmstart): a grid of
     GPU splits, then a best-first neighbourhood search (each round one vectorised batch);
  2. lets CP-SAT enumerate every configuration with I(x) <= the K-th best float value found,
     in rounds of at most ROUND_SOLUTIONS (the threshold tightens between rounds, evaluated
     plans are cut off by no-good constraints), and evaluates each with the float model
     (memory that does not fit: left out). When a round exhausts the search, every plan at
     least as good as the K-th has been evaluated, ties included, so `rank` of the evaluated
     plans is the oracle's top K in the oracle's order: status optimal. A time limit that
     comes first gives status feasible with the best plans evaluated.
Enumeration needs one CP-SAT worker, so phase 2 splits the space into cubes (one per pipeline
degree) and enumerates them in threads; seed and parameters are fixed and reported, and the
cubes' solutions are merged in cube order, so the answer is deterministic (and, when proved,
independent of the search order anyway).

explain_infeasible_cpsat: switches as assumptions, SufficientAssumptionsForInfeasibility, then a
deletion filter to an irreducible set; candidates the memory lower bound lets through are
checked with the float model and cut off under the memory switch.
"""

from __future__ import annotations

import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from ortools.sat.python import cp_model

from solver.cost.candidates import Candidates
from solver.cost.memory import estimate_memory
from solver.cost.steptime import estimate_step_time
from solver.search.constraints import MEMORY_CONSTRAINT, Constraint
from solver.search.cpsat_objectives import add_memory_objective, add_step_time_objective
from solver.search.cpsat_program import Program
from solver.search.cpsat_warmstart import beam_width, local_search, seed_plans
from solver.search.enumerate import Ranked, enumerate_feasible, rank
from solver.search.space import VARIABLES, Problem

SOLVE_WORKERS = 2
EXPLAIN_WORKERS = 1
SEED = 0
# Solutions enumerated per round before the threshold is tightened and the search restarted.
ROUND_SOLUTIONS = 2000
# Plans an explanation cuts off one by one (memory) before the enumeration decides instead.
EXPLAIN_LAZY_CUTS = 25


@dataclass(frozen=True)
class CpsatResult:
    """The answer of solve_cpsat: status (optimal: proved under the float model; feasible: the
    time limit came first; infeasible; unknown: time ran out before any plan), the top plans
    ranked exactly as the oracle ranks them, and how the solver got there."""

    status: str
    ranked: Ranked | None
    solve_seconds: float
    parameters: dict[str, object]
    num_solves: int = 0
    num_evaluated: int = 0
    num_cut_by_memory: int = 0
    timings: dict[str, float] = field(default_factory=dict)


class _Collector(cp_model.CpSolverSolutionCallback):
    """The configurations of the solutions the solver reports, with their integer objective;
    stops the search after `limit` of them."""

    def __init__(self, program: Program, limit: int) -> None:
        super().__init__()
        self.program, self.limit = program, limit
        self.solutions: dict[tuple[int, ...], int] = {}

    def on_solution_callback(self) -> None:
        config = self.program.decision(self)
        self.solutions.setdefault(config, int(self.value(self.program.objective)))
        if len(self.solutions) >= self.limit:
            self.stop_search()


def _set_parameters(solver: cp_model.CpSolver, num_workers: int, enumerate_all: bool
                    ) -> dict[str, object]:
    """Every parameter parplan sets, set explicitly (and reported): the seed and worker count
    fix the result (enumerating needs one worker); presolve, probing and the LP relaxation
    cost more than they prune on these small-table programs (benchmarks/solve_time.py:
    median 1.2 s without presolve, 1.6 s with it, over 18 zoo problems)."""
    chosen = {"num_workers": 1 if enumerate_all else num_workers, "random_seed": SEED,
              "enumerate_all_solutions": enumerate_all, "cp_model_presolve": False,
              "cp_model_probing_level": 0, "linearization_level": 0,
              "log_search_progress": False}
    for key, value in chosen.items():
        setattr(solver.parameters, key, value)
    return chosen


def _candidates(configs: Sequence[tuple[int, ...]]) -> Candidates:
    columns = np.array(configs, dtype=np.int64).reshape(-1, len(VARIABLES))
    return Candidates(**{v: columns[:, i] for i, v in enumerate(VARIABLES)})


def _violations(problem: Problem, constraints: Sequence[Constraint], candidates: Candidates
                ) -> dict[str, np.ndarray]:
    values = {v: getattr(candidates, v) for v in VARIABLES}
    return {c.name: ~np.broadcast_to(np.asarray(c.check(values), bool), (len(candidates),))
            for c in constraints}


class _Search:
    """The configurations evaluated so far with the float model."""

    def __init__(self, program: Program, top: int) -> None:
        self.program, self.top = program, top
        self.value: dict[tuple[int, ...], float] = {}   # fitting ones: the float objective
        self.seen: set[tuple[int, ...]] = set()
        self.cut: set[tuple[int, ...]] = set()
        self.found: set[tuple[int, ...]] = set()  # returned by CP-SAT
        self.cut_by_memory = 0

    def threshold(self, keep: int | None = None) -> float | None:
        """The `keep`-th best float objective so far (default: the K-th)."""
        keep = keep or self.top
        if len(self.value) < keep:
            return None
        return sorted(self.value.values())[keep - 1]

    def evaluate(self, solutions: dict[tuple[int, ...], int | None], keep: int | None = None
                 ) -> list[tuple[int, ...]]:
        """Float objective of each new configuration (`solutions` maps it to the program's
        integer objective, or None if it did not come from the solver). Memory is checked only
        where it matters: for the time objective, on plans faster than the `keep`-th best so
        far (default: the top K); a plan that does not fit is left out (the program's memory is
        a lower bound). Returns the new configurations."""
        program, problem = self.program, self.program.problem
        new = [c for c in solutions if c not in self.seen]
        if not new:
            return new
        self.seen.update(new)
        candidates = _candidates(new)
        structural = [c for c in program.constraints if c.name != MEMORY_CONSTRAINT]
        broken = _violations(problem, structural, candidates)
        from_solver = np.array([solutions[c] is not None for c in new])
        bad = [name for name, mask in broken.items() if (mask & from_solver).any()]
        assert not bad, f"CP-SAT returned plans violating {bad}: the encoding is wrong"
        ok = np.ones(len(new), bool)
        for mask in broken.values():
            ok &= ~mask
        index = np.flatnonzero(ok)
        if problem.objective == "time":
            values = estimate_step_time(problem.model_spec, problem.cluster, problem.job,
                                        candidates.take(index), problem.time_constants).step_s
            bar = self.threshold(keep)
            if bar is not None:
                index, values = index[values <= bar], values[values <= bar]
        if len(index) == 0:
            return new
        memory = [c for c in program.constraints if c.name == MEMORY_CONSTRAINT]
        fits = ~_violations(problem, memory, candidates.take(index))[MEMORY_CONSTRAINT]
        self.cut_by_memory += int((~fits & from_solver[index]).sum())
        index = index[fits]
        if problem.objective == "time":
            values = values[fits]
        else:
            values = estimate_memory(problem.model_spec, problem.job, candidates.take(index),
                                     problem.memory_options).total
        scale = program.objective_units_per_unit
        for i, value in zip(index.tolist(), values.tolist()):
            config = new[i]
            bound = solutions[config]
            assert bound is None or bound <= value * scale * (1 + 1e-9) + 2, (
                f"integer objective {bound} above the float one {value * scale} for "
                f"{config}: the CP-SAT tables disagree with the cost model")
            self.value[config] = value
        return new


# The enumeration is split into at most this many subspaces (pipeline_cubes).
MAX_CUBES = 8


def pipeline_cubes(program: Program) -> list[list[tuple[cp_model.IntVar, int]]]:
    """Disjoint subspaces that cover the program, one per value of the pipeline degree's
    free prime exponents (all of them if that makes at most MAX_CUBES, else the exponent with
    the most values): CP-SAT enumerates on one worker only, so solve_cpsat enumerates the
    subspaces side by side. Fixing pp before the search also tightens every per-stage term
    at the root: DeepSeek-V3 on 16,384 H800s takes 7,200 branches over its 6 pp cubes against
    13,500 in one search (benchmarks/solve_time.py)."""
    free = [e for _, e in sorted(program.exps["pp"].items()) if not isinstance(e, int)]
    # Exponent variables are intervals (Program._exponent). (The proto's repeated field does
    # not take negative indices: hence the list.)
    bounds = {var.index: list(var.proto.domain) for var in free}
    ranges = {i: range(b[0], b[-1] + 1) for i, b in bounds.items()}
    if math.prod(len(r) for r in ranges.values()) > MAX_CUBES:
        free = [max(free, key=lambda var: (len(ranges[var.index]), -var.index))]
    return [list(zip(free, combo)) for combo in
            itertools.product(*(ranges[var.index] for var in free))]


def _enumerate_cube(program: Program, cube: list[tuple[cp_model.IntVar, int]],
                    deadline: float) -> tuple[dict[tuple[int, ...], int], bool]:
    """Every solution of the program (up to ROUND_SOLUTIONS) inside one cube, on a copy of
    the model, and whether the cube was searched to the end."""
    model = program.model.clone()
    for var, value in cube:
        model.add(model.get_int_var_from_proto_index(var.index) == value)
    solver = cp_model.CpSolver()
    _set_parameters(solver, 1, True)
    solver.parameters.max_time_in_seconds = max(deadline - time.perf_counter(), 0.01)
    collector = _Collector(program, ROUND_SOLUTIONS)
    status = solver.solve(model, collector)
    exhausted = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE) and (
        len(collector.solutions) < ROUND_SOLUTIONS)
    return collector.solutions, exhausted


def solve_cpsat(problem: Problem, top: int = 5, time_limit_s: float = 10.0,
                num_workers: int = SOLVE_WORKERS) -> CpsatResult:
    """The `top` best configurations, the same as the oracle's (ties in the oracle's order).

    The program's objective is a lower bound I(x) of the float objective F(x) (time_tables.py).
    Phase 1 finds good plans with the float model alone (a grid of splits, then a
    neighbourhood search); phase 2 enumerates every configuration with I(x) <= the K-th
    best float value found, in rounds of at most ROUND_SOLUTIONS (the threshold tightens
    between rounds, evaluated plans are cut off), until a round exhausts the search: every
    plan at least as good as the K-th has then been evaluated, so the ranking is the
    oracle's. CP-SAT enumerates on one worker, so the space is split into pipeline cubes
    (pipeline_cubes) enumerated by `num_workers` threads side by side; their solutions are
    merged in cube order, so the answer does not depend on which thread finishes first."""
    start = time.perf_counter()
    deadline = start + time_limit_s
    program = Program(problem)
    parameters = _set_parameters(cp_model.CpSolver(), num_workers, True)
    parameters["enumeration_threads"] = max(num_workers, 1)
    if program.empty:
        return CpsatResult("infeasible", None, time.perf_counter() - start, parameters)
    (add_step_time_objective if problem.objective == "time" else add_memory_objective)(program)
    timings = {"build_s": time.perf_counter() - start}
    search = _Search(program, top)
    scale = program.objective_units_per_unit

    # Phase 1: good plans from the float model, to set the threshold.
    seeds = seed_plans(program)
    search.evaluate({c: None for c in seeds}, keep=beam_width(top))
    local_search(program, search, seeds, deadline)
    timings["phase1_s"] = time.perf_counter() - start - timings["build_s"]
    solves = 0

    # Phase 2: every plan under the threshold, one subspace (cube) per thread.
    cubes = pipeline_cubes(program)
    parameters["cubes"] = len(cubes)
    open_cubes = list(range(len(cubes)))
    proven = False
    while time.perf_counter() < deadline:
        threshold = search.threshold()
        if threshold is not None:
            program.model.add(program.objective <= int(math.floor(threshold * scale)))
        # Plans the solver returned before are cut off (those the local search evaluated
        # are not: most lie outside the window, and each cut is a row for CP-SAT).
        program.forbid(sorted(search.found - search.cut))
        search.cut |= search.found
        if search.value:  # start where the best plan is: inside the window
            program.hint(min(search.value, key=lambda c: (search.value[c], c)))
        with ThreadPoolExecutor(max(num_workers, 1)) as pool:
            rounds = list(pool.map(lambda k: _enumerate_cube(program, cubes[k], deadline),
                                   open_cubes))
        solves += len(open_cubes)
        solutions: dict[tuple[int, ...], int] = {}
        for found, _ in rounds:  # in cube order: deterministic
            for config, bound in found.items():
                solutions.setdefault(config, bound)
        fresh = search.evaluate(solutions)
        search.found.update(solutions)
        open_cubes = [k for k, (_, exhausted) in zip(open_cubes, rounds) if not exhausted]
        if not open_cubes:
            proven = True
            break
        if not fresh and time.perf_counter() >= deadline:
            break
    timings["total_s"] = time.perf_counter() - start
    if search.value:
        status_name = "optimal" if proven else "feasible"
        last = search.threshold() or max(search.value.values())
        finalists = [c for c, value in search.value.items() if value <= last]
        ranked = rank(problem, _candidates(finalists), top)
    else:
        status_name = "infeasible" if proven else "unknown"
        ranked = None
    return CpsatResult(status_name, ranked, timings["total_s"], parameters, solves,
                       len(search.seen), search.cut_by_memory, timings)


def explain_infeasible_cpsat(problem: Problem, hard: Sequence[str] = ("gpus_product",),
                             time_limit_s: float = 30.0) -> list[str]:
    """Names of an irreducible set of constraints that cannot hold together ([] if feasible):
    the solver's sufficient assumptions for infeasibility, then a deletion filter, with one
    worker. Constraints named in `hard` always hold and are never named (by default the GPU
    count: a plan must use exactly the GPUs it is given, and the memory tables rely on it).
    Memory is a lower bound in the program, so a plan it allows is checked with the float
    model and, if it does not fit, cut off under the memory switch; after EXPLAIN_LAZY_CUTS
    such cuts (or when the time limit comes) the oracle's enumeration decides that subset,
    so an empty answer always means feasible."""
    deadline = time.perf_counter() + time_limit_s
    program = Program(problem, explain=True)
    by_name = {c.name: c for c in program.constraints}
    for name in hard:
        if name in program.switches:
            program.model.add(program.switches[name] == 1)
    names = [c.name for c in program.constraints if c.name not in hard]
    solver = cp_model.CpSolver()
    _set_parameters(solver, EXPLAIN_WORKERS, False)
    memory_switch = program.switches[MEMORY_CONSTRAINT]

    def exact_conflict(active: Sequence[str]) -> list[str] | None:
        """Decide with the oracle's enumeration (slower; used when the memory bound is too
        loose for CP-SAT to settle the question)."""
        chosen = [by_name[n] for n in [*active, *hard] if n in by_name]
        found = enumerate_feasible(problem, chosen, stop_at_first=True)
        return None if len(found) else list(active)

    def conflict(active: Sequence[str]) -> list[str] | None:
        """A conflicting subset of `active`, or None if they can all hold."""
        for _ in range(EXPLAIN_LAZY_CUTS):
            if time.perf_counter() >= deadline:
                break
            program.model.clear_assumptions()
            program.model.add_assumptions([program.switches[n] for n in active])
            solver.parameters.max_time_in_seconds = max(deadline - time.perf_counter(), 0.01)
            status = solver.solve(program.model)
            if status == cp_model.INFEASIBLE:
                core = {program.model.get_bool_var_from_proto_index(i).name.removeprefix(
                    "switch_") for i in solver.sufficient_assumptions_for_infeasibility()}
                return [n for n in active if n in core] or list(active)
            if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                break
            config = program.decision(solver)
            checked = [by_name[n] for n in [*active, *hard] if n in by_name]
            broken = _violations(problem, checked, _candidates([config]))
            bad = [n for n, mask in broken.items() if mask[0]]
            if not bad:
                return None
            assert bad == [MEMORY_CONSTRAINT], f"explanation encoding is wrong for {bad}"
            program.forbid([config], enforce=[memory_switch])
        return exact_conflict(active)

    core = conflict(names)
    if core is None:
        return []
    kept = list(core)
    for name in list(core):
        if name not in kept:
            continue
        smaller = conflict([k for k in kept if k != name])
        if smaller is not None:
            kept = smaller
    return kept
