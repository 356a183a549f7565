"""Rendering `serve` answers: the JSON of DESIGN.md, the ranked table, the why, the vLLM
command, and the infeasibility explanation. Memory in decimal GB (1e9 bytes)."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_infeasible, echo_ranked
from solver.spec.plan_json import render_answer_head, render_infeasible_json


def _plan_json(plan: Any) -> dict[str, Any]:
    return {
        "tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep, "replicas": plan.replicas,
        "gpus": plan.num_gpus, "expert_parallel": plan.ep > 1, "fits": plan.fits,
        "memory_gb": {k: round(v / 1e9, 3) for k, v in plan.memory_bytes.items()},
        "kv_bytes_per_token": round(plan.kv_bytes_per_token, 1),
        "kv_cache_tokens": plan.kv_tokens,
        "max_concurrent_sequences": plan.max_sequences,
        "batch": plan.batch,
        "ttft_ms": round(plan.ttft_s * 1e3, 3),
        "tpot_ms": round(plan.tpot_s * 1e3, 3),
        "tpot_idle_ms": round(plan.tpot_idle_s * 1e3, 3),
        "request_latency_s": round(plan.latency_s, 4),
        "tokens_per_second": round(plan.tokens_per_s, 2),
        "tokens_per_second_per_gpu": round(plan.tokens_per_s_per_gpu, 2),
        "decode_step_ms": {k: round(v * 1e3, 4) for k, v in plan.decode_step_s.items()},
        "vllm_command": plan.command,
        "notes": list(plan.notes),
    }


def render_serve_json(result: Any) -> dict[str, Any]:
    """DESIGN.md: status, solve_seconds, plans (best first); conflicts and fixes if
    infeasible; the winner's vLLM command."""
    problem = result.problem
    job = problem.job
    answer: dict[str, Any] = {
        **render_answer_head(result),
        "gpu": problem.cluster.gpu.name,
        "context": job.context,
        "input_len": job.input_len,
        "output_len": job.output_len,
        "precision": job.precision,
        "kv_cache_dtype": job.kv_cache_dtype,
        "gpu_memory_utilization": job.gpu_memory_utilization,
        "objective": job.objective,
        "max_ttft_ms": job.max_ttft_ms,
        "max_tpot_ms": job.max_tpot_ms,
        "min_tokens_per_s": job.min_tokens_per_s,
        "num_feasible": result.num_feasible,
        "plans": [_plan_json(plan) for plan in result.plans],
    }
    if result.status == "infeasible":
        answer.update(render_infeasible_json(result))
    else:
        answer.update(why=list(result.why), vllm_command=result.plans[0].command)
    return answer


def echo_serve_result(result: Any) -> None:
    problem = result.problem
    job = problem.job
    click.echo(f"{problem.model_spec.name} on {problem.num_gpus} x {problem.cluster.gpu.name} "
               f"({problem.cluster.name}), context {job.context:,}, requests of "
               f"{job.input_len:,} + {job.output_len:,} tokens, {job.precision} weights, "
               f"objective {job.objective}")
    if result.status == "infeasible":
        echo_infeasible(result, "the model, the context or the cluster")
        return
    replicas = any(plan.replicas > 1 for plan in result.plans)
    columns = (["#", "tp", "pp", "dp", "ep"] + (["replicas"] if replicas else [])
               + ["GPUs", "weights GB", "KV GB", f"seqs @{job.context:,}", "batch",
                  "TTFT ms", "TPOT ms", "tokens/s", "tokens/s/GPU"])
    rows = []
    for i, plan in enumerate(result.plans, start=1):
        row = [i, plan.tp, plan.pp, plan.dp, plan.ep] + ([plan.replicas] if replicas else [])
        rows.append(row + [plan.num_gpus, round(plan.memory_bytes["weights"] / 1e9, 1),
                           round(plan.memory_bytes["kv_cache"] / 1e9, 1), plan.max_sequences,
                           plan.batch, round(plan.ttft_s * 1e3, 1),
                           round(plan.tpot_s * 1e3, 1), round(plan.tokens_per_s),
                           round(plan.tokens_per_s_per_gpu)])
    echo_ranked(result, columns, rows)
    best = result.plans[0]
    click.echo("vllm:")
    click.echo(f"  {best.command}")
    for note in best.notes:
        click.echo(f"  note: {note}")
