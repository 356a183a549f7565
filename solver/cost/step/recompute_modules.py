"""The module sets the search tries for Megatron's `--recompute-granularity selective`
(`--recompute-modules`), cheapest first: a knob between recomputing nothing and recomputing
whole layers, which the Megatron-Bridge performance recipes use instead of full recompute
(scripts/performance/configs/deepseek/deepseek_workload_base_configs.py @0426418:
DeepSeek-V3 recipes recompute ["mla_up_proj"], ["moe_act"], ["mlp"], ["mla_up_proj", "mlp"] or
["mla_up_proj", "layernorm", "moe_act"] per GPU and precision).

What each module drops is solver.cost.memory.activations.estimate_module_recompute_bytes, what
it costs solver.cost.layers.layer_time._estimate_selective_s; this module only says which sets are
worth a search:

  light   core_attn, and for MoE layers moe_act and layernorm: element-wise re-runs only,
          which the step-time model does not charge (so the light set never loses to
          core_attn alone, and replaces it), save a SwiGLU limit's eager clamp (gpt-oss:
          solver.cost.layers.moe_eager)
  then    the modules that re-run GEMMs, added one at a time, most bytes saved per GEMM
          parameter re-run first: mla_up_proj (MLA's per-head Q, K and V: DeepSeek-V3 drops
          128 x (2 x 192 + 128) x 2 B = 131,072 B per token for 54.5M up-projection
          parameters, 2.4e-3 B per token and parameter), then mlp (the dense MLPs: every
          layer of a dense model, the first layers of DeepSeek-style MoE) and shared_experts
          (an MLP's interior against its three matrices: 4F B per token in bf16 for 3hF
          parameters, 4 / (3 x 7168) = 1.9e-4 at DeepSeek-V3's width), mlp first as the
          recipes do.
Each set holds the one before, so it needs no more memory and no less time.

A set whose selective level equals recomputing nothing is dropped (core_attn alone under
FlashAttention, whose backward recomputes the attention core anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from solver.cost.step.frameworks import FrameworkProfile
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ModelSpec
from solver.spec.features import FrameworkFeatures
from solver.spec.framework import RecomputeModule

# The frameworks whose selective recompute takes a module list (Megatron's --recompute-modules).
MODULE_RECOMPUTE_FRAMEWORKS = ("megatron",)


def recompute_module_sets(model_spec: ModelSpec, framework: str, constants: TimeConstants,
                          overrides: FrameworkFeatures | Mapping[str, Any] | None = None
                          ) -> tuple[tuple[RecomputeModule, ...], ...]:
    """The module sets the search tries for `--recompute selective`, cheapest first (module
    docstring); () where the framework has no module list, its selective recompute is not the
    attention core's (torchtitan's op level), or a flag fixed the list.
    Worked examples: Llama-3.1-8B (dense, FlashAttention): (core_attn, mlp) only;
    DeepSeek-V3: (core_attn, moe_act, layernorm), then with mla_up_proj, then mlp, then
    shared_experts added."""
    given = overrides.given() if isinstance(overrides, FrameworkFeatures) else (overrides or {})
    if (framework not in MODULE_RECOMPUTE_FRAMEWORKS or "recompute_modules" in given
            or constants.selective_recompute != "attention_core"):
        return ()
    m = model_spec
    light: tuple[RecomputeModule, ...] = ("core_attn",)
    if m.is_moe:
        light += ("moe_act", "layernorm")
    sets = [light]
    heavier: list[RecomputeModule] = []
    if m.is_mla:
        heavier.append("mla_up_proj")
    if not m.is_moe or m.num_dense_layers:
        heavier.append("mlp")
    if m.is_moe and m.num_shared_experts:
        heavier.append("shared_experts")
    for module in heavier:
        sets.append(sets[-1] + (module,))
    if light == ("core_attn",) and constants.flash_attention:
        sets = sets[1:]
    return tuple(sets)


def with_default_recompute_modules(profile: FrameworkProfile, model_spec: ModelSpec,
                                   overrides: FrameworkFeatures | Mapping[str, Any] | None = None
                                   ) -> FrameworkProfile:
    """`profile` with what `--recompute selective` recomputes on `model_spec` by default: the
    first set the search tries (recompute_module_sets), or the profile's own where there is no
    search (a --recompute-modules flag, torchtitan's op level, no module list). The one
    definition `estimate`, `optimize` and `launch` share, so that "selective" is one module set
    per profile and model. Llama-3.1-8B under Megatron with FlashAttention: (core_attn, mlp),
    core_attn alone being no recompute at all (FlashAttention's backward recomputes the
    scores anyway)."""
    sets = recompute_module_sets(model_spec, profile.name, profile.time_constants, overrides)
    if not sets:
        return profile
    return profile.model_copy(update={"time_constants": profile.time_constants.model_copy(
        update={"recompute_modules": sets[0]})})


def named_recompute_modules(constants: TimeConstants, recompute: str) -> tuple[str, ...]:
    """The module set a plan at `recompute` names (Plan.recompute_modules): the profile's
    under selective recompute of Megatron's modules (attention_core), () otherwise (none and
    full recompute no module set; torchtitan's op level has none)."""
    if recompute != "selective" or constants.selective_recompute != "attention_core":
        return ()
    return tuple(constants.recompute_modules)
