"""The serving integer program: the same space, constraints and cost model as the oracle
(solver.serve.enumerate), solved with CP-SAT (objectives throughput and latency).

Encoding (DESIGN.md): each degree d in (tp, pp, dp, ep, replicas) is its prime exponents
a_d[p] over the primes p of the GPU count N. tp x pp x dp x replicas = N is one equation per
prime; "d divides X" is a bound a_d[p] <= v_p(X); "X divides d" a bound the other way; the
disjunctive rules (KV heads split or replicated, an engine within a node or whole nodes, expert
parallel on or off) switch between two such sets with a Boolean. A degree's value is an
AddElement lookup indexed by its exponents read as a mixed-radix number. The cost terms that
decide memory, SLOs and the objective depend jointly on (tp, pp, dp, expert parallel), so they
are tables over that joint index (at most 2 d(N)^3 rows: 6,750 for N = 16,384) computed by the
numpy model, so the program and the model cannot disagree: one Boolean per row the target
tables allow, exactly one chosen, ties the joint index and the objective by linear sums (whose
LP relaxation is exact, where an AddElement lookup of the objective made each solve ~20x
slower).

Top K: solve, cut the answer off (its joint index fixes the plan), solve again, until K plans
are in hand and the next optimum's integer objective falls below the K-th one's; every plan
left out then has a worse float objective, and the float model ranks those collected (exactly
as the oracle). Infeasibility is explained by the oracle's deletion filter over the same
constraint masks (solver.serve.explain).
"""

from __future__ import annotations

import math

import numpy as np
from ortools.sat.python import cp_model

from solver.search.constraints import MEMORY_CONSTRAINT
from solver.search.space import divisors
from solver.serve.candidates import ServeCandidates
from solver.serve.constraints import build_serve_constraints, tp_domain
from solver.serve.enumerate import RankedServe, objective_keys, rank_serving
from solver.serve.estimate import estimate_serving
from solver.serve.job import ServeProblem

DEGREES = ("tp", "pp", "dp", "ep", "replicas")
OBJECTIVE_UNITS = 2.0**40  # integer resolution: the largest objective value becomes 2^40
MAX_SOLVES = 400
TARGET_RULES = (MEMORY_CONSTRAINT, "ttft_within_slo", "tpot_within_slo",
                "throughput_meets_target")
SOLVER_PARAMETERS = {"num_workers": 1, "random_seed": 0, "log_search_progress": False}


def prime_exponents(n: int) -> dict[int, int]:
    """{p: v_p(n)} over the primes of n: 96 -> {2: 5, 3: 1}."""
    primes = [d for d in divisors(n) if d > 1 and all(d % q for q in range(2, math.isqrt(d) + 1))]
    out = {}
    for p in primes:
        out[p], rest = 0, n
        while rest % p == 0:
            out[p], rest = out[p] + 1, rest // p
    return out


