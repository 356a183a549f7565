"""The objectives of the CP-SAT program (solver.search.cpsat_program): the step time as an
integer lower bound of the float model's, composed from the step-time tables exactly as
time_tables.compose_step_time composes them, and the worst stage's memory.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from solver.cost.flops import estimate_model_flops_per_token
from solver.search.cpsat_program import PRODUCT_CAP, Program
from solver.search.grid import build_grid, to_units
from solver.search.space import Problem
from solver.search.time_tables import build_time_tables

# One unit of time is the ideal step (model FLOPs at peak) / 2^32; a term is clipped at 2^40
# units (256 ideal steps: far beyond any plan worth ranking, and it keeps products in int64).
TIME_RESOLUTION_OF_IDEAL_STEP = 2.0**-32
TERM_CAP = 2**40
DP_EXPOSURE_SCALE = 2**16


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
    t_mb = program.total([fwd_stage, bwd_stage, other_stage, term("head"),
                          both("grad_accumulation")], "t_mb")
    bubble = exact("bubble_share", ("pp", "vpp"), lambda pp, vpp: q * (pp - 1) // vpp)
    weight = program.total([q * micro, bubble], "steady_and_bubble")
    main = program.product(t_mb, weight, "pipeline")
    hand_offs = program.product(micro, 2 * program.degree_value("vpp"), "hand_offs")
    p2p = program.product(hand_offs, term("p2p"), "p2p_step")

    # DP, each side (backward: gradients; forward: the parameter gather): the rate when
    # compute hides what it can (1/L + c (1 - 1/L) of the traffic) plus (1 - c) x the exposed
    # excess max(sync - L x layer, 0). The excess is compared with the same lower bound of
    # the stage's forward / backward that the pipeline term uses: the step grows with the true
    # compute b at least as fast as the excess shrinks (n L b in the steady state against
    # (1 - c) n L b at most), so the step at the lower bound of b stays a lower bound.
    def exposed(sync: str, stage_compute, name: str):
        volume = both(sync)
        out = program.new_var(0, program.upper(volume), name)
        program.model.add_max_equality(out, [volume - stage_compute, 0])
        return out

    kappa = int(math.floor((1.0 - timing.contention) * DP_EXPOSURE_SCALE))

    def per_sync(sides, name: str):
        """DP time of one sync of `sides` ((side, stage compute) pairs): their rates plus
        (1 - c) x their exposed excess."""
        excess = program.total([exposed(f"dp_{side}_sync", compute, f"dp_{side}_exposed")
                                for side, compute in sides], f"{name}_exposed")
        scaled = program.new_var(0, program.upper(excess) * kappa // DP_EXPOSURE_SCALE,
                                 f"{name}_slowed")
        program.model.add_division_equality(scaled, kappa * excess, DP_EXPOSURE_SCALE)
        return program.total([*(both(f"dp_{side}_rate") for side, _ in sides), scaled], name)

    def per_step(value, every_micro_when, name: str):
        """`value` n times per step where `every_micro_when` holds, else once
        (steptime.dp_syncs_per_step)."""
        every = program.product(micro, value, f"{name}_every_micro")
        out = program.new_var(0, max(program.upper(every), program.upper(value)), name)
        program.model.add(out == every).only_enforce_if(every_micro_when)
        program.model.add(out == value).only_enforce_if(~every_micro_when)
        return out

    backward, forward = ("bwd", bwd_stage), ("fwd", fwd_stage)
    if problem.time_constants.zero2_reduce_every_micro_batch:
        # DeepSpeed's ZeRO-2: the backward side runs every micro-batch, the forward side not.
        bwd_every_micro = program.model.new_bool_var("dp_bwd_every_micro")
        program.model.add_bool_or([program.zero_is_three, program.zero_is_two]
                                  ).only_enforce_if(bwd_every_micro)
        program.model.add_bool_and([~program.zero_is_three, ~program.zero_is_two]
                                   ).only_enforce_if(~bwd_every_micro)
        dp = program.total([
            per_step(per_sync([backward], "dp_bwd_per_sync"), bwd_every_micro, "dp_bwd"),
            per_step(per_sync([forward], "dp_fwd_per_sync"), program.zero_is_three, "dp_fwd"),
        ], "dp")
    else:  # both sides run as often: one sum, one product
        dp = per_step(per_sync([backward, forward], "dp_per_sync"), program.zero_is_three, "dp")
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
