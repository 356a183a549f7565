"""Framework features, each declared once (issue 35 item 1): its name, CLI flag and values, the
frameworks that have it and where, the values a framework lacks (and why), the cost-model
switch it sets, and the setting each launch format writes for it.

Everything else is derived from FEATURE_DECLARATIONS:
  FrameworkFeatures   the overrides a command takes (one optional field per feature)
  FEATURES            their names, in declaration order (the CLI's and the plans' order)
  MEMORY_SAVERS       features that only lower memory, in the order the search tries them
  OFFLOADS            features that lower memory at a cost in step time
  the CLI flags       solver.cli.options.framework_feature_options
  the profile         solver.cost.step.frameworks.build_framework_profile writes each value into
                      TimeConstants (the field of the feature's name, or `time_switches`),
                      memory_options copies the `memory_copy` ones into MemoryOptions
  refusals            solver.cost.step.frameworks.UNSUPPORTED (from `unsupported`) and FEATURE_RULES
                      (solver.spec.feature_rules): one message, one rule name, for every command

docs/adding_a_feature.md shows how a feature is added.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from solver.spec.framework import (
    ATTENTION_KERNELS,
    DP_OVERLAPS,
    FP8_WEIGHT_COPIES,
    LOSS_IMPLEMENTATIONS,
    MOE_DISPATCHERS,
    RECOMPUTE_MODULES,
    SELECTIVE_RECOMPUTES,
    TRAINING_STATES,
    AttentionKernel,
    DpOverlap,
    Fp8WeightCopies,
    LossImplementation,
    MoeDispatcher,
    RecomputeModule,
    SelectiveRecompute,
    TrainingStates,
)

# How a flag takes its value: a choice of names, an on/off switch, a count, a module list.
FlagKind = Literal["choice", "switch", "count", "modules"]
# Why a feature is in a plan's own list: it is a setting, a memory saver the search turns on
# (never adds step time), or an offload the search tries (costs host transfers).
FeatureRole = Literal["setting", "memory_saver", "offload"]


class Feature(BaseModel):
    """One framework feature. `annotation` is its value type; `flag_kind` and `off_flag` how
    the CLI takes it; `choices` the names of a choice or module list. `time_switches` maps a
    value to the TimeConstants fields it writes, where the value is not itself the field of the
    feature's name; `time_reads` says, in order, which of those fields identify a value when a
    profile is read back (the first whose fields match). `memory_copy`: MemoryOptions has a
    field of the same name that takes the profile's value as it is. `sources`: framework ->
    where it has the feature (file, release). `unsupported`: framework -> value -> why (a flag
    asking for it is an error). `emit`: launch format -> the setting it writes."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    name: str
    annotation: Any
    flag_kind: FlagKind
    help: str
    choices: tuple[str, ...] = ()
    off_flag: str | None = None
    minimum: int | None = None
    role: FeatureRole = "setting"
    time_switches: Mapping[Any, Mapping[str, Any]] | None = None
    time_reads: tuple[tuple[Any, Mapping[str, Any]], ...] = ()
    memory_copy: bool = False
    sources: Mapping[str, str] = Field(default_factory=dict)
    unsupported: Mapping[str, Mapping[Any, str]] = Field(default_factory=dict)
    emit: Mapping[str, str] = Field(default_factory=dict)

    @property
    def flag(self) -> str:
        """The CLI flag that sets it: --attention-kernel for attention_kernel."""
        return "--" + self.name.replace("_", "-")


def _no_pure_states(why: str) -> dict[str, str]:
    return {states: why for states in ("pure_bf16", "adam8bit", "pure_bf16_adam8bit")}


_DEEPSPEED_LOSS = ("Megatron-DeepSpeed computes Megatron's vocab-parallel cross-entropy "
                   "(eager)")
_ALL_TO_ALL_ONLY = "DeepSpeed-MoE dispatches with all-to-all only"

