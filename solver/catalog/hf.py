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
from typing import Any

from solver.catalog.tomlfile import validate_spec
from solver.errors import InputError
from solver.spec import ModelSpec

Config = dict[Any, Any]
Fields = dict[str, Any]

_REQUIRED: Any = object()
_ABSENT: Any = object()
# Upper bounds far beyond any real model (the largest vocabularies are ~1e6, hidden sizes ~3e4,
# depths ~1e2); they keep a corrupt file from producing counts that overflow int64 array code
# downstream or a layer loop that never ends.
_MAX_SIZE = 1 << 24
_MAX_LAYERS = 1 << 14


# ---- reading typed values ---------------------------------------------------------------------


def _error(source: str, key: str, problem: str) -> InputError:
    return InputError(f"{source}: key '{key}': {problem}")


def _show(value: Any) -> str:
    """A JSON value as a short, one-line phrase for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({'true' if value else 'false'})"
    if isinstance(value, int) and abs(value) >= 10**30:
        return "a very large integer"
    kinds = {int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "an object"}
    kind = kinds.get(type(value), type(value).__name__)
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - any failure just drops the value from the message
        return kind
    if len(text) > 40:
        text = text[:37] + "..."
    return f"{kind} ({text})"


def _int(cfg: Config, source: str, key: str, default: Any = _REQUIRED, *, minimum: int = 1,
         maximum: int = _MAX_SIZE, nullable: bool = False) -> Any:
    """An integer key. Absent: `default` (or an error when required). With `nullable`, JSON null
    returns None (HF's "not set"); otherwise null is a type error."""
    value = cfg.get(key, _ABSENT)
    if value is _ABSENT:
        if default is _REQUIRED:
            hint = " (null if the model has none)" if nullable else ""
            raise _error(source, key, f"required key is missing{hint}")
        return default
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _error(source, key, f"must be an integer, got {_show(value)}")
    if value < minimum:
        rule = "positive" if minimum == 1 else f"at least {minimum}"
        raise _error(source, key, f"must be {rule}, got {value}")
    if value > maximum:
        raise _error(source, key, f"{_show(value)} is larger than any model ({maximum} at most)")
    return value


def _bool(cfg: Config, source: str, key: str, default: bool) -> bool:
    value = cfg.get(key, _ABSENT)
    if value is _ABSENT:
        return default
    if not isinstance(value, bool):
        raise _error(source, key, f"must be true or false, got {_show(value)}")
    return value


def _layer_indices(cfg: Config, source: str, key: str, num_layers: int) -> set[int]:
    """A list of layer indices (`mlp_only_layers`); absent or null is the empty list."""
    value = cfg.get(key)
    if value is None:
        return set()
    if not isinstance(value, list):
        raise _error(source, key, f"must be a list of layer indices, got {_show(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < num_layers:
            raise _error(source, key, f"entries must be layer indices 0..{num_layers - 1} "
                                      f"(num_hidden_layers is {num_layers}), got {_show(item)}")
    return set(value)


# ---- shared pieces --------------------------------------------------------------------------


def _attention(cfg: Config, source: str, *, kv_default: int | None,
               head_dim_default: int | None, mla: bool = False) -> Fields:
    """hidden_size, heads, kv heads (null: as many as heads) and head_dim (null: hidden/heads).
    With `mla` the head widths come from the MLA keys and head_dim is not read."""
    hidden = _int(cfg, source, "hidden_size")
    heads = _int(cfg, source, "num_attention_heads")
    kv_heads = _int(cfg, source, "num_key_value_heads", kv_default, nullable=True) or heads
    if heads % kv_heads:
        raise _error(source, "num_key_value_heads",
                     f"{kv_heads} must divide num_attention_heads ({heads})")
    head_dim = None if mla else _int(cfg, source, "head_dim", head_dim_default, nullable=True)
    if head_dim is None and not mla and hidden % heads:
        raise _error(source, "num_attention_heads",
                     f"{heads} does not divide hidden_size ({hidden}) and head_dim is not given")
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim}


def _body(cfg: Config, source: str, *, max_positions: int, tied: bool) -> Fields:
    """Depth, vocabulary, context length and tying, with that family's HF defaults."""
    return {
        "num_hidden_layers": _int(cfg, source, "num_hidden_layers", maximum=_MAX_LAYERS),
        "vocab_size": _int(cfg, source, "vocab_size"),
        "max_position_embeddings": _int(cfg, source, "max_position_embeddings", max_positions),
        "tie_word_embeddings": _bool(cfg, source, "tie_word_embeddings", tied),
    }


def _routed_experts(cfg: Config, source: str, *, experts_key: str, top_k_key: str,
                    width: int) -> Fields:
    experts = _int(cfg, source, experts_key)
    top_k = _int(cfg, source, top_k_key)
    if top_k > experts:
        raise _error(source, top_k_key, f"{top_k} exceeds {experts_key} ({experts})")
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": width}


def _moe_layout(source: str, key: str, moe_layers: list[int], num_layers: int) -> Fields | None:
    """ModelSpec's layout for the layers HF makes MoE, or None when there are none.

    ModelSpec puts MoE on layers i >= first_k_dense_layers with i % moe_layer_freq == 0
    (DeepSeek's rule); any other set of layers cannot be represented and is refused.
    """
    if not moe_layers:
        return None
    first = moe_layers[0]
    freq = moe_layers[1] - first if len(moe_layers) > 1 else 1
    expressible = [i for i in range(first, num_layers) if i % freq == 0]
    if expressible != moe_layers:
        shown = ", ".join(map(str, moe_layers[:6])) + (", ..." if len(moe_layers) > 6 else "")
        raise _error(source, key, f"puts MoE blocks on layers {shown}; parplan can only model "
                                  "a dense prefix followed by MoE on every k-th layer")
    return {"first_k_dense_layers": first, "moe_layer_freq": freq}


def _with_moe(dense: Fields, moe: Fields, layout: Fields | None) -> Fields:
    """The MoE fields when some layer is MoE; otherwise the model is dense (HF builds only
    plain MLPs of intermediate_size)."""
    return {**dense, **moe, **layout} if layout is not None else dense


# ---- one mapping per model_type ---------------------------------------------------------------


def _map_llama(cfg: Config, source: str) -> Fields:
    """LlamaAttention: q/k/v/o biases all follow `attention_bias`; LlamaMLP: gate/up/down follow
    `mlp_bias`; two RMSNorms per layer."""
    attention_bias = _bool(cfg, source, "attention_bias", False)
    return {
        **_body(cfg, source, max_positions=2048, tied=False),
        **_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": _bool(cfg, source, "mlp_bias", False),
    }


def _map_mistral(cfg: Config, source: str) -> Fields:
    """MistralAttention and MistralMLP: no biases; the sliding window has no parameters."""
    return {
        **_body(cfg, source, max_positions=4096 * 32, tied=False),
        **_attention(cfg, source, kv_default=8, head_dim_default=None),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
    }


def _map_mixtral(cfg: Config, source: str) -> Fields:
    """Every layer is sparse: `num_local_experts` SwiGLU experts of width intermediate_size and a
    bias-free router (MixtralSparseMoeBlock)."""
    width = _int(cfg, source, "intermediate_size")
    return {
        **_body(cfg, source, max_positions=4096 * 32, tied=False),
        **_attention(cfg, source, kv_default=8, head_dim_default=None),
        "intermediate_size": width,
        **_routed_experts(cfg, source, experts_key="num_local_experts",
                          top_k_key="num_experts_per_tok", width=width),
    }


def _map_qwen2(cfg: Config, source: str) -> Fields:
    """Qwen2Attention: q/k/v with biases, o_proj without (fixed in the code, no config key)."""
    return {
        **_body(cfg, source, max_positions=32768, tied=False),
        **_attention(cfg, source, kv_default=32, head_dim_default=None),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "qkv_bias": True,
    }


def _qwen_moe_layers(cfg: Config, source: str, num_layers: int, num_experts: int
                     ) -> tuple[str, list[int]]:
    """Qwen2Moe/Qwen3MoeDecoderLayer: layer i is sparse iff i is not in `mlp_only_layers` and
    (i + 1) % decoder_sparse_step == 0. Returns the key to blame and the sparse layers."""
    step = _int(cfg, source, "decoder_sparse_step", 1, maximum=_MAX_LAYERS)
    dense_only = _layer_indices(cfg, source, "mlp_only_layers", num_layers)
    moe_layers = [i for i in range(num_layers)
                  if num_experts > 0 and i not in dense_only and (i + 1) % step == 0]
    return ("decoder_sparse_step" if step > 1 else "mlp_only_layers"), moe_layers


def _map_qwen2_moe(cfg: Config, source: str) -> Fields:
    """Qwen2MoeSparseMoeBlock: bias-free router, `num_experts` experts of moe_intermediate_size,
    one shared expert of shared_expert_intermediate_size scaled by a sigmoid gate
    (Linear(hidden, 1)); attention has q/k/v biases (`qkv_bias`, default true)."""
    qkv_bias = _bool(cfg, source, "qkv_bias", True)
    dense = {
        **_body(cfg, source, max_positions=32768, tied=False),
        **_attention(cfg, source, kv_default=16, head_dim_default=None),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "qkv_bias": qkv_bias,
    }
    num_experts = _int(cfg, source, "num_experts", minimum=0)
    moe = {
        **_routed_experts(cfg, source, experts_key="num_experts", top_k_key="num_experts_per_tok",
                          width=_int(cfg, source, "moe_intermediate_size")),
        "num_shared_experts": 1,
        "shared_expert_intermediate_size": _int(cfg, source, "shared_expert_intermediate_size"),
        "shared_expert_gate": True,
    } if num_experts else {}
    key, moe_layers = _qwen_moe_layers(cfg, source, dense["num_hidden_layers"], num_experts)
    return _with_moe(dense, moe, _moe_layout(source, key, moe_layers, dense["num_hidden_layers"]))


def _map_qwen3(cfg: Config, source: str) -> Fields:
    """Qwen3Attention: q/k/v/o biases follow `attention_bias`; q_norm and k_norm are RMSNorms
    over head_dim (default 128)."""
    attention_bias = _bool(cfg, source, "attention_bias", False)
    return {
        **_body(cfg, source, max_positions=32768, tied=False),
        **_attention(cfg, source, kv_default=32, head_dim_default=128),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "qk_norm": True,
    }


def _map_qwen3_moe(cfg: Config, source: str) -> Fields:
    """Qwen3 attention (q/k norms) with Qwen3MoeSparseMoeBlock: bias-free router, no shared
    expert; head_dim defaults to hidden / heads (the config class has no head_dim default)."""
    attention_bias = _bool(cfg, source, "attention_bias", False)
    dense = {
        **_body(cfg, source, max_positions=32768, tied=False),
        **_attention(cfg, source, kv_default=4, head_dim_default=None),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "qk_norm": True,
    }
    num_experts = _int(cfg, source, "num_experts", minimum=0)
    moe = _routed_experts(cfg, source, experts_key="num_experts", top_k_key="num_experts_per_tok",
                          width=_int(cfg, source, "moe_intermediate_size")) if num_experts else {}
    key, moe_layers = _qwen_moe_layers(cfg, source, dense["num_hidden_layers"], num_experts)
    return _with_moe(dense, moe, _moe_layout(source, key, moe_layers, dense["num_hidden_layers"]))


def _map_deepseek(cfg: Config, source: str, *, v3: bool) -> Fields:
    """DeepseekV2/V3: MLA (q_proj, or q_a_proj + RMSNorm + q_b_proj when q_lora_rank is set;
    kv_a_proj_with_mqa + RMSNorm + kv_b_proj; o_proj). Layer i is MoE iff
    i >= first_k_dense_replace and i % moe_layer_freq == 0 (DeepSeek's own modeling code; HF's
    port reads only first_k_dense_replace, the same for every released config). Shared experts
    are one MLP of width n_shared_experts * moe_intermediate_size. V3's router keeps a learned
    per-expert `e_score_correction_bias`."""
    if _bool(cfg, source, "attention_bias", False):
        raise _error(source, "attention_bias", "true puts biases on q_a_proj and "
                                               "kv_a_proj_with_mqa, which parplan's MLA does not "
                                               "model")
    dense = {
        **_body(cfg, source, max_positions=4096 if v3 else 2048, tied=False),
        **_attention(cfg, source, kv_default=128 if v3 else None, head_dim_default=None,
                     mla=True),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "q_lora_rank": _int(cfg, source, "q_lora_rank", nullable=True),
        "kv_lora_rank": _int(cfg, source, "kv_lora_rank"),
        "qk_nope_head_dim": _int(cfg, source, "qk_nope_head_dim"),
        "qk_rope_head_dim": _int(cfg, source, "qk_rope_head_dim"),
        "v_head_dim": _int(cfg, source, "v_head_dim"),
        "num_nextn_predict_layers": _int(cfg, source, "num_nextn_predict_layers", 0, minimum=0,
                                         maximum=_MAX_LAYERS),
    }
    if not v3:  # DeepseekV2MLP is a LlamaMLP (mlp_bias); DeepseekV3MLP has no biases
        dense["mlp_bias"] = _bool(cfg, source, "mlp_bias", False)
    moe = {
        **_routed_experts(cfg, source, experts_key="n_routed_experts",
                          top_k_key="num_experts_per_tok",
                          width=_int(cfg, source, "moe_intermediate_size")),
        "num_shared_experts": _int(cfg, source, "n_shared_experts", minimum=0,
                                   nullable=True) or 0,
        "router_bias": v3,
    }
    first_dense = _int(cfg, source, "first_k_dense_replace", 3 if v3 else 0, minimum=0,
                       maximum=_MAX_LAYERS)
    freq = _int(cfg, source, "moe_layer_freq", 1, maximum=_MAX_LAYERS)
    num_layers = dense["num_hidden_layers"]
    moe_layers = [i for i in range(first_dense, num_layers) if i % freq == 0]
    return _with_moe(dense, moe, _moe_layout(source, "first_k_dense_replace", moe_layers,
                                             num_layers))


def _map_deepseek_v2(cfg: Config, source: str) -> Fields:
    return _map_deepseek(cfg, source, v3=False)


def _map_deepseek_v3(cfg: Config, source: str) -> Fields:
    return _map_deepseek(cfg, source, v3=True)


def _map_gemma2(cfg: Config, source: str) -> Fields:
    """Gemma2DecoderLayer: four RMSNorms (input, post-attention, pre- and post-feedforward);
    q/k/v/o biases follow `attention_bias`; gated GELU MLP without biases; tied embeddings and
    head_dim 256 by default. Soft-capping and the embedding scale have no parameters."""
    attention_bias = _bool(cfg, source, "attention_bias", False)
    return {
        **_body(cfg, source, max_positions=8192, tied=True),
        **_attention(cfg, source, kv_default=4, head_dim_default=256),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "norms_per_layer": 4,
    }


def _map_gpt2(cfg: Config, source: str) -> Fields:
    """GPT2Model: wte + learned wpe (n_positions rows), fused c_attn and c_proj with biases,
    c_fc (n_inner, null: 4 * n_embd) and c_proj with biases, ln_1/ln_2/ln_f LayerNorms; the LM
    head is tied by default."""
    if _bool(cfg, source, "add_cross_attention", False):
        raise _error(source, "add_cross_attention", "true adds encoder-decoder cross-attention "
                                                    "blocks, which parplan does not model")
    hidden = _int(cfg, source, "n_embd")
    heads = _int(cfg, source, "n_head")
    if hidden % heads:
        raise _error(source, "n_head", f"{heads} does not divide n_embd ({hidden})")
    return {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_hidden_layers": _int(cfg, source, "n_layer", maximum=_MAX_LAYERS),
        "vocab_size": _int(cfg, source, "vocab_size"),
        "intermediate_size": _int(cfg, source, "n_inner", None, nullable=True) or 4 * hidden,
        "max_position_embeddings": _int(cfg, source, "n_positions", 1024),
        "tie_word_embeddings": _bool(cfg, source, "tie_word_embeddings", True),
        "position_embedding_type": "learned",
        "mlp_type": "plain",
        "norm_type": "layernorm",
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
    }


def _map_gpt_neox(cfg: Config, source: str) -> Fields:
    """GPTNeoXLayer: input and post-attention LayerNorms (both exist whether or not
    `use_parallel_residual` runs them in parallel), fused query_key_value and dense with
    `attention_bias` (default true), MLP with biases always; untied embed_out by default. Rotary
    covers part of each head (rotary_pct) and has no parameters."""
    _bool(cfg, source, "use_parallel_residual", True)
    attention_bias = _bool(cfg, source, "attention_bias", True)
    fields = {
        **_body(cfg, source, max_positions=2048, tied=False),
        **_attention(cfg, source, kv_default=None, head_dim_default=None),
        "intermediate_size": _int(cfg, source, "intermediate_size"),
        "mlp_type": "plain",
        "norm_type": "layernorm",
        "qkv_bias": attention_bias,
        "o_bias": attention_bias,
        "mlp_bias": True,
    }
    if fields["hidden_size"] % fields["num_attention_heads"]:
        raise _error(source, "num_attention_heads", "must divide hidden_size (GPTNeoXConfig "
                                                    "refuses otherwise)")
    return fields


def _map_falcon(cfg: Config, source: str) -> Fields:
    """FalconAttention: query_key_value holds heads + 2 * kv heads, where kv heads are
    `num_kv_heads` with new_decoder_architecture, 1 with multi_query, else all heads; `bias`
    covers every linear layer. FalconDecoderLayer: 2 LayerNorms unless attention and MLP run in
    parallel from one norm (parallel_attn and num_ln_in_parallel_attn != 2; the new
    architecture defaults to 2). Plain GELU MLP of ffn_hidden_size (null: 4 * hidden); `alibi`
    replaces rotary with per-head slopes (no parameters); the LM head is tied by default."""
    hidden = _int(cfg, source, "hidden_size")
    heads = _int(cfg, source, "num_attention_heads")
    if hidden % heads:
        raise _error(source, "num_attention_heads", f"{heads} does not divide hidden_size "
                                                    f"({hidden}); FalconAttention refuses that")
    new_arch = _bool(cfg, source, "new_decoder_architecture", False)
    multi_query = _bool(cfg, source, "multi_query", True)
    parallel = _bool(cfg, source, "parallel_attn", True)
    num_kv = _int(cfg, source, "num_kv_heads", None, nullable=True) or heads
    if new_arch:
        kv_heads = num_kv
        if heads % kv_heads:
            raise _error(source, "num_kv_heads", f"{kv_heads} must divide num_attention_heads "
                                                 f"({heads})")
    else:
        kv_heads = 1 if multi_query else heads
    norms_key = "num_ln_in_parallel_attn"
    num_ln = _int(cfg, source, norms_key, 2 if new_arch else None, maximum=2, nullable=True)
    if num_ln is None and new_arch:
        num_ln = 2
    bias = _bool(cfg, source, "bias", False)
    return {
        **_body(cfg, source, max_positions=2048, tied=True),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": _int(cfg, source, "ffn_hidden_size", None, nullable=True)
        or 4 * hidden,
        "mlp_type": "plain",
        "norm_type": "layernorm",
        "norms_per_layer": 2 if (not parallel or num_ln == 2) else 1,
        "position_embedding_type": "alibi" if _bool(cfg, source, "alibi", False) else "rope",
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bias,
    }


def _map_gpt_oss(cfg: Config, source: str) -> Fields:
    """GptOssAttention: q/k/v/o always biased (the config class forces attention_bias) and one
    learned sink logit per head; every layer is MoE: GptOssTopKRouter has weight and bias,
    GptOssExperts are SwiGLU with biases on gate_up and down. The top-k is
    `num_experts_per_tok`; OpenAI's original key `experts_per_token` is read when it is absent."""
    top_k_key = "num_experts_per_tok"
    if top_k_key not in cfg and "experts_per_token" in cfg:
        top_k_key = "experts_per_token"
    elif top_k_key in cfg and cfg.get("experts_per_token", cfg[top_k_key]) != cfg[top_k_key]:
        raise _error(source, "experts_per_token",
                     f"is {_show(cfg['experts_per_token'])} but num_experts_per_tok is "
                     f"{_show(cfg[top_k_key])}; they must agree")
    width = _int(cfg, source, "intermediate_size")
    return {
        **_body(cfg, source, max_positions=131072, tied=False),
        **_attention(cfg, source, kv_default=8, head_dim_default=64),
        "intermediate_size": width,
        **_routed_experts(cfg, source, experts_key="num_local_experts", top_k_key=top_k_key,
                          width=width),
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "attention_sinks": True,
        "router_bias": True,
    }


_FAMILIES: MappingProxyType[str, Callable[[Config, str], Fields]] = MappingProxyType({
    "deepseek_v2": _map_deepseek_v2,
    "deepseek_v3": _map_deepseek_v3,
    "falcon": _map_falcon,
    "gemma2": _map_gemma2,
    "gpt2": _map_gpt2,
    "gpt_neox": _map_gpt_neox,
    "gpt_oss": _map_gpt_oss,
    "llama": _map_llama,
    "mistral": _map_mistral,
    "mixtral": _map_mixtral,
    "qwen2": _map_qwen2,
    "qwen2_moe": _map_qwen2_moe,
    "qwen3": _map_qwen3,
    "qwen3_moe": _map_qwen3_moe,
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
                         f"(a Hugging Face config.json), got {_show(data)}")
    model_type = data.get("model_type", _ABSENT)
    supported = ", ".join(SUPPORTED_MODEL_TYPES)
    if model_type is _ABSENT:
        raise _error(source, "model_type", f"required key is missing; supported: {supported}")
    if not isinstance(model_type, str) or model_type not in _FAMILIES:
        raise _error(source, "model_type",
                     f"unsupported value {_show(model_type)}; supported: {supported}")
    fields = _FAMILIES[model_type](data, source)
    fields.update(name=_name_from_source(source, model_type), model_type=model_type,
                  source=source)
    return validate_spec(ModelSpec, fields, source)
