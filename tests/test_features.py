"""Framework features declared once (solver.spec.features, issue 35 item 1): what is derived
from the declarations, the rules between features (solver.spec.feature_rules) that every
command applies alike, and the feature added through them (--moe-router-fusion)."""

from __future__ import annotations

import itertools

import pytest
from bad_input import assert_one_line_error, invoke
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_model_spec
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.layers.host_time import moe_ops_before_sync
from solver.errors import InputError
from solver.spec.feature_rules import FEATURE_RULES
from solver.spec.features import (
    FEATURE_BY_NAME,
    FEATURE_DECLARATIONS,
    FEATURES,
    MEMORY_COPIES,
    FrameworkFeatures,
)

SMALL = ("--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8")
# One candidate for optimize; the same degrees for estimate and launch.
PINNED = ("--tp", "1", "--pp", "1", "--cp", "1", "--zero", "1", "--micro-batch", "1",
          "--recompute", "none")
RULE_NAMES = {rule.name for rule in FEATURE_RULES} | {"framework_lacks_feature"}


def _other_value(name: str) -> object:
    """A value of feature `name` that is not Megatron's default."""
    feature = FEATURE_BY_NAME[name]
    default = build_framework_profile("megatron").features()[name]
    if feature.flag_kind == "switch":
        return not default
    if feature.flag_kind == "count":
        return 1
    if feature.flag_kind == "modules":
        return ("core_attn", "mlp")
    return next(value for value in feature.choices if value != default)


def _flags(name: str, value: object) -> list[str]:
    feature = FEATURE_BY_NAME[name]
    if feature.flag_kind == "switch":
        return [feature.flag if value else (feature.off_flag or "--no-" + feature.flag[2:])]
    if feature.flag_kind == "modules":
        return [feature.flag, ",".join(value)]  # type: ignore[arg-type]
    return [feature.flag, str(value)]


def test_the_override_model_and_flags_are_the_declarations() -> None:
    """FrameworkFeatures has one optional field per declaration, in their order, and every
    declared feature is a flag of estimate, optimize and launch."""
    assert tuple(FrameworkFeatures.model_fields) == FEATURES
    assert FEATURES == tuple(feature.name for feature in FEATURE_DECLARATIONS)
    for command in ("estimate", "optimize", "launch"):
        text = invoke(command, "--help").output
        missing = [f.flag for f in FEATURE_DECLARATIONS if f.flag not in text]
        assert not missing, (command, missing)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.sampled_from(MEMORY_COPIES), st.data())
def test_memory_copies_take_the_profiles_value(name: str, data: st.DataObject) -> None:
    """A feature declared memory_copy reaches MemoryOptions as the profile holds it, whatever
    value a flag sets (what memory_options derives from the declarations)."""
    feature = FEATURE_BY_NAME[name]
    if feature.flag_kind == "switch":
        value: object = data.draw(st.booleans())
    elif feature.flag_kind == "count":
        value = data.draw(st.integers(0, 12))
    elif feature.flag_kind == "modules":
        value = tuple(data.draw(st.lists(st.sampled_from(feature.choices), min_size=1,
                                         max_size=3, unique=True)))
    else:
        value = data.draw(st.sampled_from(feature.choices))
    try:
        profile = build_framework_profile("megatron", {name: value})
    except InputError:  # a value Megatron lacks (the loss implementations, fp8 all-gather)
        assert feature.unsupported.get("megatron", {}).get(
            bool(value) if feature.flag_kind == "count" else value)
        return
    assert getattr(profile.memory_options(), name) == getattr(profile.time_constants, name) \
        == value


def test_moe_router_fusion_costs_te_1883s_31_router_ops() -> None:
    """--moe-router-fusion, the feature added through its declaration: the router's host ops
    fall from 72 to 31 (TransformerEngine PR 1883, "from 72 to 31"), 41 ops per MoE layer's
    forward; off in Megatron's profile (transformer_config.py moe_router_fusion = False,
    core_v0.16)."""
    model_spec = load_model_spec("qwen3-30b-a3b")
    plain = build_framework_profile("megatron")
    fused = build_framework_profile("megatron", {"moe_router_fusion": True})
    assert plain.features()["moe_router_fusion"] is False
    assert fused.features()["moe_router_fusion"] is True
    drop = (moe_ops_before_sync(model_spec, plain.time_constants)
            - moe_ops_before_sync(model_spec, fused.time_constants))
    assert drop == pytest.approx(72 - 31)


def test_launch_writes_moe_router_fusion_as_declared() -> None:
    """Each emitter writes the setting the declaration names: Megatron's flag, Bridge's
    TransformerConfig field; without the flag neither appears."""
    feature = FEATURE_BY_NAME["moe_router_fusion"]
    args = ("launch", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
            "--ep", "8")
    for fmt in ("megatron", "megatron-bridge"):
        on = invoke(*args, "--format", fmt, "--moe-router-fusion")
        off = invoke(*args, "--format", fmt)
        assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
        assert feature.emit[fmt] in on.output
        assert feature.emit[fmt] not in off.output


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_frameworks_without_a_fused_router_refuse_it(framework: str) -> None:
    result = invoke("estimate", *SMALL, "--framework", framework, "--moe-router-fusion")
    assert_one_line_error(result, "--moe-router-fusion on", f"--framework {framework}",
                          "[framework_lacks_feature]")


def _refusal(command: str, flags: list[str]) -> str | None:
    """The one error line of `command` with `flags`, None where it answers (exit 0)."""
    extra = ("--format", "megatron") if command == "launch" else ()
    result = invoke(command, *SMALL, *PINNED, *extra, *flags)
    if result.exit_code == 0:
        return None
    assert_one_line_error(result)
    return result.stderr.strip()


def test_every_pair_of_features_is_refused_alike_by_every_command() -> None:
    """Each pair of features, each at a value other than Megatron's default: estimate,
    optimize and launch accept it or refuse it together, with the same one line, which names
    its rule (FEATURE_RULES or framework_lacks_feature) and is the library's own message.
    serve takes no framework features. At least one pair breaks each pair rule."""
    broken: set[str] = set()
    for first, second in itertools.combinations(FEATURES, 2):
        values = {first: _other_value(first), second: _other_value(second)}
        try:
            build_framework_profile("megatron", values)
            expected = None
        except InputError as error:
            expected = f"error: {error}"
            broken.add(expected.rsplit("[", 1)[-1].rstrip("]"))
        flags = _flags(first, values[first]) + _flags(second, values[second])
        answers = {command: _refusal(command, flags)
                   for command in ("estimate", "optimize", "launch")}
        assert set(answers.values()) == {expected}, (first, second, answers)
        if expected is not None:
            assert expected.endswith("]") and expected.rsplit("[", 1)[-1][:-1] in RULE_NAMES
    assert {"layer_offload_not_with_activation_offload",
            "layer_offload_not_with_cuda_graphs", "framework_lacks_feature"} <= broken