class ServeProgram:
    """Variables (exponents, indices, switches) of one serving problem and its tables."""

    def __init__(self, problem: ServeProblem) -> None:
        self.problem, self.model = problem, cp_model.CpModel()
        n = problem.num_gpus
        self.primes = prime_exponents(n)
        self.radix = [e + 1 for e in self.primes.values()]
        self.size = int(np.prod(self.radix)) if self.primes else 1
        self.values = [self._value_of(i) for i in range(self.size)]
        m = self.model
        self.a = {d: {p: m.NewIntVar(0, e, f"{d}_{p}") for p, e in self.primes.items()}
                  for d in DEGREES}
        for p, e in self.primes.items():
            m.Add(sum(self.a[d][p] for d in ("tp", "pp", "dp", "replicas")) == e)
            if not problem.model_spec.is_moe:
                m.Add(self.a["replicas"][p] == 0)
        self.index = {d: self._index(self.a[d], d) for d in DEGREES}
        self.ep_on = m.NewBoolVar("ep_on")  # ep > 1
        m.Add(sum(self.a["ep"].values()) >= 1).OnlyEnforceIf(self.ep_on)
        m.Add(sum(self.a["ep"].values()) == 0).OnlyEnforceIf(self.ep_on.Not())
        joint = (self.index["tp"] * self.size + self.index["pp"]) * self.size + self.index["dp"]
        self.joint = m.NewIntVar(0, 2 * self.size**3 - 1, "joint")
        m.Add(self.joint == 2 * joint + self.ep_on)

    def _value_of(self, index: int) -> int:
        value = 1
        for (p, _), radix in zip(self.primes.items(), self.radix):
            value *= p ** (index % radix)
            index //= radix
        return value

    def _index(self, exponents: dict[int, cp_model.IntVar], name: str) -> cp_model.IntVar:
        stride, terms = 1, []
        for (p, _), radix in zip(self.primes.items(), self.radix):
            terms.append(stride * exponents[p])
            stride *= radix
        index = self.model.NewIntVar(0, self.size - 1, f"{name}_index")
        self.model.Add(index == sum(terms))
        return index

    def value(self, exponents: dict[int, object], name: str) -> cp_model.IntVar:
        """The integer a set of exponent expressions stands for (an AddElement lookup)."""
        value = self.model.NewIntVar(1, max(self.values), f"{name}_value")
        self.model.AddElement(self._index(exponents, name), self.values, value)
        return value

    def bound(self, exponents: dict[int, object], x: int, upper: bool,
              enforce: cp_model.IntVar | None = None) -> None:
        """The degree divides x (upper) or x divides the degree (not upper), as bounds on its
        exponents, enforced by `enforce` when given."""
        m = self.model
        if not upper and any(q not in self.primes for q in prime_exponents(x)):
            assert enforce is not None
            m.AddBoolOr([enforce.Not()])  # x has a prime the GPU count lacks
            return
        for p, term in exponents.items():
            v = prime_exponents(x).get(p, 0)
            constraint = m.Add(term <= v) if upper else m.Add(term >= v)
            if enforce is not None:
                constraint.OnlyEnforceIf(enforce)


def _sum(program: ServeProgram, *degrees: str) -> dict[int, object]:
    return {p: sum(program.a[d][p] for d in degrees) for p in program.primes}


def _add_model_and_placement(program: ServeProgram, name: str) -> None:
    """One named rule of solver.serve.constraints as exponent bounds."""
    problem, m = program.problem, program.model
    spec = problem.model_spec
    tp = _sum(program, "tp")
    if name == "tp_divides_heads":
        program.bound(tp, spec.num_attention_heads, upper=True)
    elif name == "tp_kv_heads_compatible":
        split = m.NewBoolVar("kv_split")
        program.bound(tp, spec.kv_heads, upper=True, enforce=split)
        program.bound(tp, spec.kv_heads, upper=False, enforce=split.Not())
    elif name == "tp_within_nvlink":
        program.bound(tp, tp_domain(problem)[0], upper=True)
    elif name == "pp_at_most_layers":
        m.Add(program.value(program.a["pp"], "pp") <= spec.num_hidden_layers)
    elif name == "pp_across_nodes":
        node = problem.cluster.gpus_per_node
        inside = m.NewBoolVar("engine_inside_node")
        m.Add(program.value(_sum(program, "tp", "pp"), "tp_pp") <= node).OnlyEnforceIf(inside)
        program.bound(_sum(program, "tp", "pp"), node, upper=False, enforce=inside.Not())
    elif name == "dense_model_has_no_ep":
        m.Add(program.ep_on == 0)
    elif name == "ep_is_tp_x_dp":
        on = m.NewBoolVar("expert_parallel")
        for p, term in _sum(program, "tp", "dp").items():
            m.Add(program.a["ep"][p] == term).OnlyEnforceIf(on)
            m.Add(program.a["ep"][p] == 0).OnlyEnforceIf(on.Not())
    elif name == "ep_divides_experts":
        program.bound(_sum(program, "ep"), spec.num_experts, upper=True)
    elif name == "moe_tp_divides_expert_width":
        program.bound(_sum(program, "tp", "dp"), spec.moe_intermediate_size, upper=True,
                      enforce=program.ep_on.Not())
    else:
        raise AssertionError(f"no CP-SAT encoding for constraint {name}")