FEATURE_DECLARATIONS: tuple[Feature, ...] = (
    Feature(
        name="attention_kernel", annotation=AttentionKernel, flag_kind="choice",
        choices=ATTENTION_KERNELS,
        help="Attention kernels: native (FlashAttention-3 / cuDNN), flash2 (FlashAttention-2, "
             "Ampere instructions on Hopper), triton (2022 FlashAttention in Triton) or unfused "
             "(keeps the s x s probabilities for backward).",
        # The TimeConstants switches of each kernel (flash_attention, native_attention_kernels,
        # triton_attention), and the order they are read back in.
        time_switches={kernel: {"flash_attention": flash, "native_attention_kernels": native,
                                "triton_attention": triton}
                       for kernel, (flash, native, triton) in {
                           "native": (True, True, False), "flash2": (True, False, False),
                           "triton": (True, False, True),
                           "unfused": (False, False, False)}.items()},
        time_reads=(("unfused", {"flash_attention": False}),
                    ("triton", {"triton_attention": True}),
                    ("native", {"native_attention_kernels": True}), ("flash2", {})),
        sources={"megatron": "TE DotProductAttention, --attention-backend auto (core_v0.16)",
                 "torchtitan": "models/attention.py SDPBackend.CUDNN_ATTENTION (v0.2.0, #1776)",
                 "deepspeed": "Megatron-DeepSpeed --use-flash-attn-v2 (transformer.py)"},
        emit={"megatron": "--attention-backend", "torchtitan": "model attention"}),
    Feature(
        name="fused_elementwise", annotation=bool, flag_kind="switch",
        off_flag="--eager-elementwise",
        help="Fused norms, RoPE and SwiGLU (TE, torch.compile) or eager ops (more launches, and "
             "more activations saved for backward).",
        sources={"megatron": "TE LayerNormLinear, --apply-rope-fusion, bias_swiglu",
                 "torchtitan": "[compile] enable (job_config.py Compile, v0.2.x)",
                 "deepspeed": "apex FusedLayerNorm, fused bias-GeLU (Megatron-DeepSpeed)"},
        emit={"torchtitan": "compile.enable"}),
    Feature(
        name="cuda_graphs", annotation=bool, flag_kind="switch",
        help="Replay captured kernels without host launches.",
        sources={"megatron": "--cuda-graph-impl transformer_engine (cuda_graph.md, core_v0.16)"},
        unsupported={"deepspeed": {True: "DeepSpeed captures CUDA graphs for inference only"}},
        emit={"megatron": "--cuda-graph-impl"}),
    Feature(
        name="moe_dispatcher", annotation=MoeDispatcher, flag_kind="choice",
        choices=MOE_DISPATCHERS, memory_copy=True,
        help="MoE token dispatcher (deepep, hybridep: one copy per NVLink domain, forwarded "
             "inside it).",
        sources={"megatron": "--moe-token-dispatcher-type, --moe-flex-dispatcher-backend "
                             "(moe/README.md, core_v0.16)",
                 "torchtitan": "distributed/expert_parallel.py all_to_all_single; DeepEP "
                               "since #2107 (2025-12)",
                 "deepspeed": "sharded_moe.py _AllToAll"},
        unsupported={"deepspeed": {"deepep": _ALL_TO_ALL_ONLY, "hybridep": _ALL_TO_ALL_ONLY},
                     "torchtitan": {"allgather": "torchtitan has no all-gather dispatcher"}},
        emit={"megatron": "--moe-token-dispatcher-type"}),
    Feature(
        name="tp_comm_overlap", annotation=bool, flag_kind="switch",
        help="Hide TP/SP collectives behind the GEMMs.",
        sources={"megatron": "--tp-comm-overlap, TE userbuffers (model_parallel_config.py)"},
        emit={"megatron": "--tp-comm-overlap"}),
    Feature(
        name="ep_comm_overlap", annotation=bool, flag_kind="switch",
        help="Hide EP all-to-alls behind another micro-batch's compute.",
        sources={"megatron": "--overlap-moe-expert-parallel-comm (Megatron-Bridge 0.1.0 "
                             "changelog)"},
        emit={"megatron": "--overlap-moe-expert-parallel-comm"}),
    Feature(
        name="dp_overlap", annotation=DpOverlap, flag_kind="choice", choices=DP_OVERLAPS,
        help="When DP collectives overlap compute.",
        sources={"megatron": "--overlap-grad-reduce, --overlap-param-gather",
                 "torchtitan": "FSDP2 prefetching",
                 "deepspeed": "pipe/engine.py schedules its own all-reduces"},
        emit={"megatron": "--overlap-grad-reduce"}),
    Feature(
        name="selective_recompute", annotation=SelectiveRecompute, flag_kind="choice",
        choices=SELECTIVE_RECOMPUTES, memory_copy=True,
        help="What --recompute selective recomputes: attention_core (Megatron) or op_level "
             "(torchtitan: all but every second GEMM and the attention).",
        sources={"megatron": "--recompute-granularity selective",
                 "torchtitan": "distributed/activation_checkpoint.py SelectiveAC (v0.2.x)"},
        emit={"megatron": "--recompute-granularity", "torchtitan": "activation_checkpoint.mode"}),
    Feature(
        name="fp8_weight_copies", annotation=Fp8WeightCopies, flag_kind="choice",
        choices=FP8_WEIGHT_COPIES, memory_copy=True,
        help="Quantised weight copies below bf16: transformer_engine (cached row- and "
             "column-wise, sharded like the weights) or none (torchao float8 casts on the fly).",
        sources={"megatron": "TE modules cache quantised weights (--fp8-format)",
                 "torchtitan": "components/quantization/float8.py Float8Linear (v0.2.x)"}),
    Feature(
        name="precision_aware_optimizer", annotation=bool, flag_kind="switch",
        role="memory_saver",
        help="Adam moments and main gradients in bf16 (Megatron "
             "--use-precision-aware-optimizer).",
        sources={"megatron": "--use-precision-aware-optimizer (arguments.py, core_v0.16)"},
        emit={"megatron": "--use-precision-aware-optimizer"}),
    Feature(
        name="grad_reduce_in_bf16", annotation=bool, flag_kind="switch", role="memory_saver",
        help="Gradient buffer and DP reduction in bf16, not fp32.",
        sources={"megatron": "--grad-reduce-in-bf16 (distributed_data_parallel_config.py)",
                 "torchtitan": "training.mixed_precision_reduce (job_config.py)",
                 "deepspeed": "communication_data_type"},
        emit={"megatron": "--grad-reduce-in-bf16",
              "torchtitan": "training.mixed_precision_reduce",
              "deepspeed": "communication_data_type"}),
    Feature(
        name="fp8_param_gather", annotation=bool, flag_kind="switch", role="memory_saver",
        help="Below bf16, Transformer Engine's quantised weights are the parameters, with no "
             "bf16 copy (Megatron --fp8-param-gather).",
        sources={"megatron": "--fp8-param-gather (arguments.py, core_v0.16)"},
        emit={"megatron": "--fp8-param-gather"}),
    Feature(
        name="recompute_modules", annotation=tuple[RecomputeModule, ...], flag_kind="modules",
        choices=RECOMPUTE_MODULES, memory_copy=True,
        help="Modules --recompute selective recomputes (Megatron): "
             + ",".join(RECOMPUTE_MODULES) + " (default core_attn).",
        sources={"megatron": "--recompute-modules (transformer_config.py, core_v0.16)"},
        emit={"megatron": "--recompute-modules"}),
    Feature(
        name="optimizer_offload", annotation=bool, flag_kind="switch", role="offload",
        memory_copy=True,
        help="Optimizer state in host memory, stepped on the CPU (Megatron "
             "--optimizer-cpu-offload, DeepSpeed ZeRO-Offload); default: the search's choice "
             "(optimize), off (estimate).",
        sources={"megatron": "--optimizer-cpu-offload (cpu_offloading/hybrid_optimizer.py)",
                 "deepspeed": "ZeRO-Offload offload_optimizer.device cpu"},
        unsupported={"torchtitan": {True: "torchtitan offloads parameters, gradients and "
                                    "optimizer together (FSDP2 CPUOffloadPolicy), not the "
                                    "optimizer alone"}},
        emit={"megatron": "--optimizer-cpu-offload", "deepspeed": "offload_optimizer"}),
    Feature(
        name="activation_offload", annotation=bool, flag_kind="switch", role="offload",
        memory_copy=True,
        help="Attention and expert activations to host memory between forward and backward "
             "(Megatron --fine-grained-activation-offloading); default: the search's choice "
             "(optimize), off (estimate).",
        sources={"megatron": "--fine-grained-activation-offloading "
                             "(fine_grained_activation_offloading.md, core_v0.16)"},
        unsupported={"deepspeed": {True: "DeepSpeed offloads activation checkpoints "
                                   "(cpu_checkpointing), not Megatron's fine-grained groups"},
                     "torchtitan": {True: "torchtitan has no activation offloading"}},
        emit={"megatron": "--fine-grained-activation-offloading"}),
    Feature(
        name="fp8_all_gather", annotation=bool, flag_kind="switch", memory_copy=True,
        help="torchao float8: FSDP gathers the weights in float8 (torchtitan "
             "enable_fsdp_float8_all_gather; with --precision fp8).",
        sources={"torchtitan": "float8.enable_fsdp_float8_all_gather (float8.py, v0.2.2)"},
        unsupported={"megatron": {True: "Megatron gathers fp8 weights with --fp8-param-gather "
                                  "(Transformer Engine), not torchao's float8 all-gather"},
                     "deepspeed": {True: "torchao's float8 all-gather is FSDP2's, not "
                                   "DeepSpeed ZeRO-3's"}},
        emit={"torchtitan": "quantize.linear.float8.enable_fsdp_float8_all_gather"}),
    Feature(
        name="cpu_offloading_num_layers", annotation=int, flag_kind="count", minimum=0,
        memory_copy=True,
        help="The first N decoder layers' activations to host memory (Megatron layer-level "
             "CPU offloading; pp 1, no recompute; default 0).",
        sources={"megatron": "--cpu-offloading-num-layers (model_parallel_config.py)"},
        unsupported={framework: {True: "layer-level CPU offloading is Megatron's "
                                 "(--cpu-offloading-num-layers)"}
                     for framework in ("torchtitan", "deepspeed", "generic")},
        emit={"megatron": "--cpu-offloading-num-layers"}),
    Feature(
        name="loss_implementation", annotation=LossImplementation, flag_kind="choice",
        choices=LOSS_IMPLEMENTATIONS, memory_copy=True,
        help="How the loss runs, what the last stage holds for the logits: eager (the "
             "framework's own), compiled (torch.compile), chunked (upcast per chunk), fused "
             "(gradient written into the logits: Transformer Engine, Liger) or fused_linear "
             "(LM head fused with the loss: Liger); default: the framework's.",
        sources={"megatron": "--cross-entropy-loss-fusion --cross-entropy-fusion-impl te "
                             "(core_v0.16.1)",
                 "torchtitan": "components/loss.py, compile.components loss (v0.2.x)"},
        unsupported={
            "megatron": {"compiled": "Megatron's --cross-entropy-loss-fusion native compiles its "
                         "cross-entropy in pieces that still keep the fp32 logits "
                         "(fusions/fused_cross_entropy.py calculate_logits_max): eager's "
                         "memory; fused is Transformer Engine's kernel",
                         "chunked": "Megatron-Core has no chunked loss",
                         "fused_linear": "Megatron-Core core_v0.16 does not fuse the output "
                         "layer with the loss"},
            "deepspeed": {value: _DEEPSPEED_LOSS
                          for value in ("compiled", "chunked", "fused", "fused_linear")},
            "torchtitan": {"chunked": "torchtitan's releases compute the whole loss (the "
                           "chunked loss of #996 was removed by #1033)",
                           "fused": "torchtitan has no fused cross-entropy kernel",
                           "fused_linear": "torchtitan's releases (v0.2.x) do not fuse the LM "
                           "head with the loss"}},
        emit={"megatron": "--cross-entropy-loss-fusion", "torchtitan": "compile.components"}),
    Feature(
        name="training_states", annotation=TrainingStates, flag_kind="choice",
        choices=TRAINING_STATES,
        help="Weights, gradients and Adam state: mixed (the framework's fp32 master and "
             "moments; default), pure_bf16 (all bf16, no master: 8 B per parameter), adam8bit "
             "(8-bit block-wise moments, bitsandbytes / torchao) or pure_bf16_adam8bit.",
        sources={"deepspeed": "bf16.bf16_master_weights_and_grads (bf16_optimizer.py)"},
        unsupported={
            "megatron": _no_pure_states(
                "Megatron keeps main parameters in fp32 or fp16 (--main-params-dtype) and its "
                "moments in TE's FusedAdam (--use-precision-aware-optimizer --exp-avg-dtype): "
                "no pure bf16 training, no block-wise 8-bit Adam"),
            "torchtitan": _no_pure_states(
                "torchtitan's optimizers are torch.optim Adam / AdamW over FSDP2's fp32 "
                "parameters (components/optimizer.py OptimizersContainer: \"only supports "
                "Adam and AdamW\"): no pure bf16, no 8-bit states")},
        emit={"deepspeed": "bf16_master_weights_and_grads"}),
    # Added the way docs/adding_a_feature.md shows (issue 35): the cost switch is
    # TimeConstants.moe_router_fusion (KernelLaunches.router_fused: TE PR 1883, the router's
    # host ops "from 72 to 31"), the Megatron emitter writes the flag (Megatron-Bridge takes it
    # as model.moe_router_fusion, solver.emit.bridge).
    Feature(
        name="moe_router_fusion", annotation=bool, flag_kind="switch",
        help="Fused MoE router kernels (Megatron --moe-router-fusion, Transformer Engine >= "
             "2.7): top-k routing and the aux loss in 31 host ops for 72.",
        sources={"megatron": "transformer_config.py moe_router_fusion (core_v0.14-core_v0.16, "
                             "default False: \"Enable fusion for MoE TopK routing and aux-loss "
                             "computation\")"},
        unsupported={"torchtitan": {True: "torchtitan's router runs eager PyTorch ops "
                                    "(moe.py TokenChoiceTopKRouter): no fused router kernel"},
                     "deepspeed": {True: "DeepSpeed-MoE's gate runs eager PyTorch ops "
                                   "(sharded_moe.py top1gating / top2gating): no fused router "
                                   "kernel"}},
        emit={"megatron": "--moe-router-fusion", "megatron-bridge": "model.moe_router_fusion"}),
    # Added the way docs/adding_a_feature.md shows (issue 35 item 3): the cost switch is
    # TimeConstants.moe_permute_fusion (solver.cost.layers.moe_eager.
    # estimate_permuted_elements_per_token: TE's permute and unpermute kernels, 4k -> 2k + 2
    # element copies a token), the Megatron emitter writes the flag.
    Feature(
        name="moe_permute_fusion", annotation=bool, flag_kind="switch",
        help="Fused MoE token permutation (Megatron --moe-permute-fusion, Transformer Engine "
             ">= 2.1): one kernel reads each token once and writes its k copies, one reads "
             "the k copies back, weighs them by the routing probabilities and writes the "
             "token once.",
        sources={"megatron": "transformer_config.py moe_permute_fusion (core_v0.13-core_v0.16, "
                             "default False: \"Fuse token rearrangement ops during token "
                             "dispatching\"); moe_utils.py permute / unpermute fused=..."},
        unsupported={"torchtitan": {True: "torchtitan permutes tokens with eager gathers "
                                    "and a scatter-add (models/common/token_dispatcher.py): no "
                                    "fused permute kernel"},
                     "deepspeed": {True: "DeepSpeed-MoE dispatches with einsums over one-hot "
                                   "masks (sharded_moe.py MOELayer): no fused permute kernel"}},
        emit={"megatron": "--moe-permute-fusion", "megatron-bridge": "model.moe_permute_fusion"}),
    # Added the way docs/adding_a_feature.md shows (issue 35 item 3): the cost switch is
    # TimeConstants.fp8_current_scaling (solver.cost.layers.fp8_scaling: the routed experts'
    # amax reads; solver.cost.layers.host_time: three quantize kernels per grouped-GEMM split,
    # TE quantizer.cpp Float8CurrentScalingQuantizer), read under --precision fp8 only; the
    # Megatron emitter writes --fp8-recipe tensorwise, the Bridge one its preset.
    Feature(
        name="fp8_current_scaling", annotation=bool, flag_kind="switch",
        help="Per-tensor FP8 with current scaling (Megatron --fp8-recipe tensorwise, TE "
             "Float8CurrentScaling; Megatron-Bridge's fp8_cs recipes): each quantization takes "
             "its tensor's amax first, in kernels of its own per grouped-GEMM split. Off: "
             "delayed scaling (TE's default). Read under --precision fp8 only.",
        sources={"megatron": "arguments.py --fp8-recipe {tensorwise,delayed,mxfp8,blockwise} "
                             "(core_v0.13-core_v0.16; tensorwise is TE's Float8CurrentScaling, "
                             "fp8_utils.py get_fp8_recipe)",
                 "deepspeed": "the model's own Transformer Engine fp8_autocast recipe"},
        unsupported={"torchtitan": {True: "torchtitan's float8 is torchao's Float8Linear "
                                    "(converters = [\"float8\"]), which scales per tensor in its "
                                    "own kernels, not Transformer Engine's Float8CurrentScaling: "
                                    "its cost is the kernel tables' FP8 rows"}},
        emit={"megatron": "--fp8-recipe tensorwise",
              "megatron-bridge": "mixed_precision=bf16_with_fp8_current_scaling_mixed"}),
)

