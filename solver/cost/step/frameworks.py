"""Framework profiles: what Megatron-LM, torchtitan and DeepSpeed do that the step time and the
memory see (`--framework`), each feature from the framework's own code or documentation; named
flags override single features (`--moe-dispatcher deepep`, `--cuda-graphs`, ...). Every planning
command builds its profile here (`build_framework_profile`), so `optimize`, `estimate` and
`launch` agree.

A profile's features are fields of TimeConstants, the step-time model's one set of switches:
the profile chooses their values, nothing repeats them. The features a flag may override are
declared once in solver.spec.features (flag, values, frameworks, refusals, cost switch, emitters),
their rules with each other in solver.spec.feature_rules; memory_options derives MemoryOptions
from the profile (the declarations' memory_copy fields as they are, the rest below),
and, not overridable, the host ops per layer (TimeConstants.launches, counted below), the
DP details (zero*_...) and the gradient-reduction dtypes (grad_reduce_in_bf16 makes them
bf16).

Host op counts (forward, one layer, one micro-batch; TimeConstants.launches) are read off the
frameworks' layer code (solver.cost.layers.framework_launches, with what each count holds); the
backward issues twice as many. Each op costs the
host the cluster CPU's time per eager op (ClusterSpec.host_op_us; a Transformer Engine module
call TE_MODULE_OPS of them: solver.cost.layers.time_constants).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from solver.cost.memory.options import MemoryOptions
from solver.cost.kernels.precision import load_recipe
from solver.cost.layers.framework_launches import (
    DEEPSPEED_LAUNCHES,
    MEGATRON_LAUNCHES,
    TORCHTITAN_COMPILED_LAUNCHES,
    TORCHTITAN_EAGER_LAUNCHES,
)
from solver.cost.layers.time_constants import TimeConstants
from solver.cost.step.training_states import estimate_training_state_options, is_pure
from solver.errors import InputError, format_validation_error
from solver.spec import ClusterSpec
from solver.spec.feature_rules import refuse_features
from solver.spec.features import (
    FEATURE_BY_NAME,
    FEATURE_DECLARATIONS,
    FEATURES,
    MEMORY_COPIES,
    MEMORY_SAVERS,
    OFFLOADS,
    FrameworkFeatures,
)

# Megatron --exp-avg-dtype / --exp-avg-sq-dtype bf16: two fp32 moments become bf16 (2 x 2 B).
ADAM_MOMENTS_BF16_SAVED_BYTES = 2 * (4.0 - 2.0)
BF16_GRAD_BYTES = 2.0

# The frameworks whose ZeRO-3 is PyTorch FSDP with mixed precision: the fp32 parameter shard is
# the master copy (MemoryOptions.fp32_sharded_params). torchtitan: fully_shard with
# MixedPrecisionPolicy(param_dtype=bfloat16) over a model built in fp32 (parallelize.py
# apply_fsdp); generic: plain PyTorch FSDP (Composer/LLM Foundry: mosaic_parallelism.py
# get_mixed_precision, param_dtype = the autocast dtype). Megatron-FSDP and DeepSpeed ZeRO-3
# keep a bf16 shard beside the fp32 one (18 B / d).
FSDP_FP32_PARAM_FRAMEWORKS = ("torchtitan", "generic")

# torchtitan's eager loss, F.cross_entropy(pred.float(), labels) (components/loss.py
# cross_entropy_loss; train.py @9dec370), after `del pred` ("need to free to before bwd to avoid
# peaking memory"): log_softmax keeps its fp32 output (4 B per logit) for backward, where
# nll_loss's dense fp32 gradient (4 B) and log_softmax's (4 B) join it: 12 B per logit at the
# start of the backward, when every activation is still held (MemoryOptions.logits_bytes of
# its eager loss). With torch.compile the loss is compiled too ([compile] components "model",
# "loss"): loss_implementation "compiled" (solver.cost.memory.loss).
EAGER_CROSS_ENTROPY_LOGITS_BYTES = 12.0
# The frameworks whose eager loss is F.cross_entropy on upcast logits; Megatron and
# Megatron-DeepSpeed run Megatron's vocab-parallel cross-entropy (MemoryOptions.logits_bytes'
# default, 6 B), and the generic profile keeps that default [B].
EAGER_CROSS_ENTROPY_FRAMEWORKS = ("torchtitan",)

# The TimeConstants switches of each attention kernel (its declaration's time_switches).
ATTENTION_SWITCHES = FEATURE_BY_NAME["attention_kernel"].time_switches or {}



class FrameworkProfile(BaseModel):
    """A framework's name and its TimeConstants (the features are its fields, FEATURES)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    time_constants: TimeConstants

    def features(self) -> dict[str, Any]:
        """The named features and their values (FEATURES' order; a feature with switches,
        the attention kernel, read back from them)."""
        constants = self.time_constants
        values: dict[str, Any] = {}
        for feature in FEATURE_DECLARATIONS:
            value = (getattr(constants, feature.name) if not feature.time_reads
                     else next(value for value, switches in feature.time_reads
                               if all(getattr(constants, field) == on
                                      for field, on in switches.items())))
            # A list for the module list: what JSON gives back (sweep lines compare equal).
            values[feature.name] = list(value) if isinstance(value, tuple) else value
        return values

    def memory_options(self, base: MemoryOptions | None = None,
                       cluster: ClusterSpec | None = None) -> MemoryOptions:
        """The memory model's options under this profile: what `selective` keeps, the fp8
        weight copies, whether the ZeRO-3 shard is the fp32 master (PyTorch FSDP,
        FSDP_FP32_PARAM_FRAMEWORKS), the attention kernel's and eager ops' activations (an
        unfused kernel's s x s probabilities, solver.cost.memory.eager), torchtitan's FSDP2
        under PP and its eager cross-entropy (EAGER_CROSS_ENTROPY_LOGITS_BYTES), the loss
        implementation, and the smaller states of the precision-aware optimizer (Adam's m and v
        in bf16: 4 B per parameter less) and of bf16 gradient reduction (buckets of half the
        bytes; in Megatron a bf16 gradient buffer, 2 B). On a `cluster`, the GPUs of the NVLink
        domain the job fills (MemoryOptions.nvlink_domain_gpus)."""
        base = base or MemoryOptions()
        constants = self.time_constants
        # The features MemoryOptions takes as they are (their declarations' memory_copy).
        update: dict[str, Any] = {name: getattr(constants, name) for name in MEMORY_COPIES}
        update["fp32_sharded_params"] = self.name in FSDP_FP32_PARAM_FRAMEWORKS
        update["fsdp_unsharded_under_pp"] = self.name == "torchtitan"
        # torch.distributed.pipelining's kept stage outputs and gradient receive buffers
        # (MemoryOptions).
        update["keep_stage_outputs"] = base.keep_stage_outputs or self.name == "torchtitan"
        update["pipeline_grad_buffers"] = self.name == "torchtitan"
        if self.name in EAGER_CROSS_ENTROPY_FRAMEWORKS:
            update["logits_bytes"] = EAGER_CROSS_ENTROPY_LOGITS_BYTES
        # The attention kernel and element-wise fusion move memory as well as time
        # (solver.cost.memory.eager): an unfused kernel keeps the s x s probabilities, eager ops
        # what their autograd nodes save. A base that already says unfused or eager (BLOOM's
        # Megatron-DeepSpeed, benchmarks/memory_accuracy.py) stays so.
        update["flash_attention"] = base.flash_attention and constants.flash_attention
        update["fused_elementwise"] = base.fused_elementwise and constants.fused_elementwise
        if constants.precision_aware_optimizer:
            update["optimizer_bytes"] = max(base.optimizer_bytes - ADAM_MOMENTS_BF16_SAVED_BYTES,
                                            0.0)
            update["master_param_remainders"] = self.name == "megatron"
        # Only Megatron stores the gradients in the reduction dtype (its grad buffer); FSDP2
        # (torchtitan) casts the reduced shard back to the fp32 parameter's dtype and DeepSpeed's
        # communication_data_type changes the traffic only.
        # fp8 parameters: Megatron's TE parameters (MemoryOptions.fp8_params).
        if constants.fp8_param_gather and self.name == "megatron":
            update["fp8_params"] = True
        if cluster is not None:
            update["nvlink_domain_gpus"] = cluster.job_segment_gpus
        if constants.grad_reduce_in_bf16 and self.name == "megatron":
            update["grad_bytes"] = min(base.grad_bytes, BF16_GRAD_BYTES)
            update["comm_bucket_bytes"] = base.comm_bucket_bytes * BF16_GRAD_BYTES / 4.0
        # Pure bf16 / 8-bit Adam (--training-states): last, over the framework's own states.
        update.update(estimate_training_state_options(constants.training_states,
                                                      base.model_copy(update=update),
                                                      constants.bf16_master_copy))
        return base.model_copy(update=update)


