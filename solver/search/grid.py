"""Grids and lookup tables of the CP-SAT program (no ortools here); the step-time and memory
tables are filled by the numpy cost model in solver.search.time_tables and
solver.search.memory_tables.

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
table's largest reachable value. Two pieces compose the model's own functions rather than
call it whole: the DP traffic compared with compute (solver.cost.data_parallel; the
composition is checked on every grid point by time_tables._measure_contention), and the
memory of a stage as features times per-layer activations (the model's own functions on crafted layouts).

Exact tables have thousands of points (3-5 axes), which CP-SAT handles slowly; `project`
turns each into a few small tables whose maximum bounds it from below (minimum from above).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from solver.cost.candidates import Candidates
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
# Micro-batch size that makes compute hide every collective it can (the dp rate tables).


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


def whole(points: Mapping[str, np.ndarray], axis: str) -> np.ndarray:
    """The axis value as an integer array (its denominator is 1 where reachable)."""
    return points[axis + "_num"]


def make_candidates(size: int, **arrays: np.ndarray | int) -> Candidates:
    defaults = {"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "vpp": 1, "zero": 0,
                "micro_batch": 1, "recompute": 0}
    defaults.update(arrays)
    return Candidates(**{k: np.broadcast_to(np.asarray(v, dtype=np.int64), (size,))
                         for k, v in defaults.items()})


def divides(divisor: np.ndarray, n: int | np.ndarray) -> np.ndarray:
    return (np.asarray(n) % divisor) == 0


def rows_of(points: Mapping[str, np.ndarray], axis: str) -> dict[str, np.ndarray]:
    """micro_batch and cp realising the ratio `axis` (r or u with tp given elsewhere)."""
    return {"micro_batch": whole(points, axis), "cp": points[axis + "_den"]}



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
