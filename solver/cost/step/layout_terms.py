"""The cost model of one configuration as coefficients of its pipeline layout.

Under a configuration (tp, cp, pp, vpp, dp, ep, etp, zero, micro-batch, recompute) the step time
and every stage's memory are affine in what each stage holds: its layers of each kind and how
many of them recompute in full (solver.cost.step.steptime.compose_step_time,
solver.cost.memory.terms.compose_stage_memory). `estimate_layout_coefficients` reads those
coefficients off the two compositions, so the layout program (solver.search.layout_program)
optimises exactly the model that `parplan estimate --layout` evaluates: per pipeline stage i,

    T_i   = sum_k layers_ik * layer_s[k] + recompute_ik * recompute_s[k] + stage_s
            + (i == pp - 1) * last_s                                    seconds per micro-batch
    step  = m * max_i T_i + (sum_i T_i - max_i T_i) / vpp + fixed_s
    mem_i = base_bytes[i] + sum_k layers_ik * layer_bytes[i, k]
            + recompute_ik * recompute_bytes[i, k] + (recompute_i > 0) * working_bytes[i]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.distinct import distinct_rows
from solver.cost.layers.layer_compute_kept import LAYER_DEGREES
from solver.cost.memory.layout import estimate_in_flight, layer_kinds, num_layer_kinds
from solver.cost.memory.options import MemoryOptions
from solver.cost.memory.terms import (
    StageContent,
    compose_stage_total,
    estimate_memory_terms,
)
from solver.cost.step.steptime import TimeTerms, estimate_time_terms
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig


@dataclass(frozen=True)
class LayoutCoefficients:
    """The module docstring's coefficients for one configuration (floats, SI units)."""

    kinds: np.ndarray            # (L,) the kind of each decoder layer (0 dense, 1 MoE, ...)
    layer_s: np.ndarray          # (kinds,)
    recompute_s: np.ndarray      # (kinds,)
    stage_s: float
    last_s: float
    num_micro: float
    vpp: int
    fixed_s: float
    base_bytes: np.ndarray       # (pp,)
    layer_bytes: np.ndarray      # (pp, kinds)
    recompute_bytes: np.ndarray  # (pp, kinds)
    working_bytes: np.ndarray    # (pp,)

    def step_s(self, layers: np.ndarray, recompute: np.ndarray) -> float:
        """The step time of stages holding layers / recompute (arrays (pp, kinds))."""
        stage = layers @ self.layer_s + recompute @ self.recompute_s + self.stage_s
        stage[-1] += self.last_s
        return float(self.num_micro * stage.max() + (stage.sum() - stage.max()) / self.vpp
                     + self.fixed_s)

    def memory_bytes(self, layers: np.ndarray, recompute: np.ndarray) -> np.ndarray:
        """Each stage's bytes per GPU (arrays (pp, kinds) in, (pp,) out)."""
        return (self.base_bytes + (layers * self.layer_bytes).sum(axis=1)
                + (recompute * self.recompute_bytes).sum(axis=1)
                + np.where(recompute.sum(axis=1) > 0, self.working_bytes, 0.0))


def time_coefficients(terms: TimeTerms) -> dict[str, np.ndarray]:
    """Per candidate, the time coefficients of the module docstring (summed over parts):
    layer_s, recompute_s (N, kinds); stage_s, last_s, num_micro, vpp, fixed_s (N,). Rows are
    taken with {name: value[index]}."""
    return {"layer_s": terms.per_layer.sum(axis=2), "recompute_s": terms.recompute.sum(axis=2),
            "stage_s": terms.per_stage.sum(axis=1), "last_s": terms.last.sum(axis=1),
            "num_micro": terms.num_micro, "vpp": terms.vpp,
            "fixed_s": terms.pp_s + terms.dp_s + terms.optimizer_s}


def take_times(times: dict[str, np.ndarray], index: np.ndarray) -> dict[str, np.ndarray]:
    """The rows `index` of time_coefficients' answer."""
    return {name: value[index] for name, value in times.items()}