def _megatron() -> TimeConstants:
    """Megatron-LM / Megatron-Core as `parplan launch --format megatron` starts it.
    attention native: TE's DotProductAttention runs cuDNN fused attention (FlashAttention-3
      where installed) on Hopper and Blackwell (--attention-backend auto).
    elementwise fused: TE fused norms (LayerNormLinear), --apply-rope-fusion, bias_swiglu;
      but a YaRN model's RoPE runs eagerly (scaled_rope_eager: TE's fused RoPE takes no
      mscale, rope_utils.py core_r0.15.0-0.18.0).
    cuda_graphs off: --cuda-graph-impl defaults to none (transformer_config.py).
    router unfused: --moe-router-fusion defaults off (transformer_config.py moe_router_fusion
      = False) and `launch` does not ask for it: KernelLaunches.router, the guide's 72 kernels.
    dispatcher alltoall: the launch settings ask for --moe-token-dispatcher-type alltoall
      (Megatron-Core's own default, allgather, suits TP-only or small EP; moe/README.md);
      flex dispatchers (deepep, hybridep) by --moe-flex-dispatcher-backend.
    overlaps: --tp-comm-overlap and --overlap-moe-expert-parallel-comm default off
      (model_parallel_config.py); DP overlap asked (--overlap-grad-reduce,
      --overlap-param-gather); fp32 main gradients, reduced in fp32 under Megatron-FSDP too
      (--grad-reduce-in-bf16 is opt-in): ZeRO-3 gradients 4 B.
    selective attention_core: --recompute-granularity selective recomputes core attention.
    fp8 weight copies transformer_engine: --fp8-format runs the linear layers as TE modules,
      which cache their quantised weights across micro-batches.
    precision-aware optimizer and bf16 gradient reduction off: --use-precision-aware-optimizer
      and --grad-reduce-in-bf16 are opt-in (arguments.py: store_true, main/exp-avg dtypes
      default fp32; bf16 training accumulates and reduces gradients in fp32).
    pipeline sends overlapped: the interleaved schedule overlaps its steady-state sends with
      compute (--no-overlap-p2p-communication is store_false: on by default, and forced off
      without interleaving, arguments.py; solver.cost.comm.pipeline_sends).
    loss eager: --cross-entropy-loss-fusion defaults off (model_parallel_config.py
      cross_entropy_loss_fusion = False, core_v0.12 to core_v0.19): tensor_parallel.
      vocab_parallel_cross_entropy, its fp32 copy beside the bf16 logits (6 B per logit);
      --loss-implementation fused is Transformer Engine's in-place kernel
      (--cross-entropy-fusion-impl te).
    moe quantization padding on: with fp8 or fp4 the grouped experts pad and un-pad each local
      expert's rows by copy (experts.py TEGroupedMLP, core_r0.13.0-0.18.0; `launch` asks for
      no router padding; solver.cost.layers.quantization_padding).
    DP buckets of max(40e6, 1e6 x dp_cp) parameters (training.py / distributed_data_parallel.py
      bucket_size default with --overlap-grad-reduce)."""
    return TimeConstants(zero3_grad_reduce_bytes=4.0, scaled_rope_eager=True,
                         pipeline_sends="overlapped", moe_quantization_padding=True,
                         launches=MEGATRON_LAUNCHES, dp_bucket_params=40e6,
                         dp_bucket_params_per_rank=1e6)


