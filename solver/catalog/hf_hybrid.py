"""Hugging Face `config.json` -> ModelSpec fields for models with a block pattern (linear
attention, sliding / chunked attention, interleaved MoE, MTP; the Mamba hybrids are in
solver.catalog.hf_nemotron): one mapping per `model_type`, registered in solver.catalog.hf,
following the rules stated there. Each mapping cites the modeling code that builds the layers;
the pattern lands in ModelSpec's `layer_types` / `mlp_layer_types` (solver.spec.blocks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from solver.catalog.hf_fields import (
    ABSENT,
    MAX_LAYERS,
    Config,
    Fields,
    field_error,
    qwen_moe_layers,
    read_attention,
    read_body,
    read_bool,
    read_int,
    read_layer_indices,
    read_mtp,
    read_routed_experts,
    show_value,
)
from solver.errors import InputError

LAYER_TYPE_NAMES = ("full_attention", "sliding_attention", "chunked_attention",
                    "linear_attention")


def read_layer_types(cfg: Config, source: str, num_layers: int, allowed: tuple[str, ...],
                     default: list[str]) -> list[str]:
    """HF's `layer_types` list (PretrainedConfig's per-layer attention types), or `default`
    when absent or null."""
    value = cfg.get("layer_types")
    if value is None:
        return default
    if not isinstance(value, list) or len(value) != num_layers:
        raise field_error(source, "layer_types", f"must be a list of {num_layers} layer types "
                                                 f"(num_hidden_layers), got {show_value(value)}")
    for item in value:
        if item not in allowed:
            raise field_error(source, "layer_types", f"entries must be one of "
                                                     f"{', '.join(allowed)}; got {show_value(item)}")
    return value


def read_window(cfg: Config, source: str, key: str = "sliding_window",
                default: Any = None) -> int | None:
    """A window or chunk size (null: none)."""
    return read_int(cfg, source, key, default, nullable=True, maximum=1 << 24)


def sliding_pattern(num_layers: int, every: int) -> list[str]:
    """Layer i is full attention when (i + 1) % every == 0, else sliding (Gemma 2 with
    every = 2, Gemma 3's sliding_window_pattern = 6)."""
    return ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
            for i in range(num_layers)]


def with_windows(fields: Fields, cfg: Config, source: str, default_types: list[str] | None,
                 window_default: Any = None) -> Fields:
    """Add `sliding_window` and the layer types to a plain model's fields: the config's
    layer_types, else `default_types`, else every layer sliding when a window is set. No
    window: unchanged (every layer full attention)."""
    window = read_window(cfg, source, default=window_default)
    layers = fields["num_hidden_layers"]
    if window is None:
        return fields
    types = read_layer_types(cfg, source, layers, ("full_attention", "sliding_attention"),
                             default_types or ["sliding_attention"] * layers)
    return {**fields, "sliding_window": window, "layer_types": tuple(types)}


