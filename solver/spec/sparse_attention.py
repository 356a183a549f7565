"""DeepSeek Sparse Attention (DSA): the fields of ModelSpec that describe it and the shapes
they give (parameters, keys a query attends to); its costs are solver.cost.layers.sparse_attention.

DSA (DeepSeek-V3.2, arXiv:2512.02556 §2.1; GLM-5) keeps MLA and adds a **lightning indexer**
per layer: `index_n_heads` small heads of `index_head_dim` score every earlier token,
I(t, s) = sum_j w(t, j) ReLU(q(t, j) . k(s)), and each query attends (MLA, as before) to its
`index_topk` best-scored tokens only. The indexer's modules (Megatron-Core
megatron/core/transformer/experimental_attention_variant/dsa.py DSAIndexer @d98e8a6; HF
config names as in deepseek_v32 and glm_moe_dsa config.json):
  linear_wq_b          q_lora_rank -> index_n_heads x index_head_dim, bias-free
  linear_wk            hidden -> index_head_dim, bias-free (one key head shared by all heads)
  k_norm               LayerNorm(index_head_dim), weight and bias
  linear_weights_proj  hidden -> index_n_heads, bias-free
all `parallel_mode="duplicated"`: every tensor-parallel rank holds the whole indexer and
computes it on the whole sequence ("Indexer projections are duplicated across tensor-parallel
ranks, so their gradients should be averaged").
"""

from __future__ import annotations

from pydantic import Field

from solver.spec.strict import InputSpec, Width


class SparseAttentionFields(InputSpec):
    """The DSA fields (HF names); all None: dense attention."""

    index_n_heads: Width | None = Field(default=None, gt=0)
    index_head_dim: Width | None = Field(default=None, gt=0)
    index_topk: Width | None = Field(default=None, gt=0)

    @property
    def is_sparse_attention(self) -> bool:
        """Whether every attention layer runs DSA (a lightning indexer and top-k MLA)."""
        return self.index_topk is not None

    def _check_sparse_attention(self, is_mla: bool) -> None:
        """All three DSA sizes or none, and MLA under them (the indexer's queries come from
        MLA's q_a compression, dsa.py linear_wq_b)."""
        sizes = (self.index_n_heads, self.index_head_dim, self.index_topk)
        if any(v is not None for v in sizes) and any(v is None for v in sizes):
            raise ValueError("sparse attention (DSA) needs all of index_n_heads, "
                             "index_head_dim and index_topk")
        if self.is_sparse_attention and not is_mla:
            raise ValueError("index_topk (DSA sparse attention) needs multi-head latent "
                             "attention (kv_lora_rank)")

    def indexer_params(self, hidden_size: int, q_lora_rank: int | None) -> int:
        """One layer's lightning indexer (module docstring): q_lora_rank H_I d_I + h d_I
        + 2 d_I + h H_I; q_lora_rank is hidden_size where q is not compressed (dsa.py).
        DeepSeek-V3.2 (h 7168, q_lora_rank 1536, 64 heads of 128): 12,582,912 + 917,504
        + 256 + 458,752 = 13,959,424."""
        if not self.is_sparse_attention:
            return 0
        heads, dim = self.index_n_heads or 0, self.index_head_dim or 0
        rank = q_lora_rank or hidden_size
        return rank * heads * dim + hidden_size * dim + 2 * dim + hidden_size * heads

    def sparse_context_tokens(self, seq_len: int, causal: bool = True) -> float:
        """Keys a query attends to on average under DSA: query i (1-based) sees min(i, k) of
        its i causal keys, k = index_topk, so the mean over s queries is k - k(k-1)/(2s)
        for k < s, else (s+1)/2 ~ s/2 as full causal attention counts it; non-causal:
        min(k, s). DeepSeek-V3.2 at s = 8192: 2048 - 2048 x 2047 / 16384 = 1792.1."""
        full = seq_len / 2 if causal else float(seq_len)
        k = self.index_topk or seq_len
        if k >= seq_len:
            return full
        return min(full, k - k * (k - 1) / (2.0 * seq_len)) if causal else float(k)

    def indexer_core_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs per token of one layer's indexer scores (not its GEMMs): every head's
        q . k over every earlier key, 2 H_I d_I per key, s/2 keys causal (s otherwise); the
        ReLU and the head-weighted sum (2 H_I per key) are element-wise and not counted.
        DeepSeek-V3.2 at s = 8192: 2 x 64 x 128 x 4096 = 67,108,864."""
        if not self.is_sparse_attention:
            return 0.0
        keys = seq_len / 2 if causal else float(seq_len)
        return 2.0 * (self.index_n_heads or 0) * (self.index_head_dim or 0) * keys
