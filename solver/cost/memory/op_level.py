"""What a decoder layer keeps under torchtitan's per-op selective activation checkpointing
(MemoryOptions.selective_recompute "op_level", set by solver.cost.step.frameworks), per token:
the memory model's other selective recompute, beside Megatron's module list
(solver.cost.memory.activations)."""

from __future__ import annotations

from solver.spec import ModelSpec

BF16_BYTES = 2.0
FP32_BYTES = 4.0


def estimate_op_level_bytes(model_spec: ModelSpec, moe: bool) -> tuple[float, float]:
    """(divided by tp, replicated without SP) bytes per token one layer keeps under
    torchtitan's per-op selective checkpointing (solver.cost.step.frameworks): the layer input, the
    attention output and its log-sum-exp, the all-to-all outputs, and every second GEMM's
    output, taken as half of the layer's GEMM output bytes; the grouped expert GEMMs are
    recomputed. Llama-3-8B: 2h + half of (q, k, v, wo, w1, w3, w2 = 43,008 outputs) + the
    attention output 2h + 4a = 59,520 B per token against 110,720 without recompute."""
    m, h = model_spec, model_spec.hidden_size
    heads = m.num_attention_heads
    k_heads = heads if m.is_mla else m.kv_heads
    columns = heads * m.qk_head_dim + k_heads * (m.qk_head_dim + m.value_head_dim)
    if m.is_mla:
        columns += (m.q_lora_rank or 0) + (m.kv_lora_rank or 0)
    rows = float(h)  # the output projection's
    all_to_all = 0.0
    if not moe:
        columns += (2 if m.mlp_type == "gated" else 1) * m.intermediate_size
        rows += h
    elif m.num_shared_experts:
        width = m.num_shared_experts * (m.shared_expert_intermediate_size
                                        or m.moe_intermediate_size or 0)
        columns += (2 if m.mlp_type == "gated" else 1) * width
        rows += h
    if moe:
        # dispatched and combined, at the experts' token width
        all_to_all = 2 * BF16_BYTES * m.moe_token_width * m.experts_per_token
    split = (BF16_BYTES * (0.5 * columns + heads * m.value_head_dim) + FP32_BYTES * heads
             + all_to_all)
    return split, BF16_BYTES * (h + 0.5 * rows)
