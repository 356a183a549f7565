"""`launch --format deepspeed`: a DeepSpeed config (ds_config JSON) for a plan.

Keys from the DeepSpeed configuration reference (deepspeed.ai/docs/config-json):
train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel
ranks, zero_optimization.stage and .overlap_comm ("Attempts to overlap the reduction of the
gradients with backward computation", off by default below ZeRO-3; the step-time model assumes
it), bf16.enabled; tensor parallelism is AutoTP training,
"tensor_parallel": {"autotp_size": tp}, which combines with ZeRO 0-2 (deepspeed.ai tutorial
"Automatic Tensor Parallelism (Training)"). Pipeline and expert parallelism are set in the model
code (deepspeed.pipe.PipelineModule(num_stages=pp), deepspeed.moe.layer.MoE(ep_size=ep)), and
pipelining works with ZeRO 0/1 only; DeepSpeed has Ulysses sequence parallelism but no ring
context parallelism.
"""

from __future__ import annotations

import json

from solver.emit.target import Emitted, LaunchTarget


def build_deepspeed_config(target: LaunchTarget) -> tuple[dict[str, object], list[str],
                                                          list[str]]:
    """The ds_config dict, warnings (what DeepSpeed cannot do as planned) and notes."""
    c, job = target.config, target.job
    config: dict[str, object] = {
        "train_batch_size": job.global_batch,
        "train_micro_batch_size_per_gpu": c.micro_batch,
        "gradient_accumulation_steps": target.num_micro_batches,
        "zero_optimization": ({"stage": c.zero, "overlap_comm": True} if c.zero >= 1
                              else {"stage": c.zero}),
        "bf16": {"enabled": True},
    }
    warnings: list[str] = []
    notes: list[str] = []
    if c.tp > 1:
        config["tensor_parallel"] = {"autotp_size": c.tp}
        if c.zero == 3:
            warnings.append("DeepSpeed AutoTP training combines with ZeRO 0-2, not ZeRO 3")
    if c.pp > 1:
        notes.append(f"build the model as deepspeed.pipe.PipelineModule(num_stages={c.pp}); "
                     "its engine reduces gradients after the last backward, so DP traffic "
                     "is not hidden behind compute")
        if c.zero >= 2:
            warnings.append("DeepSpeed pipeline parallelism works with ZeRO 0 or 1 only")
        if c.vpp > 1:
            warnings.append("DeepSpeed's pipeline engine has no interleaved (virtual) stages")
    if c.cp > 1:
        warnings.append(f"DeepSpeed has no ring context parallelism (cp {c.cp}); its Ulysses "
                        "sequence parallelism splits heads instead")
    if c.ep > 1:
        notes.append(f"expert parallelism is set in the model: deepspeed.moe.layer.MoE("
                     f"ep_size={c.ep})")
    if c.recompute != "none":
        notes.append(f"{c.recompute} recomputation is set in the model code "
                     "(deepspeed.checkpointing or the model's gradient checkpointing)")
    if job.precision == "fp8":
        notes.append("fp8 comes from Transformer Engine layers in the model; bf16 stays on")
    return config, warnings, notes


def render_deepspeed(target: LaunchTarget) -> Emitted:
    """The ds_config as JSON."""
    config, warnings, notes = build_deepspeed_config(target)
    return Emitted(text=json.dumps(config, indent=2) + "\n", settings=config,
                   warnings=tuple(warnings), notes=tuple(notes))
