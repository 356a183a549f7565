"""Per-tensor FP8 with current scaling (TimeConstants.fp8_current_scaling; solver.cost.
fp8_scaling): Transformer Engine's Float8CurrentScalingQuantizer::quantize_impl
(transformer_engine/pytorch/csrc/quantizer.cpp, TE 2.9-2.16) runs nvte_compute_amax,
nvte_compute_scale_from_amax and nvte_quantize_v2 for every tensor, and split_quantize has no
fused multi-tensor path for it (csrc/extensions/cast.cpp multi_tensor_quantize_impl: "Currently
only have fused kernel for FP8 delayed scaling"): three launches per grouped-GEMM split, and an
amax read of each routed-expert tensor the fused-MoE lookup (static input scale) does not time.
Megatron-Bridge's H100 FP8 MoE recipes are "fp8_cs"."""

from __future__ import annotations

import json

import numpy as np
import pytest
from bad_input import assert_one_line_error, invoke

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.layers.fp8_scaling import (
    estimate_routed_current_scaling_s,
    estimate_routed_scaling_s,
)
from solver.cost.layers.host_time import estimate_host_s
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.kernels.precision import estimate_quantize_kernels_per_split, load_recipe
from solver.cost.step.steptime import TimeConstants, _degrees
from solver.spec import JobSpec, ParallelConfig
from solver.spec.profiles import resolve_profile


def test_amax_reads_of_qwen3_30b_at_ep16() -> None:
    """One 4,096-token sequence at ep 16: 32,768 copies of h 2,048 into F 768 (gated): forward
    2 x (2,048 + 768) B a copy = 184.5 MB, 0.0688 ms at 0.8 x 3.35 TB/s; backward the
    gradients of fc2's output (h) and fc1's (2F): 2 x 3,584 B a copy, 234.9 MB, 0.0876 ms."""
    model = load_model_spec("qwen3-30b-a3b")
    gpu = load_cluster_spec("dgx-h100").gpu
    forward, backward = estimate_routed_current_scaling_s(
        model, gpu, ComputeConstants(), np.array([32768.0]), np.array([1.0]))
    assert float(forward[0]) * 1e3 == pytest.approx(184.5e6 / 2.68e12 * 1e3, rel=1e-3)
    assert float(forward[0]) * 1e3 == pytest.approx(0.0688, abs=1e-4)
    assert float(backward[0]) * 1e3 == pytest.approx(0.0876, abs=1e-4)


@pytest.mark.parametrize("precision, switch, fused", [
    ("fp8", False, True), ("bf16", True, True), ("fp8-blockwise", True, True),
    ("fp8", True, False)])
def test_nothing_where_it_does_not_apply(precision: str, switch: bool, fused: bool) -> None:
    """Delayed scaling, other recipes, and routed experts timed by the GEMM tables (whose FP8
    rows quantize dynamically per tensor: amax inside the lookup) add nothing."""
    model = load_model_spec("qwen3-30b-a3b")
    gpu = load_cluster_spec("dgx-h100").gpu
    constants = TimeConstants(fp8_current_scaling=switch)
    forward, backward = estimate_routed_scaling_s(model, gpu, constants, load_recipe(precision),
                                                  fused, np.array([32768.0]), np.array([1.0]))
    assert float(forward[0]) == 0.0 and float(backward[0]) == 0.0


def test_three_launches_per_split_only_for_current_scaling() -> None:
    fp8, mxfp8 = load_recipe("fp8"), load_recipe("mxfp8")
    assert estimate_quantize_kernels_per_split(fp8, False) == 0.0
    assert estimate_quantize_kernels_per_split(fp8, True) == 3.0
    assert estimate_quantize_kernels_per_split(mxfp8, True) == 1.0
    assert estimate_quantize_kernels_per_split(load_recipe("bf16"), True) == 0.0


