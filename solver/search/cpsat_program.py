"""The CP-SAT program of a planning problem: variables over prime exponents, one add_<name>
per named constraint guarded by its switch literal, and the objectives as lower bounds built
from the cost tables (solver.search.tables). solver.search.cpsat searches it.

Variables: every degree d (tp, cp, pp, dp, ep, etp, vpp, micro_batch) as exponents a_q of the
primes of the problem (d = prod q^a_q; a degree whose domain is not a box of exponents also gets
an allowed-assignments constraint), zero and recompute as small integers. Then
`tp*cp*pp*dp == N` is one linear equation per prime, "x divides y" a bound per prime, and a
cost term that depends on a few axes (ratios of degrees, categories) is a table constraint over
their exponent digits. Products of terms are `AddMultiplicationEquality` on bounded variables,
maxima `AddMaxEquality`.

Each constraint of `build_constraints` has an `add_<name>` here, enforced only if its switch
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

from solver.cost.flops import estimate_model_flops_per_token
from solver.search.constraints import Constraint, build_constraints
from solver.search.space import VARIABLES, Problem, variable_domains
from solver.search.grid import (
    DEGREES,
    RATIOS,
    Grid,
    Table,
    build_grid,
    build_lattice,
    factorize,
    project,
    to_units,
)
from solver.search.memory_tables import (
    build_memory_tables,
    first_stage_slots,
    select_stage_slots,
)
from solver.search.time_tables import (
    build_time_tables,
)

MEMORY_RESOLUTION_BYTES = 4096
# Cost tables enter the program as the max of a few projections of at most TABLE_ROWS points:
# CP-SAT's work grows with table rows far faster than the bound loosens (grid.project).
TABLE_ROWS = 150
TABLE_PROJECTIONS = 2
# Larger budgets where the bound needs them, enough to keep these tables exact on the zoo's
# problems: expert all-to-all and routed-expert GEMM time depend on ep, etp and the tokens per
# GPU jointly, the CP ring on tp, cp and micro_batch, and fine-grained MoE models rank mostly
# by them (qwen3-30b-a3b on 2,048 H100s: the plans under the threshold fall from >5,700 to 126,
# the solve from 7.9 s to 3.2 s; benchmarks/solve_time.py).
TABLE_ROWS_FOR = {"ep_comm": 800, "ep_comm_full_extra": 800, "fwd_routed": 800,
                  "bwd_routed": 800, "cp_comm": 400, "cp_comm_full_extra": 400,
                  **{f"{name}_expert": 400 for name in ("optimizer", "dp_hidden_rate",
                                                        "dp_bwd_sync", "dp_fwd_sync")}}
# Stage slots whose memory bounds the worst stage while solving (any subset is a lower bound;
# more slots tighten it a little and cost more than they save; explaining uses all).
MEMORY_SLOTS_SOLVING = 1
# One unit of time is the ideal step (model FLOPs at peak) / 2^32; a term is clipped at 2^40
# units (256 ideal steps: far beyond any plan worth ranking, and it keeps products in int64).
TIME_RESOLUTION_OF_IDEAL_STEP = 2.0**-32
TERM_CAP = 2**40
PRODUCT_CAP = 2**61
DP_EXPOSURE_SCALE = 2**16
GIB = 2**30


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
        self.vpp_is_one = self._reify(self._sum("vpp") == 0, self._sum("vpp") >= 1, "vpp_is_one")
        self.zero_is_three = self._reify(self.zero == 3, self.zero != 3, "zero_is_three")
        self.switches: dict[str, cp_model.IntVar] = {}
        for c in self.constraints:
            self.switches[c.name] = (self.model.new_bool_var(f"switch_{c.name}") if explain
                                     else self.model.new_constant(1))
        self.memory_slots: list[cp_model.IntVar] = []
        for c in self.constraints:
            encode = ADDERS.get(c.name) or (add_pin if c.name.startswith("pin_") else None)
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
        rows = TABLE_ROWS_FOR.get(table.name, self.max_rows)
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


# ---- one add_<name> per named constraint ----------------------------------------------------

def add_gpus_product(program: Program, c: Constraint, switch) -> None:
    f = factorize(program.problem.num_gpus)
    for q in program.lattice.primes:
        total = sum(program.exps[v][q] for v in ("tp", "cp", "pp", "dp"))
        program.model.add(total == f.get(q, 0)).only_enforce_if(switch)


def add_tp_divides_heads(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("tp", program.problem.model_spec.num_attention_heads, switch)


def add_tp_divides_kv_heads(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("tp", program.problem.model_spec.kv_heads, switch)


def add_pp_at_most_layers(program: Program, c: Constraint, switch) -> None:
    layers = program.problem.model_spec.num_hidden_layers
    if max(program.lattice.domains["pp"], default=1) > layers:
        program.model.add(program.degree_value("pp") <= layers).only_enforce_if(switch)


def add_vpp_needs_pp(program: Program, c: Constraint, switch) -> None:
    program.model.add_bool_or([program.vpp_is_one, ~program.pp_is_one]).only_enforce_if(switch)


def add_vpp_divides_layers(program: Program, c: Constraint, switch) -> None:
    f = factorize(program.problem.model_spec.num_hidden_layers)
    for q in program.lattice.primes:
        program.model.add(program.exps["pp"][q] + program.exps["vpp"][q] <= f.get(q, 0)
                          ).only_enforce_if([switch, ~program.vpp_is_one])


def add_cp_splits_sequence(program: Program, c: Constraint, switch) -> None:
    seq_len = program.problem.job.seq_len
    if seq_len % 2:
        program.model.add_bool_or([~switch])
        return
    program.bound_exponents("cp", seq_len // 2, switch)


def add_batch_divides(program: Program, c: Constraint, switch) -> None:
    f = factorize(program.problem.job.global_batch)
    for q in program.lattice.primes:
        program.model.add(program.exps["dp"][q] + program.exps["micro_batch"][q]
                          <= f.get(q, 0)).only_enforce_if(switch)


def add_expert_ranks_fit_stage(program: Program, c: Constraint, switch) -> None:
    e = program.exps
    for q in program.lattice.primes:
        program.model.add(e["ep"][q] + e["etp"][q] <= e["tp"][q] + e["cp"][q] + e["dp"][q]
                          ).only_enforce_if(switch)


def add_ep_divides_experts(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("ep", program.problem.model_spec.num_experts, switch)


def add_dense_model_has_no_ep(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("ep", 1, switch)
    program.bound_exponents("etp", 1, switch)


def add_tp_within_nvlink(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("tp", program.problem.cluster.scale_up_gpus, switch)


def add_etp_within_nvlink(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("etp", program.problem.cluster.scale_up_gpus, switch)


def add_megatron_zero_stage(program: Program, c: Constraint, switch) -> None:
    program.model.add(program.zero != 2).only_enforce_if(switch)
    program.model.add_bool_or([~program.zero_is_three, program.pp_is_one]).only_enforce_if(switch)


def add_megatron_interleave_microbatches(program: Program, c: Constraint, switch) -> None:
    """With the batch split evenly, pp divides global_batch / (dp x micro_batch): exponent
    bounds; otherwise (only while explaining) the floor division of the rule, literally."""
    batch = program.problem.job.global_batch
    f = factorize(batch)
    divides = program.switches.get("batch_divides", 1)
    for q in program.lattice.primes:
        e = program.exps
        program.model.add(e["pp"][q] + e["dp"][q] + e["micro_batch"][q] <= f.get(q, 0)
                          ).only_enforce_if([switch, divides, ~program.vpp_is_one])
    if isinstance(divides, int) or not program.explain:
        return
    dp, mb, pp = (program.degree_value(v) for v in ("dp", "micro_batch", "pp"))
    split = program.product(dp, mb, "dp_times_micro_batch")
    micro = program.new_var(0, batch, "micro_batches")
    program.model.add_division_equality(micro, batch, split)
    rest = program.new_var(0, batch, "micro_batches_mod_pp")
    program.model.add_modulo_equality(rest, micro, pp)
    program.model.add(rest == 0).only_enforce_if([switch, ~divides, ~program.vpp_is_one])


def add_torchtitan_zero_stage(program: Program, c: Constraint, switch) -> None:
    program.model.add(program.zero != 1).only_enforce_if(switch)


def add_deepspeed_zero_with_pp(program: Program, c: Constraint, switch) -> None:
    program.model.add(program.zero <= 1).only_enforce_if([switch, ~program.pp_is_one])


def add_deepspeed_no_cp(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("cp", 1, switch)


def add_pin(program: Program, c: Constraint, switch) -> None:
    name = c.variables[0]
    allowed = cp_model.Domain.from_values(sorted(program.problem.pins[name]))
    var = {"zero": program.zero, "recompute": program.recompute}.get(name)
    if var is None:
        var = program.degree_value(name)
    if isinstance(var, int):
        if not allowed.contains(var):
            program.model.add_bool_or([~switch])
        return
    program.model.add_linear_expression_in_domain(var, allowed).only_enforce_if(switch)


def add_memory_fits_hbm(program: Program, c: Constraint, switch) -> None:
    """Every stage slot's memory (a lower bound of its bytes) fits the GPU. The tables assume
    tp x cp x pp x dp = N, so while explaining the rule is enforced only together with
    gpus_product (without it nothing is claimed; candidates are checked exactly instead)."""
    problem = program.problem
    if program.empty:
        return
    if program.memory_slot_limit == 1:
        slots = first_stage_slots(program.lattice)
    else:
        slots = select_stage_slots(problem, program.lattice)
    scale = math.lcm(*(program.lattice.domains["vpp"] or [1]))
    tables = build_memory_tables(problem, program.lattice, slots, scale,
                                 program.memory_slot_limit)
    capacity = problem.cluster.gpu.memory_gib * GIB
    cap = int(capacity // MEMORY_RESOLUTION_BYTES) + 2

    def units(values: np.ndarray) -> np.ndarray:
        return to_units(values, MEMORY_RESOLUTION_BYTES, "lower", cap)

    def count(values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.int64)

    shared = {k: program.bound(t, units, k) for k, t in tables.activations.items()}
    uses = {"dense": "layer_dense", "moe": "layer_moe", "first": "embedding",
            "not_last": "stage_output"}
    fixed = max(int(tables.fixed_bytes // MEMORY_RESOLUTION_BYTES) - 1, 0)
    for k in range(tables.slots):
        feats = tables.features[k]
        parts = [scale * program.bound(tables.states[k], units, f"states_{k}")]
        for key, table_name in uses.items():
            if table_name not in shared:
                continue
            counted = program.bound(feats[key], count, f"{key}_{k}")
            parts.append(program.product(counted, shared[table_name], f"{key}_bytes_{k}"))
        last = program.lookup(feats["last"].grid, feats["last"].filled().astype(np.int64),
                              f"last_{k}", boolean=True)
        if isinstance(last, int):
            parts.append(scale * last * shared["last_stage"])
        else:
            parts.append(scale * program.when(last, shared["last_stage"], f"last_bytes_{k}"))
        kind = program.lookup(feats["kind"].grid, feats["kind"].filled().astype(np.int64),
                              f"kind_{k}")
        working_table = tables.working_set[k]
        working = program.bound(working_table, units, f"working_{k}", categories={"kind": kind})
        parts.append(scale * program.when(program.full, working, f"working_bytes_{k}"))
        parts = [p for p in parts if not (isinstance(p, int) and p == 0)]
        memory = program.total(parts, f"memory_{k}") if parts else 0
        program.memory_slots.append(memory + scale * fixed)
        limit = int(capacity * scale // MEMORY_RESOLUTION_BYTES) + 1
        enforce = [switch] + ([program.switches["gpus_product"]] if program.explain else [])
        program.model.add(memory + scale * fixed <= limit).only_enforce_if(enforce)
    program.memory_units_per_byte = scale / MEMORY_RESOLUTION_BYTES


ADDERS = {
    "gpus_product": add_gpus_product,
    "tp_divides_heads": add_tp_divides_heads,
    "tp_divides_kv_heads": add_tp_divides_kv_heads,
    "pp_at_most_layers": add_pp_at_most_layers,
    "vpp_needs_pp": add_vpp_needs_pp,
    "vpp_divides_layers": add_vpp_divides_layers,
    "cp_splits_sequence": add_cp_splits_sequence,
    "batch_divides": add_batch_divides,
    "expert_ranks_fit_stage": add_expert_ranks_fit_stage,
    "ep_divides_experts": add_ep_divides_experts,
    "dense_model_has_no_ep": add_dense_model_has_no_ep,
    "tp_within_nvlink": add_tp_within_nvlink,
    "etp_within_nvlink": add_etp_within_nvlink,
    "megatron_zero_stage": add_megatron_zero_stage,
    "megatron_interleave_microbatches": add_megatron_interleave_microbatches,
    "torchtitan_zero_stage": add_torchtitan_zero_stage,
    "deepspeed_zero_with_pp": add_deepspeed_zero_with_pp,
    "deepspeed_no_cp": add_deepspeed_no_cp,
    "memory_fits_hbm": add_memory_fits_hbm,
}


# ---- objectives -----------------------------------------------------------------------------

def ideal_step_s(problem: Problem) -> float:
    """Model FLOPs of a step at the GPUs' peak: the scale of the time unit."""
    job, gpu = problem.job, problem.cluster.gpu
    flops = estimate_model_flops_per_token(problem.model_spec, job.seq_len) * job.tokens_per_step
    return flops / (problem.num_gpus * gpu.peak_flop_per_s(job.precision))


