"""FlashAttention in Triton (TimeConstants.triton_attention, `--attention-kernel triton`): the
2022 kernel LLM Foundry's MPT tables ran (llm-foundry scripts/train/benchmarking/
submit_benchmarks.py, `--attn_impl` default "triton" up to 5e85bd62; llmfoundry/models/layers/
attention.py triton_flash_attn_fn, HazyResearch's flash_attn_triton.py), at the published
rates of solver.cost.kernels.kernels_attention.triton_attention_rates:

- FlashAttention-2 (Dao 2023, arXiv 2307.08691) §1: FlashAttention-1 reaches 30-50% of the
  A100's peak forward, 25-35% backward; the Triton kernel's own header: "Overall Triton
  forward + backward is slightly slower than CUDA forward + backward";
- the same paper §4.1: FA2 is 1.3-1.5x faster than FlashAttention in Triton forward, about 2x
  backward; on Hopper applied to FA2's measured H100 rates (FA3 paper Fig. 5b/6b).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_gpu_spec
from solver.cost.kernels.efficiency import estimate_triton_attention_s, triton_padded_head_dim
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.kernels.kernels_attention import (
    FA1_PEAK_FRACTIONS,
    FA2_RATES_TFLOPS,
    TRITON_SLOWDOWN_FROM_FA2,
    triton_attention_rates,
)
from solver.cost.layers.time_constants import TimeConstants

TFLOPS = 1e12


def test_ampere_rates_are_flashattention_1s_share_of_the_peak() -> None:
    """FA2 paper §1 on A100: FlashAttention-1 forward "30-50%" of the maximum (Fig. 5, 512 to
    16K tokens), backward "25-35%" (Fig. 6). Worked number (kernels.py): 2K tokens is 2/5 of
    the way from 512 to 16K in log2, 0.30 + 0.4 x 0.20 = 0.38 forward, 0.25 + 0.4 x 0.10 =
    0.29 backward of 312 TFLOP/s."""
    peak = load_gpu_spec("a100-80gb").peak_flop_per_s("bf16")
    assert peak == 312 * TFLOPS
    assert FA1_PEAK_FRACTIONS == ((512, 0.30, 0.25), (16384, 0.50, 0.35))
    forward, backward = triton_attention_rates(peak, False, np.array([512, 2048, 16384, 65536]))
    np.testing.assert_allclose(forward / peak, [0.30, 0.38, 0.50, 0.50])
    np.testing.assert_allclose(backward / peak, [0.25, 0.29, 0.35, 0.35])


def test_hopper_rates_are_flashattention_2s_over_the_triton_slowdown() -> None:
    """FA2 paper §4.1: "around 1.3-1.5x faster than FlashAttention in Triton in the forward pass
    and around 2x faster in the backward pass" (1.4, the middle, and 2); FA2's H100 rates at
    16K: 370 forward, 322 backward TFLOP/s (FA3 paper Fig. 5b/6b): 264 and 161 on an H100,
    scaled by the peak on an H20 (148 of 989 TFLOP/s)."""
    assert TRITON_SLOWDOWN_FROM_FA2 == (1.4, 2.0)
    assert FA2_RATES_TFLOPS[-1] == (16384, 370.0, 322.0)
    h100 = load_gpu_spec("h100-sxm")
    forward, backward = triton_attention_rates(h100.peak_flop_per_s("bf16"), True, 16384)
    assert float(forward) == pytest.approx(370 / 1.4 * TFLOPS)
    assert float(backward) == pytest.approx(322 / 2 * TFLOPS)
    h20 = load_gpu_spec("h20")
    slow, _ = triton_attention_rates(h20.peak_flop_per_s("bf16"), True, 16384)
    assert float(slow / forward) == pytest.approx(h20.peak_flop_per_s("bf16") / (989 * TFLOPS))


def test_the_two_sources_agree_on_ampere() -> None:
    """FA2's best on A100, 73% forward and 63% backward (FA2 paper §1), over the Triton
    slowdown gives 52% and 32%: the top of FlashAttention-1's ranges (50%, 25-35%), as the
    Triton header's "slightly slower than" FlashAttention-1 says."""
    (_, _, _), (_, top_forward, top_backward) = FA1_PEAK_FRACTIONS
    assert 0.73 / TRITON_SLOWDOWN_FROM_FA2[0] == pytest.approx(top_forward, abs=0.03)
    assert 0.63 / TRITON_SLOWDOWN_FROM_FA2[1] == pytest.approx(top_backward, abs=0.035)


