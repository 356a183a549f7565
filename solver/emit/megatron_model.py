"""The model's shape as Megatron-LM flags (`launch --format megatron`, solver.emit.megatron).

The architecture goes out in full (architecture_flags: layers, widths, heads and query groups,
vocabulary, norm, position embedding, biases, MoE and MLA shapes, MTP layers), as
TransformerConfig fields that ArgumentGroupFactory turns into flags (--num-layers,
--hidden-size, --ffn-hidden-size, --num-attention-heads, --num-query-groups, --kv-channels,
--normalization, --num-moe-experts as --num-experts, --moe-router-topk, --moe-ffn-hidden-size,
--moe-shared-expert-intermediate-size, --moe-layer-freq, --multi-latent-attention,
--q-lora-rank, --kv-lora-rank, --qk-head-dim, --qk-pos-emb-head-dim, --v-head-dim,
--mtp-num-layers, --mtp-use-repeated-layer, --mtp-loss-scaling-factor) and
_add_network_size_args flags.
A block pattern adds its windows and gated DeltaNet layers (solver.emit.megatron_hybrid).
"""

from __future__ import annotations

from solver.emit.megatron_hybrid import build_block_flags, render_layer_pattern
from solver.emit.target import LaunchTarget
from solver.spec import ModelSpec

# Megatron-Core's default MTP loss weight (transformer_config.py mtp_loss_scaling_factor = 0.1,
# core_v0.16.1 through core_v0.20): the flag goes out only when the model's differs.
MEGATRON_MTP_LOSS_SCALE = 0.1


def architecture_flags(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str]]:
    """The model's shape as Megatron flags (module docstring), and warnings for what Megatron
    cannot build as the model has it."""
    m = target.model_spec
    flags: list[tuple[str, ...]] = [
        ("--num-layers", str(m.num_hidden_layers)),
        ("--hidden-size", str(m.hidden_size)),
        ("--ffn-hidden-size", str(m.intermediate_size)),
        ("--num-attention-heads", str(m.num_attention_heads)),
    ]
    warnings: list[str] = []
    if m.is_mla:
        flags.append(("--multi-latent-attention",))
        if m.q_lora_rank is not None:
            flags.append(("--q-lora-rank", str(m.q_lora_rank)))
        flags += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.qk_nope_head_dim)),
                  ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)),
                  ("--v-head-dim", str(m.v_head_dim))]
        if m.is_sparse_attention:
            # DeepSeek Sparse Attention: TransformerConfig experimental_attention_variant "dsa"
            # and dsa_indexer_* (core_v0.16.0 transformer_config.py; flags derived from the
            # config's fields by arguments.py ArgumentGroupFactory).
            flags += [("--experimental-attention-variant", "dsa"),
                      ("--dsa-indexer-n-heads", str(m.index_n_heads)),
                      ("--dsa-indexer-head-dim", str(m.index_head_dim)),
                      ("--dsa-indexer-topk", str(m.index_topk))]
    else:
        if m.kv_heads != m.num_attention_heads:
            flags += [("--group-query-attention",), ("--num-query-groups", str(m.kv_heads))]
        if m.qk_head_dim * m.num_attention_heads != m.hidden_size:
            flags.append(("--kv-channels", str(m.qk_head_dim)))
    flags += [("--seq-length", str(target.job.seq_len)),
              ("--max-position-embeddings", str(max(m.max_position_embeddings,
                                                    target.job.seq_len))),
              ("--vocab-size", str(m.vocab_size)),
              ("--normalization", "RMSNorm" if m.norm_type == "rmsnorm" else "LayerNorm")]
    position = {"rope": "rope", "learned": "learned_absolute"}.get(m.position_embedding_type)
    if m.model_type == "nemotron_h":
        # Nemotron-H's MambaModel: no position embedding and squared-ReLU MLPs (Megatron-Bridge
        # NemotronHModelProvider: activation_func squared_relu; MambaModel's default
        # position_embedding_type "none"; core_v0.16.1 arguments.py --squared-relu).
        position = "none"
        flags.append(("--squared-relu",))
    if position is None:
        warnings.append(f"Megatron has no {m.position_embedding_type} position embedding: the "
                        "flags ask for rope")
        position = "rope"
    flags.append(("--position-embedding-type", position))
    if position == "rope":
        rope_flags, rope_warnings = build_rope_flags(m)
        flags += rope_flags
        warnings += rope_warnings
    # TransformerConfig attention_dropout / hidden_dropout (core_v0.16.1 default 0.1 each):
    # the model's own, 0 for decoder pretraining configs (ModelSpec).
    flags += [("--attention-dropout", f"{m.attention_dropout:g}"),
              ("--hidden-dropout", f"{m.hidden_dropout:g}")]
    if m.mlp_type == "gated":
        flags.append(("--swiglu",))
    if not m.tie_word_embeddings:
        flags.append(("--untie-embeddings-and-output-weights",))
    if not (m.qkv_bias or m.o_bias or m.mlp_bias):
        flags.append(("--disable-bias-linear",))
    elif m.qkv_bias and not (m.o_bias or m.mlp_bias):
        flags += [("--disable-bias-linear",), ("--add-qkv-bias",)]
    if m.qk_norm:
        flags.append(("--qk-layernorm",))
    if m.is_moe:
        flags += [("--num-experts", str(m.num_experts)),
                  ("--moe-router-topk", str(m.num_experts_per_tok)),
                  ("--moe-ffn-hidden-size", str(m.moe_intermediate_size))]
        if m.num_shared_experts:
            width = m.shared_expert_intermediate_size or m.moe_intermediate_size
            flags.append(("--moe-shared-expert-intermediate-size",
                          str(width * m.num_shared_experts)))
        if m.moe_latent_size:  # TransformerConfig.moe_latent_size (core_v0.16.1)
            flags.append(("--moe-latent-size", str(m.moe_latent_size)))
        # moe_freq_type: a Python list expression, 1 for a MoE layer (DeepSeek's rule, or
        # the block pattern's; a Mamba hybrid's pattern places its MoE layers itself)
        pattern = [int(mlp == "moe") for mlp in m.layer_mlps]
        if not all(pattern) and "mamba" not in m.layer_mixers:
            flags.append(("--moe-layer-freq", render_layer_pattern(pattern)))
        if m.router_bias:  # aux-loss-free balancing: expert bias needs the sigmoid score
            flags += [("--moe-router-score-function", "sigmoid"),
                      ("--moe-router-enable-expert-bias",)]
        elif m.num_experts_per_tok == 1:  # top-1: a softmax over one score has no gradient
            # (core_v0.16.1 transformer_config.py: "Please use --moe-router-pre-softmax when
            # topk is 1"); Llama 4 scores its expert with a sigmoid and scales the expert's
            # input by it (HF Llama4TextMoe), Megatron's sigmoid score applied on input.
            flags += ([("--moe-router-score-function", "sigmoid"),
                       ("--moe-apply-probs-on-input",)]
                      if m.model_type in ("llama4", "llama4_text")
                      else [("--moe-router-pre-softmax",)])
    mtp_flags, mtp_warnings = build_mtp_flags(m)
    flags += mtp_flags
    warnings += mtp_warnings
    if m.is_hybrid:  # windows, gated DeltaNet
        block_flags, block_warnings = build_block_flags(m, target.config.cp)
        flags += block_flags
        warnings += block_warnings
    return flags, warnings


