"""The JSON of a plan (DESIGN.md, "Interfaces"): degrees, `fits`, `memory_gb` of the worst
stage and its views (`allocated_gb`, `reserved_gb`, `device_gb`: issue 43, MEMORY_VIEWS) with
`reserved_gb_observed` and `device_gb_observed` (what those counters read on the plan's GPU,
the allocator's cache grown into its room: OBSERVED_VIEWS), the time fields, every stage, and
the layout when the plan has one. Shared by the CLI
(`optimize --json`, `estimate --json`) and the sweep's result lines, so the shape is written
once; solver.emit.plan_file reads it back.

Memory is in decimal GB (1e9 bytes), rounded to the megabyte.
"""

from __future__ import annotations

from typing import Any

from solver.spec.job import PARALLEL_FIELDS
from solver.spec.layout import PipelineLayout
from solver.spec.layout_syntax import render_pipeline_layout
from solver.spec.plan import MEMORY_VIEWS, OBSERVED_VIEWS, Plan, StageMemory

DEGREES = PARALLEL_FIELDS
MAIN = ("weights", "grads", "optimizer", "activations")


def render_answer_head(result: Any) -> dict[str, Any]:
    """The first keys of a planning answer (DESIGN.md): status, solve_seconds, engine, and the
    model, cluster and GPU count of its problem (optimize, serve and the sweep's lines)."""
    problem = result.problem
    return {"status": result.status, "solve_seconds": round(result.solve_seconds, 3),
            "engine": result.engine, "model": problem.model_spec.name,
            "cluster": problem.cluster.name, "gpus": problem.num_gpus}


def render_infeasible_json(result: Any) -> dict[str, Any]:
    """The infeasible part of a planning answer (DESIGN.md): conflicts, their rules, fixes."""
    return {"conflicts": list(result.conflicts), "rules": dict(result.rules),
            "fixes": list(result.fixes)}


def to_gb(value_bytes: float) -> float:
    """Bytes to decimal GB, rounded to the megabyte."""
    return round(value_bytes / 1e9, 3)


def render_memory_gb(stage: StageMemory) -> dict[str, float]:
    """`weights grads optimizer activations other total` in GB."""
    values = {name: to_gb(getattr(stage, f"{name}_bytes")) for name in MAIN}
    values["other"] = to_gb(stage.other_total_bytes)
    values["total"] = to_gb(stage.total_bytes)
    return values


def render_views_gb(stage: StageMemory) -> dict[str, float]:
    """`allocated_gb reserved_gb device_gb` in GB: what the plan needs in the views of
    torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved() and nvidia-smi
    (MEMORY_VIEWS); then `reserved_gb_observed device_gb_observed`: what those counters read on
    the plan's GPU, its allocator's cache grown into the room (OBSERVED_VIEWS)."""
    views = {f"{view}_gb": to_gb(stage.view_bytes(view)) for view in MEMORY_VIEWS}
    views.update({f"{view}_gb_observed": to_gb(stage.observed_view_bytes(view))
                  for view in OBSERVED_VIEWS})
    return views


def render_memory_views_json() -> dict[str, str]:
    """`memory_views` of an answer: what reports each view (`allocated_gb`, `reserved_gb`,
    `device_gb`, and `reserved_gb_observed`, `device_gb_observed`: the same counters on the
    plan's GPU), the view a measured number is compared with (MEMORY_VIEWS, OBSERVED_VIEWS)."""
    views = {f"{view}_gb": source for view, source in MEMORY_VIEWS.items()}
    views.update({f"{view}_gb_observed": source for view, source in OBSERVED_VIEWS.items()})
    return views


def render_layout_json(layout: PipelineLayout) -> dict[str, Any]:
    """`layout` of a plan: pp, vpp, the Megatron layout text (`syntax`), and per virtual stage
    (model order) the pipeline stage it runs on, its decoder layers, how many of them recompute
    in full, whether it holds the embedding / the LM head and loss, and its MTP layers."""
    return {
        "pp": layout.pp,
        "vpp": layout.vpp,
        "syntax": render_pipeline_layout(layout),
        "stages": [
            {"virtual_stage": v, "stage": layout.stage_of(v), "layers": s.layers,
             "recompute_layers": s.recompute_layers, "embedding": s.embedding, "loss": s.loss,
             "mtp_layers": s.mtp_layers}
            for v, s in enumerate(layout.stages)
        ],
    }


def render_plan_json(plan: Plan) -> dict[str, Any]:
    """One plan: degrees, fits, memory_gb of the worst stage, its views (allocated_gb,
    reserved_gb, device_gb: device_gb is memory_gb.total; reserved_gb_observed and
    device_gb_observed on the plan's GPU: render_views_gb), other_gb items, every stage, and
    `layout` when the plan has one, and `equivalent`: the other settings of the same step time
    (solver.search.twins) with the worst-stage memory each needs, and `memory_savers` when the
    plan needs framework features on to fit, `recompute_modules` when the search chose what
    selective recomputes and `offloads` when it offloads to the host (all read back by
    `launch --plan`)."""
    worst = plan.worst_stage
    answer: dict[str, Any] = {
        **{name: getattr(plan.config, name) for name in DEGREES},
        "fits": plan.fits,
        "memory_gb": render_memory_gb(worst),
        **render_views_gb(worst),
        "other_gb": {name: to_gb(value) for name, value in worst.other_bytes.items()},
        "worst_stage": worst.stage,
        "gpu_memory_gb": to_gb(plan.gpu_memory_bytes),
        "memory_headroom": plan.memory_headroom.setting() or None,
        "usable_memory_gb": to_gb(plan.usable_memory_bytes),
        **render_time_json(plan),
        "stages": [
            {"stage": s.stage, "memory_gb": render_memory_gb(s), **render_views_gb(s),
             "other_gb": {name: to_gb(value) for name, value in s.other_bytes.items()}}
            for s in plan.stages
        ],
    }
    if plan.layout is not None:
        answer["layout"] = render_layout_json(plan.layout)
    answer["equivalent"] = [{"recompute": e.recompute, "zero": e.zero,
                             "memory_gb": to_gb(e.total_bytes)} for e in plan.equivalent]
    if plan.memory_savers:
        answer["memory_savers"] = list(plan.memory_savers)
    if plan.recompute_modules:
        answer["recompute_modules"] = list(plan.recompute_modules)
    if plan.offloads:
        answer["offloads"] = list(plan.offloads)
    return answer


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
