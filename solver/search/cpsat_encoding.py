"""One add_<name> per named constraint of the CP-SAT program (solver.search.cpsat_program),
each enforced only when its switch literal is true; `encoder_for` finds it by name.

Divisibility is a bound per prime on exponent variables, products of degrees sums of
exponents, and the memory constraint a lower bound of every stage slot's bytes built from the
memory tables (solver.search.memory_tables).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
from ortools.sat.python import cp_model

from solver.search.constraints import Constraint
from solver.search.grid import factorize, to_units
from solver.search.memory_tables import (
    build_memory_tables,
    first_stage_slots,
    select_stage_slots,
)

if TYPE_CHECKING:
    from solver.search.cpsat_program import Program

MEMORY_RESOLUTION_BYTES = 4096
GIB = 2**30


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


def add_deepspeed_tp_zero(program: Program, c: Constraint, switch) -> None:
    program.model.add(program.zero <= 2).only_enforce_if([switch, ~program.tp_is_one])


def add_deepspeed_no_vpp(program: Program, c: Constraint, switch) -> None:
    program.bound_exponents("vpp", 1, switch)


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
        parts = [scale * program.bound(part, units, part.name) for part in tables.states[k]]
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
    "deepspeed_tp_zero": add_deepspeed_tp_zero,
    "deepspeed_no_vpp": add_deepspeed_no_vpp,
    "memory_fits_hbm": add_memory_fits_hbm,
}


def encoder_for(name: str) -> Callable[[Program, Constraint, object], None] | None:
    """The add_<name> of a constraint (pins share add_pin), or None if it has none."""
    return ADDERS.get(name) or (add_pin if name.startswith("pin_") else None)
