"""FrameworkFeatures: the single features of a framework profile a user may override
(`--attention-kernel`, `--moe-dispatcher`, `--cuda-graphs`, ...), and the vocabulary of their
values, written once for the CLI's choices, the step-time model's switches
(solver.cost.time_constants) and the profiles (solver.cost.frameworks, which says what each
framework does and where that is written).
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

# native: FlashAttention-3 / cuDNN fused attention, written for the GPU's own tensor-core
# instructions; flash2: FlashAttention-2 (Ampere's mma.sync); triton: FlashAttention in Triton
# (2022, LLM Foundry's attn_impl triton); unfused: GEMMs around a softmax.
AttentionKernel = Literal["native", "flash2", "triton", "unfused"]
MoeDispatcher = Literal["alltoall", "allgather", "deepep", "hybridep"]
DpOverlap = Literal["always", "never", "without_pipeline"]
# What `--recompute selective` recomputes: Megatron's attention core, torchtitan's op level.
SelectiveRecompute = Literal["attention_core", "op_level"]
# Low-precision copies of the weights kept across micro-batches: Transformer Engine caches
# them (transformer_engine), torchao float8 casts on the fly and keeps none (none).
Fp8WeightCopies = Literal["transformer_engine", "none"]
# Megatron --recompute-modules: the modules `selective` recomputes under attention_core
# (solver.cost.memory.activations.estimate_module_recompute_bytes says what each drops).
RecomputeModule = Literal["core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts",
                          "mla_up_proj"]
# How the loss turns the LM head's output into the cross-entropy (what the logits term holds:
# solver.cost.memory.loss.estimate_logits_bytes): eager ops on upcast logits, the loss
# compiled (torch.compile), upcast and computed chunk by chunk, a fused kernel that writes the
# gradient into the logits, or fused with the LM head so the full logits never exist.
LossImplementation = Literal["eager", "compiled", "chunked", "fused", "fused_linear"]
# Model states below the framework's mixed precision (issue 43; solver.cost.training_states
# says what each keeps and streams): mixed (the framework's own), pure_bf16 (bf16 weights,
# gradients and Adam moments, no fp32 master), adam8bit (Adam's moments in 8 bits, block-wise,
# beside the framework's master), pure_bf16_adam8bit (both).
TrainingStates = Literal["mixed", "pure_bf16", "adam8bit", "pure_bf16_adam8bit"]
ATTENTION_KERNELS: tuple[AttentionKernel, ...] = get_args(AttentionKernel)
MOE_DISPATCHERS: tuple[MoeDispatcher, ...] = get_args(MoeDispatcher)
DP_OVERLAPS: tuple[DpOverlap, ...] = get_args(DpOverlap)
SELECTIVE_RECOMPUTES: tuple[SelectiveRecompute, ...] = get_args(SelectiveRecompute)
FP8_WEIGHT_COPIES: tuple[Fp8WeightCopies, ...] = get_args(Fp8WeightCopies)
RECOMPUTE_MODULES: tuple[RecomputeModule, ...] = get_args(RecomputeModule)
LOSS_IMPLEMENTATIONS: tuple[LossImplementation, ...] = get_args(LossImplementation)
TRAINING_STATES: tuple[TrainingStates, ...] = get_args(TrainingStates)


class FrameworkFeatures(BaseModel):
    """Overrides of a framework profile's features; None keeps the profile's value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention_kernel: AttentionKernel | None = None
    fused_elementwise: bool | None = None
    cuda_graphs: bool | None = None
    moe_dispatcher: MoeDispatcher | None = None
    tp_comm_overlap: bool | None = None
    ep_comm_overlap: bool | None = None
    dp_overlap: DpOverlap | None = None
    selective_recompute: SelectiveRecompute | None = None
    fp8_weight_copies: Fp8WeightCopies | None = None
    precision_aware_optimizer: bool | None = None
    grad_reduce_in_bf16: bool | None = None
    fp8_param_gather: bool | None = None
    recompute_modules: tuple[RecomputeModule, ...] | None = None
    optimizer_offload: bool | None = None
    activation_offload: bool | None = None
    fp8_all_gather: bool | None = None
    # Megatron's layer-level CPU offloading: the first N decoder layers' activations go to
    # the host (--cpu-offloading-num-layers; 0 is off).
    cpu_offloading_num_layers: int | None = Field(default=None, ge=0)
    loss_implementation: LossImplementation | None = None
    training_states: TrainingStates | None = None

    def given(self) -> dict[str, object]:
        """The features that are set."""
        return {name: value for name, value in self if value is not None}


# Features that only lower memory and never add step time, in the order the search turns them
# on where a plan needs them (solver.cost.frameworks.memory_saver_ladder); a plan names the
# ones it uses (Plan.memory_savers) and `launch --plan` emits them.
MEMORY_SAVERS: tuple[str, ...] = ("grad_reduce_in_bf16", "precision_aware_optimizer",
                                  "fp8_param_gather")

# Features that lower memory at a cost in step time (host transfers, a CPU optimizer step): the
# search tries them where it can (solver.cost.offload, solver.search.module_variants); a plan
# names the ones it uses (Plan.offloads) and `launch --plan` emits them.
OFFLOADS: tuple[str, ...] = ("optimizer_offload", "activation_offload")

# The features a flag may override, in FrameworkFeatures' order.
FEATURES: tuple[str, ...] = tuple(FrameworkFeatures.model_fields)
