"""Costs of DeepSeek Sparse Attention (DSA; the shapes: solver.spec.sparse_attention).

A DSA layer is an MLA layer whose core attends to `index_topk` keys per query, plus a
lightning indexer that scores every earlier key:

  FLOPs   core: 2 ctx a (d_qk + d_v) with ctx = ModelSpec.sparse_context_tokens (min(i, k)
          keys for query i); indexer scores: 2 H_I d_I per earlier key
          (SparseAttentionFields.indexer_core_flops_per_token); indexer GEMMs: 2 per weight.
          The indexer's score kernel (DeepGEMM fp8_mqa_logits in vLLM, Megatron-Core's
          tilelang indexer in training) has no measured rate here: its FLOPs run at the
          attention core's rate, the kernel it shares tiles and layout with [B].
  weights the indexer is duplicated on every tensor-parallel rank (Megatron-Core dsa.py
          DSAIndexer, parallel_mode="duplicated"; vLLM deepseek_v2.py Indexer builds wq_b, wk
          and weights_proj as ReplicatedLinear), so a rank holds (attention - indexer) / tp
          + indexer and runs the indexer's GEMMs on all its tokens.
  cache   vLLM keeps, next to MLA's latent and rope key, an indexer key cache per layer:
          index_head_dim fp8 values and one fp32 scale per 128 (vllm/model_executor/models/
          deepseek_v2.py DeepseekV32IndexerCache: head_dim + head_dim // 128 * 4 bytes,
          132 B for DeepSeek-V3.2). A decode step reads the indexer keys of the whole context
          and MLA's cache of the top-k tokens only (FlashMLA sparse decoding).
Training is costed as fused sparse kernels run it (Megatron-Core core_v0.19.0
dsa_tilelang_kernels.py, ops/sparse_mla.py): the top-k keys only. Megatron-Core 0.16 to 0.18
train DSA through an unfused fp32 reference over every key, which this does not describe
(solver.search.constraints refuses it: megatron_sparse_attention_is_unfused).
"""

from __future__ import annotations

import numpy as np

from solver.spec import ModelSpec

# vLLM DeepseekV32IndexerCache: fp8 keys with one fp32 scale per 128 values.
INDEXER_QUANT_BLOCK = 128
INDEXER_KEY_BYTES = 1.0
INDEXER_SCALE_BYTES = 4.0
# The top-k indices Megatron-Core's fused indexer keeps (ops/indexer.py: torch.int32).
TOPK_INDEX_BYTES = 4.0
BF16_BYTES = 2.0


def indexer_params_per_layer(model_spec: ModelSpec) -> int:
    """One layer's lightning indexer, 0 without DSA (SparseAttentionFields.indexer_params)."""
    return model_spec.indexer_params(model_spec.hidden_size, model_spec.q_lora_rank)


def estimate_indexer_replica_params(model_spec: ModelSpec, tp) -> np.ndarray:
    """Parameters a TP rank holds of one layer's indexer beyond an even 1/tp split of the
    layer's attention: indexer x (1 - 1/tp), the copy duplication adds. DeepSeek-V3.2 at
    tp 8: 13,959,424 x 7/8 = 12,214,496."""
    return indexer_params_per_layer(model_spec) * (1.0 - 1.0 / np.asarray(tp, dtype=float))


def estimate_sparse_core_flops(model_spec: ModelSpec, seq_len: int, causal: bool = True
                               ) -> float:
    """Forward FLOPs per token of one DSA layer's core: top-k attention plus indexer scores.
    DeepSeek-V3.2 at s = 8192 (128 heads, d_qk 192, d_v 128): 2 x 1792.1 x 128 x 320
    = 146,810,880 + 67,108,864 = 213,919,744 (dense MLA: 335,544,320)."""
    m = model_spec
    ctx = m.sparse_context_tokens(seq_len, causal)
    core = 2.0 * ctx * m.num_attention_heads * (m.qk_head_dim + m.value_head_dim)
    return core + m.indexer_core_flops_per_token(seq_len, causal)


def estimate_indexer_cache_bytes_per_token(model_spec: ModelSpec) -> float:
    """vLLM's indexer key cache per token per layer (module docstring), 0 without DSA.
    DeepSeek-V3.2: 128 x 1 + 128 / 128 x 4 = 132 B."""
    if not model_spec.is_sparse_attention:
        return 0.0
    dim = model_spec.index_head_dim or 0
    return dim * INDEXER_KEY_BYTES + -(-dim // INDEXER_QUANT_BLOCK) * INDEXER_SCALE_BYTES


def estimate_decode_read_tokens(model_spec: ModelSpec, context) -> np.ndarray:
    """Tokens of MLA's cache a decode step reads per sequence: the context, or under DSA at
    most index_topk of it (the indexer cache is read over the whole context apart)."""
    context = np.asarray(context, dtype=float)
    if not model_spec.is_sparse_attention:
        return context
    return np.minimum(context, float(model_spec.index_topk or 0))


def estimate_prefill_sparse_flops_per_token(model_spec: ModelSpec, context, tp) -> np.ndarray:
    """Forward core FLOPs per prefill token on one TP rank of one DSA layer, prompts of
    `context` tokens (an array): top-k attention over the rank's heads,
    2 ctx (a / tp)(d_qk + d_v) with ctx = min(c/2, k - k(k-1)/(2c)) for k < c else c/2
    (SparseAttentionFields.sparse_context_tokens, vectorised), plus the indexer's scores on
    the whole sequence, duplicated on every rank, 2 H_I d_I c/2. DeepSeek-V3.2, c = 8192,
    tp 8: 2 x 1792.1 x 16 x 320 + 67,108,864 = 85,460,224."""
    m = model_spec
    c = np.maximum(np.asarray(context, dtype=float), 1.0)
    k = float(m.index_topk or 0)
    # never more than causal attention's c/2 (at c 3, k 2 the sum's 1.67 would pass 1.5)
    ctx = np.where(k < c, np.minimum(c / 2.0, k - k * (k - 1.0) / (2.0 * c)), c / 2.0)
    heads = m.num_attention_heads / np.asarray(tp, dtype=float)
    core = 2.0 * ctx * heads * (m.qk_head_dim + m.value_head_dim)
    return core + 2.0 * (m.index_n_heads or 0) * (m.index_head_dim or 0) * c / 2.0


def estimate_indexer_saved_bytes_per_token(model_spec: ModelSpec) -> float:
    """Bytes per token one DSA layer's indexer keeps for its backward on every TP rank (it
    is duplicated and gathers the sequence-parallel shards): Megatron-Core core_v0.19.0
    ops/indexer.py IndexerFunction.save_for_backward(index_q, index_k, weights, ...,
    topk_indices), bf16 q (H_I d_I), k (d_I) and weights (H_I), int32 top-k indices (k; the
    sparse MLA kernel reads the same tensor). DeepSeek-V3.2: 2 (8192 + 128 + 64) + 4 x 2048
    = 24,960 B. 0 without DSA."""
    m = model_spec
    if not m.is_sparse_attention:
        return 0.0
    heads, dim = m.index_n_heads or 0, m.index_head_dim or 0
    return (BF16_BYTES * (heads * dim + dim + heads)
            + TOPK_INDEX_BYTES * (m.index_topk or 0))