def _torchtitan() -> TimeConstants:
    """torchtitan (v0.2.x TOML releases and main).
    attention native: ScaledDotProductAttention puts SDPBackend.CUDNN_ATTENTION first on every
      GPU since v0.2.0 (models/attention.py, #1776, 2025-10); v0.1.x ran FLASH_ATTENTION
      (FlashAttention-2, not Hopper-native) below Blackwell (#1196): --attention-kernel flash2.
    elementwise eager: [compile] enable = false by default (job_config.py Compile), and in the
      shipped llama3_8b / qwen3 configs.
    cuda_graphs off: no CUDA-graph path in its trainer.
    dispatcher alltoall: expert parallelism sends with all_to_all_single
      (distributed/expert_parallel.py); DeepEP / HybridEP backends since #2107 (2025-12).
    overlaps: no TP/EP overlap by default (async TP is opt-in); FSDP2 prefetching overlaps DP
      traffic; mixed_precision_reduce = "float32": ZeRO-2/3 gradients 4 B.
    selective op_level: SelectiveAC saves matmul, attention and communication outputs but
      recomputes every second mm/linear and every other op (distributed/activation_checkpoint
      .py _get_default_save_ops and the policy's "every second mm"); torch._grouped_mm is not
      in the save list (torch._functorch.partitioners.get_default_op_list), so the routed
      experts recompute. Layer-level SAC (v0.2.x selective_ac_option = "k": every k-th layer
      in full) is full recompute of 1/k of the layers (--recompute full with
      --recompute-num-layers).
    fp8 weight copies none: float8 training is torchao's convert_to_float8_training
      (components/quantization/float8.py), whose Float8Linear casts each weight on the fly in
      every forward and caches nothing (with enable_fsdp_float8_all_gather the FSDP2 gather
      itself is in float8).
    context parallel torch_allgather: apply_cp / context_parallel runs PyTorch's experimental
      ring attention with context_parallel_rotate_method = "allgather" by default
      (job_config.py v0.2.2; torch/distributed/tensor/experimental/_attention.py).
    loss eager: F.cross_entropy(pred.float()) (components/loss.py cross_entropy_loss), compiled
      with the model under torch.compile (build_cross_entropy_loss: compile.components
      "loss"; build_framework_profile switches it with --fused-elementwise)."""
    return TimeConstants(zero3_grad_reduce_bytes=4.0, fused_elementwise=False,
                         selective_recompute="op_level", fp8_weight_copies="none",
                         context_parallel_ring="torch_allgather",
                         launches=TORCHTITAN_EAGER_LAUNCHES)


