"""Rendering plans: the memory and time tables. The JSON of a plan is built by
solver.spec.plan_json (shared with the sweep).

Memory is shown in decimal GB (1e9 bytes).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from solver.cli.render import echo_alert, echo_table
from solver.spec.layout import VirtualStage
from solver.spec.layout_syntax import render_pipeline_layout
from solver.spec.plan import MEMORY_VIEWS, OBSERVED_VIEWS, Plan, StageMemory
from solver.spec.figures import format_significant
from solver.spec.plan_json import MAIN
from solver.spec.plan_json import to_gb as _gb

# Labels of the per-stage table when the full ones do not fit the width.
SHORT_LABELS = {
    "optimizer state": "optimizer",
    "logits + cross-entropy": "logits",
    "ZeRO-3 gathered layers": "gathered",
    "communication buckets": "buckets",
    "MoE dispatcher buffers": "dispatcher",
    "CUDA context": "CUDA",
    "NCCL buffers": "NCCL",
    "allocator fragmentation": "frag",
    "% of GPU": "%",
}
LABELS = {
    "weights": "weights",
    "grads": "gradients",
    "optimizer": "optimizer state",
    "activations": "activations",
    "logits": "logits + cross-entropy",
    "zero3_gather": "ZeRO-3 gathered layers",
    "comm_buckets": "communication buckets",
    "dispatcher": "MoE dispatcher buffers",
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
        (LABELS_TIME[name], value, f"{format_significant(100 * value / t.step_seconds)}%")
        for name, value in t.time_seconds.items()
    ]
    rows.append(("step", t.step_seconds, "100%"))
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
    "offload": "activation offload to the host (exposed)",
    "dp": "data-parallel / ZeRO comm (exposed)",
    "pp": "pipeline send/recv",
    "bubble": "pipeline bubble",
    "optimizer": "optimizer step",
}


def render_config(plan: Plan) -> str:
    """The degrees, with what a selective plan recomputes (Plan.recompute_modules)."""
    c = plan.config
    modules = f" ({','.join(plan.recompute_modules)})" if plan.recompute_modules else ""
    return (f"tp {c.tp} pp {c.pp} dp {c.dp} cp {c.cp} ep {c.ep} etp {c.etp} vpp {c.vpp} "
            f"zero {c.zero} micro-batch {c.micro_batch} recompute {c.recompute}{modules}")


def _rows(stage: StageMemory) -> list[tuple[str, float]]:
    rows = [(LABELS[name], _gb(getattr(stage, f"{name}_bytes"))) for name in MAIN]
    rows += [(LABELS.get(name, name), _gb(value)) for name, value in stage.other_bytes.items()]
    return rows


# The rows of the views in the memory table (the device view is the total).
VIEW_LABELS = {"allocated": "allocated (torch.cuda)", "reserved": "reserved (torch.cuda)",
               "device": "total (device)"}
# The rows of the observed views (OBSERVED_VIEWS): what the counters read on the plan's GPU.
OBSERVED_LABELS = {"reserved": "reserved on this GPU (torch.cuda)",
                   "device": "device on this GPU (nvidia-smi)"}


def render_views_line(stage: StageMemory) -> str:
    """Which view a measured number is compared with (MEMORY_VIEWS), and that view's value on
    the plan's GPU (OBSERVED_VIEWS) beside what the plan needs."""
    return render_views_text({view: stage.view_bytes(view) for view in MEMORY_VIEWS},
                             {view: stage.observed_view_bytes(view) for view in MEMORY_VIEWS})


def render_views_text(view_bytes: Mapping[str, float],
                      observed_bytes: Mapping[str, float] | None = None) -> str:
    """Which view a measured number is compared with (MEMORY_VIEWS), and the bytes in each
    (`view_bytes`, a training stage's or a serving plan's); where `observed_bytes` (the views
    on the plan's GPU) reads otherwise, that number first: "reserved (226 GB on this GPU,
    213 GB needed)"."""
    parts = []
    for view, source in MEMORY_VIEWS.items():
        needed = format_significant(view_bytes[view] / 1e9)
        observed = (needed if observed_bytes is None
                    else format_significant(observed_bytes[view] / 1e9))
        value = (f"{needed} GB" if observed == needed
                 else f"{observed} GB on this GPU, {needed} GB needed")
        parts.append(f"{source} with {view} ({value})")
    return ("compare a measured peak by what reported it: " + "; ".join(parts)
            + "; fits are judged on device (needed)")


