"""Framework profiles as named, versioned feature sets (solver.spec.profiles, issue 35 item 2):
`--framework NAME@RELEASE` on estimate, optimize and launch."""

from __future__ import annotations

import json

import pytest
from bad_input import assert_one_line_error, invoke

from solver.spec.profiles import RELEASES, resolve_profile

QWEN = ("--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16")
DEGREES = ("--tp", "2", "--ep", "8", "--recompute", "full")


def test_bare_names_are_the_newest_release() -> None:
    """A bare name is the last release listed; Megatron-Bridge has at least three recipe
    releases (NeMo 25.09 e4bb622, 25.11 v0.2.0, 26.02 v0.3.0, ...)."""
    assert resolve_profile("megatron").label == "megatron@core_v0.16"
    assert resolve_profile("megatron-bridge").label == "megatron-bridge@26.06"
    assert resolve_profile("torchtitan").label == "torchtitan@0.2"
    assert resolve_profile("deepspeed").label == "deepspeed@0.19"
    assert {"25.09", "25.11", "26.02"} <= set(RELEASES["megatron-bridge"])
    # Megatron-Core's own profile sets nothing over the framework's defaults.
    assert dict(resolve_profile("megatron").features) == {}


def test_bridge_releases_carry_their_recipes() -> None:
    """Qwen3-30B-A3B's H100 recipe by release (qwen3_workload_base_configs.py,
    qwen3_llm_pretrain.py): 25.09 no moe_a2a_overlap; 26.02 the flex dispatcher's DeepEP
    backend; 26.04 HybridEP without A2A overlap; the fused router in every release; bf16
    gradient reduction for every model (cfg.ddp.grad_reduce_in_fp32 = False) and Transformer
    Engine's fused cross-entropy (GPTModelProvider cross_entropy_loss_fusion = True; the
    performance scripts' cross_entropy_fusion_impl = "te": v0.3.0 utils/overrides.py)."""
    def features(release: str, model: str = "qwen3-30b-a3b") -> dict:
        return dict(resolve_profile(f"megatron-bridge@{release}", model).features)

    assert features("25.09")["ep_comm_overlap"] is False
    assert features("26.02")["moe_dispatcher"] == "deepep"
    assert (features("26.04")["moe_dispatcher"], features("26.04")["ep_comm_overlap"]) \
        == ("hybridep", False)
    assert all(features(r)["moe_router_fusion"] for r in ("25.09", "25.11", "26.02", "26.06"))
    assert features("26.02", "llama3.1-8b") == {"grad_reduce_in_bf16": True,
                                                "tp_comm_overlap": True,
                                                "ep_comm_overlap": True,
                                                "loss_implementation": "fused"}


def test_unknown_release_is_one_line_naming_the_known_ones() -> None:
    result = invoke("estimate", *QWEN, *DEGREES, "--framework", "megatron-bridge@24.12")
    assert result.exit_code == 2
    assert "megatron-bridge@24.12" in result.output


