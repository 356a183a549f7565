"""`parplan rl` output: the plans as a table, the explanation, and the JSON of DESIGN.md
(each plan: step_seconds, placement, phases, memory_gb per phase)."""

from __future__ import annotations

from typing import Any

import click

from solver.rl.explain import PHASE_LABELS, describe_placement, describe_training
from solver.rl.result import RlPlan, RlResult


def render_rl_plan_json(plan: RlPlan) -> dict[str, Any]:
    c = plan.training.config
    return {
        "placement": plan.placement,
        "step_seconds": plan.step_seconds,
        "phases": plan.phases,
        "memory_gb": plan.memory_gb,
        "training_gpus": plan.training_gpus,
        "rollout_gpus": plan.rollout_gpus,
        "training": {"tp": c.tp, "pp": c.pp, "dp": c.dp, "cp": c.cp, "ep": c.ep,
                     "etp": c.etp, "vpp": c.vpp, "zero": c.zero,
                     "micro_batch": c.micro_batch, "recompute": c.recompute,
                     "memory_savers": list(plan.training.memory_savers)},
        "rollout": dict(plan.rollout),
        "offload": plan.offload,
        "idle_seconds": {"rollout": plan.rollout_idle_seconds,
                         "training": plan.training_idle_seconds},
        "generation_seconds": plan.generation_parts,
        "rollout_slots": plan.rollout_slots,
        "sequences_per_engine": plan.seqs_per_rank,
        "rollout_gpu_memory_utilization": plan.rollout_gpu_memory_utilization,
        "generated_tokens_per_second": plan.generated_tokens_per_second,
        "trained_tokens_per_second": plan.trained_tokens_per_second,
        "utilization": plan.utilization,
    }


def render_rl_json(result: RlResult) -> dict[str, Any]:
    job = result.job
    return {
        "status": result.status,
        "solve_seconds": result.solve_seconds,
        "model": result.model_spec.name,
        "cluster": result.cluster.name,
        "num_gpus": result.num_gpus,
        "job": {"algorithm": job.algorithm, "prompts_per_step": job.prompts_per_step,
                "samples_per_prompt": job.samples_per_prompt,
                "prompt_len": job.prompt_lengths.describe(),
                "response_len": job.response_lengths.describe(),
                "max_response_len": job.max_response_len, "async_steps": job.async_steps,
                "optimizer_steps_per_rollout": job.optimizer_steps_per_rollout},
        "plans": [render_rl_plan_json(plan) for plan in result.plans],
        "why": list(result.why),
        "unplaced": dict(result.unplaced),
    }


def echo_rl_result(result: RlResult) -> None:
    job = result.job
    click.echo(f"{result.model_spec.name} {job.algorithm} on {result.num_gpus} x "
               f"{result.cluster.gpu.name} ({result.cluster.name}): {job.prompts_per_step} "
               f"prompts x {job.samples_per_prompt} samples, prompts "
               f"{job.prompt_lengths.describe()}, responses {job.response_lengths.describe()} "
               f"(max {job.max_response_len:,}), "
               + (f"off-policy by {job.async_steps}" if job.async_steps else "on-policy")
               + f"; {result.status} in {result.solve_seconds:.1f} s")
    if not result.plans:
        for label, reason in result.unplaced.items():
            click.echo(f"  {label}: {reason}")
        return
    header = ("#", "placement", "rollout", "training", "offload", "step s",
              *(PHASE_LABELS[name] for name in result.plans[0].phases), "gen tok/s",
              "util")
    rows = [header]
    for rank, plan in enumerate(result.plans, start=1):
        rows.append((str(rank), describe_placement(plan), plan.rollout_layout,
                     describe_training(plan), plan.offload, f"{plan.step_seconds:.1f}",
                     *(f"{seconds:.2f}" for seconds in plan.phases.values()),
                     f"{plan.generated_tokens_per_second:,.0f}", f"{plan.utilization:.1%}"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    click.echo("")
    for line in result.why:
        click.echo(f"- {line}")