def _deepspeed() -> TimeConstants:
    """DeepSpeed with Megatron-DeepSpeed.
    attention flash2: Megatron-DeepSpeed's --use-flash-attn-v2 calls the flash_attn 2 package
      (megatron/model/transformer.py FlashSelfAttention), Ampere's mma.sync on Hopper.
    elementwise fused: apex FusedLayerNorm, fused bias-GeLU and bias-dropout-add.
    cuda_graphs off: CUDA graphs are DeepSpeed-Inference's (enable_cuda_graph), not training's.
    dispatcher alltoall: DeepSpeed-MoE's MOELayer (_AllToAll in sharded_moe.py).
    DP: its pipeline engine leaves DP traffic exposed (dp_overlap "without_pipeline"), its
      ZeRO-0 all-reduces after the backward, its ZeRO 1-2 gather parameters inside the
      optimizer step and its ZeRO-2 reduces gradients every micro-batch; ZeRO-3 reduces in the
      parameters' dtype (2 B) unless communication_data_type says otherwise.
    selective attention_core: Megatron-DeepSpeed keeps Megatron's
      --recompute-granularity selective; DeepSpeed's own checkpointing is per layer (full).
    fp8 weight copies transformer_engine: FP8 training in DeepSpeed runs Transformer Engine
      modules (DeepSpeed's FP8 tutorial wraps the model in te.fp8_autocast).
    optimizer offload (ZeRO-Offload): gradients copied to the host during the backward
      (offload_grads_during_backward).
    pipeline sends sequential: its pipeline engine sends and receives with blocking
      dist.send / dist.recv, one after the other (pipe/p2p.py, schedule.py TrainSchedule;
      solver.cost.comm.pipeline_sends).
    loss eager: Megatron-DeepSpeed's GPT model computes Megatron's vocab-parallel
      cross-entropy (tensor_parallel.vocab_parallel_cross_entropy), 6 B per logit.
    bf16 master copy: pure bf16 (--training-states pure_bf16: bf16_master_weights_and_grads)
      keeps the master as a bf16 clone of the partition (solver.cost.step.training_states).
    DP buckets of 5e8 elements (zero_optimization reduce_bucket_size / allgather_bucket_size,
      and the pipeline engine's buffered all-reduce elements_per_buffer)."""
    return TimeConstants(dp_overlap="without_pipeline", params_gather_overlap=False,
                         zero2_reduce_every_micro_batch=True, zero0_grad_overlap=False,
                         native_attention_kernels=False, launches=DEEPSPEED_LAUNCHES,
                         offload_grads_during_backward=True, pipeline_sends="sequential",
                         bf16_master_copy=True, dp_bucket_params=5e8)


PROFILES = {"megatron": _megatron, "torchtitan": _torchtitan, "deepspeed": _deepspeed,
            "generic": TimeConstants}
