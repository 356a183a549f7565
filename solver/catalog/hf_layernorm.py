"""Hugging Face `config.json` -> ModelSpec fields for the LayerNorm-era families (GPT-2,
GPT-NeoX / Pythia, Falcon): plain GELU MLPs, LayerNorms, learned or ALiBi positions, fused
projections. Registered in solver.catalog.hf, following the rules stated there."""

from __future__ import annotations

from solver.catalog.hf_fields import (MAX_LAYERS, Config, Fields, field_error, read_attention,
    read_body, read_bool, read_int)


def map_gpt2(cfg: Config, source: str) -> Fields:
    """GPT2Model: wte + learned wpe (n_positions rows), fused c_attn and c_proj with biases,
    c_fc (n_inner, null: 4 * n_embd) and c_proj with biases, ln_1/ln_2/ln_f LayerNorms; the LM
    head is tied by default."""
    if read_bool(cfg, source, "add_cross_attention", False):
        raise field_error(source, "add_cross_attention", "true adds encoder-decoder cross-attention "
                                                    "blocks, which parplan does not model")
    hidden = read_int(cfg, source, "n_embd")
    heads = read_int(cfg, source, "n_head")
    if hidden % heads:
        raise field_error(source, "n_head", f"{heads} does not divide n_embd ({hidden})")
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_hidden_layers": read_int(cfg, source, "n_layer", maximum=MAX_LAYERS),
        "vocab_size": read_int(cfg, source, "vocab_size"),
        "intermediate_size": read_int(cfg, source, "n_inner", None, nullable=True) or 4 * hidden,
        "max_position_embeddings": read_int(cfg, source, "n_positions", 1024),
        "tie_word_embeddings": read_bool(cfg, source, "tie_word_embeddings", True),
        "position_embedding_type": "learned",
        "mlp_type": "plain",
        "norm_type": "layernorm",
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
    }


def map_gpt_neox(cfg: Config, source: str) -> Fields:
    """GPTNeoXLayer: input and post-attention LayerNorms (both exist whether or not
    `use_parallel_residual` runs them in parallel), fused query_key_value and dense with
    `attention_bias` (default true), MLP with biases always; untied embed_out by default. Rotary
    covers part of each head (rotary_pct) and has no parameters."""
    read_bool(cfg, source, "use_parallel_residual", True)
    attention_bias = read_bool(cfg, source, "attention_bias", True)
    fields = {
        **read_body(cfg, source, max_positions=2048, tied=False),
        **read_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "mlp_type": "plain",
        "norm_type": "layernorm",
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": True,
    }
    if fields["hidden_size"] % fields["num_attention_heads"]:
        raise field_error(source, "num_attention_heads", "must divide hidden_size (GPTNeoXConfig "
                                                    "refuses otherwise)")
    return fields


def map_falcon(cfg: Config, source: str) -> Fields:
    """FalconAttention: query_key_value holds heads + 2 * kv heads, where kv heads are
    `num_kv_heads` with new_decoder_architecture, 1 with multi_query, else all heads; `bias`
    covers every linear layer. FalconDecoderLayer: 2 LayerNorms unless attention and MLP run in
    parallel from one norm (parallel_attn and num_ln_in_parallel_attn != 2; the new
    architecture defaults to 2). Plain GELU MLP of ffn_hidden_size (null: 4 * hidden); `alibi`
    replaces rotary with per-head slopes (no parameters); the LM head is tied by default."""
    hidden = read_int(cfg, source, "hidden_size")
    heads = read_int(cfg, source, "num_attention_heads")
    if hidden % heads:
        raise field_error(source, "num_attention_heads", f"{heads} does not divide hidden_size "
                                                    f"({hidden}); FalconAttention refuses that")
    new_arch = read_bool(cfg, source, "new_decoder_architecture", False)
    multi_query = read_bool(cfg, source, "multi_query", True)
    parallel = read_bool(cfg, source, "parallel_attn", True)
    num_kv = read_int(cfg, source, "num_kv_heads", None, nullable=True) or heads
    if new_arch:
        kv_heads = num_kv
        if heads % kv_heads:
            raise field_error(source, "num_kv_heads", f"{kv_heads} must divide num_attention_heads "
                                                 f"({heads})")
    else:
        kv_heads = 1 if multi_query else heads
    norms_key = "num_ln_in_parallel_attn"
    num_ln = read_int(cfg, source, norms_key, 2 if new_arch else None, maximum=2, nullable=True)
    if num_ln is None and new_arch:
        num_ln = 2
    bias = read_bool(cfg, source, "bias", False)
    return {
        **read_body(cfg, source, max_positions=2048, tied=True),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": read_int(cfg, source, "ffn_hidden_size", None, nullable=True)
        or 4 * hidden,
        "mlp_type": "plain",
        "norm_type": "layernorm",
        "norms_per_layer": 2 if (not parallel or num_ln == 2) else 1,
        "position_embedding_type": "alibi" if read_bool(cfg, source, "alibi", False) else "rope",
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bias,
    }
