"""FLOPs per token, per layer kind, forward pass (the backward pass costs twice the forward).

Convention (used for MFU everywhere in parplan): model FLOPs = forward + backward of every GEMM a
token visits (its top-k routed experts, the shared experts, the router, the LM head) plus the
causal attention core (QK^T and AV over seq_len/2 keys on average), no recompute. Embedding
lookups, norms and element-wise ops count zero. `convert_mfu` translates to the other common
conventions (non-causal attention as Megatron/NeMo/PaLM/Mosaic count it; 6N only).
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost.layers.blocks import estimate_pattern_forward_flops
from solver.cost.layers.finetune import (
    ADAPTER_FLOPS_PER_PARAM,
    FROZEN_FLOPS_PER_PARAM,
    TRAINED_FLOPS_PER_PARAM,
    estimate_adapter_params,
)
from solver.cost.layers.sparse_attention import estimate_sparse_core_flops
from solver.spec import ModelSpec
from solver.spec.finetune import FinetuneSpec


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs per token of one layer, split by where they run."""

    attention_gemm: float
    attention_core: float
    mlp_gemm: float

    @property
    def total(self) -> float:
        return self.attention_gemm + self.attention_core + self.mlp_gemm


def _attention_gemm_flops(model_spec: ModelSpec) -> float:
    """2 FLOPs per weight of the attention projections (biases and q/k norms are tiny)."""
    return 2.0 * model_spec.attention_params_per_layer


def estimate_attention_core_flops(model_spec: ModelSpec, seq_len: int, causal: bool = True
                                  ) -> float:
    """QK^T and AV per token per layer: 2 * ctx * heads * (d_qk + d_v), ctx = s/2 if causal.
    Llama-3.1-8B at s = 8192, causal: 2 * 4096 * 32 * 256 = 6.7e7. DSA: its top-k keys plus
    the indexer's scores (solver.cost.layers.sparse_attention)."""
    if model_spec.is_sparse_attention:
        return estimate_sparse_core_flops(model_spec, seq_len, causal)
    ctx = seq_len / 2 if causal else seq_len
    heads = model_spec.num_attention_heads
    return 2.0 * ctx * heads * (model_spec.qk_head_dim + model_spec.value_head_dim)


def estimate_dense_layer_flops(model_spec: ModelSpec, seq_len: int) -> LayerFlops:
    """One dense layer: attention + a feed-forward block of width intermediate_size."""
    return LayerFlops(
        attention_gemm=_attention_gemm_flops(model_spec),
        attention_core=estimate_attention_core_flops(model_spec, seq_len),
        mlp_gemm=2.0 * model_spec.dense_mlp_params_per_layer,
    )


def estimate_moe_layer_flops(model_spec: ModelSpec, seq_len: int) -> LayerFlops:
    """One MoE layer: router + top-k routed experts + shared experts (balanced routing), and
    LatentMoE's two projections (Megatron core_v0.16.1 training.py moe_layer_flops: the
    routed experts at moe_latent_size plus 4 b s h latent for up and down projection)."""
    routed = model_spec.experts_per_token * model_spec.expert_params
    mlp = (model_spec.router_params_per_layer + routed + model_spec.shared_expert_params_per_layer
           + model_spec.latent_projection_params_per_layer)
    return LayerFlops(
        attention_gemm=_attention_gemm_flops(model_spec),
        attention_core=estimate_attention_core_flops(model_spec, seq_len),
        mlp_gemm=2.0 * mlp,
    )


def estimate_lm_head_flops(model_spec: ModelSpec) -> float:
    """Forward FLOPs per token of the output projection: 2 * V * h."""
    return 2.0 * model_spec.vocab_size * model_spec.hidden_size


def estimate_model_flops_per_token(model_spec: ModelSpec, seq_len: int) -> float:
    """Training (forward + backward) model FLOPs per token under parplan's convention; equals
    ModelSpec.flops_per_token(seq_len, causal=True) up to norm parameters inside attention.
    With a block pattern each layer counts its own mixer (windowed attention over its window,
    Mamba-2 and DeltaNet scans: solver.cost.layers.blocks) and MLP."""
    if model_spec.has_block_kinds:
        return 3.0 * (estimate_pattern_forward_flops(model_spec, seq_len)
                      + estimate_lm_head_flops(model_spec))
    dense = estimate_dense_layer_flops(model_spec, seq_len).total
    moe = estimate_moe_layer_flops(model_spec, seq_len).total if model_spec.is_moe else 0.0
    forward = (
        model_spec.num_dense_layers * dense
        + model_spec.num_moe_layers * moe
        + estimate_lm_head_flops(model_spec)
    )
    return 3.0 * forward


def estimate_step_flops_per_token(model_spec: ModelSpec, seq_len: int, finetune: FinetuneSpec
                                  ) -> float:
    """FLOPs per token a training step runs under `finetune` (the FLOPs behind TFLOP/s and MFU):
    estimate_model_flops_per_token, except that with adapters (LoRA, QLoRA) the frozen layer
    GEMMs run forward and input gradient only (4 FLOPs a weight, not 6) and the adapters train
    (6 a weight; solver.cost.layers.finetune):
        full - (6 - 4) x forward layer GEMMs / 2 + 6 x adapters
    The LM head keeps its 6: its input gradient and the loss run as in full training, and
    its weight is counted as trained as Megatron-Bridge counts it (flop_utils.py: the frozen
    part, "6 * vocab_size" included, x 2/3).
    Worked number: Llama-3.1-70B at 4096: 4.331e11 trained (Megatron-Bridge's SFT row:
    710e12 / 1,638 tokens/s = 4.335e11); LoRA r 32 on linear_qkv: 4.331e11 - 80 x 1.712e9
    + 6 x 4.72e7 = 2.965e11.
    """
    trained = estimate_model_flops_per_token(model_spec, seq_len)
    if not finetune.has_adapters:
        return trained
    layer = estimate_dense_layer_flops(model_spec, seq_len)
    gemm_forward = model_spec.num_hidden_layers * (layer.attention_gemm + layer.mlp_gemm)
    saved = (TRAINED_FLOPS_PER_PARAM - FROZEN_FLOPS_PER_PARAM) * gemm_forward / 2.0
    return trained - saved + ADAPTER_FLOPS_PER_PARAM * estimate_adapter_params(model_spec,
                                                                                finetune)


def convert_mfu(model_spec: ModelSpec, seq_len: int, mfu: float, to: str) -> float:
    """MFU under another convention, from parplan's (causal attention, top-k experts):
    `noncausal` counts the full s^2 attention (Megatron, NeMo, PaLM, Mosaic); `6n` counts
    6 x active parameters (embeddings included) and no attention."""
    ours = estimate_model_flops_per_token(model_spec, seq_len)
    if to == "noncausal":
        core = estimate_attention_core_flops(model_spec, seq_len, causal=True)
        other = ours + 3.0 * model_spec.num_hidden_layers * core
        if model_spec.has_block_kinds:  # every attention layer's causal core counted twice
            other = ours + 3.0 * model_spec.attention_flops_per_token(seq_len, causal=True)
    elif to == "6n":
        other = 6.0 * model_spec.active_params
    else:
        raise AssertionError(f"unknown MFU convention {to}")
    return mfu * other / ours