def estimate_layer_time_coefficients(model_spec: ModelSpec, cluster: ClusterSpec,
                                     job: JobSpec, candidates: Candidates,
                                     constants: TimeConstants | None = None
                                     ) -> dict[str, np.ndarray]:
    """time_coefficients of estimate_time_terms(..., layers_only=True): each coefficient at
    most the full one (the per-mesh terms at 0), so any step time composed from them is a
    lower bound. They depend on what a layer's time depends on (LAYER_DEGREES, and the
    recompute of the MTP layers) and on the micro-batch count and vpp: costed once per
    distinct tuple, then indexed."""
    d = {name: getattr(candidates, name) for name in (*LAYER_DEGREES, "recompute")}
    first, back = distinct_rows(d, tuple(d))
    light = estimate_time_terms(model_spec, cluster, job, candidates.take(first), constants,
                                layers_only=True)
    times = take_times(time_coefficients(light), back)
    times["num_micro"] = job.global_batch / (candidates.dp * candidates.micro_batch)
    times["vpp"] = candidates.vpp.astype(float)
    return times


@dataclass(frozen=True)
class StageMemoryCoefficients:
    """The memory coefficients of the module docstring for stage rows (bytes per GPU): base
    (R,), per layer of kind k (R, kinds), what recomputing one changes (R, kinds; <= 0), the
    working set of a stage that recomputes (R,)."""

    base_bytes: np.ndarray
    layer_bytes: np.ndarray
    recompute_bytes: np.ndarray
    working_bytes: np.ndarray