def echo_memory_table(plan: Plan, heading: str) -> None:
    """The memory table of the worst stage: each item, the allocated and reserved views, the
    total (the device view), the reserved and device views on this GPU (OBSERVED_VIEWS), the
    capacity, whether it fits; then which view a measurement is compared with."""
    worst = plan.worst_stage
    rows: list[tuple[str, Any]] = list(_rows(worst))
    rows += [(VIEW_LABELS[view], _gb(worst.view_bytes(view))) for view in MEMORY_VIEWS]
    rows += [(OBSERVED_LABELS[view], _gb(worst.observed_view_bytes(view)))
             for view in OBSERVED_VIEWS]
    rows.append(("GPU capacity", _gb(plan.gpu_memory_bytes)))
    rows.append(("% of GPU memory", round(100 * worst.total_bytes / plan.gpu_memory_bytes, 1)))
    if plan.memory_headroom.label():
        rows.append((f"usable ({plan.memory_headroom.label()} headroom)",
                     _gb(plan.usable_memory_bytes)))
    rows.append(("fits", plan.fits))
    click.echo(heading)
    click.echo(render_config(plan))
    echo_table(f"memory per GPU, worst stage: {worst.stage} of {plan.config.pp}",
               ["component", "GB"], rows)
    click.echo("memory: " + plan.memory_headroom.rule(plan.gpu_memory_bytes))
    click.echo(render_views_line(worst))



def echo_stage_table(plan: Plan, heading: str) -> None:
    """One row per pipeline stage, one column per item (GB) that some stage holds (an item
    every stage leaves at zero, ZeRO-3's gathered layers without ZeRO 3, is no column), the
    total (the device view); then the worst stage's views and which a measurement is compared
    with (the stages' views would not fit 100 columns: `--json` has them)."""
    names = [label for label, _ in _rows(plan.stages[0])]
    values = [[value for _, value in _rows(s)] for s in plan.stages]
    kept = [i for i in range(len(names)) if any(v[i] for v in values)]
    names = [names[i] for i in kept]
    rows = [
        (s.stage, *(v[i] for i in kept), _gb(s.total_bytes),
         round(100 * s.total_bytes / plan.gpu_memory_bytes),  # whole percent: 100 columns
         s.total_bytes <= plan.usable_memory_bytes)
        for s, v in zip(plan.stages, values)
    ]
    click.echo(heading)
    click.echo(render_config(plan))
    capacity = plan.memory_headroom.describe(plan.gpu_memory_bytes)
    columns = ["stage", *names, "total", "% of GPU", "fits"]
    echo_table(f"memory per GPU by pipeline stage, GB (GPU capacity {capacity})", columns,
               rows, short_columns=[SHORT_LABELS.get(name, name) for name in columns])
    click.echo("memory: " + plan.memory_headroom.rule(plan.gpu_memory_bytes))
    click.echo(render_views_line(plan.worst_stage))


def echo_fixes(fixes: tuple[str, ...]) -> None:
    """The changes after which the plan fits, cheapest first (solver.estimate_fixes, then
    single changes), or that the search found none."""
    if fixes:
        echo_alert("does not fit; changes that fit: " + "; ".join(fixes))
    else:
        echo_alert("does not fit; the search found no change that fits (up to 1024 times the "
                   "GPUs, or a GPU with more memory)")


def _chunk_label(chunk: VirtualStage) -> str:
    """A virtual stage's content: "E+7", "8+L", "3+m+L", "E" (m: MTP layers)."""
    parts = ["E"] if chunk.embedding else []
    if chunk.layers or not (chunk.embedding or chunk.loss):
        parts.append(str(chunk.layers))
    if chunk.mtp_layers:
        parts.append("m" if chunk.mtp_layers == 1 else f"{chunk.mtp_layers}m")
    return "+".join(parts + (["L"] if chunk.loss else []))


def render_layout_rows(plan: Plan) -> list[tuple[Any, ...]]:
    """One row per pipeline stage of a plan with a layout (none without): the stage, its
    virtual stages' layers ("E+7", "8+L"; chunks joined by "+" under vpp: "4+4"), the layers
    recomputing in full (per chunk under vpp), and the stage's memory per GPU in GB."""
    layout = plan.layout
    if layout is None:
        return []
    memory = {s.stage: _gb(s.total_bytes) for s in plan.stages}
    rows: list[tuple[Any, ...]] = []
    for stage in range(layout.pp):
        chunks = layout.stages[stage::layout.pp]
        recompute: Any = "+".join(str(c.recompute_layers) for c in chunks)
        rows.append((stage, "+".join(_chunk_label(c) for c in chunks),
                     recompute if layout.vpp > 1 else chunks[0].recompute_layers,
                     memory.get(stage, "-")))
    return rows


def echo_layout_table(plan: Plan) -> None:
    """The layout table (render_layout_rows), then its Megatron layout text; nothing for a plan
    without a layout."""
    if plan.layout is None:
        return
    layout = plan.layout
    echo_table(f"pipeline layout, pp {layout.pp} x vpp {layout.vpp}",
               ["stage", "layers", "recompute", "GB"], render_layout_rows(plan))
    click.echo(f"Megatron --pipeline-model-parallel-layout {render_pipeline_layout(layout)}")
