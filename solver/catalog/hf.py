"""Hugging Face `config.json` -> ModelSpec, one small mapping per `model_type`.

A config.json names the sizes; the architecture around them (which projections carry biases,
how many norms a layer has, whether q/k are normalised, whether the LM head is tied) lives in
`transformers/models/<type>/modeling_<type>.py`. Each `_map_<type>` below sets those flags the
way that module builds the model, and cites it.

Rules every mapping follows:
- Sizes that shape the weight matrices (hidden size, layers, heads, vocabulary, FFN and expert
  widths, expert counts, MLA ranks) are required. HF's defaults for them are the numbers of one
  reference checkpoint, so a file without them describes no particular model.
- Every other key, when absent, takes the default of that model's `configuration_<type>.py`.
  JSON null means what HF's `None` means there (usually "derive it": kv heads = heads,
  head_dim = hidden / heads, FFN width = 4 * hidden).
- A layout ModelSpec cannot express (for example MoE layers that are not "dense prefix, then
  every k-th layer") is refused with the reason, never approximated.
- Every problem is one `InputError` line: `<source>: key '<hf key>': <problem>`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePath
from types import MappingProxyType

from solver.catalog.hf_fields import (
    ABSENT,
    MAX_LAYERS,
    Config,
    Fields,
    field_error,
    moe_layout,
    qwen_moe_layers,
    read_attention,
    read_body,
    read_bool,
    read_int,
    read_mtp,
    read_rope_and_dropout,
    read_rope_scaling,
    read_routed_experts,
    show_value,
    with_moe,
)
from solver.catalog.hf_hybrid import (
    map_gemma3,
    map_gemma3_text,
    map_glm4_moe,
    map_llama4,
    map_llama4_text,
    map_olmoe,
    map_phi3,
    map_qwen3_next,
    read_gemma_layer,
    sliding_pattern,
    with_windows,
)
from solver.catalog.hf_newer import (
    map_ernie4_5_moe,
    map_longcat_flash,
    map_minimax_m2,
    map_qwen3_5,
)
from solver.catalog.hf_layernorm import map_falcon, map_gpt2, map_gpt_neox
from solver.catalog.hf_nemotron import map_nemotron_h
from solver.catalog.tomlfile import validate_spec
from solver.errors import InputError
from solver.spec import ModelSpec

# ---- one mapping per model_type ---------------------------------------------------------------


def _map_llama(cfg: Config, source: str) -> Fields:
    """LlamaAttention: q/k/v/o biases all follow `attention_bias`; LlamaMLP: gate/up/down follow
    `mlp_bias`; two RMSNorms per layer."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    return {
        **read_body(cfg, source, max_positions=2048, tied=False),
        **read_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": read_bool(cfg, source, "mlp_bias", False),
        **read_rope_scaling(cfg, source),  # Llama 3.1 / 3.2: rope_type llama3
    }


