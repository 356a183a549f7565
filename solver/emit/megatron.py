"""`launch --format megatron`: Megatron-LM command-line arguments for a plan.

The target is Megatron-LM core_v0.16 (VERSION; `launch --validate` runs its parse_args and
validate_args when a checkout is importable). Flag names are those of
megatron/training/arguments.py (NVIDIA/Megatron-LM core_v0.16.1):
_add_distributed_args (--tensor-model-parallel-size, --pipeline-model-parallel-size,
--overlap-grad-reduce, --overlap-param-gather,
--num-layers-per-virtual-pipeline-stage, --pipeline-model-parallel-layout,
--context-parallel-size, --use-distributed-optimizer, --use-megatron-fsdp,
--data-parallel-sharding-strategy, --use-tp-pp-dp-mapping), _add_moe_args
(--expert-model-parallel-size, --expert-tensor-parallel-size), _add_training_args
(--micro-batch-size, --global-batch-size, --sequence-parallel, --recompute-granularity
{full,selective}, --recompute-method {uniform,block}, --recompute-num-layers,
--no-gradient-accumulation-fusion), _add_data_args (--seq-length), _add_mixed_precision_args
(--bf16), _add_checkpointing_args (--ckpt-format) and _add_transformer_engine_args
(--fp8-format {e4m3,hybrid}). There is no --virtual-pipeline-model-parallel-size any more.
The framework profile's features (solver.cost.step.frameworks) go out as TransformerConfig flags
(_feature_flags: --moe-token-dispatcher-type, --moe-flex-dispatcher-backend,
--moe-grouped-gemm, --cuda-graph-impl, --cuda-graph-scope, --tp-comm-overlap,
--overlap-moe-expert-parallel-comm). The model's architecture goes out in full
(solver.emit.megatron_model), and the pipeline layout and recompute in the plainest flags that
build them (solver.emit.megatron_pipeline).

Mappings: ZeRO 1 is the distributed optimizer; ZeRO 2 and 3 are Megatron-FSDP with sharding
strategy optim_grads / optim_grads_params, which validate_args requires to checkpoint as
fsdp_dtensor (Megatron-Core docs, "Megatron FSDP": --use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion
--use-distributed-optimizer).
"""

from __future__ import annotations

import shlex

import numpy as np

from solver.cost.step.frameworks import check_training_states_supported, framework_time_constants
from solver.emit.layout import build_rank_layout
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.megatron_hybrid import build_mamba_hybrid_flags
from solver.emit.megatron_model import architecture_flags
from solver.emit.megatron_pipeline import pipeline_flags, recompute_flags
from solver.errors import InputError

VERSION = "core_v0.16"
# Megatron-LM builds its groups in one of two orders (parallel_state.initialize_model_parallel).
MEGATRON_ORDERS = {"tp-cp-ep-dp-pp": (), "tp-cp-ep-pp-dp": ("--use-tp-pp-dp-mapping",)}
FSDP_STRATEGIES = {2: "optim_grads", 3: "optim_grads_params"}


def _order_flags(target: LaunchTarget) -> tuple[list[str], list[str]]:
    """The flag that selects the target's rank order, or a warning when Megatron has none."""
    config, layout = target.config, target.layout
    is_moe = layout.expert is not None
    for order, flags in MEGATRON_ORDERS.items():
        try:
            theirs = build_rank_layout(config, is_moe, order).groups()
        except InputError:  # Megatron refuses that order for this plan too
            continue
        if all(np.array_equal(theirs[name], rows) for name, rows in layout.groups().items()):
            return list(flags), []
    return [], [f"Megatron-LM builds its groups in order tp-cp-ep-dp-pp (or tp-cp-ep-pp-dp with "
                f"--use-tp-pp-dp-mapping), not {'-'.join(layout.order)}: its groups will differ "
                "from `--format groups`"]


