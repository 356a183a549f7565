"""The step-time tables of the CP-SAT program, filled by the numpy cost model (grids and
lookups: solver.search.grid).

Step time (solver.cost.steptime), per micro-batch on the slowest stage and per layer, with L =
ceil(layers / pp) layers per stage and n = global_batch / dm micro-batches:
    fwd(tp, r) + fwd_routed(u, ep, etp),       forward and backward compute of one layer
    bwd(tp, r) + bwd_routed(u, ep, etp)         (the "recompute" and "compute" parts), the
                                                routed experts apart (they alone see ep, etp)
    head(tp, r)                                 LM head and loss (the "compute" part, minus L x
                                                and the gradient accumulation)
    grad_accumulation                           gradient accumulation outside the GEMMs per
                                                micro-batch (part of "compute"): dense (tp, pp)
                                                + experts (pp, g), as the optimizer below
    tp_comm(tp, r) [+ ep, etp under TP-overlap], cp_comm(tp, cp, micro_batch),
    ep_comm(ep, etp, u) [(tp, r, ep, etp) under EP-overlap]
                                                the "tp", "cp", "ep" parts without full
                                                recompute; *_full_extra what it adds
    t_mb = L x (fwd + bwd + [full] (fwd + extras) + tp_comm + cp_comm + ep_comm) + head
           + grad_accumulation
    p2p(pp, u) [(pp, tp, r) without sequence parallel: the arrival all-gather over TP]
                                                one pipeline hand-off (the "pp" part)
    optimizer, dp_{bwd,fwd}_rate, dp_bwd_sync, dp_fwd_sync, each the sum of an exact table of
    the dense parameters' part (zero, tp, pp) and one of the experts' part (zero, pp, g)
    (solver.cost.data_parallel): the "optimizer" part, the "dp" part when compute hides all
    it can, and the DP traffic compared with one micro-batch's backward / forward (their
    excess is exposed)
    step = t_mb x (n + (pp - 1) / vpp) + 2 n vpp p2p + dp + optimizer
    dp   = e_b (dp_bwd_rate + (1 - c) max(bwd_sync - L bwd, 0))
           + e_f (dp_fwd_rate + (1 - c) max(fwd_sync - L fwd, 0))
           e_b, e_f: n for ZeRO-3 (and e_b for DeepSpeed's ZeRO-2), else 1
           (steptime.dp_syncs_per_step); with V a side's volume, its sync table holds the
           part that can hide, V (1 - 1/L), and its rate V (1/L + c (1 - 1/L)); c = SM
           contention of overlapped collectives (the cost model's, checked against it at
           every grid point). Where a side does not overlap (TimeConstants.dp_overlap by pp,
           zero0_grad_overlap, params_gather_overlap) its rate is the whole V and its sync
           table 0: nothing is compared with compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.data_parallel import (
    estimate_dp_collectives_s,
    estimate_grad_accumulation_s,
    estimate_optimizer_s,
)
from solver.cost.steptime import estimate_layer_compute_s, estimate_step_time, sm_contention
from solver.cost.time_constants import dp_part_overlaps, dp_syncs_per_step
from solver.search.grid import (
    RECOMPUTE_FULL,
    Lattice,
    Table,
    build_grid,
    divides,
    lookup_values,
    make_candidates,
    rows_of,
    whole,
)
from solver.search.space import Problem

HUGE_MICRO_BATCH = 2**30


# ---- step time ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TimeTables:
    """The step-time terms (seconds) and the constants of their composition."""

    tables: dict[str, Table]
    contention: float  # c: extra compute per second of overlapped DP traffic


def _steptime(problem: Problem, candidates: Candidates):
    return estimate_step_time(problem.model_spec, problem.cluster, problem.job, candidates,
                              problem.time_constants)


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
        fields = {"tp": whole(p, "tp"), **rows_of(p, "r")}
        if "ep_num" in p:
            fields.update(ep=whole(p, "ep"), etp=whole(p, "etp"))
        if "full" in p:
            fields["recompute"] = RECOMPUTE_FULL * p["full"]
        return make_candidates(size, **{**fields, **kw})

    def layer_compute(c: Candidates) -> dict[str, np.ndarray]:
        return estimate_layer_compute_s(m, problem.cluster, problem.job, c,
                                        problem.time_constants)

    def fill_rest(p: dict, size: int) -> tuple[tuple[np.ndarray, ...], bool]:
        # The layer without its routed experts (any ep, etp give the same), and the head from
        # the "compute" part: L x (fwd + bwd) + head.
        c = layer_candidates(p, size)
        layer = layer_compute(c)
        micro = batch / c.micro_batch
        accumulation = estimate_grad_accumulation_s(m, problem.cluster, c,
                                                    problem.time_constants)
        head = (_steptime(problem, c).compute / micro - layers * (layer["fwd"] + layer["bwd"])
                - accumulation)
        return (layer["fwd"] - layer["fwd_routed"], layer["bwd"] - layer["bwd_routed"],
                np.maximum(head, 0.0)), True

    def fill_routed(p: dict, size: int) -> tuple[tuple[np.ndarray, ...], bool]:
        layer = layer_compute(make_candidates(size, ep=whole(p, "ep"), etp=whole(p, "etp"),
                                              **rows_of(p, "u")))
        return (layer["fwd_routed"], layer["bwd_routed"]), True

    per_layer_axes = ("tp", "r", "ep", "etp") if moe else ("tp", "r")
    add(("fwd", "bwd", "head"), ("tp", "r"), fill_rest)
    if moe:
        add(("fwd_routed", "bwd_routed"), ("u", "ep", "etp"), fill_routed)
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
    add_comm("cp_comm", "cp", ("tp", "cp", "micro_batch"), lambda p, size, rc: make_candidates(
        size, tp=whole(p, "tp"), cp=whole(p, "cp"), micro_batch=whole(p, "micro_batch"),
        recompute=rc))
    if moe and problem.time_constants.ep_comm_overlap:  # hidden behind the layer's compute
        add_comm("ep_comm", "ep", per_layer_axes,
                 lambda p, size, rc: layer_candidates(p, size, recompute=rc))
    elif moe:
        add_comm("ep_comm", "ep", ("ep", "etp", "u"), lambda p, size, rc: make_candidates(
            size, ep=whole(p, "ep"), etp=whole(p, "etp"), **rows_of(p, "u"), recompute=rc))

    # The wire carries rows / tp (u); without sequence parallel the arrival all-gather over TP
    # also depends on tp and r (steptime.py).
    sharded = problem.time_constants.sequence_parallel

    def fill_p2p(p: dict, size: int) -> tuple[np.ndarray, np.ndarray]:
        pp = whole(p, "pp")
        rows = rows_of(p, "u" if sharded else "r")
        tp = np.ones_like(pp) if sharded else whole(p, "tp")
        reachable = divides(pp * rows["cp"] * tp, n_gpus)
        dp = np.where(reachable, n_gpus // (pp * rows["cp"] * tp), 1)
        c = make_candidates(size, pp=pp, dp=dp, tp=tp, **rows)
        micro = batch / (c.dp * c.micro_batch)
        return _steptime(problem, c).pp / (micro * 2.0), reachable

    add(("p2p",), ("pp", "u") if sharded else ("pp", "tp", "r"), fill_p2p)

    # DP traffic and the optimizer: the dense parameters' part depends on (zero, tp, pp), the
    # experts' on (zero, pp, g); both parts are exact tables (solver.cost.data_parallel).
    def shard_fill(kind: str):
        def fill(p: dict, size: int) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
            pp = whole(p, "pp")
            split = whole(p, "tp") if kind == "dense" else whole(p, "g")
            reachable = divides(split * pp, n_gpus)
            rest = np.where(reachable, n_gpus // (split * pp), 1)
            c = (make_candidates(size, tp=split, pp=pp, dp=rest, zero=p["zero"])
                 if kind == "dense" else
                 make_candidates(size, pp=pp, dp=rest * split, ep=split, zero=p["zero"]))
            optimizer = estimate_optimizer_s(m, problem.cluster, c, problem.time_constants,
                                             (kind,))
            accumulation = estimate_grad_accumulation_s(m, problem.cluster, c,
                                                        problem.time_constants, (kind,))
            bwd_sync, fwd_sync = _dp_sync(problem, c, (kind,))
            return (optimizer, bwd_sync, fwd_sync, accumulation), reachable
        return fill

    kinds = ("dense", "expert") if moe else ("dense",)
    for kind in kinds:
        add((f"optimizer_{kind}", f"dp_bwd_sync_{kind}", f"dp_fwd_sync_{kind}",
             f"grad_accumulation_{kind}"),
            ("zero", "tp", "pp") if kind == "dense" else ("zero", "pp", "g"), shard_fill(kind))
    contention = _measure_contention(problem, lattice)
    for kind in kinds:
        bwd, fwd = tables[f"dp_bwd_sync_{kind}"], tables[f"dp_fwd_sync_{kind}"]
        points = bwd.grid.points()
        pp = whole(points, "pp")
        per_stage = np.ceil(layers / pp)
        overlaps = dp_part_overlaps(problem.time_constants, points["zero"], pp)
        for side, table, overlap in zip(("bwd", "fwd"), (bwd, fwd), overlaps):
            # Without overlap every collective is exposed: the rate is the whole volume and
            # nothing is compared with compute (the sync table is 0 there).
            hideable = np.where(overlap, 1.0 - 1.0 / per_stage, 0.0)
            share = np.where(overlap, 1.0 / per_stage + contention * hideable, 1.0)
            name = f"dp_{side}_rate_{kind}"
            tables[name] = Table(name, table.grid, table.values * share, table.reachable)
            # What compute is compared with: the part of each collective that can hide.
            tables[table.name] = Table(table.name, table.grid, table.values * hideable,
                                       table.reachable)
    return TimeTables(tables, contention)


def _dp_sync(problem: Problem, c: Candidates, kinds: tuple[str, ...]
             ) -> tuple[np.ndarray, np.ndarray]:
    """Seconds of the DP collectives that one micro-batch's backward (first) and forward
    (second) can hide, by ZeRO stage: the gradient all-reduce (0) or reduce-scatter (1, 2)
    behind the backward and the parameter all-gather (1-3) behind the forward; ZeRO-3 also
    reduce-scatters behind each backward (steptime.py)."""
    s = estimate_dp_collectives_s(problem.model_spec, problem.cluster, c,
                                  problem.time_constants, kinds)
    grads_sharded = s["grads_reduce_scatter"]
    if problem.time_constants.zero1_grad_all_reduce:
        grads_sharded = np.where(c.zero == 1, s["grads_all_reduce"], grads_sharded)
    bwd = np.select([c.zero == 0, c.zero == 3],
                    [s["grads_all_reduce"], s["params_all_gather"] + s["zero3_reduce_scatter"]],
                    default=grads_sharded)
    fwd = np.where(c.zero == 0, 0.0, s["params_all_gather"])
    return np.asarray(bwd, float), np.asarray(fwd, float)


def _measure_contention(problem: Problem, lattice: Lattice) -> float:
    """c in the "dp" part when compute hides all it can: each side's volume x (1/L + c (1 -
    1/L)) where it overlaps, its whole volume where it does not. c is the step-time model's
    SM contention; the composition is checked on every (zero, tp, pp, g) grid point against
    the cost model itself, so that a change of the cost model fails loudly instead of making
    the solver disagree with it."""
    grid = build_grid(lattice, ("zero", "tp", "pp", "g"))
    p = grid.points()
    tp, pp, g = whole(p, "tp"), whole(p, "pp"), whole(p, "g")
    n_gpus, batch = problem.num_gpus, problem.job.global_batch
    use = divides(tp * pp, n_gpus) & divides(g * pp, n_gpus)
    c = make_candidates(int(use.sum()), tp=tp[use], pp=pp[use], dp=n_gpus // (tp * pp)[use],
                        ep=g[use], zero=p["zero"][use], micro_batch=HUGE_MICRO_BATCH)
    bwd, fwd = _dp_sync(problem, c, ("dense", "expert"))
    micro = batch / (c.dp * c.micro_batch)
    per_stage = np.ceil(problem.model_spec.num_hidden_layers / c.pp)
    hideable = 1.0 - 1.0 / per_stage
    every_b, every_f = dp_syncs_per_step(problem.time_constants, c.zero, micro)
    overlap_b, overlap_f = dp_part_overlaps(problem.time_constants, c.zero, c.pp)
    contention = sm_contention(problem.cluster, problem.time_constants)
    composed = (every_b * bwd * np.where(overlap_b, 1.0 / per_stage + contention * hideable, 1.0)
                + every_f * fwd * np.where(overlap_f, 1.0 / per_stage + contention * hideable,
                                           1.0))
    assert np.allclose(_steptime(problem, c).dp, composed, rtol=1e-9, atol=0.0), (
        "the step-time model's DP exposure no longer reads sync x (1/L + c (1 - 1/L)) when "
        "compute hides it: update solver/search/time_tables.py")
    assert 0.0 <= contention < 1.0
    return contention


def compose_step_time(problem: Problem, timing: TimeTables, candidates: Candidates
                      ) -> np.ndarray:
    """Step seconds of each candidate from the tables, composed as the module docstring says
    (and as cpsat_objectives.add_step_time_objective encodes)."""
    def term(name: str) -> np.ndarray:
        table = timing.tables.get(name)
        return lookup_values(table, candidates) if table is not None else 0.0

    def both(name: str) -> np.ndarray:
        return term(name + "_dense") + term(name + "_expert")

    c = candidates
    per_stage = np.ceil(problem.model_spec.num_hidden_layers / c.pp)
    micro = problem.job.global_batch / (c.dp * c.micro_batch)
    full = c.recompute == RECOMPUTE_FULL
    fwd, bwd = term("fwd") + term("fwd_routed"), term("bwd") + term("bwd_routed")
    comm = sum(term(name) + np.where(full, term(name + "_full_extra"), 0.0)
               for name in ("tp_comm", "cp_comm", "ep_comm"))
    layer = fwd + bwd + np.where(full, fwd, 0.0) + comm
    t_mb = per_stage * layer + term("head") + both("grad_accumulation")
    main = t_mb * (micro + (c.pp - 1) / c.vpp)
    p2p = 2 * micro * c.vpp * term("p2p")
    kept = 1.0 - timing.contention
    per_b = both("dp_bwd_rate") + kept * np.maximum(both("dp_bwd_sync") - per_stage * bwd, 0.0)
    per_f = both("dp_fwd_rate") + kept * np.maximum(both("dp_fwd_sync") - per_stage * fwd, 0.0)
    every_b, every_f = dp_syncs_per_step(problem.time_constants, c.zero, micro)
    dp = every_b * per_b + every_f * per_f
    return main + p2p + dp + both("optimizer")
