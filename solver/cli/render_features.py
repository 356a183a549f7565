"""The memory assumptions a framework profile makes, in words, for `parplan estimate`'s text
output (issue 17: "fp8 weight copies: none (torchao float8)"); the JSON gives the same values
as `framework_features`."""

from __future__ import annotations

from solver.cost.layers.finetune import estimate_adapter_params, estimate_nf4_bytes_per_param
from solver.cost.step.frameworks import FrameworkProfile
from solver.spec import ModelSpec
from solver.spec.feature_rules import render_feature_value
from solver.spec.features import FEATURE_BY_NAME, FrameworkFeatures
from solver.spec.finetune import FinetuneSpec
from solver.spec.profiles import ResolvedProfile, feature_sources


# What each MoE dispatcher keeps of its own (solver.cost.memory.dispatcher).
DISPATCHER_BUFFERS = {
    "alltoall": "none of their own, all-to-all (the permuted copies are activations)",
    "allgather": "the gathered tokens of the ETPxEP group (Megatron's global buffer)",
    "deepep": "DeepEP's NVLink and RDMA buffers, from its configs' size hints",
    "hybridep": "HybridEP's buffers, a slot for every token of the ETPxEP group",
}

# What each --training-states keeps (solver.cost.step.training_states).
TRAINING_STATE_WORDS = {
    "pure_bf16": "bf16 weights, gradients and Adam moments, no fp32 master",
    "adam8bit": "fp32 master weights, 8-bit block-wise Adam moments (bitsandbytes / torchao)",
    "pure_bf16_adam8bit": "bf16 weights and gradients, 8-bit block-wise Adam moments, no fp32 "
                          "master",
}


# What each loss implementation keeps at the last stage's peak (solver.cost.memory.loss).
LOSS_HELD = {
    "compiled": "compiled (torch.compile): the bf16 logits and their bf16 gradient, 4 B per "
                "logit",
    "chunked": "chunked: fp32 log-softmax of every chunk and one chunk's gradients, 5 B per "
               "logit",
    "fused": "fused kernel: the gradient written into the bf16 logits, 2 B per logit",
    "fused_linear": "fused with the LM head: one chunk of logits and the head's input "
                    "gradient, no full logits",
}


def render_loss_assumption(profile: FrameworkProfile) -> str:
    """The loss line: how the loss runs and what it holds per logit."""
    options = profile.memory_options()
    if options.loss_implementation == "eager":
        return f"eager, {options.logits_bytes:g} B per logit (--loss-implementation)"
    return LOSS_HELD[options.loss_implementation]


def render_memory_assumptions(profile: FrameworkProfile, precision: str,
                              recompute: str | None = None) -> list[str]:
    """One line per memory feature of `profile` for a job at `precision`; what selective
    recompute recomputes only where the plan's `recompute` is selective (or not given)."""
    constants = profile.time_constants
    if precision == "bf16":
        copies = "none (bf16)"
    elif constants.fp8_weight_copies == "none":
        copies = "none (torchao float8 casts on the fly)" + (
            "; ZeRO-3 gathers the weights in float8 (--fp8-all-gather)"
            if constants.fp8_all_gather else "")
    elif constants.fp8_param_gather and profile.name == "megatron":
        copies = ("the parameters themselves, no bf16 weights (Transformer Engine, "
                  "--fp8-param-gather)")
    else:
        copies = "row- and column-wise, sharded like the weights (Transformer Engine)"
    options = profile.memory_options()
    optimizer = ("fp32 master weights, bf16 Adam moments (precision-aware optimizer)"
                 if constants.precision_aware_optimizer
                 else "fp32 master weights and Adam moments")
    if options.master_param_remainders and precision == "bf16":
        optimizer = optimizer.replace("fp32 master weights", "fp32 master weights kept as "
                                      "16-bit remainders of the bf16 ones")
    if constants.training_states != "mixed":
        words = TRAINING_STATE_WORDS[constants.training_states]
        if constants.bf16_master_copy and words.endswith("no fp32 master"):
            words = words.replace("no fp32 master", "a bf16 master copy of the partition")
        optimizer = f"{words} (--training-states " \
                    f"{constants.training_states}: {options.param_bytes:g} + " \
                    f"{options.grad_bytes:g} + {options.optimizer_bytes:.2f} B per parameter)"
    if options.fp32_sharded_params:
        optimizer += "; under ZeRO-3 the fp32 parameter shard is the master (PyTorch FSDP)"
    grad_bytes = options.grad_bytes
    gradients = (f"{grad_bytes:g} B per parameter, reduced in bf16 (--grad-reduce-in-bf16)"
                 if constants.grad_reduce_in_bf16
                 else f"{grad_bytes:g} B per parameter, DP reduction in "
                      f"{constants.grad_reduce_bytes:g} B (ZeRO-3: "
                      f"{constants.zero3_grad_reduce_bytes:g} B)")
    if constants.selective_recompute == "op_level":
        selective = "op level (torchtitan SAC)"
    else:
        selective = "modules " + ",".join(constants.recompute_modules)
    # What the attention kernel and element-wise fusion leave saved (solver.cost.memory.eager).
    attention = ("unfused attention keeps the s x s softmax probabilities"
                 if not options.flash_attention else "fused attention keeps no s x s scores")
    elementwise = ("fused element-wise kernels" if options.fused_elementwise else
                   "eager element-wise ops also keep silu's output and fp32 RMSNorm copies")
    return [f"memory assumptions ({profile.name}):",
            f"  activations: {attention}; {elementwise}",
            f"  fp8 weight copies: {copies}",
            f"  optimizer state: {optimizer}",
            f"  gradients: {gradients}",
            *([f"  --recompute selective: {selective}"]
              if recompute in (None, "selective") else []),
            f"  MoE dispatcher buffers: {DISPATCHER_BUFFERS[constants.moe_dispatcher]}",
            f"  loss: {render_loss_assumption(profile)}",
            *render_offload_assumptions(profile)]


