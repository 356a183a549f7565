"""Reading typed values out of a Hugging Face `config.json` for solver.catalog.hf: every
problem is one InputError line, `<source>: key '<hf key>': <problem>`."""

from __future__ import annotations

from typing import Any

from solver.errors import InputError

Config = dict[Any, Any]
Fields = dict[str, Any]

REQUIRED: Any = object()
ABSENT: Any = object()
# Upper bounds far beyond any real model (the largest vocabularies are ~1e6, hidden sizes ~3e4,
# depths ~1e2); they keep a corrupt file from producing counts that overflow int64 array code
# downstream or a layer loop that never ends.
MAX_SIZE = 1 << 24
MAX_LAYERS = 1 << 14


# ---- reading typed values ---------------------------------------------------------------------


def field_error(source: str, key: str, problem: str) -> InputError:
    return InputError(f"{source}: key '{key}': {problem}")


def show_value(value: Any) -> str:
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


def read_int(cfg: Config, source: str, key: str, default: Any = REQUIRED, *, minimum: int = 1,
         maximum: int = MAX_SIZE, nullable: bool = False) -> Any:
    """An integer key. Absent: `default` (or an error when required). With `nullable`, JSON null
    returns None (HF's "not set"); otherwise null is a type error."""
    value = cfg.get(key, ABSENT)
    if value is ABSENT:
        if default is REQUIRED:
            hint = " (null if the model has none)" if nullable else ""
            raise field_error(source, key, f"required key is missing{hint}")
        return default
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise field_error(source, key, f"must be an integer, got {show_value(value)}")
    if value < minimum:
        rule = "positive" if minimum == 1 else f"at least {minimum}"
        raise field_error(source, key, f"must be {rule}, got {value}")
    if value > maximum:
        raise field_error(source, key, f"{show_value(value)} is larger than any model ({maximum} at most)")
    return value


def read_bool(cfg: Config, source: str, key: str, default: bool) -> bool:
    value = cfg.get(key, ABSENT)
    if value is ABSENT:
        return default
    if not isinstance(value, bool):
        raise field_error(source, key, f"must be true or false, got {show_value(value)}")
    return value


# The keys a config.json states its MTP modules by (Megatron-Bridge auto_bridge.py
# MTP_CONFIG_FIELDS: DeepSeek's, Qwen's and Megatron's names for one count).
MTP_MODULE_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "mtp_num_layers")
# Megatron-Core's MTP loss weight (transformer_config.py mtp_loss_scaling_factor = 0.1).
MEGATRON_MTP_LOSS_SCALE = 0.1


def read_mtp(cfg: Config, source: str, *, modules_default: int = 0, repeated: bool = False,
             loss_scale: float = MEGATRON_MTP_LOSS_SCALE) -> Fields:
    """The MTP fields of solver.spec.ModelSpec: the modules (the first MTP_MODULE_KEYS key the
    file has, else `modules_default`), one depth per module as Megatron-Bridge converts them
    (model_bridge.py: num_nextn_predict_layers -> mtp_num_layers), and the keys
    `mtp_use_repeated_layer` and `mtp_loss_scaling_factor` (else the family's defaults,
    `repeated` and `loss_scale`, as its Bridge states them)."""
    key = next((k for k in MTP_MODULE_KEYS if k in cfg), MTP_MODULE_KEYS[0])
    fields: Fields = {"num_nextn_predict_layers": read_int(cfg, source, key, modules_default,
                                                           minimum=0, maximum=MAX_LAYERS)}
    if fields["num_nextn_predict_layers"]:
        fields["mtp_use_repeated_layer"] = read_bool(cfg, source, "mtp_use_repeated_layer",
                                                     repeated)
        fields["mtp_loss_scaling_factor"] = read_number(cfg, source, "mtp_loss_scaling_factor",
                                                        loss_scale)
    return fields


def read_number(cfg: Config, source: str, key: str, default: float, *,
                maximum: float = 1e3) -> float:
    """A non-negative number key (a weight); absent: `default`."""
    value = cfg.get(key, ABSENT)
    if value is ABSENT:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value <= maximum):
        raise field_error(source, key, f"must be a number from 0 to {maximum:g}, got "
                                       f"{show_value(value)}")
    return float(value)


def read_layer_indices(cfg: Config, source: str, key: str, num_layers: int) -> set[int]:
    """A list of layer indices (`mlp_only_layers`); absent or null is the empty list."""
    value = cfg.get(key)
    if value is None:
        return set()
    if not isinstance(value, list):
        raise field_error(source, key, f"must be a list of layer indices, got {show_value(value)}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < num_layers:
            raise field_error(source, key, f"entries must be layer indices 0..{num_layers - 1} "
                                      f"(num_hidden_layers is {num_layers}), got {show_value(item)}")
    return set(value)


# ---- shared pieces --------------------------------------------------------------------------


def read_attention(cfg: Config, source: str, *, kv_default: int | None,
               head_dim_default: int | None, mla: bool = False) -> Fields:
    """hidden_size, heads, kv heads (null: as many as heads) and head_dim (null: hidden/heads).
    With `mla` the head widths come from the MLA keys and head_dim is not read."""
    hidden = read_int(cfg, source, "hidden_size")
    heads = read_int(cfg, source, "num_attention_heads")
    kv_heads = read_int(cfg, source, "num_key_value_heads", kv_default, nullable=True) or heads
    if heads % kv_heads:
        raise field_error(source, "num_key_value_heads",
                     f"{kv_heads} must divide num_attention_heads ({heads})")
    head_dim = None if mla else read_int(cfg, source, "head_dim", head_dim_default, nullable=True)
    if head_dim is None and not mla and hidden % heads:
        raise field_error(source, "num_attention_heads",
                     f"{heads} does not divide hidden_size ({hidden}) and head_dim is not given")
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim}