def estimate_stage_memory_coefficients(model_spec: ModelSpec, job: JobSpec, rows: Candidates,
                                       stage: np.ndarray, options: MemoryOptions | None = None
                                       ) -> StageMemoryCoefficients:
    """The memory coefficients of pipeline stage `stage[i]` of configuration `rows[i]`:
    differences of compose_stage_total (compose_stage_memory summed) on stages holding
    nothing, one layer, two layers and recomputed layers (the composition is affine in what a
    stage holds, so they are exact)."""
    options = options or MemoryOptions()
    n, num_kinds = len(rows), num_layer_kinds(model_spec)
    num_micro = np.maximum(job.global_batch // (rows.dp * rows.micro_batch), 1)
    in_flight = estimate_in_flight(rows, stage, num_micro)
    terms = estimate_memory_terms(model_spec, job, rows, options, totals=True)

    def total(layers: np.ndarray, recompute: np.ndarray) -> np.ndarray:
        content = StageContent(layers=np.broadcast_to(layers, (n, num_kinds)),
                               recompute=np.broadcast_to(recompute, (n, num_kinds)),
                               is_first=stage == 0, is_last=stage == rows.pp - 1,
                               in_flight=in_flight)
        return compose_stage_total(terms, content)

    none = np.zeros(num_kinds)
    base = total(none, none)
    layer = np.zeros((n, num_kinds))
    recompute = np.zeros((n, num_kinds))
    working = np.zeros(n)
    for kind in range(num_kinds):
        unit = np.eye(num_kinds)[kind]
        layer[:, kind] = total(unit, none) - base
        recompute[:, kind] = total(2 * unit, 2 * unit) - total(2 * unit, unit)
        working = total(unit, unit) - total(unit, none) - recompute[:, kind]
    return StageMemoryCoefficients(base_bytes=base, layer_bytes=layer,
                                   recompute_bytes=recompute, working_bytes=working)


def estimate_layout_coefficients(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                                 config: ParallelConfig, options: MemoryOptions | None = None,
                                 constants: TimeConstants | None = None,
                                 time_terms: TimeTerms | None = None) -> LayoutCoefficients:
    """The coefficients of `config` (module docstring), the memory ones from
    estimate_stage_memory_coefficients. `time_terms`: the configuration's TimeTerms (one row)
    when the caller has them."""
    options = options or MemoryOptions()
    if time_terms is None:
        time_terms = estimate_time_terms(model_spec, cluster, job,
                                         Candidates.from_configs([config]), constants)
    times = time_coefficients(time_terms)
    num_micro = job.global_batch / (config.dp * config.micro_batch)

    rows = Candidates.from_configs([config] * config.pp)
    memory = estimate_stage_memory_coefficients(model_spec, job, rows, np.arange(config.pp),
                                                options)
    return LayoutCoefficients(
        kinds=layer_kinds(model_spec), layer_s=times["layer_s"][0],
        recompute_s=times["recompute_s"][0], stage_s=float(times["stage_s"][0]),
        last_s=float(times["last_s"][0]), num_micro=num_micro, vpp=config.vpp,
        fixed_s=float(times["fixed_s"][0]), base_bytes=memory.base_bytes,
        layer_bytes=memory.layer_bytes, recompute_bytes=memory.recompute_bytes,
        working_bytes=memory.working_bytes)


def estimate_layout_lower_bound_s(model_spec: ModelSpec, times: dict[str, np.ndarray],
                                  pp: np.ndarray, num_recomputed: np.ndarray,
                                  above_s: float = np.inf) -> np.ndarray:
    """A lower bound of the step time of each candidate over every layout of its layers in
    which at least `num_recomputed` layers recompute in full; `times`: the candidates'
    time_coefficients.

    With S = sum_i T_i and M = max_i T_i, step = (m - 1/v) M + S / v + fixed grows with both,
    and m >= 1 >= 1/v. S is least with the fewest layers recomputing, the cheapest ones. M is
    at least S / pp, and at least what the last stage needs for x layers and the
    head, or what the other pp - 1 stages need for the L - x layers left: with a the cheapest
    layer, M >= min_x max(a ceil((L - x) / (pp - 1)), a x + c + last), found by bisection (the
    first term falls with x, the second rises). Exact for the even split of a dense model that
    balances: no layout of such a candidate can beat it. Where the bound with M = S / pp alone
    is at least `above_s`, that bound is returned (the caller needs no more).
    """
    counts = np.bincount(layer_kinds(model_spec), minlength=num_layer_kinds(model_spec))
    present = np.flatnonzero(counts)
    layer_s, recompute_s = times["layer_s"], times["recompute_s"]
    # Column by column: numpy's reductions over a short last axis are slow on long arrays.
    cheapest = np.minimum.reduce([layer_s[:, k] for k in present])
    cheapest_recompute = np.minimum.reduce([recompute_s[:, k] for k in present])
    layers_s = sum(counts[k] * layer_s[:, k] for k in present)
    stage_s, last_s = times["stage_s"], times["last_s"]
    total = (layers_s + pp * stage_s + last_s
             + np.where(num_recomputed > 0, num_recomputed * cheapest_recompute, 0.0))
    num_micro, vpp = times["num_micro"], times["vpp"]
    balanced = num_micro * total / pp + (total - total / pp) / vpp + times["fixed_s"]
    refine = np.flatnonzero(balanced < above_s)
    if len(refine) < len(pp):
        bound = balanced.copy()
        if len(refine):
            bound[refine] = estimate_layout_lower_bound_s(
                model_spec, take_times(times, refine), pp[refine], num_recomputed[refine])
        return bound
    num_layers = model_spec.num_hidden_layers
    others = np.maximum(pp - 1, 1)

    def rest(x: np.ndarray) -> np.ndarray:  # the busiest of the other stages
        return np.where(pp > 1, cheapest * np.ceil((num_layers - x) / others) + stage_s, 0.0)

    def last(x: np.ndarray) -> np.ndarray:
        return np.where(pp > 1, cheapest * x, cheapest * num_layers) + stage_s + last_s

    low, high = np.zeros(len(pp)), np.full(len(pp), float(num_layers))
    while np.any(high > low):  # the first x where the last stage is the busier
        middle = np.floor((low + high) / 2)
        above = last(middle) >= rest(middle)
        high = np.where(above, middle, high)
        low = np.where(above, low, middle + 1)
    busiest = np.maximum(last(high), rest(high))
    before = np.maximum(high - 1, 0)
    busiest = np.minimum(busiest, np.maximum(last(before), rest(before)))
    slowest = np.maximum(busiest, total / pp)
    return num_micro * slowest + (total - slowest) / vpp + times["fixed_s"]
