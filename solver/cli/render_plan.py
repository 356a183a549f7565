"""Rendering plans: the memory and time tables of the seeds. The JSON of DESIGN.md
("Interfaces") is built by solver.spec.plan_json (shared with the sweep).

Memory is shown in decimal GB (1e9 bytes).
"""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_table
from solver.spec.plan import Plan, StageMemory
from solver.spec.plan_json import MAIN
from solver.spec.plan_json import to_gb as _gb

LABELS = {
    "weights": "weights",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
    "logits": "logits + cross-entropy",
    "zero3_gather": "ZeRO-3 gathered layers",
    "comm_buckets": "communication buckets",
    "cuda_context": "CUDA context",
    "nccl": "NCCL buffers",
    "fragmentation": "allocator fragmentation",
}


def echo_time_table(plan: Plan) -> None:
    """Step time, its breakdown (share of the step) and throughput."""
    if plan.time is None:
        return
    t = plan.time
    rows: list[tuple[str, Any, Any]] = [
        (LABELS_TIME[name], round(value, 4), f"{100 * value / t.step_seconds:.1f}%")
        for name, value in t.time_seconds.items()
    ]
    rows.append(("step", round(t.step_seconds, 4), "100.0%"))
    echo_table("step time, slowest pipeline stage", ["part", "seconds", "share"], rows)
    line = (f"{t.tokens_per_second:,.0f} tokens/s ({t.tokens_per_second_per_gpu:,.0f} per GPU), "
            f"{t.tflops_per_gpu:.0f} model TFLOP/s per GPU, MFU {100 * t.mfu:.1f}%")
    if t.train_days is not None and t.gpu_hours is not None:
        line += f"; token budget in {t.train_days:.1f} days ({t.gpu_hours:,.0f} GPU-hours)"
    click.echo(line)


LABELS_TIME = {
    "compute": "compute (forward + backward)",
    "recompute": "recompute",
    "tp": "tensor-parallel comm (exposed)",
    "cp": "context-parallel comm (exposed)",
    "ep": "expert all-to-all (exposed)",
    "dp": "data-parallel / ZeRO comm (exposed)",
    "pp": "pipeline send/recv",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
}


def render_config(plan: Plan) -> str:
    c = plan.config
    return (f"tp {c.tp} pp {c.pp} dp {c.dp} cp {c.cp} ep {c.ep} etp {c.etp} vpp {c.vpp} "
            f"zero {c.zero} micro-batch {c.micro_batch} recompute {c.recompute}")


def _rows(stage: StageMemory) -> list[tuple[str, float]]:
    rows = [(LABELS[name], _gb(getattr(stage, f"{name}_bytes"))) for name in MAIN]
    rows += [(LABELS.get(name, name), _gb(value)) for name, value in stage.other_bytes.items()]
    return rows


def echo_memory_table(plan: Plan, heading: str) -> None:
    """The seeds' "memory verification" table for the worst stage."""
    worst = plan.worst_stage
    rows: list[tuple[str, Any]] = list(_rows(worst))
    rows += [("total", _gb(worst.total_bytes)), ("GPU capacity", _gb(plan.gpu_memory_bytes)),
             ("fits", plan.fits)]
    click.echo(heading)
    click.echo(render_config(plan))
    echo_table(f"memory per GPU, worst stage: {worst.stage} of {plan.config.pp}",
               ["component", "GB"], rows)


def echo_stage_table(plan: Plan, heading: str) -> None:
    """One row per pipeline stage, one column per item (GB)."""
    names = [label for label, _ in _rows(plan.stages[0])]
    rows = [
        (s.stage, *(value for _, value in _rows(s)), _gb(s.total_bytes),
         s.total_bytes <= plan.gpu_memory_bytes)
        for s in plan.stages
    ]
    click.echo(heading)
    click.echo(render_config(plan))
    echo_table(f"memory per GPU by pipeline stage, GB (GPU capacity "
               f"{_gb(plan.gpu_memory_bytes)} GB)", ["stage", *names, "total", "fits"], rows)


def echo_fixes(fixes: tuple[str, ...]) -> None:
    if fixes:
        click.echo("does not fit; single changes that fit: " + ", ".join(fixes))
    else:
        click.echo("does not fit; no single change of zero, recompute, micro-batch, tp or pp "
                   "fits: add GPUs or use GPUs with more memory")