def test_seconds_count_the_backward_as_two_and_a_half_forwards() -> None:
    gpu = load_gpu_spec("a100-80gb")
    forward, backward = estimate_triton_attention_s(gpu, 1e12, 16384)
    assert float(forward) == pytest.approx(1e12 / (0.50 * 312 * TFLOPS))
    assert float(backward) == pytest.approx(2.5e12 / (0.35 * 312 * TFLOPS))


@settings(max_examples=40, deadline=None)
@given(gpu=st.sampled_from(["a100-80gb", "h100-sxm", "h200", "l40s", "b200"]),
       seq=st.floats(128, 1 << 18), factor=st.floats(1.0, 64.0))
def test_rates_never_fall_as_the_sequence_grows(gpu: str, seq: float, factor: float) -> None:
    spec = load_gpu_spec(gpu)
    hopper = spec.legacy_mma_fraction is not None
    short = triton_attention_rates(spec.peak_flop_per_s("bf16"), hopper, seq)
    long = triton_attention_rates(spec.peak_flop_per_s("bf16"), hopper, seq * factor)
    assert all(float(b) >= float(a) * (1 - 1e-12) for a, b in zip(short, long))


def test_attention_kernel_flag_selects_triton() -> None:
    profile = build_framework_profile("generic", {"attention_kernel": "triton"})
    constants = profile.time_constants
    assert (constants.flash_attention, constants.native_attention_kernels,
            constants.triton_attention) == (True, False, True)
    assert profile.features()["attention_kernel"] == "triton"
    assert TimeConstants().triton_attention is False
    assert build_framework_profile("megatron").features()["attention_kernel"] == "native"


def test_estimate_takes_the_triton_kernel_and_long_sequences_pay_for_it() -> None:
    """`estimate --attention-kernel triton` (Llama 3.1 8B on 8 A100 80 GB, ZeRO-3): at
    32K tokens FlashAttention-1's 50% forward / 35% backward are slower than the A100 table's
    kernel, so the compute grows; the JSON names the kernel."""
    import json

    from click.testing import CliRunner

    from solver.cli import cli

    def compute_s(*flags: str) -> tuple[float, str]:
        result = CliRunner().invoke(cli, [
            "estimate", "--model", "llama3.1-8b", "--cluster", "dgx-a100-80gb", "--gpus", "8",
            "--seq-len", "32768", "--global-batch", "16", "--zero", "3", "--recompute", "full",
            "--framework", "generic", "--json", *flags])
        assert result.exit_code == 0, result.output
        answer = json.loads(result.output)
        return (answer["plans"][0]["time_seconds"]["compute"],
                answer["framework_features"]["attention_kernel"])

    native, name = compute_s()
    triton, triton_name = compute_s("--attention-kernel", "triton")
    assert (name, triton_name) == ("native", "triton")
    assert triton > native
    bad = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--cluster",
                                   "dgx-a100-80gb", "--gpus", "8", "--attention-kernel", "trit"])
    assert bad.exit_code == 2 and "--attention-kernel" in bad.output


@pytest.mark.parametrize(("head_dim", "padded"), [(64, 64), (112, 128), (128, 128), (96, 128),
                                                  (8, 16), (160, 256)])
def test_triton_tiles_span_the_head_dim_padded_to_a_power_of_two(head_dim: int,
                                                                 padded: int) -> None:
    """llm-foundry 5e85bd62 llmfoundry/models/layers/flash_attn_triton.py (lines 622, 665):
    BLOCK_HEADDIM = max(triton.next_power_of_2(d), 16); the padded columns are multiplied, so
    the time grows by padded / d at the same FLOP count."""
    gpu = load_gpu_spec("h100-sxm")
    assert triton_padded_head_dim(head_dim) == padded
    plain = estimate_triton_attention_s(gpu, 1e12, 4096, padded)
    timed = estimate_triton_attention_s(gpu, 1e12, 4096, head_dim)
    for a, b in zip(timed, plain):
        assert float(a) == pytest.approx(float(b) * padded / head_dim)