def read_body(cfg: Config, source: str, *, max_positions: int, tied: bool) -> Fields:
    """Depth, vocabulary, context length and tying, with that family's HF defaults."""
    return {
        "num_hidden_layers": read_int(cfg, source, "num_hidden_layers", maximum=MAX_LAYERS),
        "vocab_size": read_int(cfg, source, "vocab_size"),
        "max_position_embeddings": read_int(cfg, source, "max_position_embeddings", max_positions),
        "tie_word_embeddings": read_bool(cfg, source, "tie_word_embeddings", tied),
    }


# The keys of `rope_scaling` that ModelSpec keeps (solver.spec.rope.RopeScaling), by rope type.
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "attention_factor", "truncate")
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings")
ROPE_KEYS = {"yarn": YARN_KEYS, "llama3": LLAMA3_KEYS}
ROPE_NAMES = {"yarn": "YaRN", "llama3": "Llama 3"}


def read_rope_and_dropout(cfg: Config, source: str) -> Fields:
    """`rope_theta`, `attention_dropout` and `hidden_dropout` where the config states them
    (any family: they change no cost; launch files write them); GPT-2-style configs name the
    dropouts `attn_pdrop` and `resid_pdrop` (GPT2Config: 0.1 each)."""
    fields: Fields = {}
    if cfg.get("rope_theta") is not None:
        fields["rope_theta"] = read_number(cfg, source, "rope_theta", 0.0, maximum=1e12)
    for field, keys in (("attention_dropout", ("attention_dropout", "attn_pdrop")),
                        ("hidden_dropout", ("hidden_dropout", "resid_pdrop"))):
        key = next((key for key in keys if cfg.get(key) is not None), None)
        if key is not None:
            fields[field] = read_number(cfg, source, key, 0.0, maximum=0.999)
    return fields


def read_rope_scaling(cfg: Config, source: str) -> Fields:
    """`rope_scaling` where its rope_type (older configs: `type`) is YaRN or Llama 3's, as its
    ROPE_KEYS; nothing for another rope type or none (absent or null)."""
    value = cfg.get("rope_scaling")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise field_error(source, "rope_scaling",
                          f"must be an object or null, got {show_value(value)}")
    rope_type = value.get("rope_type", value.get("type"))
    if rope_type not in ROPE_KEYS:
        return {}
    if "factor" not in value:
        raise field_error(source, "rope_scaling", f"a {ROPE_NAMES[rope_type]} table needs its "
                                                  "'factor'")
    return {"rope_scaling": {"rope_type": rope_type,
                             **{key: value[key] for key in ROPE_KEYS[rope_type]
                                if value.get(key) is not None}}}


def read_routed_experts(cfg: Config, source: str, *, experts_key: str, top_k_key: str,
                    width: int) -> Fields:
    experts = read_int(cfg, source, experts_key)
    top_k = read_int(cfg, source, top_k_key)
    if top_k > experts:
        raise field_error(source, top_k_key, f"{top_k} exceeds {experts_key} ({experts})")
    return {"num_experts": experts, "num_experts_per_tok": top_k, "moe_intermediate_size": width}


def moe_layout(source: str, key: str, moe_layers: list[int], num_layers: int) -> Fields | None:
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
        raise field_error(source, key, f"puts MoE blocks on layers {shown}; parplan can only model "
                                  "a dense prefix followed by MoE on every k-th layer")
    return {"first_k_dense_layers": first, "moe_layer_freq": freq}


def with_moe(dense: Fields, moe: Fields, layout: Fields | None) -> Fields:
    """The MoE fields when some layer is MoE; otherwise the model is dense (HF builds only
    plain MLPs of intermediate_size)."""
    return {**dense, **moe, **layout} if layout is not None else dense


def qwen_moe_layers(cfg: Config, source: str, num_layers: int, num_experts: int
                     ) -> tuple[str, list[int]]:
    """Qwen2Moe/Qwen3MoeDecoderLayer: layer i is sparse iff i is not in `mlp_only_layers` and
    (i + 1) % decoder_sparse_step == 0. Returns the key to blame and the sparse layers."""
    step = read_int(cfg, source, "decoder_sparse_step", 1, maximum=MAX_LAYERS)
    dense_only = read_layer_indices(cfg, source, "mlp_only_layers", num_layers)
    moe_layers = [i for i in range(num_layers)
                  if num_experts > 0 and i not in dense_only and (i + 1) % step == 0]
    return ("decoder_sparse_step" if step > 1 else "mlp_only_layers"), moe_layers