def map_qwen3_next(cfg: Config, source: str) -> Fields:
    """Qwen3NextDecoderLayer (transformers models/qwen3_next): `layer_types` (absent: full
    attention on every full_attention_interval-th layer, else linear) picks
    Qwen3NextGatedDeltaNet or Qwen3NextAttention (q_proj yields the query and a sigmoid output
    gate, q/k RMSNorms over head_dim, biases by attention_bias); the MLP is
    Qwen3NextSparseMoeBlock (bias-free router, experts of moe_intermediate_size, one shared
    expert with a sigmoid gate) where num_experts > 0, i is not in mlp_only_layers and
    (i + 1) % decoder_sparse_step == 0, else Qwen3NextMLP; two RMSNorms per layer."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    fields: Fields = {
        **read_body(cfg, source, max_positions=32768, tied=False),
        **read_attention(cfg, source, kv_default=2, head_dim_default=256),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "qk_norm": True,
        "attention_output_gate": True,
        "linear_num_key_heads": read_int(cfg, source, "linear_num_key_heads", 16),
        "linear_num_value_heads": read_int(cfg, source, "linear_num_value_heads", 32),
        "linear_key_head_dim": read_int(cfg, source, "linear_key_head_dim", 128),
        "linear_value_head_dim": read_int(cfg, source, "linear_value_head_dim", 128),
        "linear_conv_kernel_dim": read_int(cfg, source, "linear_conv_kernel_dim", 4),
    }
    if fields["linear_num_value_heads"] % fields["linear_num_key_heads"]:
        raise field_error(source, "linear_num_key_heads", "must divide linear_num_value_heads")
    layers = fields["num_hidden_layers"]
    interval = read_int(cfg, source, "full_attention_interval", 4, maximum=MAX_LAYERS)
    default = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
               for i in range(layers)]
    fields["layer_types"] = tuple(read_layer_types(
        cfg, source, layers, ("full_attention", "linear_attention"), default))
    num_experts = read_int(cfg, source, "num_experts", 0, minimum=0)
    _, moe_layers = qwen_moe_layers(cfg, source, layers, num_experts)
    if moe_layers:
        fields.update(
            **read_routed_experts(cfg, source, experts_key="num_experts",
                                  top_k_key="num_experts_per_tok",
                                  width=read_int(cfg, source, "moe_intermediate_size")),
            num_shared_experts=1, shared_expert_gate=True,
            shared_expert_intermediate_size=read_int(cfg, source,
                                                     "shared_expert_intermediate_size"))
    fields["mlp_layer_types"] = tuple("moe" if i in moe_layers else "dense"
                                      for i in range(layers))
    # One MTP module unless the file says (Qwen3.5: mtp_num_hidden_layers). HF's Qwen3Next
    # builds none (it drops the checkpoint's mtp.* weights), but the released checkpoints
    # carry one (mtp.layers.0: a full-attention MoE decoder layer behind fc 2h -> h and two
    # RMSNorms) and vLLM's Qwen3NextMultiTokenPredictor (qwen3_next_mtp.py) reads
    # getattr(config, "num_nextn_predict_layers", 1).
    fields.update(read_mtp(cfg, source, modules_default=1))
    return fields


def read_gemma_layer(cfg: Config, source: str, *, max_positions: int) -> Fields:
    """Gemma2DecoderLayer and Gemma3DecoderLayer alike: four RMSNorms (input, post-attention,
    pre- and post-feedforward); q/k/v/o biases follow `attention_bias`; gated GELU MLP without
    biases; tied embeddings and head_dim 256 by default."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    return {
        **read_body(cfg, source, max_positions=max_positions, tied=True),
        **read_attention(cfg, source, kv_default=4, head_dim_default=256),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "norms_per_layer": 4,
    }


def map_gemma3_text(cfg: Config, source: str) -> Fields:
    """Gemma3DecoderLayer (transformers models/gemma3): Gemma 2's layer (four RMSNorms, gated
    GELU MLP, tied embeddings, head_dim 256 by default) plus q/k RMSNorms over head_dim;
    `layer_types` (absent: sliding_window_pattern, default 6: every sixth layer global) picks
    sliding-window (sliding_window, default 4096) or full attention."""
    fields = {**read_gemma_layer(cfg, source, max_positions=131072), "qk_norm": True}
    every = read_int(cfg, source, "sliding_window_pattern", 6, maximum=MAX_LAYERS)
    return with_windows(fields, cfg, source, sliding_pattern(fields["num_hidden_layers"], every),
                        window_default=4096)


def map_text_config(cfg: Config, source: str, mapping: Callable[[Config, str], Fields]
                    ) -> Fields:
    """`mapping` applied to the language model's config inside a multimodal one
    (`text_config`); its errors name the key as text_config.<key>."""
    text = cfg.get("text_config", ABSENT)
    if not isinstance(text, dict):
        raise field_error(source, "text_config", "required object (the language model's config) "
                                                 f"is {'missing' if text is ABSENT else show_value(text)}")
    try:
        return mapping(text, source)
    except InputError as exc:
        raise InputError(str(exc).replace(f"{source}: key '", f"{source}: key 'text_config.",
                                          1)) from None


def map_gemma3(cfg: Config, source: str) -> Fields:
    """Gemma3ForConditionalGeneration: the text model of `text_config` (the SigLIP vision
    tower and projector are not planned)."""
    return map_text_config(cfg, source, map_gemma3_text)