def test_the_host_issues_them_after_the_sync() -> None:
    """Qwen3-30B-A3B at ep 8 (16 local experts) on a DGX H100 (13.48 us an op): after the
    token-count sync 48.38 ops (0.652 ms) under delayed scaling, plus fc1's and fc2's input
    quantized in three kernels per local expert under current scaling, 2 x 3 x 16 = 96 ops:
    1.946 ms; before the sync unchanged."""
    model = load_model_spec("qwen3-30b-a3b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=128, precision="fp8")
    d = _degrees(Candidates.from_configs([ParallelConfig(ep=8, dp=8)]))
    delayed = estimate_host_s(model, cluster, job, d, TimeConstants(), True)
    current = estimate_host_s(model, cluster, job, d, TimeConstants(fp8_current_scaling=True),
                              True)
    assert float(delayed[0][0]) * 1e3 == pytest.approx(0.652, abs=1e-3)
    assert float(current[0][0]) * 1e3 == pytest.approx(0.652 + 96 * 13.48e-3, abs=1e-3)
    assert float(current[1][0]) == pytest.approx(float(delayed[1][0]))


def test_the_layer_pays_the_reads_on_its_routed_part() -> None:
    """Qwen3-30B-A3B at ep 16, fp8, one sequence a micro-batch: the routed part grows by the
    amax reads exactly (the H100 table has fused FP8 MoE rows), nothing else moves."""
    model = load_model_spec("qwen3-30b-a3b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=128, precision="fp8")
    d = _degrees(Candidates.from_configs([ParallelConfig(ep=16, dp=16)]))
    delayed = estimate_layer_compute_s(model, cluster, job, d, TimeConstants())["moe"]
    current = estimate_layer_compute_s(model, cluster, job, d,
                                       TimeConstants(fp8_current_scaling=True))["moe"]
    forward, backward = estimate_routed_current_scaling_s(
        model, cluster.gpu, ComputeConstants(), np.array([32768.0]), np.array([1.0]))
    assert float(current["routed"][0] - delayed["routed"][0]) == pytest.approx(
        float(forward[0]))
    assert float(current["routed_bwd"][0] - delayed["routed_bwd"][0]) == pytest.approx(
        float(backward[0]))
    for part in ("gemm", "gemm_bwd", "core", "core_bwd", "elementwise", "cast"):
        assert float(current[part][0]) == pytest.approx(float(delayed[part][0]))


def test_current_scaling_is_a_declared_feature() -> None:
    """--fp8-current-scaling is declared once (solver.spec.features): the flag changes
    estimate's step time under fp8 only (the cost switch TimeConstants.fp8_current_scaling);
    Megatron's launch writes --fp8-recipe tensorwise (arguments.py --fp8-recipe choices,
    core_v0.13-core_v0.16; fp8_utils.py get_fp8_recipe: tensorwise is TE's
    Float8CurrentScaling), Megatron-Bridge's the bf16_with_fp8_current_scaling_mixed preset
    (mixed_precision.py v0.3.0: fp8_recipe = "tensorwise"); torchtitan refuses it with the
    framework_lacks_feature rule."""
    args = ("--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16", "--ep", "8",
            "--recompute", "full")

    def step(*extra: str) -> float:
        result = invoke("estimate", *args, "--json", *extra)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["plans"][0]["step_seconds"]

    assert step("--precision", "fp8", "--fp8-current-scaling") > step("--precision", "fp8")
    assert step("--fp8-current-scaling") == step()
    megatron = invoke("launch", *args, "--precision", "fp8", "--fp8-current-scaling",
                      "--format", "megatron")
    assert megatron.exit_code == 0, megatron.output
    assert "--fp8-recipe tensorwise" in megatron.output
    delayed = invoke("launch", *args, "--precision", "fp8", "--format", "megatron")
    assert "--fp8-recipe" not in delayed.output
    bridge = invoke("launch", *args, "--precision", "fp8", "--fp8-current-scaling",
                    "--format", "megatron-bridge")
    assert bridge.exit_code == 0, bridge.output
    assert "mixed_precision=bf16_with_fp8_current_scaling_mixed" in bridge.output
    assert_one_line_error(invoke("estimate", *args, "--precision", "fp8",
                                 "--fp8-current-scaling", "--framework", "torchtitan"),
                          "torchao", "[framework_lacks_feature]")


def test_bridge_fp8_recipes_run_current_scaling_where_they_do() -> None:
    """Megatron-Bridge's per-tensor FP8 recipes on H100 are current scaling ("fp8_cs") for
    both Qwen3 MoE models in every release and DeepSeek-V3's at 25.09 (25.09 yamls' h100
    perf_matrix; v0.2.0-v0.5.0 ship only *_H100_FP8_CS_* presets for them): the profile sets
    the feature under --precision fp8 for them, not for other models or precisions."""
    def current(release: str, model: str, precision: str = "fp8") -> bool:
        return bool(resolve_profile(f"megatron-bridge@{release}", model, precision)
                    .features.get("fp8_current_scaling"))

    assert all(current(r, "qwen3-30b-a3b") and current(r, "qwen3-235b-a22b")
               for r in ("25.09", "25.11", "26.02", "26.04", "26.06"))
    assert current("25.09", "deepseek-v3") and not current("26.02", "deepseek-v3")
    assert not current("26.02", "qwen3-30b-a3b", "bf16")
    assert not current("26.02", "llama3.1-70b")
    source = resolve_profile("megatron-bridge@26.02", "qwen3-30b-a3b", "fp8").sources[
        "fp8_current_scaling"]
    assert source == "Megatron-Bridge 26.02 (v0.3.0) performance recipe under fp8 of " \
                     "qwen3-30b-a3b"
