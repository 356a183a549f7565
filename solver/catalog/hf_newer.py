"""Hugging Face `config.json` mappings of the 2025-26 families (solver.catalog.hf's rules):
MiniMax-M2, Qwen3.5's language models, LongCat-Flash and ERNIE 4.5 MoE.
"""

from __future__ import annotations

from solver.catalog.hf_fields import (
    MAX_LAYERS,
    Config,
    Fields,
    field_error,
    moe_layout,
    read_attention,
    read_body,
    read_bool,
    read_int,
    read_routed_experts,
    with_moe,
)
from solver.catalog.hf_hybrid import map_qwen3_next, map_text_config


def map_minimax_m2(cfg: Config, source: str) -> Fields:
    """MiniMaxM2 (MiniMaxAI/MiniMax-M2 modeling_minimax_m2.py, as vLLM minimax_m2.py builds
    it): bias-free q/k/v/o; with `use_qk_norm` (default true) RMSNorms over the whole q and k
    projections (q_norm of heads x head_dim, k_norm of kv heads x head_dim: `qk_norm_type`
    "per_layer"); every layer MoE: a bias-free router over `num_local_experts` SwiGLU experts
    of intermediate_size, with a learned e_score_correction_bias when `use_routing_bias`; no
    shared expert (`shared_intermediate_size` 0); two RMSNorms per layer. Its MTP modules
    (`num_mtp_modules`) are not built by the released modeling code and not counted."""
    width = read_int(cfg, source, "intermediate_size")
    qk_norm = read_bool(cfg, source, "use_qk_norm", True)
    norm_type = cfg.get("qk_norm_type", "per_layer")
    if qk_norm and norm_type != "per_layer":
        raise field_error(source, "qk_norm_type", f"only 'per_layer' (norms over the whole q "
                                                  f"and k projections) is modelled, got "
                                                  f"{norm_type!r}")
    if read_int(cfg, source, "shared_intermediate_size", 0, minimum=0):
        raise field_error(source, "shared_intermediate_size", "MiniMax-M2's shared expert is "
                                                              "not modelled")
    return {
        **read_body(cfg, source, max_positions=196608, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=128),
        "intermediate_size": width,
        "qk_norm": qk_norm,
        "qk_norm_over": "projection",
        **read_routed_experts(cfg, source, experts_key="num_local_experts",
                              top_k_key="num_experts_per_tok", width=width),
        "router_bias": read_bool(cfg, source, "use_routing_bias", True),
    }


def map_qwen3_5(cfg: Config, source: str) -> Fields:
    """Qwen3_5ForConditionalGeneration and Qwen3_5MoeForConditionalGeneration: the language
    model of `text_config`, Qwen3-Next's layers (gated DeltaNet and gated attention, MoE or
    dense MLPs; map_qwen3_next) with `mtp_num_hidden_layers` MTP layers. The vision tower
    (`vision_config`) is not part of the plan. Qwen3.5-MoE's text config has no
    `intermediate_size` (Qwen3_5MoeTextConfig: every layer sparse, no dense MLP exists): the
    spec's required width then takes moe_intermediate_size, which shapes no weight as long
    as every layer is MoE (checked)."""
    return map_text_config(cfg, source, _map_qwen3_5_text)


def _map_qwen3_5_text(cfg: Config, source: str) -> Fields:
    if "intermediate_size" in cfg or "moe_intermediate_size" not in cfg:
        return map_qwen3_next(cfg, source)
    fields = map_qwen3_next({**cfg, "intermediate_size": cfg["moe_intermediate_size"]}, source)
    if "dense" in fields["mlp_layer_types"]:
        raise field_error(source, "intermediate_size", "required key is missing (the dense "
                                                       "layers of mlp_only_layers need it)")
    return fields


