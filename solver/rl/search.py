"""`parplan rl`: the placements of an RL step, each pool's parallelism, ranked by step time.

For each placement (colocated: every GPU both generates and trains; split: a training pool
of whole nodes and a rollout pool of the rest, PLACEMENT_SHARES of the cluster, searched
coarse to fine: search_splits), the training
search gives the actor's best plans (solver.rl.training); for each, with the training states
kept on the GPUs or swapped to the host while they are not used (OFFLOADS), the memory each
phase leaves to vLLM sizes every rollout engine layout (solver.rl.rollout), and the phases
compose into a step (solver.cost.rl.step). Every phase must fit the usable memory of each GPU;
the plans are ranked by step seconds (ties: fewer offloads, then colocated).

Memory per GPU, per phase (bytes of the worst GPU; "kept": the states of the roles not running,
none where they are offloaded):

    generation  colocated: the training process's CUDA context and NCCL, the kept states, and
                vLLM's budget (weights, activations, reserves, KV cache: it takes all of it);
                split: vLLM's budget at --gpu-memory-utilization 0.9 (vLLM's default)
    log_probs   the forward roles' worst device bytes while running (their training plan's,
                an upper bound: a forward keeps no activations for backward) + kept + asleep
    training    the trained roles' worst device bytes + kept + asleep
    weight_sync the actor's states and the kept ones, the context, vLLM's weights
                (colocated), or the actor's states alone (split)

"asleep": what a sleeping vLLM keeps in the colocated plan (verl sleeps it at level 2,
discarding weights and KV cache): its CUDA-graph pool and NCCL communicators
(solver.serve.job.ServeConstants: 1 GiB and 0.4 GiB).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from solver.api import load_problem_specs
from solver.catalog import load_model_spec
from solver.cost.comm.comm import estimate_group_link
from solver.cost.rl.step import compose_rl_step
from solver.cost.rl.sync import (
    WEIGHT_SYNC_BYTES_PER_PARAM,
    estimate_broadcast_s,
    estimate_gather_s,
    estimate_host_swap_s,
    estimate_shard_copy_s,
)
from solver.cost.step.offload import host_link_bytes_per_s
from solver.errors import InputError
from solver.rl.explain import explain_rl
from solver.rl.job import RlJob, RlPins
from solver.rl.result import RlPlan, RlResult
from solver.rl.rollout import VERL_MAX_NUM_SEQS, Rollouts, describe_layout, estimate_rollouts
from solver.rl.training import TrainingOption, search_training
from solver.serve.job import ServeConstants
from solver.spec import ClusterSpec, ModelSpec

GIB = 2**30
PLACEMENT_SHARES = (1 / 8, 1 / 4, 3 / 8, 1 / 2, 5 / 8, 3 / 4, 7 / 8)  # training's share, split
COARSE_SHARES = (1 / 4, 1 / 2, 3 / 4)  # placed first (search_splits)
OFFLOADS = ("none", "states")
SPLIT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default --gpu-memory-utilization
PHASES = ("generation", "log_probs", "training", "weight_sync", "host_swap")


def build_placements(num_gpus: int, gpus_per_node: int) -> tuple[tuple[str, int, int], ...]:
    """(placement, training GPUs, rollout GPUs): colocated on all, then splits whose training
    share is each of PLACEMENT_SHARES, in whole nodes on two nodes or more, else in GPUs of the
    one node: one, or an even count (odd pools of 3, 5, 7 GPUs take tp 1 only). 64 GPUs of 8:
    8+56, 16+48, ..., 56+8; 8 GPUs: 1+7, 2+6, 4+4, 6+2."""
    unit = gpus_per_node if num_gpus >= 2 * gpus_per_node else 1
    found = [("colocated", num_gpus, num_gpus)]
    seen = set()
    for share in PLACEMENT_SHARES:
        train = round(share * num_gpus / unit) * unit
        if 0 < train < num_gpus and train not in seen and (unit > 1 or train == 1
                                                           or train % 2 == 0):
            seen.add(train)
            found.append(("split", train, num_gpus - train))
    return tuple(found)


def search_splits(splits: Sequence[tuple[str, int, int]], place: Callable[[int], float]
                  ) -> list[int]:
    """Which splits to place, coarse then fine (each once): the shares 1/4, 1/2 and 3/4 of
    the training pool (COARSE_SHARES, where present), then the neighbours of the fastest of
    them, on the assumption that the step, generation falling and training rising with the
    training share, has one valley. Returns the indices placed, in order. With 8 shares of
    64 GPUs: 16, 32 and 48 training GPUs, then 40 and 56 where 48 was the fastest."""
    if not splits:
        return []
    total = splits[0][1] + splits[0][2]
    coarse = [i for i, (_, train, _) in enumerate(splits)
              if any(abs(train / total - share) < 1e-9 for share in COARSE_SHARES)]
    coarse = coarse or list(range(len(splits)))
    steps = {i: place(i) for i in coarse}
    best = min(steps, key=lambda i: (steps[i], i))
    for neighbour in (best - 1, best + 1):
        if 0 <= neighbour < len(splits) and neighbour not in steps:
            steps[neighbour] = place(neighbour)
    return list(steps)


def plan_rl(model: str, cluster: str, num_gpus: int, job: RlJob, *,
            gpus_per_node: int | None = None, role_models: dict[str, str] | None = None,
            top: int = 5, pins: RlPins | None = None) -> RlResult:
    """The best RL plans of the step `job` for `model` on `num_gpus` GPUs of `cluster`;
    `role_models`: the reference, critic and reward models where they are not the policy's
    architecture (the --*-model values); `pins`: choices fixed in advance (a published
    configuration's, benchmarks/rl_accuracy.py)."""
    pins = pins or RlPins()
    started = time.perf_counter()
    model_spec, cluster_spec, _ = load_problem_specs(
        model, cluster, gpus_per_node=gpus_per_node, seq_len=job.max_sequence,
        global_batch=job.mini_batch)
    specs = {"actor": model_spec}
    for role, ref in (role_models or {}).items():
        specs[role] = load_model_spec(ref)
    try:
        host_link = host_link_bytes_per_s(cluster_spec)
    except InputError:
        host_link = None
    plans: list[RlPlan] = []
    unplaced: dict[str, str] = {}

    def place(placement: str, train_gpus: int, roll_gpus: int) -> float:
        """Plans of one placement into `plans`; its best step (inf where none fits)."""
        label = placement if placement == "colocated" else f"split {train_gpus}+{roll_gpus}"
        asleep = _asleep_bytes() if placement == "colocated" else 0.0
        options, reason = search_training(model, specs, cluster, gpus_per_node, job,
                                          train_gpus, asleep, pins.training)
        found = []
        rollouts: dict[float, Rollouts] = {}  # by vLLM's budget: the engines' times
        for option in options:
            for offload in OFFLOADS:
                if (offload != "none" and host_link is None) or pins.offload not in (None,
                                                                                     offload):
                    continue
                plan = _best_plan(model_spec, cluster_spec, job, placement, train_gpus,
                                  roll_gpus, option, offload, asleep, host_link, rollouts,
                                  pins)
                if plan is not None:
                    found.append(plan)
        if not found:
            unplaced[label] = reason or ("no rollout engine fits the memory the training "
                                         "states leave, kept or offloaded")
        plans.extend(found)
        return min((p.step_seconds for p in found), default=float("inf"))

    colocated, *splits = build_placements(num_gpus, cluster_spec.gpus_per_node)
    if pins.training_gpus is not None:
        if pins.placement == "colocated":
            raise InputError(f"--training-gpus {pins.training_gpus}: sizes the training pool of "
                             "a split placement, not a colocated one")
        if not 0 < pins.training_gpus < num_gpus:
            raise InputError(f"--training-gpus {pins.training_gpus}: a split needs between 1 "
                             f"and {num_gpus - 1} of the {num_gpus} GPUs for training")
        splits = [("split", pins.training_gpus, num_gpus - pins.training_gpus)]
    if pins.placement != "split" and pins.training_gpus is None:
        place(*colocated)
    if pins.placement != "colocated":
        search_splits(splits, lambda index: place(*splits[index]))
    plans.sort(key=lambda p: (p.step_seconds, p.offload != "none", p.placement != "colocated"))
    chosen = tuple(plans[:top])
    # Not "optimal": the splits are searched coarse to fine and each pool tries the training
    # search's TRAINING_PLANS_TRIED best plans, so the best plan found is not proven best.
    status = "feasible" if chosen else "infeasible"
    result = RlResult(job=job, model_spec=model_spec, cluster=cluster_spec, num_gpus=num_gpus,
                      status=status, solve_seconds=time.perf_counter() - started,
                      plans=chosen, unplaced=unplaced)
    return replace(result, why=explain_rl(result, plans)) if chosen else result


def _asleep_bytes() -> float:
    constants = ServeConstants()
    return (constants.cuda_graph_gib + constants.nccl_gib) * GIB


def _best_plan(model_spec: ModelSpec, cluster: ClusterSpec, job: RlJob, placement: str,
               train_gpus: int, roll_gpus: int, option: TrainingOption, offload: str,
               asleep: float, host_link: float | None, memo: dict[float, Rollouts],
               pins: RlPins) -> RlPlan | None:
    """The fastest rollout layout under this training plan and offload, as an RlPlan (None
    where no layout fits or a phase does not)."""
    colocated = placement == "colocated"
    usable = cluster.usable_memory_bytes
    roles = option.roles
    worst = option.plan.worst_stage
    context = worst.other_bytes.get("cuda_context", 0.0) + worst.other_bytes.get("nccl", 0.0)
    resident = {role: passes.resident_bytes for role, passes in roles.items()}
    kept_all = sum(resident.values()) if offload == "none" else 0.0

    def kept_besides(role: str) -> float:
        return sum(v for r, v in resident.items() if r != role) if offload == "none" else 0.0

    share = pins.rollout_gpu_memory_utilization
    if colocated:
        budget = usable - context - kept_all
        if share is not None:  # vLLM takes its share, if the phase leaves it that much
            budget = share * usable if share * usable <= budget else -1.0
        swapped = sum(resident.values()) if offload == "states" else 0.0
    else:
        budget = (share or SPLIT_GPU_MEMORY_UTILIZATION) * usable
        swapped = sum(v for r, v in resident.items() if r != "actor") \
            if offload == "states" else 0.0
    if budget not in memo:
        memo[budget] = estimate_rollouts(model_spec, cluster, job, roll_gpus, budget,
                                         pins.rollout_max_num_seqs or VERL_MAX_NUM_SEQS)
    rollouts = memo[budget]
    allowed = rollouts.fits & ((rollouts.candidates.tp == pins.rollout_tp) if pins.rollout_tp
                               else True)
    if not allowed.any():
        return None
    memory = {
        "log_probs": max(roles[r].running_bytes + kept_besides(r) for r in job.forward_roles)
        + asleep,
        "training": max(roles[r].running_bytes + kept_besides(r) for r in job.trained_roles)
        + asleep,
    }
    if max(memory.values()) > usable:
        return None
    weight_bytes = WEIGHT_SYNC_BYTES_PER_PARAM * model_spec.total_params
    config = option.plan.config
    shard = config.tp * config.pp * (config.ep if model_spec.is_moe else 1) * (
        config.dp if config.zero == 3 else 1)
    gather = float(estimate_gather_s(weight_bytes, shard,
                                     estimate_group_link(cluster, 1, shard)))
    hbm = cluster.gpu.hbm_gb_per_s * 1e9 * ServeConstants().hbm_fraction
    copy = estimate_shard_copy_s(weight_bytes, rollouts.candidates.tp, hbm)
    sync = gather + copy
    if not colocated:
        sync = sync + estimate_broadcast_s(weight_bytes, roll_gpus,
                                           estimate_group_link(cluster, 1, train_gpus + roll_gpus))
    swap = float(estimate_host_swap_s(swapped, host_link)) if swapped and host_link else 0.0
    log_probs = sum(roles[r].forward_s for r in job.forward_roles)
    training = sum(roles[r].train_s for r in job.trained_roles)
    generation = rollouts.generation.total_s
    step = compose_rl_step(np.full(len(generation), not colocated), job.async_steps,
                           generation, log_probs, training, sync, swap)
    seconds = np.where(allowed, step.step_s, np.inf)
    best = int(np.argmin(seconds))
    return _as_plan(model_spec, cluster, job, placement, train_gpus, roll_gpus, option, offload,
                    rollouts, best, step, sync, swap, log_probs, training, memory, context,
                    kept_all, budget, resident)


def _as_plan(model_spec, cluster, job, placement, train_gpus, roll_gpus, option, offload,
             rollouts: Rollouts, best: int, step, sync, swap, log_probs, training, memory,
             context, kept_all, budget, resident) -> RlPlan:
    """Row `best` of the rollout layouts under this training plan as an RlPlan."""
    gen = rollouts.generation
    mem = rollouts.memory
    vllm_weights = float(mem.weights_bytes[best])
    vllm_total = float(mem.weights_bytes[best] + mem.activations_bytes[best]
                       + mem.other_bytes[best] + mem.kv_cache_bytes[best])
    colocated = placement == "colocated"
    memory = dict(memory)
    memory["generation"] = (context + kept_all + vllm_total) if colocated else vllm_total
    memory["weight_sync"] = (context + max(kept_all, resident["actor"]) + vllm_weights
                             if colocated else option.plan.worst_stage.device_bytes)
    phases = {"generation": float(gen.total_s[best]), "log_probs": float(log_probs),
              "training": float(training), "weight_sync": float(np.asarray(sync)[best]
                                                                if np.ndim(sync) else sync),
              "host_swap": float(swap)}
    step_s = float(step.step_s[best])
    gen_flops = job.num_samples * job.mean_sequence * model_spec.flops_per_token(
        max(1, round(job.mean_sequence))) / 3.0
    peak = cluster.gpu.peak_tflops_bf16 * 1e12
    utilization = (option.flops_per_step + gen_flops) / (peak * (
        train_gpus if colocated else train_gpus + roll_gpus) * step_s)
    return RlPlan(
        placement=placement, training_gpus=train_gpus, rollout_gpus=roll_gpus,
        training=option.plan, rollout=rollouts.candidates.row(best),
        rollout_layout=describe_layout(rollouts.candidates, best), offload=offload,
        phases=phases, memory_gb={k: v / 1e9 for k, v in memory.items()},
        step_seconds=step_s, rollout_idle_seconds=float(step.rollout_idle_s[best]),
        training_idle_seconds=float(step.training_idle_s[best]),
        generation_parts={"prefill": float(gen.prefill_s[best]),
                          "queued": float(gen.queued_s[best]),
                          "tail": float(gen.tail_s[best])},
        rollout_slots=int(rollouts.slots[best]), seqs_per_rank=int(rollouts.seqs_per_rank[best]),
        rollout_gpu_memory_utilization=float(rollouts.problem.job.gpu_memory_utilization),
        generated_tokens_per_second=job.num_samples * job.response_lengths.mean / step_s,
        trained_tokens_per_second=job.num_samples * job.mean_sequence / step_s,
        utilization=utilization)
