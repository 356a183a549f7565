"""Lookup tables of the CP-SAT program, filled by the numpy cost model (no ortools here).

Every degree is a product of prime powers, d = prod q^a_q over the primes of the problem (those
of the GPU count, the global batch and the layer count). An **axis** is a ratio of degrees, so
its exponents are a linear function of the degrees' exponents: `r` = micro_batch / cp (rows of
a GPU's GEMMs per sequence length), `u` = r / tp, `g` = ep x etp, `dm` = dp x micro_batch
(global_batch / dm micro-batches per step), or a **category** (zero, recompute, a stage kind).
A **grid** is the cartesian product of a few axes' digits (one digit per prime with a
non-trivial range, one per category; single-valued digits are kept aside as `fixed`), in
mixed-radix order. A **table** holds one cost term at every grid point; the program looks it
up with a table constraint over the digits' exponent variables.

Tables are filled by calling the cost model on representative candidates: any configuration
with the grid point's axis values gives the same term (that is what makes the term depend on
those axes only; `compose_step_time` / `compose_memory` rebuild the model's numbers from the
tables, and tests/test_cpsat.py checks them on every feasible configuration). Points no
configuration of the problem can reach (e.g. tp x pp not dividing the GPU count) get the
table's largest reachable value. Two pieces mirror the model rather than call it whole: the DP
traffic compared with compute (`_dp_sync`: the model's own collectives and stage parameters;
the composition is checked on every grid point by `_measure_contention`), and the memory of a
stage as features times per-layer activations (the model's own functions on crafted layouts).

Exact tables have thousands of points (3-5 axes), which CP-SAT handles slowly; `project`
turns each into a few small tables whose maximum bounds it from below (minimum from above).

Step time (solver.cost.steptime), per micro-batch on the slowest stage and per layer, with L =
ceil(layers / pp) layers per stage and n = global_batch / dm micro-batches:
    fwd(tp, r, ep, etp), bwd(tp, r, ep, etp)   forward and backward compute of one layer
                                                (the "recompute" and "compute" parts)
    head(tp, r)                                 LM head and loss (the "compute" part, minus L x)
    tp_comm(tp, r) [+ ep, etp under TP-overlap], cp_comm(tp, cp, micro_batch),
    ep_comm(ep, etp, u)                         the "tp", "cp", "ep" parts without full
                                                recompute; *_full_extra what it adds
    t_mb = L x (fwd + bwd + [full] (fwd + extras) + tp_comm + cp_comm + ep_comm) + head
    p2p(pp, u)                                  one pipeline hand-off (the "pp" part)
    optimizer(zero, tp, pp, g)                  the "optimizer" part
    dp_hidden_rate(zero, tp, pp, g)             the "dp" part when compute hides all it can
    dp_bwd_sync, dp_fwd_sync(zero, tp, pp, g)   the DP traffic compared with one micro-batch's
                                                backward / forward (their excess is exposed)
    step = t_mb x (n + (pp - 1) / vpp) + 2 n vpp p2p + dp + optimizer
    dp   = [zero 3: n x] (dp_hidden_rate + (1 - c) x (max(bwd_sync - L bwd, 0)
                                                     + max(fwd_sync - L fwd, 0)))
           c = SM contention of overlapped collectives, measured from the tables themselves.

Worst-stage memory (solver.cost.memory), over a few **stage slots**: for each (pp, vpp) the
stages that no other stage dominates (more of every layer kind, micro-batches in flight, the
embedding, the LM head), for every number of micro-batches; the memory of a stage is a sum
of non-negative coefficients times those stage features, so the worst stage is one of them:
    states_s(tp, pp, vpp, zero, g)              weights, grads, optimizer, ZeRO-3 gathers
    in_flight x dense layers, x MoE layers, x embedding, x (not last)   (pp, vpp, dm) features
    layer_dense(tp, r, recompute), layer_moe(tp, r, recompute, etp), embedding(tp, r),
    stage_output(tp, r)                         activations per layer / per micro-batch in flight
    last_stage(tp, r, recompute, etp)           LM head inputs, MTP, logits
    working_set_s(tp, r, etp, kind_s)           full recompute: the largest layer replayed
    memory_s = (1 + fragmentation) x (states + sum features x activations + [last] last_stage
               + [full] working_set + buckets) + CUDA context + NCCL
All memory tables already carry the (1 + fragmentation) factor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import combinations

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.comm import estimate_collective_s, estimate_group_link
from solver.cost.memory import estimate_stage_memory
from solver.cost.memory.activations import (
    estimate_layer_activation_bytes,
    estimate_logits_bytes,
    estimate_stage_activations,
)
from solver.cost.memory.layout import StageLayout, estimate_stage_layout
from solver.cost.steptime import BF16_BYTES, _stage_params, estimate_step_time
from solver.search.space import Problem

DEGREES = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "micro_batch")
RATIOS: dict[str, dict[str, int]] = {
    **{name: {name: 1} for name in DEGREES},
    "r": {"micro_batch": 1, "cp": -1},
    "u": {"micro_batch": 1, "cp": -1, "tp": -1},
    "g": {"ep": 1, "etp": 1},
    "dm": {"dp": 1, "micro_batch": 1},
}
RECOMPUTE_FULL = 2
# Micro-batch size that makes compute hide every collective it can (the dp_hidden_rate table).
HUGE_MICRO_BATCH = 2**30


def factorize(n: int) -> dict[int, int]:
    """Prime exponents of n >= 1: 96 -> {2: 5, 3: 1}."""
    out: dict[int, int] = {}
    q = 2
    while q * q <= n:
        while n % q == 0:
            out[q] = out.get(q, 0) + 1
            n //= q
        q += 1
    if n > 1:
        out[n] = out.get(n, 0) + 1
    return out


def to_units(values: np.ndarray, resolution: float, bound: str, cap: int) -> np.ndarray:
    """The one door from floats into CP-SAT: `values` (seconds or bytes) in integer units of
    `resolution`, rounded so that the integer is a valid `bound` ("lower" or "upper") of the
    float with a unit of slack for floating-point noise, clipped to [0, cap] (clipping a lower
    bound keeps it a lower bound; an upper bound is only clipped where it exceeds cap, which
    the program treats as "at least cap")."""
    scaled = np.asarray(values, dtype=float) / resolution
    assert np.all(np.isfinite(scaled)) and np.all(scaled >= -1e-6 * (1 + np.abs(scaled)))
    if bound == "lower":
        units = np.floor(scaled) - 1
    elif bound == "upper":
        units = np.ceil(scaled) + 1
    else:
        raise AssertionError(f"unknown bound {bound}")
    return np.clip(units, 0, cap).astype(np.int64)


@dataclass(frozen=True)
class Lattice:
    """The exponent box of every degree and the range of every category of one problem."""

    primes: tuple[int, ...]
    domains: Mapping[str, tuple[int, ...]]
    bounds: Mapping[str, Mapping[int, tuple[int, int]]]
    categories: Mapping[str, tuple[int, int]]
    ratio_bounds: Mapping[str, Mapping[int, tuple[int, int]]]

    def exponents(self, name: str, value: int) -> dict[int, int]:
        f = factorize(value)
        return {q: f.get(q, 0) for q in self.primes}

    def ratio_range(self, ratio: str, prime: int) -> tuple[int, int]:
        lo = hi = 0
        for var, coeff in RATIOS[ratio].items():
            a, b = self.bounds[var][prime]
            lo += coeff * (a if coeff > 0 else b)
            hi += coeff * (b if coeff > 0 else a)
        if ratio in self.ratio_bounds and prime in self.ratio_bounds[ratio]:
            a, b = self.ratio_bounds[ratio][prime]
            lo, hi = max(lo, a), min(hi, b)
        return lo, max(lo, hi)


def build_lattice(problem: Problem, domains: Mapping[str, Sequence[int]],
                  identities: bool) -> Lattice:
    """The lattice over `domains` (value lists of every variable). With `identities` (every
    structural constraint holds, as when solving) derived axes get tighter ranges:
    dp x micro_batch divides the global batch, ep x etp divides the GPU count."""
    numbers = [problem.num_gpus, problem.job.global_batch, problem.model_spec.num_hidden_layers]
    primes = tuple(sorted({q for n in numbers for q in factorize(n)}))
    bounds = {}
    for name in DEGREES:
        exps = [factorize(v) for v in domains[name]] or [{}]
        bounds[name] = {q: (min(e.get(q, 0) for e in exps), max(e.get(q, 0) for e in exps))
                        for q in primes}
    categories = {
        "zero": (min(domains["zero"], default=0), max(domains["zero"], default=0)),
        "recompute": (min(domains["recompute"], default=0), max(domains["recompute"], default=0)),
    }
    categories["full"] = (int(categories["recompute"][0] == RECOMPUTE_FULL),
                          int(categories["recompute"][1] == RECOMPUTE_FULL))
    ratio_bounds: dict[str, dict[int, tuple[int, int]]] = {}
    if identities:
        batch, gpus = factorize(problem.job.global_batch), factorize(problem.num_gpus)
        ratio_bounds["dm"] = {q: (0, batch.get(q, 0)) for q in primes}
        ratio_bounds["g"] = {q: (0, gpus.get(q, 0)) for q in primes}
    return Lattice(primes, dict(domains), bounds, categories, ratio_bounds)


@dataclass(frozen=True)
class Digit:
    """One digit of a grid: an axis (a ratio at one prime, or a category) and its range."""

    axis: str
    prime: int | None
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo + 1


@dataclass(frozen=True)
class Grid:
    """Grid points of a few axes, first digit most significant; `fixed` digits have a single
    value (part of every point, not of the index)."""

    axes: tuple[str, ...]
    digits: tuple[Digit, ...]
    fixed: tuple[Digit, ...] = ()

    @property
    def size(self) -> int:
        return math.prod(d.size for d in self.digits)

    @property
    def strides(self) -> tuple[int, ...]:
        out, stride = [], 1
        for d in reversed(self.digits):
            out.append(stride)
            stride *= d.size
        return tuple(reversed(out))

    def points(self) -> dict[str, np.ndarray]:
        """Per axis, its value at every grid point: exponent arrays per prime are turned into
        a (numerator, denominator) pair for ratios, the integer for categories."""
        shape = tuple(d.size for d in self.digits) or (1,)
        index = np.indices(shape).reshape(len(shape), -1) if self.digits else np.zeros((0, 1))
        size = index.shape[1]
        out: dict[str, np.ndarray] = {}
        for axis in self.axes:
            if axis not in RATIOS:
                out[axis] = np.zeros(size, dtype=np.int64)
                continue
            out[axis + "_num"] = np.ones(size, dtype=np.int64)
            out[axis + "_den"] = np.ones(size, dtype=np.int64)
        constant = [(d, np.full(size, d.lo)) for d in self.fixed]
        for d, value in [*((d, index[k] + d.lo) for k, d in enumerate(self.digits)), *constant]:
            if d.prime is None:
                out[d.axis] = value.astype(np.int64)
                continue
            out[d.axis + "_num"] *= d.prime ** np.maximum(value, 0).astype(np.int64)
            out[d.axis + "_den"] *= d.prime ** np.maximum(-value, 0).astype(np.int64)
        return out


def build_grid(lattice: Lattice, axes: Sequence[str],
               categories: Mapping[str, tuple[int, int]] | None = None) -> Grid:
    """The grid of `axes` (ratios or categories of the lattice or `categories`); digits with
    a single value are left out."""
    extra = dict(categories or {})
    digits, fixed = [], []
    for axis in axes:
        if axis in RATIOS:
            for q in lattice.primes:
                lo, hi = lattice.ratio_range(axis, q)
                (digits if hi > lo else fixed).append(Digit(axis, q, lo, hi))
            continue
        lo, hi = extra[axis] if axis in extra else lattice.categories[axis]
        (digits if hi > lo else fixed).append(Digit(axis, None, lo, hi))
    return Grid(tuple(axes), tuple(digits), tuple(fixed))


@dataclass(frozen=True)
class Table:
    """One term at every grid point, in float (seconds or bytes) and as a reachable mask."""

    name: str
    grid: Grid
    values: np.ndarray
    reachable: np.ndarray

    def filled(self) -> np.ndarray:
        """Values with unreachable points set to the largest reachable one."""
        top = float(self.values[self.reachable].max()) if self.reachable.any() else 0.0
        return np.where(self.reachable, self.values, top)


def _whole(points: Mapping[str, np.ndarray], axis: str) -> np.ndarray:
    """The axis value as an integer array (its denominator is 1 where reachable)."""
    return points[axis + "_num"]


def _candidates(size: int, **arrays: np.ndarray | int) -> Candidates:
    defaults = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "zero": 0,
                "micro_batch": 1, "recompute": 0}
    defaults.update(arrays)
    return Candidates(**{k: np.broadcast_to(np.asarray(v, dtype=np.int64), (size,))
                         for k, v in defaults.items()})


def _divides(divisor: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    return (np.asarray(n) % divisor) == 0


# ---- step time ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TimeTables:
    """The step-time terms (seconds) and the constants of their composition."""

    tables: dict[str, Table]
    contention: float  # c: extra compute per second of overlapped DP traffic


def _steptime(problem: Problem, candidates: Candidates):
    return estimate_step_time(problem.model_spec, problem.cluster, problem.job, candidates,
                              problem.time_constants)


def _rows(points: Mapping[str, np.ndarray], axis: str) -> dict[str, np.ndarray]:
    """micro_batch and cp realising the ratio `axis` (r or u with tp given elsewhere)."""
    return {"micro_batch": _whole(points, axis), "cp": points[axis + "_den"]}


def _per_layer(problem: Problem, part: str, candidates: Candidates,
               num_layers_per_stage: float) -> np.ndarray:
    """A part that the cost model gives as n x L x value: the value."""
    micro = problem.job.global_batch / (candidates.dp * candidates.micro_batch)
    return getattr(_steptime(problem, candidates), part) / (micro * num_layers_per_stage)


def build_time_tables(problem: Problem, lattice: Lattice) -> TimeTables:
    """Every step-time table of the module docstring (solve mode: all identities hold)."""
    m, n_gpus, batch = problem.model_spec, problem.num_gpus, problem.job.global_batch
    layers = m.num_hidden_layers
    moe = m.is_moe
    tables: dict[str, Table] = {}

    def add(names: Sequence[str], axes: Sequence[str], fill: Callable[..., tuple]) -> None:
        grid = build_grid(lattice, axes)
        points = grid.points()
        values, reachable = fill(points, grid.size)
        values = values if isinstance(values, tuple) else (values,)
        mask = np.broadcast_to(np.asarray(reachable, bool), (grid.size,)).copy()
        for name, value in zip(names, values):
            tables[name] = Table(name, grid, np.asarray(value, float), mask)

    def layer_candidates(p: dict, size: int, **kw) -> Candidates:
        fields = {"tp": _whole(p, "tp"), **_rows(p, "r")}
        if "ep_num" in p:
            fields.update(ep=_whole(p, "ep"), etp=_whole(p, "etp"))
        if "full" in p:
            fields["recompute"] = RECOMPUTE_FULL * p["full"]
        return _candidates(size, **{**fields, **kw})

    def fill_compute(p: dict, size: int) -> tuple[tuple[np.ndarray, ...], bool]:
        # fwd from the "recompute" part (full recompute replays one forward); fwd + bwd and
        # the head from the "compute" part at two stage depths (L = layers and L = 1).
        full = layer_candidates(p, size, recompute=RECOMPUTE_FULL)
        micro = batch / full.micro_batch
        fwd = _steptime(problem, full).recompute / (micro * layers)
        deep = _steptime(problem, layer_candidates(p, size)).compute / micro
        if layers > 1:
            shallow = _steptime(problem, layer_candidates(p, size, pp=layers)).compute / micro
            both = (deep - shallow) / (layers - 1)
            head = np.maximum(deep - layers * both, 0.0)
        else:
            both, head = deep, np.zeros_like(deep)
        return (fwd, both - fwd, head), True

    per_layer_axes = ("tp", "r", "ep", "etp") if moe else ("tp", "r")
    add(("fwd", "bwd"), per_layer_axes, lambda p, size: (fill_compute(p, size)[0][:2], True))
    add(("head",), ("tp", "r"), lambda p, size: (fill_compute(p, size)[0][2], True))
    # Communication per layer without full recompute, and what full recompute adds (it
    # replays the forward's collectives): two tables without the recompute axis.
    def add_comm(name: str, part: str, axes: Sequence[str], candidates) -> None:
        def fill(p: dict, size: int) -> tuple[tuple[np.ndarray, np.ndarray], bool]:
            base = _per_layer(problem, part, candidates(p, size, 0), layers)
            full = _per_layer(problem, part, candidates(p, size, RECOMPUTE_FULL), layers)
            return (base, np.maximum(full - base, 0.0)), True
        add((name, name + "_full_extra"), axes, fill)

    # TP overlap hides TP traffic behind the layer's GEMMs, which depend on ep and etp.
    tp_axes = per_layer_axes if problem.time_constants.tp_comm_overlap else ("tp", "r")
    add_comm("tp_comm", "tp", tp_axes,
             lambda p, size, rc: layer_candidates(p, size, recompute=rc))
    add_comm("cp_comm", "cp", ("tp", "cp", "micro_batch"), lambda p, size, rc: _candidates(
        size, tp=_whole(p, "tp"), cp=_whole(p, "cp"), micro_batch=_whole(p, "micro_batch"),
        recompute=rc))
    if moe:
        add_comm("ep_comm", "ep", ("ep", "etp", "u"), lambda p, size, rc: _candidates(
            size, ep=_whole(p, "ep"), etp=_whole(p, "etp"), **_rows(p, "u"), recompute=rc))

    handoff = "u" if problem.time_constants.sequence_parallel else "r"

    def fill_p2p(p: dict, size: int) -> tuple[np.ndarray, np.ndarray]:
        pp, rows = _whole(p, "pp"), _rows(p, handoff)
        reachable = _divides(pp * rows["cp"], n_gpus)
        dp = np.where(reachable, n_gpus // (pp * rows["cp"]), 1)
        c = _candidates(size, pp=pp, dp=dp, **rows)
        micro = batch / (c.dp * c.micro_batch)
        return _steptime(problem, c).pp / (micro * 2.0), reachable

    add(("p2p",), ("pp", handoff), fill_p2p)

    def shard_candidates(p: dict, size: int, **kw) -> tuple[Candidates, np.ndarray]:
        tp, pp, g = _whole(p, "tp"), _whole(p, "pp"), _whole(p, "g")
        reachable = _divides(tp * pp, n_gpus) & _divides(g * pp, n_gpus)
        dp = np.where(reachable, n_gpus // (tp * pp), 1)
        return _candidates(size, tp=tp, pp=pp, dp=dp, ep=g, zero=p["zero"], **kw), reachable

    def fill_shards(p: dict, size: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        c, reachable = shard_candidates(p, size)
        optimizer = _steptime(problem, c).optimizer
        bwd_sync, fwd_sync = _dp_sync(problem, c)
        hidden = replace(c, micro_batch=np.full(size, HUGE_MICRO_BATCH))
        micro = batch / (hidden.dp * hidden.micro_batch)
        dp_time = _steptime(problem, hidden).dp
        rate = np.where(c.zero == 3, dp_time / micro, dp_time)
        return (optimizer, rate, bwd_sync, fwd_sync), reachable

    add(("optimizer", "dp_hidden_rate", "dp_bwd_sync", "dp_fwd_sync"),
        ("zero", "tp", "pp", "g"), fill_shards)
    return TimeTables(tables, _measure_contention(problem, tables))


def _dp_sync(problem: Problem, c: Candidates) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of the DP collectives that one micro-batch's backward (first) and forward
    (second) can hide, by ZeRO stage: the gradient all-reduce (0) or reduce-scatter (1, 2)
    behind the backward and the parameter all-gather (1-3) behind the forward; ZeRO-3 also
    reduce-scatters behind each backward. The volumes are the cost model's (steptime.py: the
    dense stage parameters over dp x cp, the experts over the expert-data-parallel group)."""
    m, cluster, constants = problem.model_spec, problem.cluster, problem.time_constants
    dense_params, expert_params = _stage_params(m, c.pp)
    dense_local = dense_params / c.tp
    expert_local = expert_params / (c.ep * c.etp)
    edp = np.maximum(c.tp * c.cp * c.dp // (c.ep * c.etp), 1)
    dp_ranks = c.cp * c.dp
    dp_link = estimate_group_link(cluster, c.tp, dp_ranks)
    edp_link = estimate_group_link(cluster, c.etp * c.ep, edp)

    def sync(bytes_per_param: float, op: str) -> np.ndarray:
        return (estimate_collective_s(op, dense_local * bytes_per_param, dp_ranks, dp_link)
                + estimate_collective_s(op, expert_local * bytes_per_param, edp, edp_link))

    grads = constants.grad_reduce_bytes
    all_reduce = sync(grads, "all_reduce")
    reduce_scatter = sync(grads, "reduce_scatter")
    all_gather = sync(BF16_BYTES, "all_gather")
    zero3 = sync(constants.zero3_grad_reduce_bytes, "reduce_scatter")
    bwd = np.select([c.zero == 0, c.zero == 3], [all_reduce, all_gather + zero3],
                    default=reduce_scatter)
    fwd = np.where(c.zero == 0, 0.0, all_gather)
    return bwd, fwd


def _measure_contention(problem: Problem, tables: Mapping[str, Table]) -> float:
    """c in dp_hidden_rate = (bwd_sync + fwd_sync) x (c + 1/L), read from the tables; the
    composition of the "dp" part is checked here, on every grid point, so that a change of the
    cost model fails loudly instead of making the solver disagree with it."""
    hidden, bwd, fwd = (tables[k] for k in ("dp_hidden_rate", "dp_bwd_sync", "dp_fwd_sync"))
    points = hidden.grid.points()
    pp = _whole(points, "pp")
    layers_per_stage = np.ceil(problem.model_spec.num_hidden_layers / pp)
    volume = bwd.values + fwd.values
    use = hidden.reachable & (volume > 0)
    if not use.any():
        return 0.0
    rates = hidden.values[use] / volume[use] - 1.0 / layers_per_stage[use]
    contention = float(np.median(rates))
    assert np.allclose(rates, contention, rtol=1e-9, atol=1e-12), (
        "the step-time model's DP exposure no longer reads (sync) x (c + 1/L) when compute "
        "hides it: update solver/search/tables.py")
    assert 0.0 <= contention < 1.0
    return contention


# ---- memory ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryTables:
    """Memory terms (bytes) per stage slot and shared per-layer activations."""

    slots: int
    states: list[Table]            # per slot
    features: list[dict[str, Table]]  # per slot: in-flight products, last, kind
    working_set: list[Table]       # per slot
    activations: dict[str, Table]  # layer_dense, layer_moe, embedding, stage_output, last_stage
    fixed_bytes: float
    feature_scale: int             # features are integers in units of 1 / feature_scale


STAGE_FEATURES = ("dense", "moe", "first", "not_last")  # multiplied by micro-batches in flight


def _stage_features(layout: StageLayout, scale: int) -> dict[str, np.ndarray]:
    flight = layout.in_flight
    out = {
        "dense": flight * layout.num_dense_layers,
        "moe": flight * layout.num_moe_layers,
        "first": flight * layout.is_first,
        "not_last": flight * ~layout.is_last,
    }
    out = {k: np.rint(v * scale).astype(np.int64) for k, v in out.items()}
    out["last"] = layout.is_last.astype(np.int64)
    out["kind"] = ((layout.num_dense_layers > 0).astype(np.int64)
                   + 2 * (layout.num_moe_layers > 0).astype(np.int64))
    out["num_dense"] = layout.num_dense_layers.astype(np.int64)
    out["num_moe"] = layout.num_moe_layers.astype(np.int64)
    return out


def _layout(problem: Problem, candidates: Candidates, stage: np.ndarray) -> StageLayout:
    return estimate_stage_layout(problem.model_spec, problem.job, candidates, stage,
                                 problem.memory_options.account_for_embedding_in_pipeline_split)


def select_stage_slots(problem: Problem, lattice: Lattice) -> dict[tuple[int, int], list[int]]:
    """For each (pp, vpp) of the domains, the stages that can be the worst one: those no other
    stage dominates (every feature at least as large) for some number of micro-batches."""
    pps, vpps = lattice.domains["pp"], lattice.domains["vpp"]
    dms = sorted({d * b for d in lattice.domains["dp"] for b in lattice.domains["micro_batch"]})
    rows = [(pp, vpp, dm, s) for pp in pps for vpp in vpps for dm in dms for s in range(pp)]
    if not rows:
        return {}
    pp, vpp, dm, stage = (np.array(col, dtype=np.int64) for col in zip(*rows))
    c = _candidates(len(pp), pp=pp, vpp=vpp, dp=dm)
    f = _stage_features(_layout(problem, c, stage), 1)
    keys = ("dense", "moe", "first", "not_last", "last", "num_dense", "num_moe")
    matrix = np.stack([f[k] for k in keys] + [f["kind"] & 1, f["kind"] >> 1], axis=1)
    slots: dict[tuple[int, int], set[int]] = {}
    start = 0
    for p in pps:
        earlier = np.tril(np.ones((p, p), bool), -1).T  # earlier[j, i]: j < i
        for v in vpps:
            block = matrix[start:start + p * len(dms)].reshape(len(dms), p, -1)
            start += p * len(dms)
            ge = (block[:, :, None, :] >= block[:, None, :, :]).all(axis=3)  # [d, j, i]: j >= i
            gt = (block[:, :, None, :] > block[:, None, :, :]).any(axis=3)
            dominated = (ge & (gt | earlier)).any(axis=1)  # [d, i]
            slots[(p, v)] = set(np.flatnonzero((~dominated).any(axis=0)).tolist())
    return {key: sorted(v) for key, v in slots.items()}


def build_memory_tables(problem: Problem, lattice: Lattice,
                        slots: Mapping[tuple[int, int], Sequence[int]],
                        feature_scale: int, max_slots: int | None = None) -> MemoryTables:
    """Every memory table of the module docstring, for the first `max_slots` stage slots;
    valid wherever tp x cp x pp x dp equals the GPU count (no other identity is assumed)."""
    m, job, options = problem.model_spec, problem.job, problem.memory_options
    n_gpus = problem.num_gpus
    grow = 1.0 + options.fragmentation
    num_slots = max((len(v) for v in slots.values()), default=1)
    num_slots = min(num_slots, max_slots or num_slots)

    keys = sorted(slots)
    key_pp = np.array([p for p, _ in keys], dtype=np.int64)
    key_vpp = np.array([v for _, v in keys], dtype=np.int64)
    stage_of = np.array([[chosen[k] if k < len(chosen) else chosen[0] for k in range(num_slots)]
                         for chosen in (slots[key] for key in keys)], dtype=np.int64).reshape(
        len(keys), num_slots)

    def slot_stage(pp: np.ndarray, vpp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Stage of slot k for each (pp, vpp), and whether (pp, vpp) is in the domains."""
        match = (pp[:, None] == key_pp[None, :]) & (vpp[:, None] == key_vpp[None, :])
        known = match.any(axis=1)
        stage = np.where(known, stage_of[match.argmax(axis=1), k] if len(keys) else 0, 0)
        return stage.astype(np.int64), known

    def table(name: str, axes: Sequence[str], fill, categories=None) -> Table:
        grid = build_grid(lattice, axes, categories)
        p = grid.points()
        values, reachable = fill(p, grid.size)
        return Table(name, grid, np.asarray(values, float),
                     np.broadcast_to(np.asarray(reachable, bool), (grid.size,)).copy())

    states, features, working = [], [], []
    kind_range = {"kind": (0, 3)}
    for k in range(num_slots):
        def fill_states(p, size, k=k):
            tp, pp, g = _whole(p, "tp"), _whole(p, "pp"), _whole(p, "g")
            vpp = _whole(p, "vpp")
            stage, known = slot_stage(pp, vpp, k)
            reachable = known & _divides(tp * pp, n_gpus)
            dp = np.where(reachable, n_gpus // (tp * pp), 1)
            c = _candidates(size, tp=tp, pp=pp, dp=dp, ep=g, vpp=vpp, zero=p["zero"])
            items = estimate_stage_memory(m, job, c, stage, options).items
            held = items["weights"] + items["grads"] + items["optimizer"] + items["zero3_gather"]
            return grow * held, reachable

        states.append(table(f"states_{k}", ("tp", "pp", "vpp", "zero", "g"), fill_states))

        feats: dict[str, Table] = {}
        for key in (*STAGE_FEATURES, "last", "kind"):
            axes = ("pp", "vpp") if key in ("last", "kind") else ("pp", "vpp", "dm")

            def fill_feature(p, size, k=k, key=key, axes=axes):
                pp, vpp = _whole(p, "pp"), _whole(p, "vpp")
                dm = _whole(p, "dm") if "dm" in axes else np.ones(size, dtype=np.int64)
                stage, known = slot_stage(pp, vpp, k)
                c = _candidates(size, pp=pp, vpp=vpp, dp=dm)
                return _stage_features(_layout(problem, c, stage), feature_scale)[key], known

            feats[key] = table(f"{key}_{k}", axes, fill_feature)
        features.append(feats)

    def layout_of(size: int, dense=0.0, moe_layers=0.0, first=False, last=False, flight=0.0):
        full = np.full(size, 1.0)
        return StageLayout(num_dense_layers=dense * full, num_moe_layers=moe_layers * full,
                           is_first=np.full(size, first), is_last=np.full(size, last),
                           num_microbatches=np.ones(size, dtype=np.int64),
                           in_flight=flight * full)

    def rows(p, size, recompute=0, etp=None):
        return _candidates(size, tp=_whole(p, "tp"), **_rows(p, "r"), recompute=recompute,
                           etp=1 if etp is None else etp)

    def activations(c: Candidates, layout: StageLayout) -> np.ndarray:
        return estimate_stage_activations(m, job, c, layout, options)

    for k in range(num_slots):
        def fill_working(p, size):
            c = rows(p, size, RECOMPUTE_FULL, _whole(p, "etp") if m.is_moe else None)
            kind = p["kind"]
            layout = replace(layout_of(size), num_dense_layers=(kind & 1).astype(float),
                             num_moe_layers=(kind >> 1).astype(float))
            return grow * activations(c, layout), True

        working.append(table(f"working_set_{k}", ("tp", "r", "etp", "kind") if m.is_moe
                             else ("tp", "r", "kind"), fill_working, kind_range))

    shared: dict[str, Table] = {}

    def fill_layer(moe: bool):
        def fill(p, size):
            c = rows(p, size, p["recompute"], _whole(p, "etp") if moe else None)
            return grow * estimate_layer_activation_bytes(m, job, c, options, moe=moe), True
        return fill

    shared["layer_dense"] = table("layer_dense", ("tp", "r", "recompute"), fill_layer(False))
    if m.is_moe:
        shared["layer_moe"] = table("layer_moe", ("tp", "r", "recompute", "etp"),
                                    fill_layer(True))

    def fill_output(p, size):
        return grow * activations(rows(p, size), layout_of(size, flight=1.0)), True

    def fill_embedding(p, size):
        c = rows(p, size)
        both = activations(c, layout_of(size, first=True, flight=1.0))
        return grow * (both - activations(c, layout_of(size, flight=1.0))), True

    def fill_last(p, size):
        c = rows(p, size, p["recompute"], _whole(p, "etp") if m.is_moe else None)
        layout = layout_of(size, last=True)
        return grow * (activations(c, layout) + estimate_logits_bytes(m, job, c, layout,
                                                                     options)), True

    shared["stage_output"] = table("stage_output", ("tp", "r"), fill_output)
    shared["embedding"] = table("embedding", ("tp", "r"), fill_embedding)
    shared["last_stage"] = table("last_stage", ("tp", "r", "recompute", "etp") if m.is_moe
                                 else ("tp", "r", "recompute"), fill_last)

    one = _candidates(1)
    items = estimate_stage_memory(m, job, one, 0, options).items
    fixed = grow * items["comm_buckets"][0] + items["cuda_context"][0] + items["nccl"][0]
    return MemoryTables(num_slots, states, features, working, shared, float(fixed),
                        feature_scale)


# ---- small tables for the program ----------------------------------------------------------

def project(table: Table, max_rows: int, max_count: int, upper: bool = False
            ) -> list[tuple[Grid, np.ndarray]]:
    """A few small tables whose maximum (upper: minimum) bounds `table` from below (above)
    at every reachable point: projections on subsets of its digits of at most `max_rows`
    points, the minimum (maximum) over the other digits, chosen greedily by how much they
    tighten the bound (relative to each point's value). A table that is small already is
    returned as it is."""
    grid, values = table.grid, table.filled()
    shape = tuple(d.size for d in grid.digits)
    if values.size <= max_rows or not shape:
        return [(grid, values)]
    full = values.reshape(shape)
    reach = table.reachable.reshape(shape)
    masked = np.where(reach, full, -np.inf if upper else np.inf)
    options = []
    for size in range(1, len(shape)):
        for keep in combinations(range(len(shape)), size):
            if math.prod(shape[k] for k in keep) > max_rows:
                continue
            drop = tuple(k for k in range(len(shape)) if k not in keep)
            proj = (masked.max if upper else masked.min)(axis=drop, keepdims=True)
            proj = np.where(np.isfinite(proj), proj, full.max() if upper else 0.0)
            options.append((keep, proj))
    options = [o for o in options if not any(set(o[0]) < set(p[0]) for p in options)]
    weight = reach / np.maximum(np.abs(full), 1e-300)
    bound = np.full(shape, np.inf if upper else 0.0)
    chosen: list[tuple[tuple[int, ...], np.ndarray]] = []
    for _ in range(max_count):
        if not options:
            break
        def tighter(option) -> np.ndarray:
            return np.minimum(bound, option[1]) if upper else np.maximum(bound, option[1])

        def gain(option) -> float:
            new = tighter(option)
            diff = np.where(np.isfinite(bound), np.abs(new - bound), np.abs(new))
            return float((diff * weight).sum())

        best = max(options, key=gain)
        if chosen and gain(best) <= 1e-6 * reach.sum():
            break
        chosen.append(best)
        options.remove(best)
        bound = tighter(best)
    out = []
    for keep, proj in chosen:
        sub = Grid(tuple(dict.fromkeys(grid.digits[k].axis for k in keep)),
                   tuple(grid.digits[k] for k in keep), grid.fixed)
        out.append((sub, proj.reshape(-1)))
    return out


# ---- the composition, in floats (what the program encodes; tests compare it with the model) --

def _digit_values(candidates: Candidates, digit: Digit, categories: Mapping[str, np.ndarray]
                  ) -> np.ndarray:
    if digit.prime is None:
        if digit.axis in categories:
            return categories[digit.axis]
        if digit.axis == "full":
            return (candidates.recompute == RECOMPUTE_FULL).astype(np.int64)
        return getattr(candidates, digit.axis)
    total = np.zeros(len(candidates), dtype=np.int64)
    for var, coeff in RATIOS[digit.axis].items():
        values = getattr(candidates, var).copy()
        exps = np.zeros(len(values), dtype=np.int64)
        while True:
            divisible = values % digit.prime == 0
            if not divisible.any():
                break
            exps += divisible
            values = np.where(divisible, values // digit.prime, values)
        total += coeff * exps
    return total


def lookup_values(table: Table, candidates: Candidates,
                  categories: Mapping[str, np.ndarray] | None = None) -> np.ndarray:
    """The table's value at each candidate's grid point."""
    index = np.zeros(len(candidates), dtype=np.int64)
    for digit, stride in zip(table.grid.digits, table.grid.strides):
        index += stride * (_digit_values(candidates, digit, categories or {}) - digit.lo)
    return table.filled()[index]


def compose_step_time(problem: Problem, timing: TimeTables, candidates: Candidates
                      ) -> np.ndarray:
    """Step seconds of each candidate from the tables, composed as the module docstring says
    (and as cpsat_program.add_step_time_objective encodes)."""
    def term(name: str) -> np.ndarray:
        table = timing.tables.get(name)
        return lookup_values(table, candidates) if table is not None else 0.0

    c = candidates
    per_stage = np.ceil(problem.model_spec.num_hidden_layers / c.pp)
    micro = problem.job.global_batch / (c.dp * c.micro_batch)
    full = c.recompute == RECOMPUTE_FULL
    fwd, bwd = term("fwd"), term("bwd")
    comm = sum(term(name) + np.where(full, term(name + "_full_extra"), 0.0)
               for name in ("tp_comm", "cp_comm", "ep_comm"))
    layer = fwd + bwd + np.where(full, fwd, 0.0) + comm
    t_mb = per_stage * layer + term("head")
    main = t_mb * (micro + (c.pp - 1) / c.vpp)
    p2p = 2 * micro * c.vpp * term("p2p")
    excess = (np.maximum(term("dp_bwd_sync") - per_stage * bwd, 0.0)
              + np.maximum(term("dp_fwd_sync") - per_stage * fwd, 0.0))
    per_sync = term("dp_hidden_rate") + (1.0 - timing.contention) * excess
    dp = np.where(c.zero == 3, micro * per_sync, per_sync)
    return main + p2p + dp + term("optimizer")


def compose_memory(problem: Problem, tables: MemoryTables, candidates: Candidates,
                   slots: Sequence[int] | None = None) -> np.ndarray:
    """Worst-stage bytes of each candidate from the tables (the largest of the stage slots),
    composed as cpsat_program.add_memory_fits_hbm encodes."""
    full = candidates.recompute == RECOMPUTE_FULL
    uses = {"dense": "layer_dense", "moe": "layer_moe", "first": "embedding",
            "not_last": "stage_output"}
    worst = np.zeros(len(candidates))
    for k in range(tables.slots) if slots is None else slots:
        feats = tables.features[k]
        total = lookup_values(tables.states[k], candidates) + tables.fixed_bytes
        for key, name in uses.items():
            if name in tables.activations:
                count = lookup_values(feats[key], candidates) / tables.feature_scale
                total = total + count * lookup_values(tables.activations[name], candidates)
        total = total + lookup_values(feats["last"], candidates) * lookup_values(
            tables.activations["last_stage"], candidates)
        kind = lookup_values(feats["kind"], candidates).astype(np.int64)
        working = lookup_values(tables.working_set[k], candidates, {"kind": kind})
        worst = np.maximum(worst, total + np.where(full, working, 0.0))
    return worst