def _joint_candidates(program: ServeProgram) -> ServeCandidates:
    """Every (tp, pp, dp, expert parallel) of the joint index, in its order."""
    values = np.array(program.values, dtype=np.int64)
    size, n = program.size, program.problem.num_gpus
    grid = np.indices((size, size, size, 2)).reshape(4, -1)
    tp, pp, dp = values[grid[0]], values[grid[1]], values[grid[2]]
    engine = tp * pp * dp
    replicas = np.where(n % engine == 0, n // np.maximum(engine, 1), 1)
    if not program.problem.model_spec.is_moe:
        replicas = np.ones_like(tp)
    ep = np.where(grid[3] == 1, tp * dp, 1)
    return ServeCandidates(tp=tp, pp=pp, dp=dp, ep=ep, replicas=replicas)


def build_serve_program(problem: ServeProblem) -> tuple[ServeProgram, cp_model.IntVar]:
    """The program with every constraint and the objective to minimise (negated throughput,
    or latency)."""
    program = ServeProgram(problem)
    grid = _joint_candidates(program)
    values = grid.values()
    allowed = _reachable(program, grid)
    for constraint in build_serve_constraints(problem):
        if constraint.name in TARGET_RULES:
            allowed &= np.broadcast_to(np.asarray(constraint.check(values), bool), (len(grid),))
        else:
            _add_model_and_placement(program, constraint.name)
    rows = np.flatnonzero(allowed)
    measure = objective_keys(problem, estimate_serving(problem, grid.take(rows)))[0]
    scale = max(float(np.max(np.abs(measure), initial=0.0)), 1e-300) / OBJECTIVE_UNITS
    units = np.round(measure / scale).astype(np.int64)  # the one door from floats
    m = program.model
    pick = [m.NewBoolVar(f"pick_{j}") for j in rows]
    m.AddExactlyOne(pick)  # no row allowed: infeasible
    m.Add(program.joint == cp_model.LinearExpr.WeightedSum(pick, rows.tolist()))
    objective = m.NewIntVar(int(units.min(initial=0)), int(units.max(initial=0)), "objective")
    m.Add(objective == cp_model.LinearExpr.WeightedSum(pick, units.tolist()))
    m.Minimize(objective)
    return program, objective


def _reachable(program: ServeProgram, grid: ServeCandidates) -> np.ndarray:
    """Joint rows that are whole configurations of the space: tp x pp x dp divides N, and a
    dense model's dp takes all the rest."""
    n = program.problem.num_gpus
    engine = grid.tp * grid.pp * grid.dp
    if program.problem.model_spec.is_moe:
        return n % engine == 0
    return engine == n


def solve_serving_cpsat(problem: ServeProblem, top: int = 5) -> RankedServe | None:
    """The top plans, proved under the float model; None when nothing is feasible."""
    if problem.job.objective == "gpus":
        from solver.errors import InputError

        raise InputError("--engine cpsat plans --objective throughput or latency; "
                         "--objective gpus searches GPU counts below --gpus with the "
                         "exhaustive engine (--engine enumerate)")
    program, objective = build_serve_program(problem)
    solver = cp_model.CpSolver()
    for key, value in SOLVER_PARAMETERS.items():
        setattr(solver.parameters, key, value)
    found: dict[int, int] = {}
    for _ in range(MAX_SOLVES):
        if solver.Solve(program.model) != cp_model.OPTIMAL:
            break
        joint, units = int(solver.Value(program.joint)), int(solver.Value(objective))
        kth = sorted(found.values())[top - 1] if len(found) >= top else None
        if kth is not None and units > kth:
            break
        found[joint] = units
        program.model.Add(program.joint != joint)
    if not found:
        return None
    grid = _joint_candidates(program)
    chosen = grid.take(np.array(sorted(found), dtype=np.int64))
    return rank_serving(problem, chosen, top)