def add_step_time_objective(program: Program) -> None:
    """Integer step time, a lower bound of the float one (units tau / q, q = lcm of the vpp
    domain, tau from the ideal step), composed as in time_tables.py:
        t_mb x q (n + (pp - 1) / vpp) + q (2 n vpp p2p + dp + optimizer)."""
    problem, lattice = program.problem, program.lattice
    timing = build_time_tables(problem, lattice)
    tau = ideal_step_s(problem) * TIME_RESOLUTION_OF_IDEAL_STEP

    def term(name: str, upper: bool = False):
        table = timing.tables.get(name)
        if table is None:
            return 0
        bound = "upper" if upper else "lower"
        return program.bound(table, lambda v: to_units(v, tau, bound, TERM_CAP),
                             name + ("_upper" if upper else ""), upper=upper)

    def both(name: str):
        """The dense parameters' part plus the experts' (time_tables.py)."""
        return term(name + "_dense") + term(name + "_expert")

    def exact(name: str, axes: Sequence[str], formula) -> object:
        grid = build_grid(lattice, axes)
        p = grid.points()
        value = formula(*(p[a + "_num"] // p[a + "_den"] for a in axes))
        return program.lookup(grid, np.asarray(value, dtype=np.int64), name)

    batch, layers = problem.job.global_batch, problem.model_spec.num_hidden_layers
    q = math.lcm(*(lattice.domains["vpp"] or [1]))
    per_stage = exact("layers_per_stage", ("pp",), lambda pp: -(-layers // pp))
    micro = exact("micro_batches", ("dm",), lambda dm: batch // dm)
    fwd = program.total([term("fwd"), term("fwd_routed")], "fwd_layer")
    bwd = program.total([term("bwd"), term("bwd_routed")], "bwd_layer")
    fwd_stage = program.product(per_stage, fwd, "fwd_stage")
    bwd_stage = program.product(per_stage, bwd, "bwd_stage")
    comm = ("tp_comm", "cp_comm", "ep_comm")
    replay = program.total([fwd, *(term(name + "_full_extra") for name in comm)], "replay")
    other = program.total([program.when(program.full, replay, "recompute_layer"),
                           *(term(name) for name in comm)], "comm_layer")
    other_stage = program.product(per_stage, other, "other_stage")
    t_mb = program.total([fwd_stage, bwd_stage, other_stage, term("head")], "t_mb")
    bubble = exact("bubble_share", ("pp", "vpp"), lambda pp, vpp: q * (pp - 1) // vpp)
    weight = program.total([q * micro, bubble], "steady_and_bubble")
    main = program.product(t_mb, weight, "pipeline")
    hand_offs = program.product(micro, 2 * program.degree_value("vpp"), "hand_offs")
    p2p = program.product(hand_offs, term("p2p"), "p2p_step")

    # DP: the rate compute hides (c + 1/L of the traffic) plus (1 - c) x the exposed excess
    # max(sync - L x layer, 0). The excess is compared with the same lower bound of the
    # stage's forward / backward that the pipeline term uses: the step grows with the true
    # compute b at least as fast as the excess shrinks (n L b in the steady state against
    # (1 - c) n L b at most), so the step at the lower bound of b stays a lower bound.
    def exposed(sync: str, stage_compute, name: str):
        volume = both(sync)
        out = program.new_var(0, program.upper(volume), name)
        program.model.add_max_equality(out, [volume - stage_compute, 0])
        return out

    excess = program.total([exposed("dp_bwd_sync", bwd_stage, "dp_bwd_exposed"),
                            exposed("dp_fwd_sync", fwd_stage, "dp_fwd_exposed")], "dp_exposed")
    kappa = int(math.floor((1.0 - timing.contention) * DP_EXPOSURE_SCALE))
    scaled = program.new_var(0, program.upper(excess) * kappa // DP_EXPOSURE_SCALE, "dp_slowed")
    program.model.add_division_equality(scaled, kappa * excess, DP_EXPOSURE_SCALE)
    per_micro = program.total([both("dp_hidden_rate"), scaled], "dp_per_sync")
    every_micro = program.product(micro, per_micro, "dp_zero3")
    dp = program.new_var(0, max(program.upper(every_micro), program.upper(per_micro)), "dp")
    program.model.add(dp == every_micro).only_enforce_if(program.zero_is_three)
    program.model.add(dp == per_micro).only_enforce_if(~program.zero_is_three)
    rest = program.minimum([program.total([p2p, dp, both("optimizer")], "rest")],
                           PRODUCT_CAP // (2 * q), "rest_clipped")
    program.objective = main + q * rest
    program.objective_units_per_unit = q / tau


def add_memory_objective(program: Program) -> None:
    """Worst-stage memory: the largest stage slot."""
    top = max(program.upper(m) for m in program.memory_slots)
    worst = program.new_var(0, top, "worst_stage_memory")
    program.model.add_max_equality(worst, program.memory_slots)
    program.objective = worst
    program.objective_units_per_unit = program.memory_units_per_byte


