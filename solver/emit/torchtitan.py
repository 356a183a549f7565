"""`launch --format torchtitan`: the TOML job config sections of torchtitan for a plan.

Field names are those of torchtitan's TOML job config (pytorch/torchtitan,
torchtitan/config/job_config.py: class Parallelism, Training, ActivationCheckpoint): data
parallelism is split into data_parallel_replicate_degree (DDP/HSDP replicas) and
data_parallel_shard_degree (FSDP2); tensor_parallel_degree (sequence parallel included),
pipeline_parallel_degree, pipeline_parallel_schedule, pipeline_parallel_microbatch_size,
pipeline_parallel_layers_per_stage, context_parallel_degree, expert_parallel_degree,
expert_tensor_parallel_degree; [training] local_batch_size ("per-device batch size"),
global_batch_size (gradient accumulation fills the gap), seq_len, mixed_precision_param;
[activation_checkpoint] mode = none | selective | full, selective_ac_option = "op".
(torchtitan's main branch has since moved to Python configs with other names; these are the
names of its TOML releases.)

ZeRO: torchtitan shards with FSDP2 only, so ZeRO 0 is replication (DDP), ZeRO 2 is FSDP
without resharding after forward, ZeRO 3 FSDP resharding after forward; there is no
optimizer-only ZeRO 1 (it becomes ZeRO 2, which saves more memory, with a warning).
"""

from __future__ import annotations

import json

from solver.emit.target import Emitted, LaunchTarget

RESHARD = {1: "never", 2: "never", 3: "always"}
AC_MODES = {"none": "none", "selective": "selective", "full": "full"}


def build_torchtitan_config(target: LaunchTarget) -> tuple[dict[str, dict[str, object]],
                                                           list[str], list[str]]:
    """The [parallelism], [training] and [activation_checkpoint] sections, warnings, notes."""
    c, job = target.config, target.job
    warnings: list[str] = []
    notes: list[str] = []
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": c.dp if c.zero == 0 else 1,
        "data_parallel_shard_degree": 1 if c.zero == 0 else c.dp,
    }
    if c.zero >= 1:
        parallelism["fsdp_reshard_after_forward"] = RESHARD[c.zero]
    if c.zero == 1:
        warnings.append("torchtitan has no optimizer-only ZeRO 1: FSDP2 without resharding "
                        "after forward (ZeRO 2) shards the gradients too")
    parallelism["tensor_parallel_degree"] = c.tp
    parallelism["pipeline_parallel_degree"] = c.pp
    if c.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if c.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = c.micro_batch
        layers = target.layers_per_virtual_stage()
        if len(set(layers)) == 1:
            parallelism["pipeline_parallel_layers_per_stage"] = layers[0]
        else:
            notes.append(f"{target.model_spec.num_hidden_layers} layers do not split evenly "
                         f"over {len(layers)} pipeline stages: torchtitan places them by its "
                         "own split points")
    parallelism["context_parallel_degree"] = c.cp
    if target.model_spec.is_moe:
        parallelism["expert_parallel_degree"] = c.ep
        parallelism["expert_tensor_parallel_degree"] = c.etp
        if c.ep > 1 and c.etp not in (1, c.tp):
            warnings.append(f"torchtitan supports expert tensor parallelism of 1 or tp ({c.tp}) "
                            f"only, not {c.etp}")
    # Without pipelining a step accumulates gradients over micro-batches of local_batch_size;
    # with it, local_batch_size is cut into pipeline micro-batches.
    local_batch = job.global_batch // c.dp if c.pp > 1 else c.micro_batch
    training: dict[str, object] = {
        "local_batch_size": local_batch,
        "global_batch_size": job.global_batch,
        "seq_len": job.seq_len,
        "mixed_precision_param": "bfloat16",
    }
    checkpoint: dict[str, object] = {"mode": AC_MODES[c.recompute]}
    if c.recompute == "selective":
        checkpoint["selective_ac_option"] = "op"
    if job.precision == "fp8":
        notes.append("fp8: enable torchao Float8 training in the config (model.converters = "
                     "[\"float8\"] in torchtitan's TOML releases)")
    sections = {"parallelism": parallelism, "training": training,
                "activation_checkpoint": checkpoint}
    return sections, warnings, notes


def render_toml(sections: dict[str, dict[str, object]], header: str = "") -> str:
    """Flat TOML sections of strings, numbers and booleans (JSON string escapes are valid TOML
    basic strings)."""
    lines = [f"# {line}" for line in header.splitlines()]
    for name, values in sections.items():
        lines += ["", f"[{name}]"] if lines else [f"[{name}]"]
        for key, value in values.items():
            shown = ("true" if value else "false") if isinstance(value, bool) else (
                json.dumps(value) if isinstance(value, str) else str(value))
            lines.append(f"{key} = {shown}")
    return "\n".join(lines) + "\n"


def render_torchtitan(target: LaunchTarget) -> Emitted:
    """The sections as TOML, headed by the plan they come from."""
    sections, warnings, notes = build_torchtitan_config(target)
    c = target.config
    header = (f"parplan launch: {target.model_spec.name} on {c.num_gpus} GPUs "
              f"({target.cluster.name}): tp {c.tp} pp {c.pp} dp {c.dp} cp {c.cp} ep {c.ep} "
              f"etp {c.etp} vpp {c.vpp} zero {c.zero}\n"
              "merge into your torchtitan job config (--job.config_file)")
    return Emitted(text=render_toml(sections, header), settings=sections,
                   warnings=tuple(warnings), notes=tuple(notes))
