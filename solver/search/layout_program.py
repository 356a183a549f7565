"""The layout program (OR-Tools CP-SAT): how many decoder layers each virtual pipeline stage of
one configuration holds, and how many of them recompute in full, for the shortest step under
every stage's memory limit.

For a configuration with pp stages of vpp chunks (V = pp x vpp virtual stages, model order;
virtual stage v runs on stage v % pp) and the coefficients of solver.cost.step.layout_terms:

    n_v  in [lo_v, L]     layers of virtual stage v (lo = 0 for the first and last, which hold
                          the embedding and the loss, else 1); sum_v n_v = L
    B_v  = n_0 + ... + n_v                  the layer boundaries
    c_kv = D_k(B_v) - D_k(B_{v-1})          layers of kind k, D_k(x) the kind-k layers among
                                            the first x (an element lookup per kind)
    r_v  in [0, n_v]      layers recomputing in full (the first r_v of the chunk, Megatron's
                          block method); one count R for every chunk, r_v = min(R, n_v), where
                          the framework takes one (--recompute-num-layers)
    aggregation: the middle chunks of a stage that can hold only the model's last kind of
                          layer (chunk v starts at layer v - 1 or later) are interchangeable:
                          the stage's time and memory depend on their total and recomputed
                          count only. The program sizes those (one unit per stage) and the
                          answer splits them (_split, _split_uniform); under one recompute
                          count R the unit's recomputed layers range over what some split
                          reaches (_add_recompute).
    q_kv = D_k(B_{v-1} + r_v) - D_k(B_{v-1}) recomputed layers of kind k
    T_i  = sum_{v on i} sum_k a_k c_kv + b_k q_kv  + c + (i = pp - 1) last   (integer units)
    M   >= T_i;  minimise  (m vpp - 1) M + sum_i T_i   (= vpp x (step - fixed) / unit)
    mem_i = base_i + sum_{v on i} sum_k l_ik c_kv + s_ik q_kv + w_i [stage i recomputes]
            <= capacity

One door from floats into CP-SAT (STYLE.md): `to_units` scales the time coefficients to
microseconds (rounded to nearest; the answer is re-costed in floats, and its step time may
exceed the float optimum by the rounding, about 1e-5 of it) and the memory ones to KiB rounded
up, against the capacity rounded down, so every layout the program accepts fits under the
float model too (one that fits by less than a few hundred KiB may be refused). Finer units made
CP-SAT's LP numerically unstable (10-digit coefficients: a 5-variable program unsolved in 2 s).
One worker with a fixed seed solves it, so the same problem gives the same layout.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from solver.cost.step.layout_terms import LayoutCoefficients
from solver.cost.memory.layout import layout_layer_counts
from solver.search.layout_counts import add_kind_counts, add_stage_tables
from solver.spec import ParallelConfig, PipelineLayout, VirtualStage

TIME_UNIT_S = 1e-6
MEMORY_UNIT_BYTES = 1024.0


@dataclass(frozen=True)
class LayoutAnswer:
    """The best layout found, its step time and stage memory under the float model, and
    whether the program proved it optimal (status "optimal") or stopped at the time limit
    ("feasible"); `objective` the program's objective value (integer units)."""

    layout: PipelineLayout
    step_s: float
    memory_bytes: np.ndarray
    status: str
    objective: int = 0


@dataclass(frozen=True)
class LayoutRules:
    """What the layout may choose: `recompute` whether layers may recompute in full (the
    configuration recomputes "full": at least one layer then does); `uniform_recompute` one
    count for every chunk (Megatron's --recompute-num-layers); `mtp_layers` on the last
    virtual stage."""

    recompute: bool
    uniform_recompute: bool
    mtp_layers: int = 0


def to_units(value: float | np.ndarray, unit: float, rounding: str) -> np.ndarray:
    """Floats in integer units: "nearest", "up" or "down"."""
    scaled = np.asarray(value, dtype=float) / unit
    rounded = {"nearest": np.rint, "up": np.ceil, "down": np.floor}[rounding](scaled)
    return rounded.astype(np.int64)


@dataclass(frozen=True)
class _Unit:
    """A run of layers the program sizes: one virtual stage, or all the tail chunks of one
    stage together (`chunks`: the virtual stages it stands for, `low`: its fewest layers)."""

    stage: int
    chunks: tuple[int, ...]
    low: int


