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

Pipeline layout (torchtitan/distributed/pipeline_parallel.py, v0.2.x): without
module_fqns_per_model_part, torchtitan cuts the model itself (generate_llm_fqn_per_model_part,
mirrored by torchtitan_split) into ceil((L + first + last) / pipeline_parallel_layers_per_stage)
stages, where first / last = pipeline_parallel_first_stage_less_layers /
pipeline_parallel_last_stage_less_layers (both 1 by default) are the layer slots the embedding
and the norm + output take; the stage count must be pp for 1F1B and a multiple of pp, at least
2 pp, for Interleaved1F1B (stage s on rank s % pp). Any other split goes out as
module_fqns_per_model_part, one list of module names per virtual stage ("tok_embeddings",
"layers.i", "norm", "output"). Activation checkpointing is one mode for all layers (none,
selective, full), so per-stage full-recompute counts cannot be expressed; torchtitan has no
multi-token prediction module.
"""

from __future__ import annotations

import math

from solver.cost.step.frameworks import check_training_states_supported, framework_time_constants
from solver.emit.quoting import render_comment_text, render_toml_value
from solver.emit.target import Emitted, LaunchTarget
from solver.spec import PipelineLayout

RESHARD = {1: "never", 2: "never", 3: "always"}
AC_MODES = {"none": "none", "selective": "selective", "full": "full"}


def torchtitan_split(num_stages: int, num_layers: int, first_less: int,
                     last_less: int) -> list[int] | None:
    """Decoder layers of each stage of torchtitan's own split, None where it refuses one
    (more stages than slots, an empty average stage, a weight above the average).

    generate_llm_fqn_per_model_part: the L layers plus `first_less` slots for the embedding
    and `last_less` for the norm + output are dealt out evenly, the first (L + slots) % stages
    stages one more; the first stage's slots and the last's are not layers.
    Worked example (its docstring): 2 stages, 3 layers, weights 2 and 2 -> 7 slots, 4 and 3 ->
    layers [2, 1].
    """
    if num_stages == 1:
        return [num_layers]
    slots = num_layers + first_less + last_less
    base, extra = divmod(slots, num_stages)
    if num_stages > slots or base == 0 or max(first_less, last_less) > base:
        return None
    counts = [base + (1 if stage < extra else 0) for stage in range(num_stages)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return counts


def _layers_per_stage(slots: int, num_stages: int) -> int | None:
    """A pipeline_parallel_layers_per_stage for which torchtitan counts `num_stages` stages
    (ceil(slots / it)), None when none does."""
    layers = math.ceil(slots / num_stages)
    return layers if math.ceil(slots / layers) == num_stages else None


def _module_names(pipeline: PipelineLayout, head: str) -> list[list[str]]:
    """module_fqns_per_model_part of a layout (the LM head is "output" in torchtitan's TOML
    releases, "lm_head" in 0.3)."""
    parts: list[list[str]] = []
    start = 0
    for stage in pipeline.stages:
        names = ["tok_embeddings"] if stage.embedding else []
        names += [f"layers.{i}" for i in range(start, start + stage.layers)]
        parts.append(names + (["norm", head] if stage.loss else []))
        start += stage.layers
    return parts


def _pipeline_fields(pipeline: PipelineLayout, vpp: int, head: str = "output"
                     ) -> dict[str, object]:
    """The fields that make torchtitan build `pipeline` (module docstring)."""
    layers = [stage.layers for stage in pipeline.stages]
    num_layers, num_stages = sum(layers), len(layers)
    for first_less in range(max(layers) + 2):
        for last_less in range(max(layers) + 2):
            if torchtitan_split(num_stages, num_layers, first_less, last_less) != layers:
                continue
            per_stage = _layers_per_stage(num_layers + first_less + last_less, num_stages)
            fields: dict[str, object] = {
                "pipeline_parallel_first_stage_less_layers": first_less,
                "pipeline_parallel_last_stage_less_layers": last_less}
            if per_stage is not None:
                return {"pipeline_parallel_layers_per_stage": per_stage, **fields}
            if vpp <= 2:  # torchtitan's default: 1 stage a rank under 1F1B, 2 if interleaved
                return fields
    return {"module_fqns_per_model_part": _module_names(pipeline, head)}


def _checkpoint_section(target: LaunchTarget, pipeline: PipelineLayout
                        ) -> tuple[dict[str, object], list[str]]:
    """[activation_checkpoint] for the layout's full-recompute counts, and warnings."""
    counts = [stage.recompute_layers for stage in pipeline.stages]
    layers = [stage.layers for stage in pipeline.stages]
    if not any(counts):
        mode = target.other_recompute
        section: dict[str, object] = {"mode": AC_MODES[mode]}
        if mode == "selective":
            section["selective_ac_option"] = "op"
        return section, []
    if counts == layers:
        return {"mode": "full"}, []
    return {"mode": "full"}, [
        f"torchtitan checkpoints all layers or none in full mode: the plan recomputes "
        f"{sum(counts)} of {sum(layers)} layers ({'/'.join(map(str, sorted(set(counts))))} "
        "per virtual stage), all of them recompute: less activation memory, more step time "
        "than estimated"]


