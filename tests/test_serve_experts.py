"""MoE serving kernels by weight format and GPU (solver.cost.serving.experts, issue 38 item 4):
which path each format takes and the grouped dequantising path's cost, pinned by hand and by
the property that its rate never falls as the batch's rows grow."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cost.serving.experts import (
    estimate_grouped_experts_s,
    estimate_routed_experts_s,
    expert_path,
)


def gpu_of(cluster: str):
    return load_calibrated_cluster(cluster, None, None).gpu


def test_each_format_takes_the_path_its_gpu_has() -> None:
    """The shared kernel tables (AIConfigurator 095f58a, moe/trtllm 1.3.0rc20) hold fused MoE
    rows in bf16, fp8 and fp8_block on H100/H200, plus nvfp4 on B200; their w4a16_mxfp4 rows
    were dropped (kernels README, "What was dropped"). So MXFP4 on Hopper runs the grouped
    dequantising path (vLLM mxfp4.py: triton matmul_ogs on sm90, Marlin otherwise) and NVFP4
    on Blackwell the measured kernel."""
    gpt_oss = load_model_spec("gpt-oss-120b")
    h100, b200 = gpu_of("dgx-h100"), gpu_of("dgx-b200")
    assert expert_path(gpt_oss, h100, "fp4") == "grouped"
    assert expert_path(gpt_oss, h100, "int4") == "grouped"
    assert expert_path(gpt_oss, h100, "bf16") == "table"
    assert expert_path(gpt_oss, h100, "fp8") == "table"
    assert expert_path(gpt_oss, b200, "fp4") == "table"


def test_grouped_mxfp4_decode_row_on_h100_by_hand() -> None:
    """gpt-oss-120b at tp 2 on one H100, one decode row: 4 of 128 experts touched, each
    24,891,840 / 2 parameters (3 x 2880 x 2880 and biases, split over 2 GPUs) at 0.5625 B:
    4 x 12,445,920 x 0.5625 = 28.0 MB at 0.8 x 3,350 GB/s = 10.45 us, plus 2 launches x 8.5 us
    (ComputeConstants.gemm_kernel_s): 27.45 us a layer."""
    m, gpu = load_model_spec("gpt-oss-120b"), gpu_of("dgx-h100")
    one = np.array([1.0])
    seconds = estimate_routed_experts_s(m, gpu, "fp4", tp=np.array([2]), dp=np.array([1]),
                                        ep=np.array([1]), weight_bytes_per_element=0.5625,
                                        rows=one)
    by_hand = 4 * m.expert_params / 2 * 0.5625 / (0.8 * 3350e9) + 2 * 8.5e-6
    assert float(seconds[0]) == pytest.approx(by_hand, rel=1e-9)
    assert float(seconds[0]) == pytest.approx(27.45e-6, rel=1e-3)


def test_grouped_path_is_one_launch_per_projection_not_per_expert() -> None:
    """The per-expert loop it replaces paid 2 launches per touched expert: 128 x 2 x 8.5 us =
    2.18 ms a layer once 64 decodes touch 87% of the experts; the grouped kernels pay 17 us of
    launches plus the touched share of the 128 experts' weights on the GPU, streamed once
    (tp 2: 128 x 12.4 M x 0.5625 B = 0.896 GB, 334 us at 0.8 x 3.35 TB/s; 87%: 291 us)."""
    m, gpu = load_model_spec("gpt-oss-120b"), gpu_of("dgx-h100")
    seconds = estimate_routed_experts_s(m, gpu, "fp4", tp=np.array([2]), dp=np.array([1]),
                                        ep=np.array([1]), weight_bytes_per_element=0.5625,
                                        rows=np.array([64.0, 1e4]))
    all_weights = 128 * m.expert_params / 2 * 0.5625 / (0.8 * 3350e9)
    touched_64 = 1 - (1 - 4 / 128) ** 64
    assert float(seconds[0]) == pytest.approx(touched_64 * all_weights + 17e-6, rel=1e-9)
    assert float(seconds[0]) < 0.4e-3


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["gpt-oss-120b", "mixtral-8x7b", "qwen3-30b-a3b"]),
       st.sampled_from(["dgx-h100", "dgx-a100-80gb"]), st.sampled_from(["fp4", "int4"]),
       st.sampled_from([(1, 1), (2, 1), (1, 2), (4, 2)]),
       st.floats(1.0, 3e4), st.floats(1.0, 8.0))
def test_grouped_rate_never_falls_as_rows_grow(model: str, cluster: str, weights: str,
                                               etp_ep, tokens: float, more: float) -> None:
    """More tokens never take less time, nor more time per token (issue 38 item 4: the decode
    expert cost is a grouped GEMM over the batch's tokens whose rate never falls as rows
    grow)."""
    m, gpu = load_model_spec(model), gpu_of(cluster)
    etp, ep = etp_ep
    if m.num_experts % ep:
        return
    seconds = estimate_grouped_experts_s(m, gpu, weights, tokens=np.array([tokens, tokens * more]),
                                         etp=float(etp), ep=float(ep),
                                         weight_bytes_per_element=0.5625)
    assert seconds[1] >= seconds[0] * (1 - 1e-12)
    assert seconds[1] / (tokens * more) <= seconds[0] / tokens * (1 + 1e-12)