def _build_units(num_virtual: int, pp: int, num_layers: int, tail_from: int,
                 aggregate: bool) -> tuple[list[_Unit], int]:
    """The units of the program and how many of them lead (sized one virtual stage each, in
    model order, their kinds looked up): every virtual stage, or, aggregated, the virtual
    stages up to the one that may still hold a layer before `tail_from`, then per stage its
    other middle chunks together, then the last virtual stage."""
    def low(v: int) -> int:
        if num_virtual == 1:
            return num_layers
        return 0 if v in (0, num_virtual - 1) else 1

    if not aggregate:
        return [_Unit(v % pp, (v,), low(v)) for v in range(num_virtual)], num_virtual
    lead = [_Unit(v % pp, (v,), low(v)) for v in range(tail_from + 1)]
    groups = []
    for stage in range(pp):
        chunks = tuple(v for v in range(tail_from + 1, num_virtual - 1) if v % pp == stage)
        if chunks:
            groups.append(_Unit(stage, chunks, len(chunks)))
    last = _Unit((num_virtual - 1) % pp, (num_virtual - 1,), low(num_virtual - 1))
    return lead + groups + [last], len(lead)


def _split(total: int, parts: int) -> list[int]:
    """The canonical split of `total` layers over `parts` chunks: non-increasing, at most one
    apart."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def objective_bound(co: LayoutCoefficients, below_s: float) -> int | None:
    """The largest objective (integer units) of a layout at least as fast as `below_s`
    seconds, to the time unit; None when no layout can be (the fixed terms alone pass it)."""
    bound = (below_s - co.fixed_s) * co.vpp / TIME_UNIT_S
    return None if bound < 0 else int(math.ceil(bound))


def seconds_at_least(co: LayoutCoefficients, config: ParallelConfig, bound: float,
                     below_s: float | None) -> float:
    """A lower bound, in seconds, of the step time of every layout of a program whose
    objective CP-SAT bounded from below by `bound` (integer units) under the bar `below_s`:
    the bound less what rounding each time coefficient to the unit may have taken off a
    layout's objective (half a unit per coefficient and layer: at most L + 1 per stage time,
    L + pp in their sum), as a step time; a layout past the bar is slower than the bar."""
    num_layers = len(co.kinds)
    slack = (co.num_micro * co.vpp - 1) * (num_layers + 1) + num_layers + config.pp
    seconds = co.fixed_s + (bound - slack) * TIME_UNIT_S / co.vpp
    return seconds if below_s is None else min(seconds, below_s)


class _Program(cp_model.CpModel):
    """A CpModel without the camelCase aliases (NewIntVar, ...) its constructor binds: OR-Tools
    9.15 wraps every method, 5 ms per model, a tenth of a small sweep problem's time."""

    def _add_pre_pep8_methods(self) -> None:
        pass