def _feature_flags(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str]]:
    """The framework profile's features as Megatron-Core settings (TransformerConfig fields,
    flags by ArgumentGroupFactory): the MoE dispatcher (--moe-token-dispatcher-type
    alltoall | allgather | flex with --moe-flex-dispatcher-backend deepep | hybridep) and
    TE's grouped expert GEMMs (--moe-grouped-gemm), which the profile's kernel counts assume;
    CUDA graphs of attention and MLP, or of attention, router and preprocessing in dropless MoE
    layers (docs/user-guide/features/cuda_graph.md); TP and EP communication overlap; the
    precision-aware optimizer with bf16 main gradients and moments, bf16 gradient reduction,
    fp8 parameters (arguments.py); Transformer Engine's fused cross-entropy. Returns the flags
    and notes."""
    constants = target.time_constants or framework_time_constants("megatron")
    c, is_moe = target.config, target.model_spec.is_moe
    flags: list[tuple[str, ...]] = []
    notes: list[str] = []
    if is_moe:
        dispatcher = constants.moe_dispatcher
        if dispatcher in ("deepep", "hybridep"):
            flags += [("--moe-token-dispatcher-type", "flex"),
                      ("--moe-flex-dispatcher-backend", dispatcher)]
        else:
            flags.append(("--moe-token-dispatcher-type", dispatcher))
        flags.append(("--moe-grouped-gemm",))
        if constants.moe_router_fusion:  # TE's fused top-k and aux loss (TE >= 2.7)
            flags.append(("--moe-router-fusion",))
        if constants.moe_permute_fusion:  # TE's fused permute / unpermute (TE >= 2.1)
            flags.append(("--moe-permute-fusion",))
    if constants.cuda_graphs:
        # mlp only where the model has dense MLP layers (megatron-core 0.16.1
        # transformer_config.py __post_init__: "mlp cuda graph is only supported for dense
        # layers")
        m = target.model_spec
        dense = not is_moe or m.first_k_dense_layers > 0 or m.moe_layer_freq > 1
        modules = ("attn",) + (("mlp",) if dense else ()) + (
            ("moe_router", "moe_preprocess") if is_moe else ())
        flags += [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", *modules)]
        if (c.recompute == "selective" and "core_attn" in constants.recompute_modules
                and m.attention_dropout > 0):
            # transformer_config.py __post_init__: "attention dropout is not supported with
            # graphed attention recomputation"; this 0 replaces the model's own dropout,
            # which goes out with the architecture (megatron_model)
            flags.append(("--attention-dropout", "0"))
            notes.append("graphed attention with its core recomputed needs attention dropout "
                         "0 (Megatron-Core refuses it otherwise): the flags set it; take attn "
                         "out of --cuda-graph-scope to train with attention dropout")
    if constants.tp_comm_overlap and c.tp > 1:
        flags.append(("--tp-comm-overlap",))
    if constants.ep_comm_overlap and is_moe and c.ep > 1:
        flags.append(("--overlap-moe-expert-parallel-comm",))
        # The cost model times the overlap with the experts' weight gradient delayed behind
        # the backward's dispatch (solver.cost.comm.comm_ep; delay_wgrad_compute). Not written:
        # Megatron-LM's validate_args (core_v0.16) asserts TE >= 2.8 for it with
        # --overlap-grad-reduce and TE >= 2.12 with attention in the CUDA graph scope, while
        # core 0.16 pins TE >= 2.9, < 2.12 (pyproject.toml); the note says when to add it.
        notes.append("EP all-to-all overlap is costed with the experts' weight gradient "
                     "delayed (as Megatron-Bridge's recipes run it): add --delay-wgrad-compute "
                     "with Transformer Engine >= 2.8 (>= 2.12 with attn in --cuda-graph-scope)")
    check_training_states_supported("megatron", constants)  # mixed only
    if constants.precision_aware_optimizer:
        flags += [("--use-precision-aware-optimizer",), ("--main-grads-dtype", "bf16"),
                  ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if constants.grad_reduce_in_bf16:
        flags.append(("--grad-reduce-in-bf16",))
    # fp8 parameters: below bf16, with the distributed optimizer (arguments.py asserts it)
    if constants.fp8_param_gather and c.zero >= 1 and target.job.precision != "bf16":
        flags.append(("--fp8-param-gather",))
    if c.recompute == "selective" and constants.recompute_modules != ("core_attn",):
        flags.append(("--recompute-modules", *constants.recompute_modules))
    if constants.loss_implementation == "fused":
        # Transformer Engine's parallel cross-entropy, the gradient written into the logits
        # (language_module.py compute_language_model_loss; model_parallel_config.py
        # cross_entropy_loss_fusion, cross_entropy_fusion_impl, core_v0.16.1)
        flags += [("--cross-entropy-loss-fusion",), ("--cross-entropy-fusion-impl", "te")]
    flags += _offload_flags(target, notes)
    return flags, notes


def _offload_flags(target: LaunchTarget, notes: list[str]) -> list[tuple[str, ...]]:
    """Megatron's flags for the offloads the plan uses (solver.cost.step.offload): the optimizer on
    the CPU with its copies overlapped (arguments.py asserts the precision-aware optimizer's
    code path with it), activations of the modules the cost model moves."""
    constants = target.time_constants
    flags: list[tuple[str, ...]] = []
    if constants is None:
        return flags
    if constants.optimizer_offload:
        flags += [("--optimizer-cpu-offload",), ("--optimizer-offload-fraction", "1.0"),
                  ("--overlap-cpu-optimizer-d2h-h2d",)]
        if not constants.precision_aware_optimizer:
            flags.append(("--use-precision-aware-optimizer",))
    if constants.activation_offload:
        modules = ("core_attn", "attn_proj") + (
            ("expert_fc1", "moe_act") if target.model_spec.is_moe else ())
        flags += [("--fine-grained-activation-offloading",), ("--offload-modules", *modules)]
        notes.append("export NVTE_CPU_OFFLOAD_V1=1 (Megatron asserts it for fine-grained "
                     "activation offloading with Transformer Engine 2.10 or later)")
    if constants.cpu_offloading_num_layers:
        # arguments.py: cpu_offloading_num_layers > 0 turns cpu_offloading on (activations)
        flags.append(("--cpu-offloading-num-layers", str(constants.cpu_offloading_num_layers)))
    return flags



def build_megatron_args(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str],
                                                         list[str]]:
    """Flags (each a tuple: the flag and its value, if any), warnings and notes."""
    c, job, model_spec = target.config, target.job, target.model_spec
    flags: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(c.tp)),
        ("--pipeline-model-parallel-size", str(c.pp)),
        ("--context-parallel-size", str(c.cp)),
    ]
    order_flags, warnings = _order_flags(target)
    if model_spec.is_moe:
        flags += [("--expert-model-parallel-size", str(c.ep)),
                  ("--expert-tensor-parallel-size", str(c.etp))]
    feature_flags, notes = _feature_flags(target)
    flags += feature_flags
    pipeline = target.pipeline_layout()
    if "mamba" in model_spec.layer_mixers:  # MambaModel: the pattern places the layers
        split_flags, hybrid_warnings, split_notes = build_mamba_hybrid_flags(target, pipeline)
        warnings += hybrid_warnings
    else:
        split_flags, split_notes = pipeline_flags(target, pipeline)
    flags += split_flags
    notes += split_notes
    if c.vpp > 1 and target.num_micro_batches % c.pp:
        warnings.append(f"the interleaved schedule wants the {target.num_micro_batches} "
                        f"micro-batches per step to be a multiple of pp ({c.pp})")
    if c.sequence_parallel:
        flags.append(("--sequence-parallel",))
        if target.job.seq_len % (c.tp * c.cp):  # the search's megatron_sequence_parallel_split
            warnings.append(f"sequence parallelism scatters each CP rank's tokens over TP: "
                            f"seq_len ({target.job.seq_len}) must be a multiple of tp x cp "
                            f"({c.tp * c.cp}) or Megatron's reduce-scatter asserts "
                            "[megatron_sequence_parallel_split]")
    if c.zero >= 1:
        flags.append(("--use-distributed-optimizer",))
    if c.dp * c.cp > 1:
        # The step-time model hides DP traffic behind compute; Megatron does so only when
        # asked (_add_distributed_args: --overlap-grad-reduce, and --overlap-param-gather,
        # which needs the distributed optimizer or Megatron-FSDP).
        flags.append(("--overlap-grad-reduce",))
        if c.zero >= 1:
            flags.append(("--overlap-param-gather",))
    if c.zero >= 2:
        flags += [("--use-megatron-fsdp",),
                  ("--data-parallel-sharding-strategy", FSDP_STRATEGIES[c.zero]),
                  ("--no-gradient-accumulation-fusion",), ("--ckpt-format", "fsdp_dtensor")]
        if c.pp > 1:
            warnings.append("Megatron-FSDP (ZeRO 2/3) does not combine with pipeline "
                            "parallelism")
    flags += [("--micro-batch-size", str(c.micro_batch)),
              ("--global-batch-size", str(job.global_batch))]
    architecture, architecture_warnings = architecture_flags(target)
    forced = {flag[0] for flag in feature_flags}  # e.g. graphed attention's dropout 0
    flags += [flag for flag in architecture if flag[0] not in forced]
    warnings += architecture_warnings
    recompute, recompute_warnings, recompute_notes = recompute_flags(target, pipeline)
    flags += recompute
    warnings += recompute_warnings
    notes += recompute_notes
    flags.append(("--bf16",))
    flags += PRECISION_FLAGS[job.precision]
    constants = target.time_constants or framework_time_constants("megatron")
    if job.precision == "fp8" and constants.fp8_current_scaling:
        # TE's Float8CurrentScaling (fp8_utils.py get_fp8_recipe: Fp8Recipe.tensorwise)
        flags.append(("--fp8-recipe", "tensorwise"))
    flags += [(flag,) for flag in order_flags]
    if c.zero >= 2:
        notes.append("leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (Megatron-FSDP "
                     "asserts it)")
    elif c.tp > 1 or c.cp > 1:
        notes.append("export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it with tp or cp "
                     "> 1 on GPUs before Blackwell)")
    return flags, warnings, notes


# The precision recipes (solver.cost.kernels.precision) as _add_transformer_engine_args flags: fp8 is
# TE's default delayed per-tensor scaling with E4M3 forward / E5M2 backward ("hybrid"); the
# block-scaled recipes run E4M3 throughout.
PRECISION_FLAGS: dict[str, list[tuple[str, ...]]] = {
    "bf16": [],
    "fp8": [("--fp8-format", "hybrid")],
    "fp8-blockwise": [("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise")],
    "mxfp8": [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")],
    "nvfp4": [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")],
}


def render_megatron(target: LaunchTarget) -> Emitted:
    """The arguments as a shell continuation, one flag per line, every token shell-quoted,
    under a comment naming the plan and the Megatron-LM version."""
    from solver.emit.torchtitan import render_header

    flags, warnings, notes = build_megatron_args(target)
    text = " \\\n".join(" ".join(shlex.quote(token) for token in flag) for flag in flags)
    header = render_header(target, f"Megatron-LM {VERSION}: arguments of pretrain_gpt.py")
    return Emitted(text=header + text + "\n",
                   settings=[token for flag in flags for token in flag],
                   warnings=tuple(warnings), notes=tuple(notes))
