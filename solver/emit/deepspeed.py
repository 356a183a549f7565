"""`launch --format deepspeed`: a DeepSpeed config (ds_config JSON) for a plan.

Keys from the DeepSpeed configuration reference (deepspeed.ai/docs/config-json):
train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel
ranks, zero_optimization.stage and .overlap_comm ("Attempts to overlap the reduction of the
gradients with backward computation", off by default below ZeRO-3; the step-time model assumes
it), bf16.enabled; tensor parallelism is AutoTP training,
"tensor_parallel": {"autotp_size": tp}, which combines with ZeRO 0-2 (deepspeed.ai tutorial
"Automatic Tensor Parallelism (Training)"). Expert parallelism is AutoEP (DeepSpeed 0.19:
"expert_parallel": {"enabled": true, "autoep_size": ep, "preset_model": ...}, parsed by
deepspeed/module_inject/auto_ep_config.py parse_autoep_config; its presets name the HF
model_types whose MoE layers it replaces, e.g. "mixtral", "deepseek_v3", "qwen3_moe"), which
takes no expert tensor parallelism and folds AutoTP only without pipeline parallelism
(auto_ep_folding.py validate_folding_global; the search's deepspeed_autoep_* constraints).
Pipeline parallelism is set in the model code (deepspeed.pipe.PipelineModule(num_stages=pp))
and works with ZeRO 0/1 only; DeepSpeed has Ulysses sequence parallelism but no ring context
parallelism.

Pipeline partition (deepspeed/runtime/pipe/module.py PipelineModule._partition_layers, the
tutorial "Pipeline Parallelism", "Load Balancing Pipeline Modules"): partition_method
"parameters" (the default) balances parameters, "uniform" the number of layer specs, and
"type:REGEX" the layer specs whose class name matches REGEX (case-insensitive), by
deepspeed/runtime/utils.py partition_balanced, which minimises the spread between the largest
and the smallest stage. There is no method that takes explicit boundaries. So a layout whose
stages hold equally many matched layers (the decoder layers, plus the embedding and the LM head
when they take a slot) is "type:" exactly; one whose counts differ by one is balanced too, but
DeepSpeed picks which stages take the extra layer; anything else it cannot build. Its engine has
no virtual stages, and activation checkpointing (activation_checkpoint_interval) covers every
layer.
"""

from __future__ import annotations

import json

from solver.cost.step.frameworks import check_training_states_supported, check_training_states_zero
from solver.cost.step.training_states import is_8bit, is_pure
from solver.emit.nodes import count_nodes, render_hostfile
from solver.emit.target import Emitted, LaunchTarget
from solver.spec import PipelineLayout

VERSION = "0.19"
# AutoEP's presets (deepspeed/module_inject/auto_ep_presets/*.py PRESET_NAME, hf_model_types),
# by the Hugging Face model_type they match.
AUTOEP_PRESETS = {"mixtral": "mixtral", "deepseek_v2": "deepseek_v2", "deepseek_v3": "deepseek_v3",
                  "qwen3_moe": "qwen3_moe"}
# Stand-ins for the user's layer class names in a partition_method regex.
CLASS_NAMES = {"decoder": "DecoderLayer", "embedding": "Embedding", "loss": "LMHead"}