def build_torchtitan_config(target: LaunchTarget, head: str = "output"
                            ) -> tuple[dict[str, dict[str, object]], list[str], list[str]]:
    """The [parallelism], [training] and [activation_checkpoint] sections, warnings, notes
    (`head`: the LM head's module name)."""
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
    m = target.model_spec
    if not m.is_mla and m.kv_heads % c.tp:  # solver.search.constraints tp_divides_kv_heads
        warnings.append(f"torchtitan splits whole KV heads over TP (wk and wv column-wise): "
                        f"tp {c.tp} must divide num_key_value_heads ({m.kv_heads})")
    parallelism["pipeline_parallel_degree"] = c.pp
    pipeline = target.pipeline_layout()
    if c.pp > 1:
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if c.vpp > 1 else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = c.micro_batch
        parallelism.update(_pipeline_fields(pipeline, c.vpp, head))
    mtp = pipeline.stages[-1].mtp_layers
    if mtp:
        warnings.append(f"torchtitan builds no multi-token prediction module: the plan's {mtp} "
                        "MTP layer(s) are left out")
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
    checkpoint, checkpoint_warnings = _checkpoint_section(target, pipeline)
    warnings += checkpoint_warnings
    if job.precision == "fp8":
        notes.append("fp8: enable torchao Float8 training in the config (model.converters = "
                     "[\"float8\"] in torchtitan's TOML releases)")
    sections = {"parallelism": parallelism, "training": training,
                "activation_checkpoint": checkpoint}
    features = _feature_sections(target, parallelism, warnings)
    training.update(features.pop("training", {}))
    sections.update(features)
    return sections, warnings, notes


def _feature_sections(target: LaunchTarget, parallelism: dict[str, object],
                      warnings: list[str]) -> dict[str, dict[str, object]]:
    """The framework profile's features in torchtitan's fields (v0.2.x job_config.py):
    fused element-wise ops are torch.compile of the model, a compiled loss of the loss
    ([compile] enable, components); DeepEP is
    parallelism.expert_parallel_comm_backend = "deepep"; what the TOML releases cannot ask for
    is a warning."""
    constants = target.time_constants or framework_time_constants("torchtitan")
    dispatcher = constants.moe_dispatcher
    if target.model_spec.is_moe and target.config.ep > 1 and dispatcher == "deepep":
        parallelism["expert_parallel_comm_backend"] = "deepep"
    elif target.model_spec.is_moe and dispatcher != "alltoall":
        warnings.append(f"torchtitan's TOML releases dispatch with all-to-all or DeepEP, not "
                        f"{dispatcher}")
    if constants.cuda_graphs:
        warnings.append("torchtitan's trainer captures no CUDA graphs")
    if target.config.recompute == "selective" and constants.selective_recompute != "op_level":
        warnings.append("torchtitan's selective checkpointing is per op (every second matmul "
                        "saved), not the attention core alone: more recompute, less memory")
    if constants.grad_reduce_in_bf16:  # job_config.py Training.mixed_precision_reduce
        training = {"mixed_precision_reduce": "bfloat16"}
    else:
        training = {}
    if constants.fp8_all_gather and target.job.precision == "fp8":
        # job_config.py Float8Linear (v0.2.x); docs/float8.md recommends both for tensorwise
        sections_fp8 = {"enable_fsdp_float8_all_gather": True,
                        "precompute_float8_dynamic_scale_for_fsdp": True}
    else:
        sections_fp8 = {}
    check_training_states_supported("torchtitan", constants)  # mixed only
    if constants.precision_aware_optimizer:
        warnings.append("torchtitan's optimizers keep their states in the parameters' fp32: no "
                        "precision-aware optimizer (planned with bf16 Adam moments)")
    sections: dict[str, dict[str, object]] = {"training": training} if training else {}
    if sections_fp8:
        sections["quantize.linear.float8"] = sections_fp8
    # torch.compile of the model (fused element-wise ops) and of the loss (job_config.py
    # Compile.components; components/loss.py build_cross_entropy_loss compiles the loss when
    # "loss" is among them)
    components = (["model"] if constants.fused_elementwise else []) + (
        ["loss"] if constants.loss_implementation == "compiled" else [])
    if components:
        sections["compile"] = {"enable": True, "components": components}
    if constants.loss_implementation not in ("eager", "compiled"):
        warnings.append(f"torchtitan computes the loss with F.cross_entropy, eager or compiled, "
                        f"not {constants.loss_implementation}: the logits take more memory "
                        "than estimated")
    return sections


def render_toml(sections: dict[str, dict[str, object]], header: str = "") -> str:
    """Flat TOML sections of strings, numbers, booleans and lists of them, under a comment of
    the header's lines (each kept to one printable line)."""
    lines = [f"# {render_comment_text(line)}" for line in header.split("\n") if header]
    for name, values in sections.items():
        lines += ["", f"[{name}]"] if lines else [f"[{name}]"]
        for key, value in values.items():
            lines.append(f"{key} = {render_toml_value(value)}")
    return "\n".join(lines) + "\n"


def render_plan_line(target: LaunchTarget) -> str:
    """The header line every emitted file starts with: the plan it comes from."""
    c = target.config
    return (f"parplan launch: {target.model_spec.name} on {c.num_gpus} GPUs "
            f"({target.cluster.name}): tp {c.tp} pp {c.pp} dp {c.dp} cp {c.cp} ep {c.ep} "
            f"etp {c.etp} vpp {c.vpp} zero {c.zero}")


def render_header(target: LaunchTarget, what: str) -> str:
    """Comment lines over an emitted shell text: the plan, and what the text is for whom."""
    return "".join(f"# {render_comment_text(line)}\n" for line in (render_plan_line(target), what))


def render_torchtitan_toml(target: LaunchTarget) -> Emitted:
    """torchtitan 0.2's sections as TOML, headed by the plan they come from (0.3's
    command-line overrides: solver.emit.torchtitan_cli; which release gets which:
    solver.emit.formats.render_torchtitan)."""
    sections, warnings, notes = build_torchtitan_config(target)
    header = (f"{render_plan_line(target)}\ntorchtitan 0.2: merge into your job config "
              "(--job.config_file)")
    return Emitted(text=render_toml(sections, header), settings=sections,
                   warnings=tuple(warnings), notes=tuple(notes))