# Megatron-Core's Llama 3 RoPE scaling (rotary_pos_embedding.py RotaryEmbedding._apply_scaling,
# core_v0.16.1): only the factor comes from the flags (--rope-scaling-factor); the bands and the
# original context are these defaults, Llama 3.1's and 3.2's (config.json rope_scaling).
MEGATRON_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                        "original_max_position_embeddings": 8192}


def build_rope_flags(m: ModelSpec) -> tuple[list[tuple[str, ...]], list[str]]:
    """The rotary base (--rotary-base, an int in Megatron's parser; default 10000) and Llama 3's
    RoPE scaling (--use-rope-scaling --rope-scaling-factor F). Worked numbers: Llama 3.1 8B,
    rope_theta 500000 and factor 8 -> --rotary-base 500000 --use-rope-scaling
    --rope-scaling-factor 8. What Megatron cannot express as the model has it is a warning."""
    flags: list[tuple[str, ...]] = []
    warnings: list[str] = []
    if m.rope_theta is None:
        warnings.append("the model states no rope_theta: Megatron's --rotary-base default "
                        "10000 applies")
    elif m.rope_theta != int(m.rope_theta):
        warnings.append(f"rope_theta {m.rope_theta:g} is not an integer and Megatron's "
                        "--rotary-base takes one: the flags leave it out")
    else:
        flags.append(("--rotary-base", str(int(m.rope_theta))))
    scaling = m.rope_scaling
    if scaling is None:
        return flags, warnings
    if scaling.rope_type == "llama3":
        flags += [("--use-rope-scaling",), ("--rope-scaling-factor", f"{scaling.factor:g}")]
        for key, fixed in MEGATRON_LLAMA3_ROPE.items():
            value = getattr(scaling, key)
            if value is not None and value != fixed:
                warnings.append(f"rope_scaling {key} is {value:g} but Megatron's Llama 3 "
                                f"scaling fixes it at {fixed:g}: the model trains with {fixed:g}")
    elif not m.is_mla:  # MLA models: MLATransformerConfig's own YaRN (rope_type "yarn")
        warnings.append(f"rope_scaling {scaling.rope_type} (factor {scaling.factor:g}) is not "
                        "in the flags: Megatron-LM core_v0.16 has no flag for a non-MLA "
                        "model's YaRN; set it in the model provider")
    return flags, warnings


def build_mtp_flags(m: ModelSpec) -> tuple[list[tuple[str, ...]], list[str]]:
    """The MTP depths (--mtp-num-layers: the depths a step runs, which Megatron places on the
    last pipeline stage without a layout), one module repeated over them
    (--mtp-use-repeated-layer, Megatron-Core 0.17 or later) and the loss weight when it is
    not Megatron's 0.1 (Megatron-Bridge's Nemotron 3 recipes: 2 depths of one repeated "*E"
    module, 0.3)."""
    if not m.mtp_depths:
        return [], []
    flags: list[tuple[str, ...]] = [("--mtp-num-layers", str(m.mtp_depths))]
    warnings: list[str] = []
    if m.mtp_use_repeated_layer and m.mtp_depths > 1:
        flags.append(("--mtp-use-repeated-layer",))
    if m.mtp_use_repeated_layer and m.mtp_depths > 1 and "mamba" not in m.layer_mixers:
        # (a Mamba hybrid's MTP pattern already goes out in the 0.17 form: megatron_hybrid)
        warnings.append("--mtp-use-repeated-layer needs Megatron-Core 0.17 or later "
                        "(core_v0.16 builds one MTP module per depth)")
    if m.mtp_loss_scaling_factor != MEGATRON_MTP_LOSS_SCALE:
        flags.append(("--mtp-loss-scaling-factor", f"{m.mtp_loss_scaling_factor:g}"))
    return flags, warnings