def _estimate(*args: str) -> dict:
    result = invoke("estimate", *QWEN, *DEGREES, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_a_release_is_its_features_as_flags() -> None:
    """estimate under megatron-bridge@26.02 is estimate under megatron with the release's
    features given as flags (the profile is a feature set, nothing else), and differs from
    Megatron-Core's defaults; the JSON names the profile and each feature's source."""
    bridge = _estimate("--framework", "megatron-bridge@26.02")
    flags = _estimate("--moe-dispatcher", "deepep", "--moe-router-fusion", "--tp-comm-overlap",
                      "--ep-comm-overlap", "--grad-reduce-in-bf16", "--moe-permute-fusion",
                      "--loss-implementation", "fused")
    core = _estimate()
    assert bridge["plans"] == flags["plans"]
    assert bridge["framework_features"] == flags["framework_features"]
    assert bridge["plans"][0]["step_seconds"] < core["plans"][0]["step_seconds"]
    profile = bridge["framework_profile"]
    assert profile["name"] == "megatron-bridge@26.02" and profile["framework"] == "megatron"
    assert "v0.3.0" in profile["sources"]["moe_dispatcher"]
    assert flags["framework_profile"]["sources"]["moe_dispatcher"] == "flag"


def test_estimate_text_lists_each_feature_and_its_source() -> None:
    result = invoke("estimate", *QWEN, *DEGREES, "--framework", "megatron-bridge@26.02",
                    "--no-tp-comm-overlap")
    assert result.exit_code == 0, result.output
    assert "framework profile megatron-bridge@26.02 (runs megatron):" in result.output
    assert "--moe-dispatcher deepep: Megatron-Bridge 26.02 (v0.3.0) performance recipe of " \
           "qwen3-30b-a3b" in result.output
    assert "--tp-comm-overlap off: flag" in result.output


def test_launch_of_an_optimized_plan_writes_the_profile_it_was_costed_with(tmp_path) -> None:
    """optimize under megatron-bridge@26.02, then launch --plan: the Megatron flags of the
    release's features (what the plan's step time assumed) are written."""
    result = invoke("optimize", *QWEN, "--framework", "megatron-bridge@26.02", "--top", "1",
                    "--json")
    assert result.exit_code == 0, result.output
    plan = tmp_path / "plan.json"
    plan.write_text(result.output)
    launched = invoke("launch", "--plan", plan, "--format", "megatron")
    assert launched.exit_code == 0, launched.output
    for flag in ("--moe-router-fusion", "--grad-reduce-in-bf16",
                 "--moe-flex-dispatcher-backend deepep"):
        assert flag in launched.output, flag
    plain = invoke("launch", "--plan", plan, "--format", "megatron", "--framework", "megatron")
    assert plain.exit_code == 0 and "--moe-router-fusion" in plain.output


@pytest.mark.parametrize(("args", "needles"), [
    (("--format", "torchtitan", "--framework", "megatron-bridge@26.02"),
     ("--framework megatron-bridge@26.02 with --format torchtitan", "runs megatron")),
    (("--format", "megatron-bridge", "--framework", "megatron-bridge@25.11"),
     ("--framework megatron-bridge@25.11", "launch writes megatron-bridge 0.3")),
    (("--target", "torchtitan@0.3", "--framework", "torchtitan@0.2"),
     ("--framework torchtitan@0.2", "launch writes torchtitan 0.3")),
])
def test_launch_refuses_a_profile_its_target_does_not_run(args: tuple, needles: tuple) -> None:
    """launch --framework must run --format's framework and be the --target version."""
    assert_one_line_error(invoke("launch", *QWEN, *DEGREES, *args), *needles)


def test_launch_writes_a_releases_features_for_its_target() -> None:
    """--framework megatron-bridge@26.02 with --format megatron-bridge writes Bridge 0.3
    (v0.3.0 is NeMo 26.02) overrides with the release's features."""
    result = invoke("launch", *QWEN, *DEGREES, "--format", "megatron-bridge", "--framework",
                    "megatron-bridge@26.02")
    assert result.exit_code == 0, result.output
    for key in ("model.moe_flex_dispatcher_backend=deepep", "model.moe_router_fusion=true",
                "model.tp_comm_overlap=true", "model.overlap_moe_expert_parallel_comm=true"):
        assert key in result.output, key


def test_bridge_recipes_turn_tp_overlap_off_under_nvfp4() -> None:
    """Megatron-Bridge's Llama 3 / 3.1 recipes set `cfg.comm_overlap.tp_comm_overlap = False
    if precision == "nvfp4"` after their own CommOverlapConfig from v0.2.0 (NeMo 25.11:
    llama3/llama3_llm_pretrain.py, llama31/llama31_llm_pretrain.py), gpt-oss-120b's from
    v0.4.0 (26.04: gpt_oss/gpt_oss_llm_pretrain.py gpt_oss_120b_pretrain_config_gb200); 25.09
    (e4bb622) has no NVFP4 recipe; Qwen3's recipes keep CommOverlapConfig(tp_comm_overlap=True)
    under every precision (v0.5.0 qwen/qwen3_llm_pretrain.py)."""
    def overlap(release: str, model: str, precision: str) -> bool:
        return resolve_profile(f"megatron-bridge@{release}", model, precision
                               ).features["tp_comm_overlap"]

    assert overlap("26.02", "llama3.1-70b", "mxfp8") is True
    assert overlap("26.02", "llama3.1-70b", "nvfp4") is False
    assert overlap("25.11", "llama3.1-405b", "nvfp4") is False
    assert overlap("25.09", "llama3.1-8b", "nvfp4") is True
    assert overlap("26.02", "gpt-oss-120b", "nvfp4") is True
    assert overlap("26.04", "gpt-oss-120b", "nvfp4") is False
    assert overlap("26.06", "qwen3-30b-a3b", "nvfp4") is True
    resolved = resolve_profile("megatron-bridge@26.04", "llama3.1-8b", "nvfp4")
    assert "under nvfp4" in resolved.sources["tp_comm_overlap"]


def test_estimate_under_nvfp4_costs_the_recipes_exposed_tp_traffic() -> None:
    """estimate --framework megatron-bridge@26.04 --precision nvfp4 of llama3.1-70b at tp 4
    is estimate with --no-tp-comm-overlap (what the recipe runs), and slower than with the
    overlap the profile used to keep on; the output names the nvfp4 recipe as the source."""
    args = ("--model", "llama3.1-70b", "--cluster", "gb200-nvl72", "--gpus", "64", "--tp", "4",
            "--pp", "2", "--precision", "nvfp4", "--recompute", "full", "--json")
    bridge = invoke("estimate", *args, "--framework", "megatron-bridge@26.04")
    off = invoke("estimate", *args, "--framework", "megatron-bridge@26.04",
                 "--no-tp-comm-overlap")
    on = invoke("estimate", *args, "--framework", "megatron-bridge@26.04", "--tp-comm-overlap")
    for result in (bridge, off, on):
        assert result.exit_code == 0, result.output
    step = {name: json.loads(result.output)["plans"][0]["step_seconds"]
            for name, result in (("bridge", bridge), ("off", off), ("on", on))}
    assert step["bridge"] == step["off"] > step["on"]
    sources = json.loads(bridge.output)["framework_profile"]["sources"]
    assert "under nvfp4" in sources["tp_comm_overlap"]