# Feature values a framework does not offer, from the declarations' `unsupported`:
# framework -> (feature, value) -> why (a flag asking for one is an error naming the flag;
# a count's value is True for any number of layers).
UNSUPPORTED: dict[str, dict[tuple[str, Any], str]] = {
    framework: {(feature.name, value): why for feature in FEATURE_DECLARATIONS
                for value, why in feature.unsupported.get(framework, {}).items()}
    for framework in dict.fromkeys(name for feature in FEATURE_DECLARATIONS
                                   for name in feature.unsupported)}


def _flag(feature: str) -> str:
    return "--" + feature.replace("_", "-")


# Memory savers (solver.spec.framework.MEMORY_SAVERS) the search turns on where a plan needs
# them (issue 17), in that order: each only lowers memory and never adds step time, so a plan gets the shortest prefix
# that fits (dominance: no product of choices is enumerated). bf16 gradient reduction halves
# Megatron's gradient buffer and the DP bytes (estimate_dp_collectives_s); the precision-aware
# optimizer keeps Adam's moments in bf16 (estimate_optimizer_s streams fewer bytes). Megatron
# only: elsewhere they save no memory (memory_options). Both change the numerics, so a plan
# that fits without them keeps them off, and a flag pins them either way.
MEMORY_SAVER_FRAMEWORKS = ("megatron",)


def memory_saver_ladder(framework: str, overrides: FrameworkFeatures | None = None,
                        precision: str = "bf16") -> tuple[str, ...]:
    """The MEMORY_SAVERS the search may turn on: those of a framework where they save memory
    that no flag set (on or off); fp8 parameters only below bf16 with Transformer Engine's
    weights (where they save anything)."""
    if framework not in MEMORY_SAVER_FRAMEWORKS:
        return ()
    given = overrides.given() if overrides is not None else {}
    low = load_recipe(precision).low_precision and given.get(
        "fp8_weight_copies", "transformer_engine") == "transformer_engine"
    return tuple(name for name in MEMORY_SAVERS
                 if name not in given and (low or name != "fp8_param_gather")
                 and _rules_allow(framework, given, name))


# The offloads (solver.spec.framework.OFFLOADS) each framework runs: Megatron both
# (--optimizer-cpu-offload, --fine-grained-activation-offloading), DeepSpeed the optimizer's
# (ZeRO-Offload); torchtitan and the generic profile none the search turns on.
OFFLOAD_FRAMEWORKS = {"megatron": OFFLOADS, "deepspeed": ("optimizer_offload",)}
# Megatron takes --optimizer-cpu-offload with --fp8-param-gather only under delayed scaling
# (arguments.py), which is the fp8 recipe's (solver.emit.megatron PRECISION_FLAGS).
OFFLOAD_FP8_PARAM_PRECISIONS = ("bf16", "fp8")


def check_feature_precision(constants: TimeConstants, precision: str) -> None:
    """An InputError where a feature asks for a precision the job does not train in: torchao's
    float8 all-gather is for tensorwise float8 (torchtitan v0.2.2 float8.py: with a recipe name,
    rowwise, "enable_fsdp_float8_all_gather ... is not supported")."""
    if constants.fp8_all_gather and precision != "fp8":
        raise InputError(f"--fp8-all-gather: torchao's float8 all-gather is for tensorwise "
                         f"float8 (--precision fp8), not {precision}")
    # Pure bf16 keeps no fp32 master; the fp8 and fp4 recipes cast from one (Transformer
    # Engine, torchao float8) and are modelled with it.
    if is_pure(constants.training_states) and precision != "bf16":
        raise InputError(f"--training-states {constants.training_states}: pure bf16 training "
                         f"is for --precision bf16, not {precision}")


def offload_ladder(framework: str, overrides: FrameworkFeatures | None = None,
                   precision: str = "bf16") -> tuple[str, ...]:
    """The OFFLOADS the search may turn on: those `framework` runs that no flag set, the
    optimizer's not where Megatron's fp8 parameters may be on under a block-scaled recipe."""
    given = overrides.given() if overrides is not None else {}
    fp8_params = framework == "megatron" and precision not in OFFLOAD_FP8_PARAM_PRECISIONS \
        and given.get("fp8_param_gather", True) is not False
    return tuple(name for name in OFFLOAD_FRAMEWORKS.get(framework, ())
                 if name not in given and _rules_allow(framework, given, name)
                 and not (fp8_params and name == "optimizer_offload"))


