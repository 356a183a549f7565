"""The vocabulary of the framework features' values (`--attention-kernel`, `--moe-dispatcher`,
...), written once for the feature declarations (solver.spec.features), the step-time model's
switches (solver.cost.layers.time_constants) and the profiles (solver.cost.step.frameworks, which says what
each framework does and where that is written).
"""

from __future__ import annotations

from typing import Literal, get_args


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
# Model states below the framework's mixed precision (issue 43; solver.cost.step.training_states
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