def map_longcat_flash(cfg: Config, source: str) -> Fields:
    """LongcatFlashDecoderLayer (transformers models/longcat_flash): each of `num_layers`
    layers is two sublayers, each MLA (q_a + RMSNorm + q_b, kv_a + RMSNorm + kv_b, o; no
    biases) and a SwiGLU MLP of ffn_hidden_size with two RMSNorms, plus one MoE fed from the
    first sublayer's MLP input (the shortcut-connected MoE, added to the second sublayer's
    output): a bias-free classifier over n_routed_experts + zero_expert_num with an
    e_score_correction_bias, n_routed_experts SwiGLU experts of expert_ffn_hidden_size and
    zero_expert_num identity experts (solver.spec.zero_experts), top moe_topk. As a ModelSpec:
    2 x num_layers layers; the first of each pair is MoE (moe_layer_freq 2) and its dense MLP
    is that MoE's shared expert (same input, every token), the second is dense. The
    checkpoint's model.mtp.* weights are not built by HF's LongcatFlashForCausalLM
    (_keys_to_ignore_on_load_unexpected) and not counted."""
    if read_bool(cfg, source, "attention_bias", False):
        raise field_error(source, "attention_bias", "biased MLA projections are not modelled")
    if cfg.get("zero_expert_type", "identity") != "identity":
        raise field_error(source, "zero_expert_type", "only identity zero experts are modelled")
    pairs = read_int(cfg, source, "num_layers", maximum=MAX_LAYERS // 2)
    heads = read_int(cfg, source, "num_attention_heads")
    width = read_int(cfg, source, "ffn_hidden_size")
    return {
        "num_hidden_layers": 2 * pairs,
        "vocab_size": read_int(cfg, source, "vocab_size"),
        "max_position_embeddings": read_int(cfg, source, "max_position_embeddings", 131072),
        "tie_word_embeddings": read_bool(cfg, source, "tie_word_embeddings", False),
        "hidden_size": read_int(cfg, source, "hidden_size"),
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": width,
        "q_lora_rank": read_int(cfg, source, "q_lora_rank", nullable=True),
        "kv_lora_rank": read_int(cfg, source, "kv_lora_rank"),
        "qk_nope_head_dim": read_int(cfg, source, "qk_nope_head_dim"),
        "qk_rope_head_dim": read_int(cfg, source, "qk_rope_head_dim"),
        "v_head_dim": read_int(cfg, source, "v_head_dim"),
        **read_routed_experts(cfg, source, experts_key="n_routed_experts", top_k_key="moe_topk",
                              width=read_int(cfg, source, "expert_ffn_hidden_size")),
        "num_zero_experts": read_int(cfg, source, "zero_expert_num", 0, minimum=0),
        "router_bias": True,
        "num_shared_experts": 1,
        "shared_expert_intermediate_size": width,
        "moe_layer_freq": 2,
    }


def map_ernie4_5_moe(cfg: Config, source: str) -> Fields:
    """Ernie4_5_MoeDecoderLayer (transformers models/ernie4_5_moe): q/k/v/o and MLPs biased
    by `use_bias`; two RMSNorms; layer i is MoE iff moe_layer_start_index <= i <=
    moe_layer_end_index (-1: the last) and (i + 1) % moe_layer_interval == 0: a bias-free
    gate over moe_num_experts SwiGLU experts of moe_intermediate_size with a learned
    e_score_correction_bias (moe_statics), and moe_num_shared_experts shared experts as one
    MLP of moe_num_shared_experts x moe_intermediate_size; other layers a SwiGLU MLP of
    intermediate_size; tied embeddings by default. The MTP layers are not built by HF's
    Ernie4_5_MoeForCausalLM and not counted."""
    bias = read_bool(cfg, source, "use_bias", False)
    dense = {
        **read_body(cfg, source, max_positions=131072, tied=True),
        **read_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": bias, "o_bias": bias, "mlp_bias": bias,
    }
    width = read_int(cfg, source, "moe_intermediate_size")
    shared = read_int(cfg, source, "moe_num_shared_experts", 0, minimum=0)
    moe = {
        **read_routed_experts(cfg, source, experts_key="moe_num_experts", top_k_key="moe_k",
                              width=width),
        "router_bias": True,
        "num_shared_experts": 1 if shared else 0,
        **({"shared_expert_intermediate_size": shared * width} if shared else {}),
    }
    layers = dense["num_hidden_layers"]
    start = read_int(cfg, source, "moe_layer_start_index", 0, minimum=0, maximum=MAX_LAYERS)
    end = cfg.get("moe_layer_end_index", -1)
    end = layers - 1 if end in (None, -1) else read_int(cfg, source, "moe_layer_end_index")
    interval = read_int(cfg, source, "moe_layer_interval", 1, maximum=MAX_LAYERS)
    moe_layers = [i for i in range(layers) if start <= i <= end and (i + 1) % interval == 0]
    if moe_layers and moe_layers[-1] != layers - 1:
        raise field_error(source, "moe_layer_end_index", "dense layers after the MoE ones are "
                                                         "not modelled")
    return with_moe(dense, moe, moe_layout(source, "moe_layer_start_index", moe_layers, layers))