def _map_mistral(cfg: Config, source: str) -> Fields:
    """MistralAttention and MistralMLP: no biases; every layer attends within
    `sliding_window` (MistralConfig's default 4096; null: full attention)."""
    fields = {
        **read_body(cfg, source, max_positions=4096 * 32, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
    }
    return with_windows(fields, cfg, source, None, window_default=4096)


def _map_mixtral(cfg: Config, source: str) -> Fields:
    """Every layer is sparse: `num_local_experts` SwiGLU experts of width intermediate_size and a
    bias-free router (MixtralSparseMoeBlock)."""
    width = read_int(cfg, source, "intermediate_size")
    return {
        **read_body(cfg, source, max_positions=4096 * 32, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=None),
        "intermediate_size": width,
        **read_routed_experts(cfg, source, experts_key="num_local_experts",
                          top_k_key="num_experts_per_tok", width=width),
    }


def _map_qwen2(cfg: Config, source: str) -> Fields:
    """Qwen2Attention: q/k/v with biases, o_proj without (fixed in the code, no config key)."""
    return {
        **read_body(cfg, source, max_positions=32768, tied=False),
        **read_attention(cfg, source, kv_default=32, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": True,
    }


def _map_qwen2_moe(cfg: Config, source: str) -> Fields:
    """Qwen2MoeSparseMoeBlock: bias-free router, `num_experts` experts of moe_intermediate_size,
    one shared expert of shared_expert_intermediate_size scaled by a sigmoid gate
    (Linear(hidden, 1)); attention has q/k/v biases (`qkv_bias`, default true)."""
    qkv_bias = read_bool(cfg, source, "qkv_bias", True)
    dense = {
        **read_body(cfg, source, max_positions=32768, tied=False),
        **read_attention(cfg, source, kv_default=16, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": qkv_bias,
    }
    num_experts = read_int(cfg, source, "num_experts", minimum=0)
    moe = {
        **read_routed_experts(cfg, source, experts_key="num_experts", top_k_key="num_experts_per_tok",
                          width=read_int(cfg, source, "moe_intermediate_size")),
        "num_shared_experts": 1,
        "shared_expert_intermediate_size": read_int(cfg, source, "shared_expert_intermediate_size"),
        "shared_expert_gate": True,
    } if num_experts else {}
    key, moe_layers = qwen_moe_layers(cfg, source, dense["num_hidden_layers"], num_experts)
    return with_moe(dense, moe, moe_layout(source, key, moe_layers, dense["num_hidden_layers"]))


def _map_qwen3(cfg: Config, source: str) -> Fields:
    """Qwen3Attention: q/k/v/o biases follow `attention_bias`; q_norm and k_norm are RMSNorms
    over head_dim (default 128)."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    return {
        **read_body(cfg, source, max_positions=32768, tied=False),
        **read_attention(cfg, source, kv_default=32, head_dim_default=128),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "qk_norm": True,
    }


def _map_qwen3_moe(cfg: Config, source: str) -> Fields:
    """Qwen3 attention (q/k norms) with Qwen3MoeSparseMoeBlock: bias-free router, no shared
    expert; head_dim defaults to hidden / heads (the config class has no head_dim default)."""
    attention_bias = read_bool(cfg, source, "attention_bias", False)
    dense = {
        **read_body(cfg, source, max_positions=32768, tied=False),
        **read_attention(cfg, source, kv_default=4, head_dim_default=None),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "qk_norm": True,
    }
    num_experts = read_int(cfg, source, "num_experts", minimum=0)
    moe = read_routed_experts(cfg, source, experts_key="num_experts", top_k_key="num_experts_per_tok",
                          width=read_int(cfg, source, "moe_intermediate_size")) if num_experts else {}
    key, moe_layers = qwen_moe_layers(cfg, source, dense["num_hidden_layers"], num_experts)
    return with_moe(dense, moe, moe_layout(source, key, moe_layers, dense["num_hidden_layers"]))


def _map_deepseek(cfg: Config, source: str, *, v3: bool) -> Fields:
    """DeepseekV2/V3: MLA (q_proj, or q_a_proj + RMSNorm + q_b_proj when q_lora_rank is set;
    kv_a_proj_with_mqa + RMSNorm + kv_b_proj; o_proj). Layer i is MoE iff
    i >= first_k_dense_replace and i % moe_layer_freq == 0 (DeepSeek's own modeling code; HF's
    port reads only first_k_dense_replace, the same for every released config). Shared experts
    are one MLP of width n_shared_experts * moe_intermediate_size. V3's router keeps a learned
    per-expert `e_score_correction_bias`."""
    if read_bool(cfg, source, "attention_bias", False):
        raise field_error(source, "attention_bias", "true puts biases on q_a_proj and "
                                               "kv_a_proj_with_mqa, which parplan's MLA does not "
                                               "model")
    dense = {
        **read_body(cfg, source, max_positions=4096 if v3 else 2048, tied=False),
        **read_attention(cfg, source, kv_default=128 if v3 else None, head_dim_default=None,
                     mla=True),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "q_lora_rank": read_int(cfg, source, "q_lora_rank", nullable=True),
        "kv_lora_rank": read_int(cfg, source, "kv_lora_rank"),
        "qk_nope_head_dim": read_int(cfg, source, "qk_nope_head_dim"),
        "qk_rope_head_dim": read_int(cfg, source, "qk_rope_head_dim"),
        "v_head_dim": read_int(cfg, source, "v_head_dim"),
        **read_mtp(cfg, source),
    }
    if not v3:  # DeepseekV2MLP is a LlamaMLP (mlp_bias); DeepseekV3MLP has no biases
        dense["mlp_bias"] = read_bool(cfg, source, "mlp_bias", False)
    moe = {
        **read_routed_experts(cfg, source, experts_key="n_routed_experts",
                          top_k_key="num_experts_per_tok",
                          width=read_int(cfg, source, "moe_intermediate_size")),
        "num_shared_experts": read_int(cfg, source, "n_shared_experts", minimum=0,
                                   nullable=True) or 0,
        "router_bias": v3,
        "n_group": read_int(cfg, source, "n_group", 1),
        "topk_group": read_int(cfg, source, "topk_group", 1),
    }
    first_dense = read_int(cfg, source, "first_k_dense_replace", 3 if v3 else 0, minimum=0,
                       maximum=MAX_LAYERS)
    freq = read_int(cfg, source, "moe_layer_freq", 1, maximum=MAX_LAYERS)
    num_layers = dense["num_hidden_layers"]
    moe_layers = [i for i in range(first_dense, num_layers) if i % freq == 0]
    return with_moe(dense, moe, moe_layout(source, "first_k_dense_replace", moe_layers,
                                             num_layers))


def _map_deepseek_v2(cfg: Config, source: str) -> Fields:
    return _map_deepseek(cfg, source, v3=False)


def _map_deepseek_v3(cfg: Config, source: str) -> Fields:
    """DeepSeek-V3, and Kimi K2 (model_type kimi_k2): Moonshot's checkpoints are
    DeepseekV3ForCausalLM (config.json `architectures`, `auto_map` to DeepseekV3Config); the
    distinct model_type only lets engines tell them apart (Kimi K2's deployment guide)."""
    return _map_deepseek(cfg, source, v3=True)


def _map_deepseek_sparse(cfg: Config, source: str) -> Fields:
    """DeepSeek-V3.2 (deepseek_v32) and GLM-5 (glm_moe_dsa): DeepSeek-V3's layers with DSA's
    lightning indexer in every attention layer (solver.spec.sparse_attention; vLLM
    deepseek_v2.py Indexer, built when config has index_topk). GLM-5.1's shared indexers
    (`index_topk_freq`, `indexer_types`: one indexer reused by several layers) are refused."""
    for key in ("index_topk_freq", "indexer_types"):
        if key in cfg:
            raise field_error(source, key, "indexers shared between layers are not modelled")
    return {**_map_deepseek(cfg, source, v3=True),
            "index_n_heads": read_int(cfg, source, "index_n_heads"),
            "index_head_dim": read_int(cfg, source, "index_head_dim"),
            "index_topk": read_int(cfg, source, "index_topk")}


def _map_gemma2(cfg: Config, source: str) -> Fields:
    """Gemma2DecoderLayer: four RMSNorms (input, post-attention, pre- and post-feedforward);
    q/k/v/o biases follow `attention_bias`; gated GELU MLP without biases; tied embeddings and
    head_dim 256 by default. Soft-capping and the embedding scale have no parameters. Layers
    alternate sliding-window (sliding_window, default 4096) and full attention, the first
    sliding (Gemma2Config.layer_types)."""
    fields = read_gemma_layer(cfg, source, max_positions=8192)
    return with_windows(fields, cfg, source, sliding_pattern(fields["num_hidden_layers"], 2),
                        window_default=4096)


def read_limit(cfg: Config, source: str, key: str) -> float | None:
    """An optional positive number (absent or null: no limit)."""
    value = cfg.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise field_error(source, key, f"must be a positive number or null, got "
                                       f"{show_value(value)}")
    return float(value)


def _map_gpt_oss(cfg: Config, source: str) -> Fields:
    """GptOssAttention: q/k/v/o always biased (the config class forces attention_bias) and one
    learned sink logit per head; every layer is MoE: GptOssTopKRouter has weight and bias,
    GptOssExperts are SwiGLU with biases on gate_up and down, clamped at `swiglu_limit`. The
    top-k is `num_experts_per_tok`; OpenAI's original key `experts_per_token` is read when it
    is absent. RoPE is YaRN-scaled (`rope_scaling`, read_rope_scaling)."""
    top_k_key = "num_experts_per_tok"
    if top_k_key not in cfg and "experts_per_token" in cfg:
        top_k_key = "experts_per_token"
    elif top_k_key in cfg and cfg.get("experts_per_token", cfg[top_k_key]) != cfg[top_k_key]:
        raise field_error(source, "experts_per_token",
                     f"is {show_value(cfg['experts_per_token'])} but num_experts_per_tok is "
                     f"{show_value(cfg[top_k_key])}; they must agree")
    width = read_int(cfg, source, "intermediate_size")
    fields = {
        **read_body(cfg, source, max_positions=131072, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=64),
        "intermediate_size": width,
        **read_routed_experts(cfg, source, experts_key="num_local_experts", top_k_key=top_k_key,
                          width=width),
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "attention_sinks": True,
        "router_bias": True,
        "swiglu_limit": read_limit(cfg, source, "swiglu_limit"),
        **read_rope_scaling(cfg, source),
    }
    # GptOssConfig: layers alternate sliding (window 128) and full attention, the first sliding.
    return with_windows(fields, cfg, source, sliding_pattern(fields["num_hidden_layers"], 2),
                        window_default=128)


_FAMILIES: MappingProxyType[str, Callable[[Config, str], Fields]] = MappingProxyType({
    "deepseek_v2": _map_deepseek_v2,
    "deepseek_v3": _map_deepseek_v3,
    "deepseek_v32": _map_deepseek_sparse,
    "ernie4_5_moe": map_ernie4_5_moe,
    "falcon": map_falcon,
    "gemma2": _map_gemma2,
    "gemma3": map_gemma3,
    "gemma3_text": map_gemma3_text,
    "glm4_moe": map_glm4_moe,
    "glm_moe_dsa": _map_deepseek_sparse,
    "gpt2": map_gpt2,
    "gpt_neox": map_gpt_neox,
    "gpt_oss": _map_gpt_oss,
    "kimi_k2": _map_deepseek_v3,
    "llama": _map_llama,
    "llama4": map_llama4,
    "llama4_text": map_llama4_text,
    "longcat_flash": map_longcat_flash,
    "minimax_m2": map_minimax_m2,
    "mistral": _map_mistral,
    "mixtral": _map_mixtral,
    "nemotron_h": map_nemotron_h,
    "olmoe": map_olmoe,
    "phi3": map_phi3,
    "qwen2": _map_qwen2,
    "qwen2_moe": _map_qwen2_moe,
    "qwen3": _map_qwen3,
    "qwen3_moe": _map_qwen3_moe,
    "qwen3_next": map_qwen3_next,
    "qwen3_5": map_qwen3_5,
    "qwen3_5_moe": map_qwen3_5,
})
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def _name_from_source(source: str, model_type: str) -> str:
    """`.../Llama-3.1-8B/config.json` -> "Llama-3.1-8B"; `llama3.1-8b.json` -> "llama3.1-8b"."""
    path = PurePath(source)
    if path.stem.lower() == "config" and path.parent.name:
        return path.parent.name
    return path.stem or model_type


def model_spec_from_hf_config(data: object, source: str) -> ModelSpec:
    """The ModelSpec of a parsed Hugging Face config.json; `source` names it in errors."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: top level: expected a JSON object with a 'model_type' key "
                         f"(a Hugging Face config.json), got {show_value(data)}")
    model_type = data.get("model_type", ABSENT)
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is ABSENT:
        raise field_error(source, "model_type", f"required key is missing; supported: {supported}")
    if not isinstance(model_type, str) or model_type not in _FAMILIES:
        raise field_error(source, "model_type",
                     f"unsupported value {show_value(model_type)}; supported: {supported}")
    fields = {**read_rope_and_dropout(data, source), **_FAMILIES[model_type](data, source)}
    fields.update(name=_name_from_source(source, model_type), model_type=model_type,
                  source=source)
    return validate_spec(ModelSpec, fields, source)
