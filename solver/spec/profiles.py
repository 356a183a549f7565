"""Framework profiles as named, versioned feature sets (issue 35 item 2): `--framework
NAME@RELEASE` picks the features a release turns on over its framework's defaults (the
profile of solver.cost.step.frameworks); a bare name is the newest release.

  megatron@core_v0.16       Megatron-Core's own defaults, as `launch --format megatron` starts it
  megatron-bridge@25.09 ... Megatron-Bridge's H100 performance recipes of that NeMo release
  torchtitan@0.2            torchtitan's v0.2.x defaults
  deepspeed@0.19            DeepSpeed with Megatron-DeepSpeed
  generic                   no framework's own choices

A Megatron-Bridge release runs Megatron-Core (its framework is megatron): its features are
flags over Megatron's profile, so `launch` writes each one, and every output lists them with
their sources (feature_sources). The releases' dates and tags: NeMo 25.09 is
NVIDIA-NeMo/Megatron-Bridge e4bb622 (scripts/performance/run_script.py, configs/*/*.yaml),
25.11 tag v0.2.0, 26.02 v0.3.0, 26.04 v0.4.0, 26.06 v0.5.0
(scripts/performance/configs/<family>/*_llm_pretrain.py, *workload_base_configs.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from solver.errors import InputError


@dataclass(frozen=True)
class Release:
    """One release of a framework profile: the `framework` whose code runs (one of
    solver.spec.job.FRAMEWORKS), the features it sets for every model and where each comes
    from, the features its recipe for a model sets over those (`models`: zoo name -> features,
    with `model_sources`), what a model's recipe sets last under a training precision
    (`precision_models`: precision -> zoo name -> features, with `precision_sources` by
    precision), and the `launch` target version whose settings it runs ("" where launch
    writes none of its own)."""

    framework: str
    features: Mapping[str, Any] = field(default_factory=dict)
    sources: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    model_sources: Mapping[str, str] = field(default_factory=dict)
    precision_models: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(
        default_factory=dict)
    precision_sources: Mapping[str, str] = field(default_factory=dict)
    target: str = ""


# What every Megatron-Bridge H100 performance recipe sets, in every release read (25.09
# e4bb622 configs/*/*.yaml; v0.2.0-v0.5.0 configs/<family>/*_llm_pretrain.py):
#   grad_reduce_in_bf16  `cfg.ddp.grad_reduce_in_fp32 = False` for every model
#   tp_comm_overlap      CommOverlapConfig(tp_comm_overlap=True) on H100 (off under nvfp4 and
#                        for the models below); the cost model overlaps only where tp > 1
#   ep_comm_overlap      EP all-to-all overlap for MoE models ("EP A2A communication overlap
#                        with computation in both 1F1B pipelining and non-pipelined
#                        training", changelog 0.1.0; moe_a2a_overlap=True), but the models below
#   loss_implementation  Transformer Engine's fused cross-entropy: the providers fuse the loss
#                        (GPTModelProvider cross_entropy_loss_fusion = True; off only in the
#                        fine-tuning recipes) and the performance scripts pick TE's kernel
#                        (cross_entropy_fusion_impl: "te" in 25.09's configs/*/*.yaml; v0.2.0
#                        utils/helpers.py, v0.3.0-v0.5.0 utils/overrides.py
#                        `recipe.model.cross_entropy_fusion_impl = "te"` for every recipe)
BRIDGE_RECIPE_FEATURES = {"grad_reduce_in_bf16": True, "tp_comm_overlap": True,
                          "ep_comm_overlap": True, "loss_implementation": "fused"}
_BRIDGE_SOURCES = {
    "grad_reduce_in_bf16": "cfg.ddp.grad_reduce_in_fp32 = False (scripts/performance/configs)",
    "tp_comm_overlap": "CommOverlapConfig(tp_comm_overlap=True), H100 recipes",
    "ep_comm_overlap": "moe_a2a_overlap=True, MoE recipes (changelog 0.1.0)",
    "loss_implementation": "cross_entropy_loss_fusion = True (GPTModelProvider) with "
                           "cross_entropy_fusion_impl = \"te\" (scripts/performance)"}
# Each release's recipe for a MoE model, where it differs from the above:
#   deepseek-v3   25.09: DeepEP on H100 (`enable_deepep = gpu in ["h100"]`), EP all-to-all overlap
#                 (`A2A_1F1B`), recompute_modules ["mla_up_proj", "mlp"], moe_router_fusion:
#                 true (configs/deepseek/deepseek_v3_llm_pretrain.yaml)
#   qwen3-235b    25.09: tp_comm_overlap only (no overlap_moe_expert_parallel_comm); from 25.11
#                 moe_a2a_overlap=True and CommOverlapConfig(tp_comm_overlap=False) on H100
#                 (qwen3_235b_a22b_*h100* in qwen3_llm_pretrain.py, v0.2.0-v0.5.0)
#   qwen3-30b     25.09: tp_comm_overlap only; 25.11-26.02 (pp 2, vp 12) moe_a2a_overlap=True,
#                 26.02 with the flex dispatcher's DeepEP backend (qwen3_workload_base_configs.py
#                 QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1: moe_flex_dispatcher_backend);
#                 26.04-26.06 (ep 16, pp 1) moe_a2a_overlap=False with the flex dispatcher's
#                 HybridEP backend (qwen3_llm_pretrain.py: moe_token_dispatcher_type = "flex")
#   qwen3 (both)  every release: moe_router_fusion=True (25.09 configs/qwen3/*.yaml model:
#                 moe_router_fusion: true; v0.2.0-v0.5.0 qwen3_llm_pretrain.py
#                 set_qwen3_common_configs)
#   nemotron-3-nano  26.02-26.06: the flex dispatcher's HybridEP backend, no moe_a2a_overlap
#                 (nemotron_3_nano_workload_base_configs.py BASE_NEMOTRON_3_NANO_CONFIG
#                 moe_flex_dispatcher_backend="hybridep"; read at 0011573)
#   gpt-oss-120b  25.11-26.06: no moe_a2a_overlap (GPT_OSS_120B_..._H100_BF16 sets pp 4 and
#                 recompute_modules ["layernorm", "moe_act"] only; the field defaults to False;
#                 v0.2.0 workload_base_configs.py, v0.3.0-v0.5.0
#                 gpt_oss_workload_base_configs.py)
#   every MoE model  every release: moe_permute_fusion=True, set by the model's provider and
#                 kept by the recipes (25.09 e4bb622 and v0.2.0-v0.3.0 qwen_provider.py
#                 Qwen3MoEModelProvider, gpt_oss_provider.py, nemotron_h_provider.py
#                 `moe_permute_fusion: bool = True`, deepseek_provider.py
#                 `is_te_min_version("2.1.0")` and recipes/deepseek/deepseek_v3.py
#                 `moe_permute_fusion = True`; v0.4.0-v0.5.0 qwen3_moe_bridge.py,
#                 gpt_oss_bridge.py, nemotron_h_bridge.py `provider.moe_permute_fusion = True`;
#                 v0.5.0 turns it off for gpt-oss-20b only, set_gpt_oss_20b_common_configs)
_MOE = {"moe_permute_fusion": True}
_QWEN3 = {**_MOE, "moe_router_fusion": True}
_QWEN3_235B = {**_QWEN3, "tp_comm_overlap": False}
_NEMOTRON_3_NANO = {**_MOE, "ep_comm_overlap": False, "moe_dispatcher": "hybridep"}
_GPT_OSS_120B = {**_MOE, "ep_comm_overlap": False,
                 "recompute_modules": ("layernorm", "moe_act")}
_QWEN3_30B_HYBRIDEP = {**_QWEN3, "ep_comm_overlap": False, "moe_dispatcher": "hybridep"}
_BRIDGE_MODELS: dict[str, dict[str, dict[str, Any]]] = {
    "25.09": {"deepseek-v3": {**_MOE, "moe_dispatcher": "deepep",
                              "recompute_modules": ("mla_up_proj", "mlp"),
                              "moe_router_fusion": True},
              "qwen3-235b-a22b": {**_QWEN3, "ep_comm_overlap": False},
              "qwen3-30b-a3b": {**_QWEN3, "ep_comm_overlap": False}},
    "25.11": {"qwen3-235b-a22b": _QWEN3_235B, "qwen3-30b-a3b": _QWEN3,
              "gpt-oss-120b": _GPT_OSS_120B},
    "26.02": {"qwen3-235b-a22b": _QWEN3_235B,
              "qwen3-30b-a3b": {**_QWEN3, "moe_dispatcher": "deepep"},
              "nemotron-3-nano-30b-a3b": _NEMOTRON_3_NANO, "gpt-oss-120b": _GPT_OSS_120B},
    **{release: {"qwen3-235b-a22b": _QWEN3_235B, "qwen3-30b-a3b": _QWEN3_30B_HYBRIDEP,
                 "nemotron-3-nano-30b-a3b": _NEMOTRON_3_NANO, "gpt-oss-120b": _GPT_OSS_120B}
       for release in ("26.04", "26.06")},
}
# What a recipe sets last under a precision: its Llama 3 / 3.1 recipes turn TP communication
# overlap off under NVFP4 from 25.11 (`cfg.comm_overlap.tp_comm_overlap = False if precision ==
# "nvfp4" else ...` after the recipe's own CommOverlapConfig: v0.2.0 llama3/llama3_llm_pretrain.py
# llama3_8b_*/llama3_70b_* and llama31/llama31_llm_pretrain.py llama31_405b_* configs; v0.3.0-
# v0.5.0 llama/llama3_llm_pretrain.py, llama/llama31_llm_pretrain.py), and gpt-oss-120b's from
# 26.04 (v0.4.0-v0.5.0 gpt_oss/gpt_oss_llm_pretrain.py gpt_oss_120b_pretrain_config_gb200).
# Bridge's Llama 3 8B / 70B recipes are the zoo's llama3.1-8b / -70b (one architecture; 3.1
# changes only the RoPE scaling). 25.09 (e4bb622) has no NVFP4 recipe.
_NVFP4_OFF = {"tp_comm_overlap": False}
_LLAMA3 = ("llama3.1-8b", "llama3.1-70b", "llama3.1-405b")
_BRIDGE_NVFP4_MODELS: dict[str, tuple[str, ...]] = {
    "25.09": (), "25.11": _LLAMA3, "26.02": _LLAMA3,
    "26.04": (*_LLAMA3, "gpt-oss-120b"), "26.06": (*_LLAMA3, "gpt-oss-120b")}
# Per-tensor FP8 (`--precision fp8`) as the recipes run it on H100: current scaling ("fp8_cs",
# Float8CurrentScaling) for both Qwen3 MoE models in every release and DeepSeek-V3's 25.09
# recipe: the 25.09 yamls' h100 perf_matrix lists fp8_cs (DeepSeek-V3 also fp8_ss, the
# blockwise variant), v0.2.0-v0.5.0 ship only *_H100_FP8_CS_* presets for them
# (workload_base_configs.py, qwen3_workload_base_configs.py).
_FP8_CS = {"fp8_current_scaling": True}
_QWEN3_MOE = ("qwen3-235b-a22b", "qwen3-30b-a3b")
_BRIDGE_FP8_CS_MODELS: dict[str, tuple[str, ...]] = {
    "25.09": (*_QWEN3_MOE, "deepseek-v3"),
    **{release: _QWEN3_MOE for release in ("25.11", "26.02", "26.04", "26.06")}}
# The Megatron-Bridge package each NeMo release ships (its git tag), where `launch` writes it.
_BRIDGE_TAGS = {"25.09": "e4bb622", "25.11": "v0.2.0", "26.02": "v0.3.0", "26.04": "v0.4.0",
                "26.06": "v0.5.0"}
_BRIDGE_TARGETS = {"26.02": "0.3"}

# Releases of each profile, oldest first: the last is what a bare name means.
RELEASES: dict[str, dict[str, Release]] = {
    "megatron": {"core_v0.16": Release(framework="megatron", target="core_v0.16")},
    "megatron-bridge": {
        release: Release(
            framework="megatron", features=BRIDGE_RECIPE_FEATURES,
            sources={name: f"{source}, Megatron-Bridge {release} ({_BRIDGE_TAGS[release]})"
                     for name, source in _BRIDGE_SOURCES.items()},
            models=models,
            model_sources={model: f"Megatron-Bridge {release} ({_BRIDGE_TAGS[release]}) "
                                  f"performance recipe of {model}" for model in models},
            precision_models={
                "nvfp4": {model: _NVFP4_OFF for model in _BRIDGE_NVFP4_MODELS[release]},
                "fp8": {model: _FP8_CS for model in _BRIDGE_FP8_CS_MODELS[release]}},
            precision_sources={
                precision: f"Megatron-Bridge {release} ({_BRIDGE_TAGS[release]}) performance "
                           f"recipe under {precision}" for precision in ("nvfp4", "fp8")},
            target=_BRIDGE_TARGETS.get(release, ""))
        for release, models in _BRIDGE_MODELS.items()},
    "torchtitan": {"0.2": Release(framework="torchtitan", target="0.2")},
    "deepspeed": {"0.19": Release(framework="deepspeed", target="0.19")},
    "generic": {"": Release(framework="generic")},
}


def profile_names() -> tuple[str, ...]:
    """Every NAME@RELEASE (and bare NAME) `--framework` takes."""
    return tuple(name for family, releases in RELEASES.items()
                 for name in (family, *(f"{family}@{r}" for r in releases if r)))


@dataclass(frozen=True)
class ResolvedProfile:
    """A `--framework` value resolved: the profile's `label` (NAME@RELEASE), the framework
    whose code runs, the features the release sets for this model (what a flag may still
    override), and where each comes from."""

    label: str
    framework: str
    release: Release
    features: Mapping[str, Any]
    sources: Mapping[str, str]


def resolve_profile(text: str, model_name: str | None = None, precision: str | None = None
                    ) -> ResolvedProfile:
    """`--framework NAME[@RELEASE]` for a model of the zoo named `model_name` (its recipe's
    features where the release has one) trained in `precision` (what the recipe sets last under
    it: megatron-bridge@26.02's llama3.1-70b under nvfp4 turns TP overlap off); an unknown name
    or release is an InputError that lists the known ones."""
    family, _, release = text.partition("@")
    if family not in RELEASES:
        raise InputError(f"--framework {text}: unknown framework ({', '.join(RELEASES)})")
    releases = RELEASES[family]
    release = release or list(releases)[-1]
    if release not in releases:
        known = ", ".join(f"{family}@{r}" for r in releases if r) or family
        raise InputError(f"--framework {text}: unknown release of {family} ({known})")
    chosen = releases[release]
    model = model_name or ""
    model_features = chosen.models.get(model, {})
    precision_features = chosen.precision_models.get(precision or "", {}).get(model, {})
    sources = {**chosen.sources,
               **{name: chosen.model_sources[model] for name in model_features},
               **{name: f"{chosen.precision_sources[precision or '']} of {model}"
                  for name in precision_features}}
    label = f"{family}@{release}" if release else family
    return ResolvedProfile(label=label, framework=chosen.framework, release=chosen,
                           features={**chosen.features, **model_features, **precision_features},
                           sources=sources)


def feature_sources(resolved: ResolvedProfile, given: Mapping[str, Any]
                    ) -> dict[str, tuple[Any, str]]:
    """Each feature the release or a flag sets (`given`: the release's features with the
    flags' over them): its value and where it comes from, the release's source or "flag"."""
    out: dict[str, tuple[Any, str]] = {}
    for name, value in given.items():
        from_release = name in resolved.features and resolved.features[name] == value
        out[name] = (value, resolved.sources[name] if from_release else "flag")
    return out


def render_profile_json(resolved: ResolvedProfile, given: Mapping[str, Any] | None = None
                        ) -> dict[str, Any]:
    """The profile in JSON answers: its name, the framework that runs, and the source of each
    feature its release (or, in `given`, a flag) sets."""
    sources = feature_sources(resolved, resolved.features if given is None else given)
    return {"name": resolved.label, "framework": resolved.framework,
            "sources": {name: source for name, (_, source) in sources.items()}}
