"""Hugging Face `config.json` -> ModelSpec fields for NVIDIA's Nemotron-H family (model_type
nemotron_h: Nemotron-H, Nemotron Nano 2, Nemotron 3), whose layers each hold one block: a
Mamba-2 mixer, attention, an MLP or a MoE. Registered in solver.catalog.hf, following the rules
stated there.
"""

from __future__ import annotations

from solver.catalog.hf_fields import (ABSENT, MAX_LAYERS, Config, Fields, field_error,
    read_attention, read_body, read_bool, read_int, read_mtp, read_routed_experts,
    show_value)

NEMOTRON_LETTERS = {"M": ("mamba", "none"), "*": ("full_attention", "none"),
                    "-": ("none", "dense"), "E": ("none", "moe")}
# transformers NemotronHConfig._pattern_to_list names, and the legacy names
# remap_legacy_layer_types turns into them (configuration_utils: mamba, attention).
NEMOTRON_BLOCK_TYPES = {"linear_attention": "M", "mamba": "M", "full_attention": "*",
                        "attention": "*", "mlp": "-", "moe": "E"}


def _nemotron_block_types(cfg: Config, source: str) -> list[tuple[str, str]]:
    """`layers_block_type`: one name per layer, as NemotronHConfig writes it."""
    key, blocks = "layers_block_type", []
    for item in cfg[key]:
        if not isinstance(item, str) or item not in NEMOTRON_BLOCK_TYPES:
            raise field_error(source, key, f"entries must be one of "
                                           f"{', '.join(NEMOTRON_BLOCK_TYPES)}; got "
                                           f"{show_value(item)}")
        blocks.append(NEMOTRON_LETTERS[NEMOTRON_BLOCK_TYPES[item]])
    if not blocks:
        raise field_error(source, key, "must list at least one layer")
    return blocks


def _nemotron_pattern(cfg: Config, source: str, num_layers: int) -> list[tuple[str, str]]:
    key = "hybrid_override_pattern"
    pattern = cfg.get(key, ABSENT)
    if not isinstance(pattern, str):
        raise field_error(source, key, f"required string of M, *, - and E (or the list "
                                       f"layers_block_type) is "
                                       f"{'missing' if pattern is ABSENT else show_value(pattern)}")
    if len(pattern) != num_layers:
        raise field_error(source, key, f"has {len(pattern)} letters but num_hidden_layers is "
                                       f"{num_layers}")
    bad = sorted(set(pattern) - set(NEMOTRON_LETTERS))
    if bad:
        raise field_error(source, key, f"letters must be M (Mamba-2), * (attention), - (MLP) "
                                       f"or E (MoE); got {bad[0]!r}")
    return [NEMOTRON_LETTERS[letter] for letter in pattern]


def map_nemotron_h(cfg: Config, source: str) -> Fields:
    """NemotronHForCausalLM (transformers models/nemotron_h): every layer is ONE block behind
    one RMSNorm, chosen by `hybrid_override_pattern` or, in the configs the newer
    NemotronHConfig writes, the list `layers_block_type` (M NemotronHMamba2Mixer, * NemotronH
    Attention without biases, - NemotronHMLP: up and down projections with squared ReLU, E
    NemotronHMoE: a router with e_score_correction_bias, n_routed_experts NemotronHMLP experts
    of moe_intermediate_size and a shared NemotronHMLP of
    moe_shared_expert_intermediate_size). Mamba: mamba_num_heads x mamba_head_dim, n_groups,
    ssm_state_size, conv_kernel (4), chunk_size (128), use_conv_bias (true), projections biased
    by mamba_proj_bias (HF's `use_bias`). LatentMoE (Nemotron 3 Super and Ultra):
    `moe_latent_size` set, the experts work at that width between fc1_latent_proj and
    fc2_latent_proj; null or absent, at hidden_size."""
    listed = "hybrid_override_pattern" not in cfg and isinstance(cfg.get("layers_block_type"),
                                                                  list)
    if listed:  # NemotronHConfig takes the depth from the list (num_hidden_layers deprecated)
        blocks = _nemotron_block_types(cfg, source)
        cfg = {**cfg, "num_hidden_layers": len(blocks)}
    num_layers = read_int(cfg, source, "num_hidden_layers", maximum=MAX_LAYERS)
    if not listed:
        blocks = _nemotron_pattern(cfg, source, num_layers)
    if "head_dim" not in cfg and "attention_head_dim" in cfg:
        cfg = {**cfg, "head_dim": cfg["attention_head_dim"]}
    mixers = {mixer for mixer, _ in blocks}
    mlps = {mlp for _, mlp in blocks}
    bias_key = "mamba_proj_bias" if "mamba_proj_bias" in cfg else "use_bias"
    fields: Fields = {
        **read_body(cfg, source, max_positions=4096, tied=False),
        **read_attention(cfg, source, kv_default=8, head_dim_default=128),
        "intermediate_size": read_int(cfg, source, "intermediate_size"),
        "mlp_type": "plain",
        "mlp_bias": read_bool(cfg, source, "mlp_bias", False),
        "norms_per_layer": 1,
        "layer_types": tuple(mixer for mixer, _ in blocks),
        "mlp_layer_types": tuple(mlp for _, mlp in blocks),
    }
    if read_bool(cfg, source, "attention_bias", False):
        fields.update(qkv_bias=True, o_bias=True)
    if "mamba" in mixers:
        fields.update(
            mamba_num_heads=read_int(cfg, source, "mamba_num_heads"),
            mamba_head_dim=read_int(cfg, source, "mamba_head_dim"),
            n_groups=read_int(cfg, source, "n_groups"),
            ssm_state_size=read_int(cfg, source, "ssm_state_size"),
            conv_kernel=read_int(cfg, source, "conv_kernel", 4),
            chunk_size=read_int(cfg, source, "chunk_size", 128),
            use_conv_bias=read_bool(cfg, source, "use_conv_bias", True),
            mamba_proj_bias=read_bool(cfg, source, bias_key, False))
        if fields["mamba_num_heads"] % fields["n_groups"]:
            raise field_error(source, "n_groups", f"{fields['n_groups']} must divide "
                                                  f"mamba_num_heads ({fields['mamba_num_heads']})")
    if "moe" in mlps:
        fields.update(
            **read_routed_experts(cfg, source, experts_key="n_routed_experts",
                                  top_k_key="num_experts_per_tok",
                                  width=read_int(cfg, source, "moe_intermediate_size")),
            router_bias=True)
        latent = read_int(cfg, source, "moe_latent_size", None, nullable=True)
        if latent is not None:
            fields["moe_latent_size"] = latent
        shared = read_int(cfg, source, "n_shared_experts", 1, minimum=0)
        if shared:
            fields.update(num_shared_experts=1, shared_expert_intermediate_size=shared * read_int(
                cfg, source, "moe_shared_expert_intermediate_size"))
    # Megatron-Bridge's defaults for a nemotron_h config.json without the keys
    # (nemotron_h_bridge.py: mtp_use_repeated_layer True, mtp_loss_scaling_factor 0.3).
    fields.update(read_mtp(cfg, source, repeated=True, loss_scale=0.3))
    return fields
