"""The rules between framework features, each named once (issue 35 item 1): a feature value
a framework lacks (the declarations' `unsupported`, rule `framework_lacks_feature`) and pairs
of features that do not run together (FEATURE_RULES). `estimate`, `optimize`, `launch` and the
search's ladders all ask `refuse_features`, so they refuse the same combinations with the same
one-line message, which ends in the rule's name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from solver.spec.features import FEATURE_BY_NAME


@dataclass(frozen=True)
class FeatureRule:
    """Two features that do not run together: `refuses(values)` on the profile's feature
    values (every feature present), `message` says why with its source."""

    name: str
    features: tuple[str, str]
    refuses: Callable[[Mapping[str, Any]], bool]
    message: str


def _pure(values: Mapping[str, Any]) -> bool:
    return values["training_states"] != "mixed"


FEATURE_RULES: tuple[FeatureRule, ...] = (
    FeatureRule(
        "layer_offload_not_with_activation_offload",
        ("cpu_offloading_num_layers", "activation_offload"),
        lambda v: bool(v["cpu_offloading_num_layers"]) and v["activation_offload"],
        "Megatron refuses layer-level CPU offloading with fine-grained activation offloading "
        "(transformer_config.py: \"fine_grained_activation_offloading cannot be enabled with "
        "cpu_offloading\")"),
    FeatureRule(
        "layer_offload_not_with_cuda_graphs", ("cpu_offloading_num_layers", "cuda_graphs"),
        lambda v: bool(v["cpu_offloading_num_layers"]) and v["cuda_graphs"],
        "Megatron refuses layer-level CPU offloading with per-layer CUDA graphs "
        "(transformer_config.py __post_init__)"),
    FeatureRule(
        "low_states_not_with_precision_aware_optimizer",
        ("training_states", "precision_aware_optimizer"),
        lambda v: _pure(v) and v["precision_aware_optimizer"],
        "the precision-aware optimizer keeps its own bf16 moments beside an fp32 master"),
    FeatureRule(
        "low_states_not_with_optimizer_offload", ("training_states", "optimizer_offload"),
        lambda v: _pure(v) and v["optimizer_offload"],
        "the host optimizers (DeepSpeedCPUAdam, Megatron's CPU AdamW) step fp32 states only"),
)


def render_feature_value(value: Any) -> str:
    """A feature value as its flag takes it: on / off, a number, names joined by commas."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(str(item) for item in value)
    return str(value)


def _lacks(framework: str, name: str, value: Any) -> str | None:
    feature = FEATURE_BY_NAME[name]
    key = bool(value) if feature.flag_kind == "count" else value
    return feature.unsupported.get(framework, {}).get(key)


def refuse_features(framework: str, values: Mapping[str, Any],
                    given: tuple[str, ...] | None = None) -> str | None:
    """The one-line message of the first rule `values` (a profile's feature values) break
    under `framework`, or None: a value the framework lacks among the `given` features (all
    where None), then FEATURE_RULES in order. Each message names the flags, the rule and the
    framework."""
    for name in given if given is not None else tuple(values):
        if name in FEATURE_BY_NAME:
            why = _lacks(framework, name, values[name])
            if why:
                flag = FEATURE_BY_NAME[name].flag
                return (f"{flag} {render_feature_value(values[name])}: {why} (--framework "
                        f"{framework}) [framework_lacks_feature]")
    for rule in FEATURE_RULES:
        if all(name in values for name in rule.features) and rule.refuses(values):
            flags = " with ".join(f"{FEATURE_BY_NAME[name].flag} "
                                  f"{render_feature_value(values[name])}"
                                  for name in rule.features)
            return f"{flags}: {rule.message} [{rule.name}]"
    return None
