"""The CP-SAT program of a planning problem: variables over prime exponents, one add_<name>
per named constraint guarded by its switch literal (solver.search.cpsat_encoding), and the
objectives as lower bounds built from the cost tables (solver.search.cpsat_objectives, from
time_tables and memory_tables). solver.search.cpsat searches it.

Variables: every degree d (tp, cp, pp, dp, ep, etp, vpp, micro_batch) as exponents a_q of the
primes of the problem (d = prod q^a_q; a degree whose domain is not a box of exponents also gets
an allowed-assignments constraint), zero and recompute as small integers. Then
`tp*cp*pp*dp == N` is one linear equation per prime, "x divides y" a bound per prime, and a
cost term that depends on a few axes (ratios of degrees, categories) is a table constraint over
their exponent digits. Products of terms are `AddMultiplicationEquality` on bounded variables,
maxima `AddMaxEquality`.

Each constraint of `build_constraints` has an `add_<name>` (cpsat_encoding), enforced only if its switch
literal is true: solving fixes every switch to true (and first narrows each domain by the
single-variable constraints, which then hold anyway); explaining makes them assumptions. A
constraint without an encoding raises NotImplementedError.

Costs: CP-SAT's work grows quickly with table rows (a 3,000-row table costs seconds), while
the exact cost terms depend on 3-5 axes jointly (thousands of grid points). So each table
enters as the maximum of a few projections of at most TABLE_ROWS points (grid.project; an
upper bound, the minimum of maximum-projections, where a term is subtracted), and the
objective is a lower bound of the float objective, the memory a lower bound of the worst
stage's bytes. solver.search.cpsat turns that into an exact answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from ortools.sat.python import cp_model, cp_model_helper

from solver.search.constraints import Constraint, build_constraints
from solver.search.cpsat_encoding import encoder_for
from solver.search.grid import (
    DEGREES,
    RATIOS,
    Grid,
    Table,
    build_grid,
    build_lattice,
    factorize,
    project,
)
from solver.search.space import VARIABLES, Problem, variable_domains

# Cost tables enter the program as the max of a few projections of at most TABLE_ROWS points:
# CP-SAT's work grows with table rows far faster than the bound loosens (grid.project).
TABLE_ROWS = 150
TABLE_PROJECTIONS = 2
# Larger budgets where the bound needs them, enough to keep these tables exact on the zoo's
# problems: expert all-to-all and routed-expert GEMM time depend on ep, etp and the tokens per
# GPU jointly, the CP ring on tp, cp and micro_batch, and fine-grained MoE models rank mostly
# by them (qwen3-30b-a3b on 2,048 H100s: the plans under the threshold fall from >5,700 to 126,
# the solve from 7.9 s to 3.2 s; benchmarks/solve_time.py). The memory of the routed experts'
# states and of a layer's activations likewise (deepseek-v2 on 512 H100s: 10.3 s -> 3.3 s, the
# plans the memory bound lets through but that do not fit from 2,260 to 387). Keys are table
# names without their stage-slot suffix.
TABLE_ROWS_FOR = {"ep_comm": 800, "ep_comm_full_extra": 800, "fwd_routed": 800,
                  "bwd_routed": 800, "cp_comm": 400, "cp_comm_full_extra": 400,
                  "states_expert": 400, "states_gather": 400, "layer_moe": 400,
                  "layer_dense": 400, "last_stage": 400,
                  **{f"{name}_expert": 400 for name in ("optimizer", "dp_bwd_rate",
                                                        "dp_fwd_rate", "dp_bwd_sync",
                                                        "dp_fwd_sync")}}
# Stage slots whose memory bounds the worst stage while solving (any subset is a lower bound;
# more slots tighten it a little and cost more than they save; explaining uses all).
MEMORY_SLOTS_SOLVING = 1
# Products are clipped so that they stay in int64 (cpsat_objectives.py).
PRODUCT_CAP = 2**61


def restricted_domains(problem: Problem, constraints: Sequence[Constraint]
                       ) -> dict[str, tuple[int, ...]]:
    """Variable domains narrowed by every single-variable constraint (pins, divisibility)."""
    domains = {k: np.array(v, dtype=np.int64) for k, v in variable_domains(problem).items()}
    for c in constraints:
        if len(c.variables) == 1:
            name = c.variables[0]
            keep = np.broadcast_to(np.asarray(c.check({name: domains[name]}), bool),
                                   domains[name].shape)
            domains[name] = domains[name][keep]
    return {k: tuple(int(x) for x in v) for k, v in domains.items()}


class Program:
    """The CP-SAT program of one problem (the module docstring says what is in it)."""

    def __init__(self, problem: Problem, explain: bool = False, max_rows: int | None = None,
                 max_projections: int | None = None, memory_slots: int | None = None) -> None:
        self.problem, self.explain = problem, explain
        self.max_rows = max_rows or TABLE_ROWS
        self.max_projections = max_projections or TABLE_PROJECTIONS
        self.memory_slot_limit = memory_slots or (99 if explain else MEMORY_SLOTS_SOLVING)
        self.model = cp_model.CpModel()
        self.constraints = build_constraints(problem)
        domains = variable_domains(problem) if explain else restricted_domains(
            problem, self.constraints)
        self.lattice = build_lattice(problem, domains, identities=not explain)
        self.empty = any(len(domains[v]) == 0 for v in VARIABLES)
        self._digits: dict[tuple, cp_model.IntVar] = {}
        self.exps = {v: {q: self._exponent(v, q) for q in self.lattice.primes} for v in DEGREES}
        self.zero = self.model.new_int_var_from_domain(
            cp_model.Domain.from_values(domains["zero"] or [0]), "zero")
        self.recompute = self.model.new_int_var_from_domain(
            cp_model.Domain.from_values(domains["recompute"] or [0]), "recompute")
        for v in DEGREES:
            self._restrict_to_domain(v, domains[v])
        self.full = self._reify(self.recompute == 2, self.recompute != 2, "full")
        self.pp_is_one = self._reify(self._sum("pp") == 0, self._sum("pp") >= 1, "pp_is_one")
        self.tp_is_one = self._reify(self._sum("tp") == 0, self._sum("tp") >= 1, "tp_is_one")
        self.vpp_is_one = self._reify(self._sum("vpp") == 0, self._sum("vpp") >= 1, "vpp_is_one")
        self.zero_is_three = self._reify(self.zero == 3, self.zero != 3, "zero_is_three")
        self.zero_is_two = self._reify(self.zero == 2, self.zero != 2, "zero_is_two")
        self.switches: dict[str, cp_model.IntVar] = {}
        for c in self.constraints:
            self.switches[c.name] = (self.model.new_bool_var(f"switch_{c.name}") if explain
                                     else self.model.new_constant(1))
        self.memory_slots: list[cp_model.IntVar] = []
        for c in self.constraints:
            encode = encoder_for(c.name)
            if encode is None:
                raise NotImplementedError(f"no CP-SAT encoding for constraint {c.name}")
            encode(self, c, self.switches[c.name])
        self.objective: cp_model.LinearExpr | None = None
        self.objective_units_per_unit = 1.0  # integer objective units per second or byte

    # ---- variables ------------------------------------------------------------------------
    def _exponent(self, v: str, q: int):
        lo, hi = self.lattice.bounds[v][q]
        return lo if lo == hi else self.model.new_int_var(lo, hi, f"{v}_exp{q}")

    def _sum(self, v: str):
        return sum(self.exps[v].values())

    def _restrict_to_domain(self, v: str, values: Sequence[int]) -> None:
        free = [q for q in self.lattice.primes if not isinstance(self.exps[v][q], int)]
        box = math.prod(self.lattice.bounds[v][q][1] - self.lattice.bounds[v][q][0] + 1
                        for q in free)
        if free and box != len(values):
            tuples = [[self.lattice.exponents(v, x)[q] for q in free] for x in values]
            self.model.add_allowed_assignments([self.exps[v][q] for q in free], tuples)

    def _reify(self, when_true, when_false, name: str) -> cp_model.IntVar:
        b = self.model.new_bool_var(name)
        self.model.add(when_true).only_enforce_if(b)
        self.model.add(when_false).only_enforce_if(~b)
        return b

    def new_var(self, lo: int, hi: int, name: str) -> cp_model.IntVar:
        return self.model.new_int_var(int(lo), int(hi), name)

    @staticmethod
    def upper(expr, sign: int = 1) -> int:
        """The largest (sign -1: smallest) value of a linear expression over its variables'
        domains."""
        if isinstance(expr, (int, np.integer)):
            return int(expr)
        flat = cp_model_helper.FlatIntExpr(expr)
        total = flat.offset
        for v, c in zip(flat.vars, flat.coeffs):
            domain = list(v.proto.domain)
            total += c * (domain[-1] if c * sign > 0 else domain[0])
        return total

    def category(self, axis: str, categories: dict | None):
        if categories and axis in categories:
            return categories[axis]
        return {"zero": self.zero, "recompute": self.recompute, "full": self.full}[axis]

    def digit(self, axis: str, prime: int | None, lo: int, hi: int, categories: dict | None):
        """The variable (or constant) of one digit of a grid."""
        if prime is None:
            return self.category(axis, categories)
        if axis in DEGREES:
            return self.exps[axis][prime]
        key = (axis, prime)
        if key not in self._digits:
            expr = sum(c * self.exps[v][prime] for v, c in RATIOS[axis].items())
            var = self.new_var(lo, hi, f"{axis}_exp{prime}")
            self.model.add(var == expr)
            self._digits[key] = var
        return self._digits[key]

    def lookup(self, grid: Grid, units: np.ndarray, name: str, categories: dict | None = None,
               boolean: bool = False):
        """A variable equal to `units` at the current grid point: a table constraint over the
        grid's digits and the value (a constant where every row agrees)."""
        units = np.asarray(units, dtype=np.int64)
        keep = np.ones(len(units), bool)
        columns, rows = [], []
        digits = np.indices(tuple(d.size for d in grid.digits) or (1,)).reshape(
            len(grid.digits) or 1, -1)
        for k, d in enumerate(grid.digits):
            var = self.digit(d.axis, d.prime, d.lo, d.hi, categories)
            value = digits[k] + d.lo
            if isinstance(var, (int, np.integer)):
                keep &= value == int(var)
                continue
            columns.append(var)
            rows.append(value)
        values = units[keep]
        if len(set(values.tolist())) == 1:
            return int(values[0])
        var = (self.model.new_bool_var(name) if boolean
               else self.new_var(int(values.min()), int(values.max()), name))
        table = np.stack([r[keep] for r in rows] + [values], axis=1)
        self.model.add_allowed_assignments(columns + [var], table.tolist())
        return var

    def bound(self, table: Table, to_int, name: str, upper: bool = False,
              categories: dict | None = None):
        """A lower (upper) bound of `table` at the current grid point, from a few small
        projections of it (grid.project): their maximum (minimum)."""
        rows = TABLE_ROWS_FOR.get(table.name.rstrip("_0123456789"), self.max_rows)
        parts = [self.lookup(grid, to_int(values), f"{name}_{k}", categories)
                 for k, (grid, values) in enumerate(
                     project(table, rows, self.max_projections, upper))]
        if len(parts) == 1:
            return parts[0]
        lo = max(self.upper(p, -1) for p in parts) if not upper else min(
            self.upper(p, -1) for p in parts)
        hi = max(self.upper(p) for p in parts) if not upper else min(
            self.upper(p) for p in parts)
        out = self.new_var(lo, hi, name)
        (self.model.add_min_equality if upper else self.model.add_max_equality)(out, parts)
        return out

    def degree_value(self, v: str):
        grid = build_grid(self.lattice, (v,))
        p = grid.points()
        return self.lookup(grid, p[v + "_num"], f"{v}_value")

    def product(self, a, b, name: str):
        """a x b for non-negative a and b, with `a` clipped so the product stays in int64
        (clipping lowers it, so a lower bound stays one)."""
        if isinstance(a, int) or isinstance(b, int):
            return a * b
        ub_a, ub_b = self.upper(a), self.upper(b)
        if ub_a * ub_b > PRODUCT_CAP:
            a = self.minimum([a], PRODUCT_CAP // max(ub_b, 1), name + "_clip")
            ub_a = self.upper(a)
        out = self.new_var(self.upper(a, -1) * self.upper(b, -1), ub_a * ub_b, name)
        self.model.add_multiplication_equality(out, [a, b])
        return out

    def minimum(self, terms: list, cap: int, name: str):
        out = self.new_var(0, cap, name)
        self.model.add_min_equality(out, [*terms, cap])
        return out

    def total(self, terms: list, name: str):
        hi = sum(self.upper(t) for t in terms)
        out = self.new_var(0, hi, name)
        self.model.add(out == sum(terms))
        return out

    def when(self, literal, value, name: str):
        """value if literal else 0."""
        if isinstance(value, int) and value == 0:
            return 0
        out = self.new_var(0, self.upper(value), name)
        self.model.add(out == value).only_enforce_if(literal)
        self.model.add(out == 0).only_enforce_if(~literal)
        return out

    def bound_exponents(self, v: str, n: int, switch, extra: Sequence = ()) -> None:
        """v must divide n."""
        f = factorize(n)
        for q in self.lattice.primes:
            if self.lattice.bounds[v][q][1] > f.get(q, 0):
                self.model.add(self.exps[v][q] <= f.get(q, 0)).only_enforce_if([switch, *extra])

    def decision(self, solver) -> tuple[int, ...]:
        """The configuration of a solution, in VARIABLES order."""
        values = {}
        for v in DEGREES:
            values[v] = math.prod(q ** int(solver.value(e)) for q, e in self.exps[v].items())
        values["zero"] = int(solver.value(self.zero))
        values["recompute"] = int(solver.value(self.recompute))
        return tuple(values[v] for v in VARIABLES)

    def hint(self, config: tuple[int, ...]) -> None:
        """Suggest `config` to the solver as its first assignment."""
        self.model.clear_hints()
        values = dict(zip(VARIABLES, config))
        for v in DEGREES:
            f = factorize(values[v])
            for q, e in self.exps[v].items():
                if not isinstance(e, int):
                    self.model.add_hint(e, f.get(q, 0))
        self.model.add_hint(self.zero, values["zero"])
        self.model.add_hint(self.recompute, values["recompute"])

    def forbid(self, configs: Sequence[tuple[int, ...]], enforce: Sequence = ()) -> None:
        """No-good cuts: none of `configs` again."""
        free = [(v, q) for v in DEGREES for q in self.lattice.primes
                if not isinstance(self.exps[v][q], int)]
        variables = [self.exps[v][q] for v, q in free] + [self.zero, self.recompute]
        rows = []
        for config in configs:
            values = dict(zip(VARIABLES, config))
            rows.append([factorize(values[v]).get(q, 0) for v, q in free]
                        + [values["zero"], values["recompute"]])
        if rows:
            self.model.add_forbidden_assignments(variables, rows).only_enforce_if(list(enforce))
