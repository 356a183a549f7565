"""--moe-permute-fusion (issue 35 item 3), added through its declaration (docs/adding_a_feature.md):
the token permutation's traffic (solver.cost.layers.moe_eager.estimate_permuted_elements_per_token)
pinned to Megatron-Core core_v0.16 moe_utils.py permute / unpermute (unfused: index_select, then
scatter_add_) and TransformerEngine transformer_engine/common/triton/permutation.py at d0067d0
(fused: _permute_kernel reads a token once and writes its k copies, _unpermute_kernel reads the k
copies and writes the token once); the Megatron-Bridge releases whose MoE recipes turn it on;
what launch writes; the frameworks that refuse it."""

from __future__ import annotations

import numpy as np
import pytest
from bad_input import assert_one_line_error, invoke
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.kernels.efficiency import ComputeConstants, estimate_elementwise_s
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.layers.moe_eager import estimate_permuted_elements_per_token
from solver.cost.step.frameworks import build_framework_profile
from solver.spec import JobSpec
from solver.spec.features import FEATURE_BY_NAME
from solver.spec.profiles import RELEASES, resolve_profile

BF16_BYTES = 2.0


def test_worked_number_qwen3_30b() -> None:
    """The docstring's number: Qwen3-30B-A3B (k 8, h 2048, bf16). Unfused: index_select reads and
    writes 8 copies, scatter_add_ reads 8 copies and writes 8 adds: 32 widths, 131.1 kB a token;
    TE's fused kernels 8 + 1 each way: 18 widths, 73.7 kB. Next to a measured fused MoE kernel
    (which permutes in the same two passes) the unfused path leaves 14 widths, 57.3 kB."""
    spec = load_model_spec("qwen3-30b-a3b")
    k, h = spec.num_experts_per_tok, spec.moe_token_width
    assert (k, h) == (8, 2048)
    unfused = estimate_permuted_elements_per_token(k, False)
    fused = estimate_permuted_elements_per_token(k, True)
    assert (unfused, fused) == (32.0, 18.0)
    assert unfused * h * BF16_BYTES == pytest.approx(131.1e3, rel=1e-3)
    assert fused * h * BF16_BYTES == pytest.approx(73.7e3, rel=1e-3)
    assert estimate_permuted_elements_per_token(k, False, measured_kernel=True) == 14.0
    assert estimate_permuted_elements_per_token(k, True, measured_kernel=True) == 0.0


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 64))
def test_fusion_never_streams_more(k: int) -> None:
    """2k + 2 <= 4k for every k >= 1 (equal at top-1: one copy a token either way), and the
    excess over a measured kernel is never negative."""
    fused = estimate_permuted_elements_per_token(k, True)
    unfused = estimate_permuted_elements_per_token(k, False)
    assert fused <= unfused
    assert (fused == unfused) == (k == 1)
    assert estimate_permuted_elements_per_token(k, False, measured_kernel=True) >= 0.0


def _moe_parts(measured: bool, fusion: bool) -> dict[str, float]:
    cluster = load_cluster_spec("dgx-h100")
    if not measured:  # the datasheet path: no kernel table, no measured fused MoE kernel
        cluster = cluster.model_copy(update={"gpu": cluster.gpu.model_copy(
            update={"kernel_table": None})})
    constants = build_framework_profile(
        "megatron", {"moe_permute_fusion": fusion}).time_constants
    d = {key: np.array([value]) for key, value in
         dict(tp=1.0, cp=1.0, ep=8.0, etp=1.0, micro_batch=1.0).items()}
    parts = estimate_layer_compute_s(load_model_spec("qwen3-30b-a3b"), cluster,
                                     JobSpec(seq_len=4096, global_batch=1280), d, constants)
    return {name: float(parts["moe"][name][0])
            for name in ("elementwise", "routed", "routed_bwd")}


def test_the_switch_removes_exactly_that_traffic_on_the_datasheet_path() -> None:
    """Without a kernel table the permutation is element-wise traffic: the switch saves
    32 - 18 = 14 widths for each of the 4,096 tokens, times the traffic factor, streamed at
    the H100's HBM fraction; the routed experts do not change."""
    unfused, fused = _moe_parts(False, False), _moe_parts(False, True)
    gpu, cc = load_cluster_spec("dgx-h100").gpu, ComputeConstants()
    bytes_saved = 4096 * (32.0 - 18.0) * 2048 * BF16_BYTES
    expected = float(estimate_elementwise_s(gpu, bytes_saved, cc)
                     - estimate_elementwise_s(gpu, 0.0, cc))
    assert unfused["elementwise"] - fused["elementwise"] == pytest.approx(expected, rel=1e-9)
    assert unfused["routed"] == fused["routed"]


def test_next_to_the_measured_kernel_only_the_unfused_excess_is_paid() -> None:
    """On the H100's kernel table (the measured fused MoE kernel permutes itself) the unfused
    path's 2k - 2 = 14 widths are a pure copy in each pass (4,096 x 14 x 2,048 x 2 B =
    234.9 MB, 0.0876 ms at 0.8 x 3.35 TB/s); fused, nothing; the element-wise part does not
    change."""
    unfused, fused = _moe_parts(True, False), _moe_parts(True, True)
    copy_bytes = 4096 * 14 * 2048 * BF16_BYTES
    assert copy_bytes == pytest.approx(234.9e6, rel=1e-3)
    expected = copy_bytes / (0.8 * 3350e9)
    assert expected == pytest.approx(0.0876e-3, rel=1e-3)
    for name in ("routed", "routed_bwd"):
        assert unfused[name] - fused[name] == pytest.approx(expected, rel=1e-6)
    assert unfused["elementwise"] == fused["elementwise"]


def test_megatron_default_is_off_and_bridge_moe_recipes_turn_it_on() -> None:
    """Megatron-Core's default is off (transformer_config.py moe_permute_fusion: bool = False,
    core_v0.16); every Megatron-Bridge release's MoE recipe turns it on through the model's
    provider (e.g. v0.2.0 qwen_provider.py Qwen3MoEModelProvider `moe_permute_fusion: bool =
    True`, v0.5.0 qwen3_moe_bridge.py `provider.moe_permute_fusion = True`); a dense model's
    recipe does not set it."""
    assert build_framework_profile("megatron").features()["moe_permute_fusion"] is False
    for release, chosen in RELEASES["megatron-bridge"].items():
        assert chosen.models, release
        for model in chosen.models:
            resolved = resolve_profile(f"megatron-bridge@{release}", model)
            assert resolved.features["moe_permute_fusion"] is True, (release, model)
            assert "performance recipe" in resolved.sources["moe_permute_fusion"]
    assert "moe_permute_fusion" not in resolve_profile("megatron-bridge", "llama3-8b").features


def test_launch_writes_it_as_declared() -> None:
    """Megatron's flag and Bridge's TransformerConfig field, only where the flag asks for it."""
    feature = FEATURE_BY_NAME["moe_permute_fusion"]
    args = ("launch", "--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
            "--ep", "8")
    for fmt in ("megatron", "megatron-bridge"):
        on = invoke(*args, "--format", fmt, "--moe-permute-fusion")
        off = invoke(*args, "--format", fmt)
        assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
        assert feature.emit[fmt] in on.output
        assert feature.emit[fmt] not in off.output


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_frameworks_without_a_fused_permute_refuse_it(framework: str) -> None:
    result = invoke("estimate", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus",
                    "8", "--framework", framework, "--moe-permute-fusion")
    assert_one_line_error(result, "--moe-permute-fusion on", f"--framework {framework}",
                          "[framework_lacks_feature]")