def map_llama4_text(cfg: Config, source: str) -> Fields:
    """Llama4TextDecoderLayer (transformers models/llama4): attention without biases (its q/k
    L2 norm has no weights); layer i is MoE iff i is in `moe_layers` (default: every
    interleave_moe_layer_step-th, counting from step - 1): Llama4TextMoe = a bias-free router,
    num_local_experts SwiGLU experts of intermediate_size and one shared expert of the same
    width; other layers are a SwiGLU MLP of intermediate_size_mlp. Layers that use RoPE
    (no_rope_layers[i] = 1; default: all but every no_rope_layer_interval-th, 4) attend within
    chunks of attention_chunk_size; the NoPE layers attend globally."""
    fields: Fields = {
        **read_body(cfg, source, max_positions=4096 * 32, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=128),
        "intermediate_size": read_int(cfg, source, "intermediate_size_mlp"),
    }
    layers = fields["num_hidden_layers"]
    step = read_int(cfg, source, "interleave_moe_layer_step", 1, maximum=MAX_LAYERS)
    moe_layers = (read_layer_indices(cfg, source, "moe_layers", layers) if cfg.get("moe_layers")
                  else set(range(step - 1, layers, step)))
    width = read_int(cfg, source, "intermediate_size")
    if moe_layers:
        fields.update(**read_routed_experts(cfg, source, experts_key="num_local_experts",
                                            top_k_key="num_experts_per_tok", width=width),
                      num_shared_experts=1, shared_expert_intermediate_size=width)
    fields["mlp_layer_types"] = tuple("moe" if i in moe_layers else "dense"
                                      for i in range(layers))
    interval = read_int(cfg, source, "no_rope_layer_interval", 4, maximum=MAX_LAYERS)
    rope = cfg.get("no_rope_layers")
    if rope in (None, []):
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if not isinstance(rope, list) or len(rope) != layers or any(v not in (0, 1) or
                                                                isinstance(v, bool) for v in rope):
        raise field_error(source, "no_rope_layers", f"must be a list of {layers} zeros and ones, "
                                                    f"got {show_value(rope)}")
    chunk = read_window(cfg, source, "attention_chunk_size", 8192)
    if chunk is not None:
        fields["attention_chunk_size"] = chunk
        fields["layer_types"] = tuple("chunked_attention" if uses_rope else "full_attention"
                                      for uses_rope in rope)
    return fields


def map_llama4(cfg: Config, source: str) -> Fields:
    """Llama4ForConditionalGeneration: the text model of `text_config`."""
    return map_text_config(cfg, source, map_llama4_text)


def map_glm4_moe(cfg: Config, source: str) -> Fields:
    """Glm4MoeDecoderLayer (transformers models/glm4_moe): q/k/v biased by attention_bias
    (o_proj never), q/k RMSNorms over head_dim when use_qk_norm; layer i is MoE iff
    i >= first_k_dense_replace: Glm4MoeMoE = a router with e_score_correction_bias,
    n_routed_experts experts of moe_intermediate_size and n_shared_experts shared ones (one MLP
    of n_shared_experts x moe_intermediate_size); num_nextn_predict_layers MTP layers."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    fields: Fields = {
        **read_body(cfg, source, max_positions=131072, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=128),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "qk_norm": read_bool(cfg, source, "use_qk_norm", False),
        # Megatron-Bridge glm45_bridge.py: mtp_loss_scaling_factor 0.3
        **read_mtp(cfg, source, loss_scale=0.3),
    }
    layers = fields["num_hidden_layers"]
    first_dense = read_int(cfg, source, "first_k_dense_replace", 1, minimum=0, maximum=MAX_LAYERS)
    if first_dense < layers:
        shared = read_int(cfg, source, "n_shared_experts", 1, minimum=0)
        width = read_int(cfg, source, "moe_intermediate_size")
        fields.update(**read_routed_experts(cfg, source, experts_key="n_routed_experts",
                                            top_k_key="num_experts_per_tok", width=width),
                      first_k_dense_layers=first_dense, router_bias=True)
        if shared:
            fields.update(num_shared_experts=1, shared_expert_intermediate_size=shared * width)
    return fields


def map_phi3(cfg: Config, source: str) -> Fields:
    """Phi3Attention (transformers models/phi3): a fused qkv_proj and o_proj without biases;
    Phi3MLP: a fused gate_up_proj and down_proj without biases (the counts of separate
    matrices); two RMSNorms; every layer attends within `sliding_window` when set
    (Phi-3-mini-4k: 2047; null, Phi3Config's default: full attention)."""
    fields = {
        **read_body(cfg, source, max_positions=4096, tied=False),
        **read_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
    }
    return with_windows(fields, cfg, source, None)


def map_olmoe(cfg: Config, source: str) -> Fields:
    """OlmoeDecoderLayer (transformers models/olmoe): q/k/v/o biases follow attention_bias
    (clip_qkv has no parameters); q_norm and k_norm are RMSNorms over the whole q projection
    (hidden) and k projection (kv heads x head_dim); every layer is OlmoeSparseMoeBlock: a
    bias-free router and num_experts SwiGLU experts of intermediate_size, no shared expert."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    width = read_int(cfg, source, "intermediate_size")
    return {
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        **read_body(cfg, source, max_positions=4096, tied=False),
        **read_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": width,
        **read_routed_experts(cfg, source, experts_key="num_experts",
                              top_k_key="num_experts_per_tok", width=width),
        "qk_norm": True,
        "qk_norm_over": "projection",
    }
