"""The grouped experts' FP8 / FP4 row padding (TimeConstants.moe_quantization_padding;
solver.cost.layers.quantization_padding). Megatron-Core TEGroupedMLP.forward pads the permuted tokens
and un-pads the output whenever fp8 is on (megatron/core/transformer/moe/experts.py,
core_r0.13.0-core_v0.18.0: `if self.config.fp8: ... self.fp8_padding(...)`,
`self.fp8_unpadding(output, actual_tokens_per_expert)`), and TE's Fp8Padding copies every row
into a new buffer unless all splits are already aligned (transformer_engine/pytorch/module/
fp8_padding.py, TE v2.8: `if m_splits == padded_m_splits: return inp`, else torch.empty +
tex.fused_multi_row_padding; the backward un-pads the gradient). HybridEP pads in its dispatch
(token_dispatcher.py _HybridEPManager.dispatch pad_multiple, core_v0.16.0), so its splits
arrive aligned."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.step.frameworks import framework_time_constants
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.kernels.precision import load_recipe
from solver.cost.layers.quantization_padding import (
    estimate_expert_padding_s,
    estimate_routed_padding_s,
)
from solver.cost.step.steptime import TimeConstants, _degrees
from solver.spec import JobSpec, ParallelConfig


def test_copies_of_qwen3_235b_at_tp2() -> None:
    """One 4,096-token sequence at tp 2: 2,048 tokens x top-8 = 16,384 copies of h 4,096. Pad
    the input and un-pad the output, each read and written in BF16: 8 x 16,384 x 4,096 B =
    536.9 MB a pass, 0.200 ms at 0.8 x 3.35 TB/s; the backward copies the two gradients back."""
    model = load_model_spec("qwen3-235b-a22b")
    gpu = load_cluster_spec("dgx-h100").gpu
    forward, backward = estimate_expert_padding_s(model, gpu, ComputeConstants(),
                                                  np.array([16384.0]))
    assert model.moe_token_width == 4096
    assert float(forward[0]) == pytest.approx(536.87e6 / (0.8 * 3.35e12), rel=1e-4)
    assert float(forward[0]) * 1e3 == pytest.approx(0.200, abs=1e-3)
    assert float(backward[0]) == pytest.approx(float(forward[0]))


@pytest.mark.parametrize("precision, switch, dispatcher", [
    ("bf16", True, "alltoall"), ("fp8", False, "alltoall"), ("fp8", True, "hybridep")])
def test_nothing_where_it_does_not_apply(precision: str, switch: bool, dispatcher: str) -> None:
    """BF16 (no alignment needed), a framework whose experts do not pad by copy, and HybridEP
    (aligned splits from its dispatch) add nothing."""
    model = load_model_spec("qwen3-30b-a3b")
    gpu = load_cluster_spec("dgx-h100").gpu
    constants = TimeConstants(moe_quantization_padding=switch, moe_dispatcher=dispatcher)
    forward, backward = estimate_routed_padding_s(model, gpu, constants, load_recipe(precision),
                                                  np.array([32768.0]))
    assert float(forward[0]) == 0.0 and float(backward[0]) == 0.0


@pytest.mark.parametrize("precision", ["fp8", "fp8-blockwise", "mxfp8", "nvfp4"])
def test_every_quantized_recipe_pads(precision: str) -> None:
    """FP8 pads to 16 rows, MXFP8 to 32, FP4 to its own (Fp8Padding's align_size,
    get_align_size_for_quantization): the copy is the same bytes in each."""
    model = load_model_spec("qwen3-30b-a3b")
    gpu = load_cluster_spec("dgx-h100").gpu
    constants = TimeConstants(moe_quantization_padding=True)
    forward, _ = estimate_routed_padding_s(model, gpu, constants, load_recipe(precision),
                                           np.array([32768.0]))
    expected, _ = estimate_expert_padding_s(model, gpu, ComputeConstants(), np.array([32768.0]))
    assert float(forward[0]) == pytest.approx(float(expected[0])) and float(forward[0]) > 0.0


def test_megatron_profile_pads_and_the_layer_pays_it_on_its_routed_part() -> None:
    """Megatron's profile turns it on; Qwen3-30B-A3B at ep 16, fp8, one sequence a micro-batch
    (32,768 copies of h 2,048: 0.200 ms a pass): the routed part grows by the copies exactly,
    nothing else moves."""
    model = load_model_spec("qwen3-30b-a3b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=128, precision="fp8")
    d = _degrees(Candidates.from_configs([ParallelConfig(ep=16, dp=16)]))
    megatron = framework_time_constants("megatron")
    assert megatron.moe_quantization_padding
    padded = estimate_layer_compute_s(model, cluster, job, d, megatron)["moe"]
    plain = estimate_layer_compute_s(
        model, cluster, job, d, megatron.model_copy(update={"moe_quantization_padding": False})
    )["moe"]
    forward, backward = estimate_expert_padding_s(model, cluster.gpu, ComputeConstants(),
                                                  np.array([32768.0]))
    assert float(forward[0]) * 1e3 == pytest.approx(0.200, abs=1e-3)
    assert float(padded["routed"][0] - plain["routed"][0]) == pytest.approx(float(forward[0]))
    assert float(padded["routed_bwd"][0] - plain["routed_bwd"][0]) == pytest.approx(
        float(backward[0]))
    for part in ("gemm", "gemm_bwd", "core", "core_bwd", "elementwise", "cast"):
        assert float(padded[part][0]) == pytest.approx(float(plain[part][0]))
