"""Hugging Face `config.json` mappings of the 2025-26 families (solver.catalog.hf's rules):
MiniMax-M2 and Qwen3.5's language models.
"""

from __future__ import annotations

from solver.catalog.hf_fields import (
    Config,
    Fields,
    field_error,
    read_attention,
    read_body,
    read_bool,
    read_int,
    read_routed_experts,
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