def solve_layout(config: ParallelConfig, coefficients: LayoutCoefficients,
                 capacity_bytes: float, rules: LayoutRules, below_s: float | None = None,
                 time_limit_s: float = 10.0, hint: PipelineLayout | None = None,
                 work_limit: float | None = None, none_below: Callable[[int], bool] | None = None,
                 on_work: Callable[[float], None] | None = None,
                 stage_tables: list[np.ndarray] | None = None,
                 on_bound: Callable[[float], None] | None = None
                 ) -> tuple[LayoutAnswer | None, bool]:
    """The best layout of `config` (module docstring), or None when no layout fits the memory
    or, with `below_s`, none is as fast (to the time unit); and whether the answer is proven.
    `time_limit_s` bounds the wall time; `work_limit`, CP-SAT's deterministic time (its own
    count of work, the same on a busy machine and an idle one), so that a program stopped by
    it gives the same answer whatever the load. `none_below(objective)`, a bound from outside
    the program: True when no layout has a lower objective; a layout found at such an
    objective ends the search, proven; `on_work` is told the deterministic seconds it took.
    `stage_tables[i]`: count vectors (layers of each kind the model has, in kind order), one
    of which stage i holds in every layout that fits and meets the bar (solver.search.
    layout_relaxation.stage_sets): exact, and CP-SAT propagates a table as it cannot the
    element lookups' linear relaxation. `on_bound`, where the answer is not proven, is told a
    lower bound of the step time of every layout (seconds_at_least)."""
    co = coefficients
    pp, vpp = config.pp, config.vpp
    num_virtual = pp * vpp
    num_layers = len(co.kinds)
    present = [k for k in range(len(co.layer_s)) if (co.kinds == k).any()]
    changes = np.flatnonzero(co.kinds[1:] != co.kinds[:-1])
    tail_from = int(changes[-1]) + 1 if len(changes) else 0
    units, num_lead = _build_units(num_virtual, pp, num_layers, tail_from,
                                   aggregate=num_virtual - 2 > tail_from)
    program = _Program()
    n = [program.new_int_var(unit.low, num_layers, f"n{i}") for i, unit in enumerate(units)]
    program.add(sum(n) == num_layers)
    bounds = [program.new_int_var(0, num_layers, f"b{i}") for i in range(num_lead)]
    for i in range(num_lead):
        program.add(bounds[i] == (bounds[i - 1] if i else 0) + n[i])

    r, count_var = _add_recompute(program, n, units, num_layers, rules)
    counts, recomputed = add_kind_counts(program, co.kinds, present, n[:num_lead], bounds,
                                         r[:num_lead])
    tail_kind = int(co.kinds[-1])
    for kind in present:
        same = kind == tail_kind
        counts[kind] = list(counts[kind]) + [x if same else 0 for x in n[num_lead:]]
        recomputed[kind] = list(recomputed[kind]) + [x if same else 0 for x in r[num_lead:]]

    a = to_units(co.layer_s, TIME_UNIT_S, "nearest")
    b = to_units(co.recompute_s, TIME_UNIT_S, "nearest")
    stage_units = int(to_units(co.stage_s, TIME_UNIT_S, "nearest"))
    last_units = int(to_units(co.last_s, TIME_UNIT_S, "nearest"))
    layer_bytes = to_units(co.layer_bytes, MEMORY_UNIT_BYTES, "up")
    recompute_bytes = to_units(co.recompute_bytes, MEMORY_UNIT_BYTES, "up")
    base_bytes = to_units(co.base_bytes, MEMORY_UNIT_BYTES, "up")
    working_bytes = to_units(np.maximum(co.working_bytes, 0.0), MEMORY_UNIT_BYTES, "up")
    capacity = int(to_units(capacity_bytes, MEMORY_UNIT_BYTES, "down"))

    stage_time = []
    horizon = int(num_layers * (max(a.max(), 0) + max(b.max(), 0)) + stage_units + last_units)
    slowest = program.new_int_var(0, horizon, "slowest")
    for stage in range(pp):
        held = [i for i, unit in enumerate(units) if unit.stage == stage]
        time_expr = sum(int(a[k]) * counts[k][i] + int(b[k]) * recomputed[k][i]
                        for i in held for k in present)
        time_expr += stage_units + (last_units if stage == pp - 1 else 0)
        stage_time.append(time_expr)
        program.add(slowest >= time_expr)
        memory_expr = int(base_bytes[stage]) + sum(
            int(layer_bytes[stage, k]) * counts[k][i]
            + int(recompute_bytes[stage, k]) * recomputed[k][i] for i in held for k in present)
        if rules.recompute and working_bytes[stage] > 0:
            recomputes = program.new_bool_var(f"recomputes{stage}")
            program.add(sum(r[i] for i in held) <= num_layers * recomputes)
            memory_expr += int(working_bytes[stage]) * recomputes
        program.add(memory_expr <= capacity)

    if stage_tables is not None:
        add_stage_tables(program, [unit.stage for unit in units], counts, present,
                         stage_tables)
    num_micro = int(round(co.num_micro))
    objective = (num_micro * vpp - 1) * slowest + sum(stage_time)
    if below_s is not None:
        bound = objective_bound(co, below_s)
        if bound is None:
            return None, True
        program.add(objective <= bound)
    program.minimize(objective)
    if hint is not None:
        for i, unit in enumerate(units):
            program.add_hint(n[i], sum(hint.stages[v].layers for v in unit.chunks))
            if rules.recompute:
                program.add_hint(r[i], sum(hint.stages[v].recompute_layers for v in unit.chunks))

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = 0
    # Probing (presolve fixing each variable in turn) costs more than it saves here: Gemma 3
    # 27B on 8 H100s, 18 programs: 29.8 -> 8.2 s; the zoo's others 4% less. Same answers.
    solver.parameters.cp_model_probing_level = 0
    if count_var is not None:
        # One recompute count for every chunk: branched on first, least first, min(count, n_v)
        # then propagates (Llama-3.1-405B on 64 A100s, pp 8: proved in 1.1 deterministic s,
        # not past the work limit; fixed search, 0.02 s there, changed hybrid answers).
        program.add_decision_strategy([count_var], cp_model.CHOOSE_FIRST,
                                      cp_model.SELECT_MIN_VALUE)
    solver.parameters.max_time_in_seconds = time_limit_s
    if work_limit is not None:
        solver.parameters.max_deterministic_time = work_limit
    watch = _Certifier(none_below)
    status = solver.solve(program, watch if none_below is not None else None)
    if on_work is not None:
        on_work(solver.response_proto.deterministic_time)
    if status == cp_model.FEASIBLE and watch.certified:
        status = cp_model.OPTIMAL
    if on_bound is not None and status in (cp_model.FEASIBLE, cp_model.UNKNOWN):
        on_bound(seconds_at_least(co, config, solver.best_objective_bound, below_s))
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None, status == cp_model.INFEASIBLE
    layers, recompute = [0] * num_virtual, [0] * num_virtual
    for i, unit in enumerate(units):
        total, left = solver.value(n[i]), solver.value(r[i]) if rules.recompute else 0
        if count_var is not None:
            count = solver.value(count_var)
            sizes = _split_uniform(total, len(unit.chunks), left, count)
            for v, size in zip(unit.chunks, sizes):
                layers[v], recompute[v] = size, min(count, size)
            continue
        for v, size in zip(unit.chunks, _split(total, len(unit.chunks))):
            layers[v], recompute[v] = size, min(size, left)
            left -= recompute[v]
    layout = build_layout(config, layers, recompute, rules.mtp_layers)
    stage_layers, stage_recompute = layout_layer_counts(co.kinds, layout, len(co.layer_s))
    answer = LayoutAnswer(layout=layout, step_s=co.step_s(stage_layers, stage_recompute),
                          memory_bytes=co.memory_bytes(stage_layers, stage_recompute),
                          status="optimal" if status == cp_model.OPTIMAL else "feasible",
                          objective=int(round(solver.objective_value)))
    return answer, status == cp_model.OPTIMAL


