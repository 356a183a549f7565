"""`parplan rl`: RL post-training plans (GRPO, PPO, DAPO): colocated or split, each pool's
parallelism, the step by phase, and verl's launch settings."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.help_groups import JOB, OUTPUT, SEARCH, GroupedCommand
from solver.cli.params import MAX_TOP, BoundedInt
from solver.cli.serve_command import LengthSpec
from solver.spec.strict import MAX_GPUS, MAX_SEQ_LEN

DEFAULT_PROMPT_LEN = "512"
DEFAULT_RESPONSE_LEN = "512-4096"  # reasoning responses: a long tail to the maximum


@click.command(cls=GroupedCommand, groups={"algorithm": JOB, "prompts_per_step": JOB,
                                           "samples_per_prompt": JOB, "prompt_len": JOB,
                                           "response_len": JOB, "max_response_len": JOB,
                                           "async_steps": JOB, "optimizer_steps": JOB,
                                           "reference_model": JOB, "critic_model": JOB,
                                           "reward_model": JOB, "verl": OUTPUT,
                                           "placement": SEARCH, "training_gpus": SEARCH,
                                           "rollout_tp": SEARCH, "offload": SEARCH})
@click.option("--model", required=True, metavar="NAME|PATH",
              help="The policy: a zoo name, a zoo-format TOML or a Hugging Face config.json.")
@click.option("--cluster", required=True, metavar="NAME|PATH", help="Cluster preset or file.")
@click.option("--gpus", "num_gpus", required=True, type=BoundedInt(1, MAX_GPUS),
              help="GPUs for the whole job (both pools when split).")
@click.option("--gpus-per-node", type=BoundedInt(1, MAX_GPUS), default=None,
              help="Override the preset's GPUs per node.")
@click.option("--algorithm", type=click.Choice(["grpo", "ppo", "dapo"]), default="grpo",
              show_default=True, help="Which models run which passes (grpo: actor and "
              "reference; dapo: actor alone; ppo: actor, reference and critic).")
@click.option("--prompts-per-step", type=BoundedInt(1, MAX_SEQ_LEN), default=256,
              show_default=True, help="Prompts per RL step (verl data.train_batch_size).")
@click.option("--samples-per-prompt", type=BoundedInt(1, MAX_SEQ_LEN), default=None,
              help="Responses per prompt (verl actor_rollout_ref.rollout.n); default 8 for "
              "grpo and dapo, 1 for ppo.")
@click.option("--prompt-len", type=LengthSpec(), default=DEFAULT_PROMPT_LEN,
              show_default=True, help="Prompt lengths: N, LO-HI (uniform) or @FILE.")
@click.option("--response-len", type=LengthSpec(), default=DEFAULT_RESPONSE_LEN,
              show_default=True, help="Response lengths: N, LO-HI (uniform) or @FILE (one "
              "length a line): the tail decides the rollout's end.")
@click.option("--max-response-len", type=BoundedInt(1, MAX_SEQ_LEN), default=None,
              help="Responses stop here (verl data.max_response_length); default the longest "
              "--response-len.")
@click.option("--async-steps", type=BoundedInt(0, MAX_SEQ_LEN), default=0, show_default=True,
              help="Steps the rollout may run ahead of training (0: on-policy).")
@click.option("--optimizer-steps-per-rollout", "optimizer_steps", type=BoundedInt(1, MAX_SEQ_LEN),
              default=1, show_default=True,
              help="Optimizer steps per rollout batch (the batch in that many mini-batches).")
@click.option("--reference-model", default=None, metavar="NAME|PATH",
              help="The reference model, where it is not the policy's architecture.")
@click.option("--critic-model", default=None, metavar="NAME|PATH",
              help="PPO's critic, where it is not the policy's architecture.")
@click.option("--reward-model", default=None, metavar="NAME|PATH",
              help="A reward model that scores every response (default: a rule, no GPU time).")
@click.option("--placement", type=click.Choice(["colocated", "split"]), default=None,
              help="Only this placement (default: both searched).")
@click.option("--training-gpus", type=BoundedInt(1, MAX_GPUS), default=None,
              help="Split: the training pool's GPUs (the rest generate).")
@click.option("--rollout-tp", type=BoundedInt(1, MAX_GPUS), default=None,
              help="The rollout engines' tensor parallel size.")
@click.option("--offload", type=click.Choice(["none", "states"]), default=None,
              help="Training states kept on the GPUs (none) or swapped to the host while "
              "unused (states); default: searched.")
@click.option("--top", type=BoundedInt(1, MAX_TOP), default=5, show_default=True,
              help="How many plans to list.")
@click.option("--verl", is_flag=True, help="Print verl's command line for the best plan.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def rl(model: str, cluster: str, num_gpus: int, gpus_per_node: int | None, algorithm: str,
       prompts_per_step: int, samples_per_prompt: int | None, prompt_len: Any,
       response_len: Any, max_response_len: int | None, async_steps: int,
       optimizer_steps: int, reference_model: str | None, critic_model: str | None,
       reward_model: str | None, placement: str | None, training_gpus: int | None,
       rollout_tp: int | None, offload: str | None, top: int, verl: bool,
       as_json: bool) -> None:
    """RL post-training plans: colocated or split, rollout and training parallelism, the step
    by phase."""
    from pydantic import ValidationError

    from solver.cli.render import echo_json
    from solver.cli.render_rl import echo_rl_result, render_rl_json
    from solver.errors import InputError, format_validation_error
    from solver.rl.job import DEFAULT_SAMPLES_PER_PROMPT, RlJob, RlPins
    from solver.rl.search import plan_rl
    from solver.rl.verl import render_verl_command

    if critic_model is not None and algorithm != "ppo":
        raise InputError(f"--critic-model: {algorithm} has no critic (ppo has)")
    try:
        job = RlJob(algorithm=algorithm, prompts_per_step=prompts_per_step,
                    samples_per_prompt=samples_per_prompt or DEFAULT_SAMPLES_PER_PROMPT[algorithm],
                    prompt_lengths=prompt_len, response_lengths=response_len,
                    max_response_len=max_response_len or response_len.maximum,
                    async_steps=async_steps, optimizer_steps_per_rollout=optimizer_steps,
                    reward_model=reward_model is not None)
    except ValidationError as exc:
        raise InputError(format_validation_error("rl job", exc)) from None
    roles = {role: ref for role, ref in (("reference", reference_model),
                                         ("critic", critic_model), ("reward", reward_model))
             if ref is not None}
    pins = RlPins(placement=placement, training_gpus=training_gpus, rollout_tp=rollout_tp,
                  offload=offload)
    result = plan_rl(model, cluster, num_gpus, job, gpus_per_node=gpus_per_node,
                     role_models=roles, top=top, pins=pins)
    if as_json:
        echo_json(render_rl_json(result))
        return
    echo_rl_result(result)
    if verl and result.plans:
        click.echo("\nverl:\n" + render_verl_command(result, result.plans[0]))
