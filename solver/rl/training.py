"""The training side of an RL step on a pool of GPUs: the actor's plans from the training
search (solver.optimize, Megatron-Core, as verl's megatron backend runs it) and, for each, the
passes of every role (solver.cost.rl.passes) and the states each keeps on the GPUs.

The search runs at the longest sequence (longest prompt + max_response_len, what a micro-batch
may hold) with one optimizer step's sequences as the global batch, so that every plan fits the
worst micro-batch; its plans are then timed at the mean sequence (verl packs sequences without
padding: actor.megatron use_remove_padding, default true). The other roles (reference, critic,
reward) run under the actor's parallel layout, as verl's ref / critic megatron settings
inherit the actor's (ppo_megatron_trainer.yaml: ${oc.select:actor_rollout_ref.actor.megatron.
tensor_model_parallel_size,1}).
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.api import check_parallel_config, estimate_plans
from solver.errors import InputError
from solver.cost.rl.passes import estimate_forward_only_s
from solver.optimize import build_problem, solve
from solver.ranked_plans import saver_constants, saver_levels
from solver.rl.job import RlJob
from solver.spec import JobSpec, ModelSpec
from solver.spec.headroom import MemoryHeadroom
from solver.spec.plan import Plan

TRAINING_PLANS_TRIED = 3
# verl's megatron backend shards optimizer states (use_distributed_optimizer) but has no
# ZeRO-3 (its McoreEngineConfig: no FSDP switch at verl b178a3cd).
VERL_PINS = {"zero": (0, 1)}  # the search's best plans each placement tries


@dataclass(frozen=True)
class RolePasses:
    """One role under a training plan: seconds of its forward pass over the step's samples and
    of its training (0 where it does not train), the bytes per GPU it keeps between passes
    (weights; with gradients and optimizer states where it trains) and its device bytes while
    it runs (the worst stage)."""

    forward_s: float
    train_s: float
    resident_bytes: float
    running_bytes: float


@dataclass(frozen=True)
class TrainingOption:
    """One actor plan of a pool and every role's passes under its layout."""

    plan: Plan
    roles: dict[str, RolePasses]
    flops_per_step: float  # model FLOPs of the roles' passes (trained and forward)


def search_training(actor_model: str, model_specs: dict[str, ModelSpec], cluster: str,
                    gpus_per_node: int | None, job: RlJob, num_gpus: int, headroom_bytes: float,
                    pins: dict[str, tuple[int, ...]] | None = None
                    ) -> tuple[tuple[TrainingOption, ...], str]:
    """The actor's best plans on `num_gpus` GPUs that keep `headroom_bytes` free (what the
    phase leaves to other things on the GPU), each with the roles' passes; and, where none is
    found, why (the training search's conflicts). `actor_model` is the --model value,
    `model_specs` each role's model (the actor's among them); `pins` narrow the search as
    optimize's pins do (verl's ZeRO 0-1 always)."""
    actor = model_specs["actor"]
    try:
        problem = build_problem(actor_model, cluster, num_gpus,
                                gpus_per_node=gpus_per_node, seq_len=job.max_sequence,
                                global_batch=job.mini_batch, pins={**(pins or {}), **VERL_PINS},
                                memory_headroom=MemoryHeadroom(bytes=max(headroom_bytes, 0.0)))
    except InputError as exc:
        return (), str(exc)
    # The problem's own recompute module set and no activation offload: the host link carries
    # the RL step's own swaps (solver.cost.rl.sync), and one search per pool keeps `parplan rl`
    # within seconds.
    problem = problem.model_copy(update={
        "recompute_module_sets": problem.recompute_module_sets[:1], "offloads": ()})
    result = solve(problem, top=TRAINING_PLANS_TRIED, engine="even", compare=False)
    if not result.plans:
        return (), "training: " + ", ".join(result.conflicts or ("no plan",))
    mean_job = JobSpec(seq_len=max(1, round(job.mean_sequence)), global_batch=job.mini_batch,
                       precision=problem.job.precision)
    options = []
    for plan in result.plans:
        roles = {}
        timed: dict[str, tuple[Plan, Plan]] = {}  # a model's plans at the longest and mean
        for role in sorted(set(job.forward_roles) | set(job.trained_roles)):
            passes = _role_passes(model_specs.get(role, actor), problem, mean_job, plan,
                                  role in job.trained_roles, job.optimizer_steps_per_rollout,
                                  role == "actor" or role not in model_specs, timed)
            if passes is None:
                break
            roles[role] = passes
        else:
            options.append(TrainingOption(plan=plan, roles=roles,
                                          flops_per_step=_flops(model_specs, job, mean_job)))
    return tuple(options), ""


def _role_passes(model_spec: ModelSpec, problem, mean_job: JobSpec, plan: Plan, trains: bool,
                 steps: int, is_actor: bool, timed: dict[str, tuple[Plan, Plan]]
                 ) -> RolePasses | None:
    """A role's passes under the actor plan's layout (None where its model cannot take it):
    timed at the mean sequence, its memory at the longest (the actor's: the search's plan),
    each with the memory savers the plan turns on (solver.ranked_plans.saver_levels) and, for
    the policy's architecture, its pipeline layout. `timed` keeps each model's two plans
    for the roles that share it."""
    config = plan.config
    key = "actor" if is_actor else model_spec.name
    if key not in timed:
        try:
            check_parallel_config(model_spec, problem.job, config.num_gpus, config)
        except InputError:
            return None
        timed[key] = _estimate_role(model_spec, problem, mean_job, plan, is_actor)
    longest, mean = timed[key]
    assert mean.time is not None
    worst = longest.worst_stage
    resident = worst.weights_bytes + (worst.grads_bytes + worst.optimizer_bytes if trains else 0)
    return RolePasses(
        forward_s=steps * float(estimate_forward_only_s(mean.time.time_seconds)),
        train_s=steps * mean.time.step_seconds if trains else 0.0,
        resident_bytes=resident, running_bytes=worst.device_bytes)


def _estimate_role(model_spec: ModelSpec, problem, mean_job: JobSpec, plan: Plan,
                   is_actor: bool) -> tuple[Plan, Plan]:
    """A model's plans under the actor plan's configuration: at the longest sequence (the
    actor's own plan) and at the mean."""
    config = plan.config
    options = dict(saver_levels(problem))[plan.memory_savers]
    constants = saver_constants(problem, plan.memory_savers)
    spec = model_spec.at_length(problem.job.seq_len)
    layout = plan.layout if spec.num_hidden_layers == problem.model_spec.num_hidden_layers \
        else None
    longest = plan if is_actor else estimate_plans(spec, problem.cluster, problem.job, [config],
                                                   options, constants, [layout])[0]
    mean = estimate_plans(spec, problem.cluster, mean_job, [config], options, constants,
                          [layout])[0]
    return longest, mean


def _flops(model_specs: dict[str, ModelSpec], job: RlJob, mean_job: JobSpec) -> float:
    """Model FLOPs of a step's training-side passes: per token, a forward pass is a third of
    a training step's (ModelSpec.flops_per_token)."""
    tokens = job.num_samples * mean_job.seq_len
    actor = model_specs["actor"]
    total = 0.0
    for role in job.forward_roles:
        total += tokens * model_specs.get(role, actor).flops_per_token(mean_job.seq_len) / 3.0
    for role in job.trained_roles:
        total += tokens * model_specs.get(role, actor).flops_per_token(mean_job.seq_len)
    return total