class _Certifier(cp_model.CpSolverSolutionCallback):
    """Stops the search at a layout that `none_below` proves optimal (solve_layout)."""

    def __init__(self, none_below: Callable[[int], bool] | None) -> None:
        super().__init__()
        self.none_below, self.certified = none_below, False

    def on_solution_callback(self) -> None:
        if self.none_below is not None and self.none_below(int(round(self.objective_value))):
            self.certified = True
            self.stop_search()


def _add_recompute(program: cp_model.CpModel, n: list, units: list[_Unit], num_layers: int,
                   rules: LayoutRules) -> tuple[list, cp_model.IntVar | None]:
    """r_u: the recomputed layers of each unit (constants 0 when none may), and the count R
    (None unless the rules take one). Under one count R
    for every chunk a chunk recomputes min(R, its layers); a unit of c interchangeable chunks
    holding T layers then recomputes anything from min(T, c - 1 + R) (one chunk takes all but
    c - 1 layers) to min(T, c R) (the even split), each value reached by some split
    (_split_uniform)."""
    if not rules.recompute:
        return [0] * len(n), None
    r = [program.new_int_var(0, num_layers, f"r{i}") for i in range(len(n))]
    count = None
    if rules.uniform_recompute:
        count = program.new_int_var(1, num_layers, "recompute_num_layers")
    for i, (x, unit) in enumerate(zip(r, units)):
        chunks = len(unit.chunks)
        if count is None:
            program.add(x <= n[i])
        elif chunks == 1:
            program.add_min_equality(x, [count, n[i]])
        else:
            least = program.new_int_var(0, num_layers, f"least{i}")
            program.add_min_equality(least, [n[i], count + (chunks - 1)])
            program.add(x >= least)
            program.add(x <= n[i])
            program.add(x <= chunks * count)
    program.add(sum(r) >= 1)
    return r, count


def _split_uniform(total: int, parts: int, recomputed: int, count: int) -> list[int]:
    """A split of `total` layers over `parts` chunks in which min(count, chunk) adds up to
    `recomputed`: from all but parts - 1 layers in one chunk, move layers one at a time from
    the largest chunk (above count) to the smallest (below count), each move recomputing one
    more."""
    sizes = [total - parts + 1] + [1] * (parts - 1)
    while sum(min(count, size) for size in sizes) < recomputed:
        sizes[sizes.index(max(sizes))] -= 1
        sizes[sizes.index(min(sizes))] += 1
    return sorted(sizes, reverse=True)


def build_layout(config: ParallelConfig, layers: list[int], recompute: list[int],
                 mtp_layers: int) -> PipelineLayout:
    """The PipelineLayout of per-virtual-stage layer and recompute counts."""
    last = len(layers) - 1
    stages = tuple(VirtualStage(layers=count, recompute_layers=recompute[v], embedding=v == 0,
                                loss=v == last, mtp_layers=mtp_layers if v == last else 0)
                   for v, count in enumerate(layers))
    return PipelineLayout(pp=config.pp, vpp=config.vpp, stages=stages)
