"""verl's launch settings for an RL plan: the command and its Hydra overrides, every key one
verl's own config has, at commit b178a3cd and in verl 0.9.1 from PyPI (tests/data/verl;
tests/test_rl_verl.py checks the keys, and has verl's Hydra compose them where verl is
installed).

    colocated  python3 -m verl.trainer.main_ppo --config-name ppo_megatron_trainer
               (the hybrid engine: vLLM and Megatron-Core on the same GPUs)
    split      python3 -m verl.experimental.one_step_off_policy.main_ppo
               --config-name one_step_off_ppo_megatron_trainer with hybrid_engine False and the
               rollout pool's rollout.nnodes / rollout.n_gpus_per_node (verl runs a split
               placement one step off-policy: its README, "Megatron Configuration Example")

Batch keys: data.train_batch_size counts prompts and actor_rollout_ref.rollout.n samples per
prompt; actor.ppo_mini_batch_size counts prompts too (verl multiplies it by n), so an optimizer
step of the plan's mini-batch is train_batch_size / optimizer steps per rollout prompts.
"""

from __future__ import annotations

from solver.errors import InputError
from solver.rl.result import RlPlan, RlResult

COLOCATED_COMMAND = ("python3 -m verl.trainer.main_ppo --config-path=config "
                     "--config-name=ppo_megatron_trainer")
SPLIT_COMMAND = ("python3 -m verl.experimental.one_step_off_policy.main_ppo "
                 "--config-path=config --config-name=one_step_off_ppo_megatron_trainer")
ADVANTAGE = {"grpo": "grpo", "dapo": "grpo", "ppo": "gae"}  # algorithm.adv_estimator
RECOMPUTE = {"selective": ("selective", None, None), "full": ("full", "uniform", 1)}


def _megatron(prefix: str, plan: RlPlan) -> list[tuple[str, object]]:
    """One role's megatron settings: the actor plan's degrees and offloads."""
    c = plan.training.config
    offload = plan.offload == "states"
    values: list[tuple[str, object]] = [
        (f"{prefix}.megatron.tensor_model_parallel_size", c.tp),
        (f"{prefix}.megatron.pipeline_model_parallel_size", c.pp),
        (f"{prefix}.megatron.context_parallel_size", c.cp),
        (f"{prefix}.megatron.expert_model_parallel_size", c.ep),
        (f"{prefix}.megatron.param_offload", offload),
    ]
    if c.vpp > 1:
        values.append((f"{prefix}.megatron.virtual_pipeline_model_parallel_size", c.vpp))
    if c.etp > 1:
        values.append((f"{prefix}.megatron.expert_tensor_parallel_size", c.etp))
    return values


def build_verl_overrides(result: RlResult, plan: RlPlan) -> list[tuple[str, object]]:
    """(key, value) of every override, in the config's order of sections."""
    job = result.job
    c = plan.training.config
    if c.zero > 1:
        raise InputError(f"verl's megatron backend has no ZeRO-{c.zero}: plan with zero 0 or 1")
    offload = plan.offload == "states"
    node = result.cluster.gpus_per_node
    values: list[tuple[str, object]] = [
        ("algorithm.adv_estimator", ADVANTAGE[job.algorithm]),
        ("data.train_batch_size", job.prompts_per_step),
        ("data.max_prompt_length", job.prompt_lengths.maximum),
        ("data.max_response_length", job.max_response_len),
        ("actor_rollout_ref.actor.strategy", "megatron"),
        ("actor_rollout_ref.actor.ppo_mini_batch_size",
         job.prompts_per_step // job.optimizer_steps_per_rollout),
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", c.micro_batch),
        ("actor_rollout_ref.actor.use_kl_loss", job.algorithm == "grpo"),
        *_megatron("actor_rollout_ref.actor", plan),
        ("actor_rollout_ref.actor.megatron.use_distributed_optimizer", c.zero >= 1),
        ("actor_rollout_ref.actor.megatron.optimizer_offload", offload),
    ]
    if c.recompute in RECOMPUTE:
        granularity, method, layers = RECOMPUTE[c.recompute]
        base = "actor_rollout_ref.actor.megatron.override_transformer_config"
        values.append((f"{base}.recompute_granularity", granularity))
        if method is not None:
            values += [(f"{base}.recompute_method", method),
                       (f"{base}.recompute_num_layers", layers)]
    if "reference" in job.forward_roles:
        values.append(("actor_rollout_ref.ref.megatron.param_offload", offload))
    values += [
        ("actor_rollout_ref.rollout.name", "vllm"),
        ("actor_rollout_ref.rollout.n", job.samples_per_prompt),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", plan.rollout["tp"]),
        ("actor_rollout_ref.rollout.data_parallel_size", plan.rollout["dp"]),
        ("actor_rollout_ref.rollout.expert_parallel_size", plan.rollout["ep"]),
        ("actor_rollout_ref.rollout.gpu_memory_utilization",
         float(f"{int(plan.rollout_gpu_memory_utilization * 100) / 100:.2f}")),
        ("actor_rollout_ref.rollout.max_num_seqs", 256),
        ("actor_rollout_ref.rollout.max_num_batched_tokens", 8192),
    ]
    if job.algorithm == "ppo":
        values += [("critic.strategy", "megatron"),
                   ("critic.ppo_micro_batch_size_per_gpu", c.micro_batch),
                   *_megatron("critic", plan)]
    values += [("trainer.nnodes", max(plan.training_gpus // node, 1)),
               ("trainer.n_gpus_per_node", min(plan.training_gpus, node))]
    if plan.placement == "split":
        values += [("actor_rollout_ref.hybrid_engine", False),
                   ("rollout.nnodes", max(plan.rollout_gpus // node, 1)),
                   ("rollout.n_gpus_per_node", min(plan.rollout_gpus, node))]
    return values


def render_verl_command(result: RlResult, plan: RlPlan) -> str:
    """The verl command line of `plan`, one override a line."""
    command = SPLIT_COMMAND if plan.placement == "split" else COLOCATED_COMMAND
    lines = [command] + [f"    {key}={value}" for key, value in build_verl_overrides(result, plan)]
    return " \\\n".join(lines)