def render_offload_assumptions(profile: FrameworkProfile) -> list[str]:
    """The offload lines: what each offload keeps on the host and how its time is counted
    (solver.cost.step.offload)."""
    constants = profile.time_constants
    optimizer = "off (--optimizer-offload)"
    if constants.optimizer_offload:
        overlap = ("gradients copied during the backward"
                   if constants.offload_grads_during_backward
                   else "copies pipelined with the CPU step")
        optimizer = (f"on: fp32 master and Adam moments in host memory, the step on the CPU "
                     f"({constants.host_optimizer_bytes_per_param:g} B per parameter through "
                     f"host memory; {overlap})")
    activations = "off (--activation-offload)"
    if constants.activation_offload:
        activations = ("on: core_attn, attn_proj, expert_fc1 and moe_act saved tensors in "
                       "host memory, the last layer's kept; transfers hidden behind each "
                       "layer's compute up to the host link's rate")
    layers = constants.cpu_offloading_num_layers
    layer_level = "off (--cpu-offloading-num-layers)" if not layers else (
        f"the first {layers} layers' activations in host memory (Megatron "
        f"--cpu-offloading-num-layers); copies hidden behind the other layers up to the host "
        f"link's rate")
    return [f"  optimizer offload: {optimizer}", f"  activation offload: {activations}",
            f"  layer-level CPU offloading: {layer_level}"]


def render_profile_assumptions(resolved: ResolvedProfile, features: FrameworkFeatures
                               ) -> list[str]:
    """The framework profile's lines: its NAME@RELEASE, each feature its release or a flag
    sets and where from; the rest are the framework's defaults (solver.cost.step.frameworks)."""
    lines = [f"framework profile {resolved.label} (runs {resolved.framework}):"]
    for name, (value, source) in feature_sources(resolved, features.given()).items():
        lines.append(f"  {FEATURE_BY_NAME[name].flag} {render_feature_value(value)}: {source}")
    lines.append(f"  every other feature: {resolved.framework}'s defaults")
    return lines


def render_finetune_assumptions(model_spec: ModelSpec, finetune: FinetuneSpec) -> list[str]:
    """What a fine-tuning job trains, in a line (solver.cost.layers.finetune); nothing for
    pretraining."""
    if finetune.mode == "none":
        return []
    if finetune.mode == "full":
        return [f"fine-tuning ({finetune.label()}): every weight trains, as in pretraining"]
    adapters = estimate_adapter_params(model_spec, finetune)
    share = adapters / model_spec.total_params
    base = ("the layers' linears in NF4 with double-quantized constants "
            f"({8 * estimate_nf4_bytes_per_param():.3f} bits a weight), dequantized to bf16 "
            "in every GEMM pass; embedding and LM head bf16"
            if finetune.quantized_base else "bf16")
    return [f"fine-tuning ({finetune.label()}): base frozen, {base}; no gradients or optimizer "
            f"state for it and no weight-gradient GEMM; {adapters / 1e6:,.1f}M adapter "
            f"parameters ({share:.2%}) train with the training states above"]