# Declarations by name.
FEATURE_BY_NAME: dict[str, Feature] = {feature.name: feature for feature in FEATURE_DECLARATIONS}
# The features a flag may override, in declaration order.
FEATURES: tuple[str, ...] = tuple(FEATURE_BY_NAME)
# Features that only lower memory and never add step time, in the order the search turns them
# on where a plan needs them (solver.cost.step.frameworks.memory_saver_ladder); a plan names the
# ones it uses (Plan.memory_savers) and `launch --plan` emits them.
MEMORY_SAVERS: tuple[str, ...] = ("grad_reduce_in_bf16", "precision_aware_optimizer",
                                  "fp8_param_gather")
# Features that lower memory at a cost in step time (host transfers, a CPU optimizer step): the
# search tries them where it can (solver.cost.step.offload, solver.search.module_variants); a plan
# names the ones it uses (Plan.offloads) and `launch --plan` emits them.
OFFLOADS: tuple[str, ...] = tuple(feature.name for feature in FEATURE_DECLARATIONS
                                  if feature.role == "offload")
# MemoryOptions fields that take the profile's value of the feature of the same name.
MEMORY_COPIES: tuple[str, ...] = tuple(feature.name for feature in FEATURE_DECLARATIONS
                                       if feature.memory_copy)


class _Overrides(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def given(self) -> dict[str, object]:
        """The features that are set."""
        return {name: value for name, value in self if value is not None}


def _override_field(feature: Feature) -> tuple[Any, Any]:
    bounds = {} if feature.minimum is None else {"ge": feature.minimum}
    return feature.annotation | None, Field(default=None, **bounds)


# Overrides of a framework profile's features: one optional field per declared feature; None
# keeps the profile's value.
FrameworkFeatures = create_model(  # type: ignore[call-overload]
    "FrameworkFeatures", __base__=_Overrides, __module__=__name__,
    **{feature.name: _override_field(feature) for feature in FEATURE_DECLARATIONS})