def _rules_allow(framework: str, given: Mapping[str, Any], name: str) -> bool:
    """Whether turning feature `name` on under the `given` flags breaks no FEATURE_RULES
    (Megatron's layer-level CPU offloading refuses fine-grained activation offloading; the
    host optimizers step fp32 states only: solver.spec.feature_rules)."""
    values = {**build_framework_profile(framework, given).features(), name: True}
    return refuse_features(framework, values, given=()) is None


def with_memory_savers(profile: FrameworkProfile, savers: tuple[str, ...]) -> FrameworkProfile:
    """`profile` with the named MEMORY_SAVERS on."""
    update = {name: True for name in savers}
    return profile.model_copy(update={"time_constants":
                                      profile.time_constants.model_copy(update=update)})


def build_framework_profile(framework: str, overrides: FrameworkFeatures | Mapping[str, Any]
                            | None = None) -> FrameworkProfile:
    """The profile of `framework` with single features overridden (None values keep the
    profile's); an unknown framework or feature, a bad value, or a value the framework lacks
    is an InputError naming the flag."""
    if framework not in PROFILES:
        raise InputError(f"--framework {framework}: unknown framework "
                         f"({', '.join(PROFILES)})")
    constants = PROFILES[framework]()
    if isinstance(overrides, FrameworkFeatures):
        overrides = overrides.given()
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    for feature in given:
        if feature not in FEATURES:
            raise InputError(f"{_flag(feature)}: not a framework feature ({', '.join(FEATURES)})")
    try:
        features = FrameworkFeatures(**given)
    except ValidationError as exc:
        feature = str(exc.errors()[0]["loc"][0])
        raise InputError(format_validation_error(_flag(feature), exc)) from None
    update = features.given()
    why = refuse_features(framework, update)  # a value the framework lacks
    if why:
        raise InputError(why)
    kernel = update.pop("attention_kernel", None)
    if kernel is not None:
        update.update(ATTENTION_SWITCHES[kernel])
    if framework == "torchtitan" and "fused_elementwise" in update:
        update["launches"] = (TORCHTITAN_COMPILED_LAUNCHES if update["fused_elementwise"]
                              else TORCHTITAN_EAGER_LAUNCHES)
        # torch.compile compiles the loss with the model ([compile] components "model",
        # "loss", as `launch` writes it) unless a flag says how the loss runs.
        update.setdefault("loss_implementation",
                          "compiled" if update["fused_elementwise"] else "eager")
    if is_pure(update.get("training_states", "mixed")):
        # bf16 gradients are reduced in bf16 (DDP and FSDP2 without a mixed-precision policy
        # reduce in the gradient's dtype).
        update["grad_reduce_bytes"] = BF16_GRAD_BYTES
        update["zero3_grad_reduce_bytes"] = BF16_GRAD_BYTES
    profile = FrameworkProfile(name=framework, time_constants=constants.model_copy(update=update))
    why = refuse_features(framework, profile.features(), given=())  # FEATURE_RULES
    if why:
        raise InputError(why)
    return profile


def framework_time_constants(framework: str) -> TimeConstants:
    """The TimeConstants of `framework`'s profile, no feature overridden."""
    return build_framework_profile(framework).time_constants


def check_training_states_supported(framework: str, constants: TimeConstants) -> None:
    """An InputError where `framework` has no setting for constants' training states (UNSUPPORTED):
    what an emitter of its launch settings refuses rather than writes."""
    states = constants.training_states
    why = UNSUPPORTED.get(framework, {}).get(("training_states", states))
    if why:
        raise InputError(f"--training-states {states}: {why} (--framework {framework}) "
                         "[framework_lacks_feature]")


def check_training_states_zero(framework: str, constants: TimeConstants,
                               zero_stages: tuple[int, ...]) -> None:
    """An InputError where DeepSpeed's pure bf16 (bf16_master_weights_and_grads) meets ZeRO 0,
    which its engine refuses (the search's deepspeed_bf16_master_needs_zero)."""
    states = constants.training_states
    if framework == "deepspeed" and is_pure(states) and 0 in zero_stages:
        raise InputError(f"--training-states {states}: DeepSpeed takes bf16 master weights "
                         "(bf16_master_weights_and_grads) with ZeRO 1, 2 or 3, not --zero 0 "
                         "[deepspeed_bf16_master_needs_zero]")