def _partition_advice(pipeline: PipelineLayout) -> tuple[str, str | None]:
    """The partition_method that builds the layout's per-stage layers, and a warning when
    DeepSpeed may (or cannot) build it."""
    layers = [pipeline.layers_of_stage(stage) for stage in range(pipeline.pp)]
    shown = ", ".join(map(str, layers))
    options = []
    for slots in ([], ["embedding"], ["loss"], ["embedding", "loss"]):
        counts = list(layers)
        counts[0] += "embedding" in slots
        counts[-1] += "loss" in slots
        options.append((max(counts) - min(counts), ["decoder", *slots]))
    spread, kinds = min(options, key=lambda option: option[0])  # the first of equals
    method = "type:" + "|".join(CLASS_NAMES[kind] for kind in kinds)
    stand_ins = ", ".join(CLASS_NAMES[kind] for kind in kinds)
    advice = (f'partition_method="{method}") ({stand_ins}: your layer classes\' names; '
              f"decoder layers per stage {shown})")
    if spread == 0:
        return advice, None
    if spread == 1:
        return advice, (f"DeepSpeed balances the layers to within one but picks itself which "
                        f"stages take one more; the plan has {shown}: check the 'stage=i "
                        "layers=n' lines it prints at start-up")
    return advice, (f"DeepSpeed's PipelineModule takes no explicit partition: its methods "
                    f"balance layer counts or parameters, not the plan's {shown} decoder layers "
                    "per stage (a subclass can set self.parts in _partition_layers)")


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
        m = target.model_spec
        if not m.is_mla and m.kv_heads % c.tp:  # solver.search.constraints
            warnings.append(f"DeepSpeed AutoTP splits whole KV heads: tp {c.tp} must divide "
                            f"num_key_value_heads ({m.kv_heads})")
    pipeline = target.pipeline_layout()
    if c.pp > 1:
        advice, partition_warning = _partition_advice(pipeline)
        notes.append(f"build the model as deepspeed.pipe.PipelineModule(num_stages={c.pp}, "
                     f"{advice}; its engine reduces gradients after the last backward, so DP "
                     "traffic is not hidden behind compute")
        warnings += [partition_warning] if partition_warning else []
        if c.zero >= 2:
            warnings.append("DeepSpeed pipeline parallelism works with ZeRO 0 or 1 only")
        if c.vpp > 1:
            warnings.append("DeepSpeed's pipeline engine has no interleaved (virtual) stages")
    if c.cp > 1:
        warnings.append(f"DeepSpeed has no ring context parallelism (cp {c.cp}); its Ulysses "
                        "sequence parallelism splits heads instead")
    if target.model_spec.is_moe and c.ep > 1:
        config["expert_parallel"] = _autoep_section(target, warnings, notes)
    counts = [stage.recompute_layers for stage in pipeline.stages]
    if any(counts) and counts != [stage.layers for stage in pipeline.stages]:
        notes.append(f"full recomputation of {sum(counts)} of {pipeline.num_layers} layers (the "
                     f"first {'/'.join(map(str, sorted(set(counts))))} of each virtual stage) "
                     "is set in the model code (deepspeed.checkpointing.checkpoint around "
                     "those layers); activation_checkpoint_interval would recompute them all")
    elif c.recompute != "none":
        notes.append(f"{c.recompute} recomputation is set in the model code "
                     "(deepspeed.checkpointing or the model's gradient checkpointing)")
    if job.precision == "fp8":
        notes.append("fp8 comes from Transformer Engine layers in the model; bf16 stays on")
    constants = target.time_constants
    if constants is not None and constants.grad_reduce_in_bf16:
        config["communication_data_type"] = "bf16"  # ds_config: gradients reduced in bf16
    if constants is not None and constants.optimizer_offload:
        # ZeRO-Offload (ds_config zero_optimization.offload_optimizer, ZeRO 1-3):
        # DeepSpeedCPUAdam steps the fp32 partition in pinned host memory.
        zero = config["zero_optimization"]
        assert isinstance(zero, dict)
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if constants is not None:
        check_training_states_supported("deepspeed", constants)
    states = constants.training_states if constants is not None else "mixed"
    if constants is not None:
        check_training_states_zero("deepspeed", constants, (c.zero,))
    if is_pure(states):
        # ds_config bf16: the master partition and its gradients in bf16 (ZeRO 1-3 only,
        # runtime/engine.py), DeepSpeed's own Adam states too (bf16_optimizer_states).
        config["bf16"] = {"enabled": True, "bf16_master_weights_and_grads": True,
                          **({} if is_8bit(states) else {"bf16_optimizer_states": True})}
    if is_8bit(states):
        # ds_config's optimizer types have no 8-bit Adam: a client optimizer, which ZeRO takes
        # only with zero_allow_untested_optimizer (deepspeed/runtime/constants.py
        # ZERO_ALLOW_UNTESTED_OPTIMIZER; transformers' integrations/deepspeed.py sets it for
        # the Trainer's own optimizer); ZeRO hands it its master partition (fp32, or bf16 in
        # pure bf16), so its 8-bit moments sit beside it (solver.cost.step.training_states).
        config["zero_allow_untested_optimizer"] = True
        notes.append("8-bit Adam: pass bitsandbytes.optim.AdamW8bit(model.parameters(), ...) "
                     "(or torchao's AdamW8bit) to deepspeed.initialize(optimizer=...); "
                     "ds_config names no optimizer")
    if constants is not None and constants.precision_aware_optimizer:
        warnings.append("DeepSpeed's ZeRO optimizer keeps fp32 Adam moments: no "
                        "precision-aware optimizer (planned with bf16 moments)")
    return config, warnings, notes


def _autoep_section(target: LaunchTarget, warnings: list[str], notes: list[str]
                    ) -> dict[str, object]:
    """ds_config "expert_parallel" (AutoEP) for the plan's ep, with what it cannot do."""
    c, model_type = target.config, target.model_spec.model_type
    section: dict[str, object] = {"enabled": True, "autoep_size": c.ep}
    preset = AUTOEP_PRESETS.get(model_type)
    if preset is not None:
        section["preset_model"] = preset
    else:
        notes.append(f"AutoEP has no preset for model_type {model_type}: set "
                     "expert_parallel.moe_layer_pattern, router_pattern and expert_pattern to "
                     "your MoE modules' names")
    if c.etp > 1:
        warnings.append(f"DeepSpeed AutoEP has no expert tensor parallelism (etp {c.etp}): "
                        "expert_tensor_parallel_size > 1 is refused")
    if c.tp > 1 and c.pp > 1:
        warnings.append("DeepSpeed AutoEP folds AutoTP only without pipeline parallelism "
                        f"(tp {c.tp}, pp {c.pp})")
    return section


def render_launcher_line(target: LaunchTarget) -> str:
    """DeepSpeed's launcher for the plan's nodes, run on the first one (solver.emit.nodes)."""
    num_nodes = count_nodes(target)
    per_node = min(target.cluster.gpus_per_node, target.config.num_gpus)
    if num_nodes == 1:
        return f"run: deepspeed --num_gpus {per_node} TRAIN.py --deepspeed_config ds_config.json"
    hosts = render_hostfile(target).strip().replace("\n", "; ")
    return (f"run on the first node: deepspeed --hostfile hostfile --num_nodes {num_nodes} "
            f"--num_gpus {per_node} TRAIN.py --deepspeed_config ds_config.json, with hostfile "
            f"lines \"{hosts}\" (your node names)")


def render_deepspeed(target: LaunchTarget) -> Emitted:
    """The ds_config as JSON."""
    config, warnings, notes = build_deepspeed_config(target)
    # JSON has no comments: the version the file is for is a note, and so is the launcher
    notes.insert(0, f"a ds_config for DeepSpeed {VERSION}; {render_launcher_line(target)}")
    return Emitted(text=json.dumps(config, indent=2) + "\n", settings=config,
                   warnings=tuple(warnings), notes=tuple(notes))
