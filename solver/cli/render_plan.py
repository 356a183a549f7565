"""Rendering plans: the JSON of DESIGN.md ("Interfaces") and the memory tables of the seeds.

Memory is shown in decimal GB (1e9 bytes), rounded to the megabyte in JSON.
"""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_table
from solver.spec.plan import Plan, StageMemory

DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute")
MAIN = ("weights", "grads", "optimizer", "activations")
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


def _gb(value_bytes: float) -> float:
    return round(value_bytes / 1e9, 3)


def render_memory_gb(stage: StageMemory) -> dict[str, float]:
    """`weights grads optimizer activations other total` in GB."""
    values = {name: _gb(getattr(stage, f"{name}_bytes")) for name in MAIN}
    values["other"] = _gb(stage.other_total_bytes)
    values["total"] = _gb(stage.total_bytes)
    return values


def render_plan_json(plan: Plan) -> dict[str, Any]:
    """One plan: degrees, fits, memory_gb of the worst stage, other_gb items, every stage."""
    worst = plan.worst_stage
    return {
        **{name: getattr(plan.config, name) for name in DEGREES},
        "fits": plan.fits,
        "memory_gb": render_memory_gb(worst),
        "other_gb": {name: _gb(value) for name, value in worst.other_bytes.items()},
        "worst_stage": worst.stage,
        "gpu_memory_gb": _gb(plan.gpu_memory_bytes),
        **render_time_json(plan),
        "stages": [
            {"stage": s.stage, "memory_gb": render_memory_gb(s),
             "other_gb": {name: _gb(value) for name, value in s.other_bytes.items()}}
            for s in plan.stages
        ],
    }


def render_time_json(plan: Plan) -> dict[str, Any]:
    """The DESIGN.md time fields of a plan (empty when it has no time estimate)."""
    if plan.time is None:
        return {}
    t = plan.time
    return {
        "step_seconds": round(t.step_seconds, 6),
        "tokens_per_second": round(t.tokens_per_second, 3),
        "tokens_per_second_per_gpu": round(t.tokens_per_second_per_gpu, 3),
        "tflops_per_gpu": round(t.tflops_per_gpu, 3),
        "mfu": round(t.mfu, 5),
        "time_seconds": {name: round(value, 6) for name, value in t.time_seconds.items()},
        "train_days": None if t.train_days is None else round(t.train_days, 4),
        "gpu_hours": None if t.gpu_hours is None else round(t.gpu_hours, 1),
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
