"""Attention in the measured kernel tables (solver.cost.kernels.kernels) and the published attention
kernel rates that complement them: FlashAttention-3's backward over forward ratio, FlashAttention-2
on Hopper (2023-era kernels), FlashAttention in Triton (LLM Foundry's 2023 runs).

A lookup returns a throughput in the grid's work unit (solver.cost.kernels.kernels: causal attention
2 b h s^2 d, a sliding window 4 b h s ctx d, MLA b h s^2 (192 + 128)); the caller divides its
own work by it.
"""

from __future__ import annotations

import numpy as np

from solver.cost.kernels.kernels import KernelTable

GQA_GROUP = 4  # query heads per KV head from which the GQA grid applies alone


def estimate_table_attention_rate(table: KernelTable, batch, seq, heads, kv_heads, head_dim
                                  ) -> np.ndarray:
    """Causal attention FLOP/s (2 b h s^2 d counted) of the table's forward kernel for `batch`
    sequences of `seq` tokens with `heads` query and `kv_heads` KV heads on the GPU: the MHA
    grid at group size heads/kv_heads = 1, the GQA grid (the median over the measured KV
    heads 1-8, groups of 4 and more) from group size 4, log-linear in the group size between.

    The timings include what TRT-LLM's attention op fuses around the FMHA kernel: RoPE on q and
    k and the write of K and V into the paged KV cache (README "Context attention"); between
    a quarter and a half of the time at 4K tokens. The caller counts them as the RoPE and
    q/k/v re-layout a training step does around its attention kernel, and charges no rotary
    traffic of its own on this path."""
    return _blend_mha_gqa(table, "attention", batch, seq, heads, kv_heads, head_dim)


def estimate_table_mla_rate(table: KernelTable, batch, seq, heads) -> np.ndarray:
    """FLOP/s (b h s^2 (192 + 128) counted) of the table's MLA prefill kernel (DeepSeek
    geometry: q/k head dim 192, v head dim 128) with `heads` local heads."""
    return np.exp(table.grids["mla"].interpolate_log_rate(batch, seq, heads))


def estimate_table_window_rate(table: KernelTable, window: int, batch, seq, heads, kv_heads,
                               head_dim) -> np.ndarray | None:
    """Sliding-window attention FLOP/s (4 b h s ctx d counted, solver.cost.kernels.kernels.
    window_attention_flop) of the table's measured kernel for a window of `window` keys, None
    where the table measured no such window (the source has w = 128 at head dim 64: gpt-oss's
    geometry, with its per-head sinks). Blended between the MHA and GQA grids as
    estimate_table_attention_rate does. The measured kernel computes whole tiles along the
    window's edge and carries the per-token RoPE and KV write: H100, 64 heads, 8 KV heads,
    4,096 tokens, w = 128: 0.183 ms, 45% of the same full attention's 0.408 ms though it does
    6% of its work."""
    prefix = f"window.{window}"
    if not table.has(f"{prefix}.mha"):
        return None
    return _blend_mha_gqa(table, prefix, batch, seq, heads, kv_heads, head_dim)


def _blend_mha_gqa(table: KernelTable, prefix: str, batch, seq, heads, kv_heads, head_dim
                   ) -> np.ndarray:
    """exp of the log rates of `prefix`.mha and `prefix`.gqa, weighted log-linearly in the
    group size heads / kv_heads between 1 (MHA) and GQA_GROUP (GQA)."""
    mha = table.grids[f"{prefix}.mha"].interpolate_log_rate(batch, seq, heads, head_dim)
    gqa = table.grids[f"{prefix}.gqa"].interpolate_log_rate(batch, seq, heads, head_dim)
    group = np.asarray(heads, dtype=float) / np.asarray(kv_heads, dtype=float)
    weight = np.clip(np.log2(np.maximum(group, 1.0)) / np.log2(GQA_GROUP), 0.0, 1.0)
    return np.exp((1.0 - weight) * mha + weight * gqa)


# FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608) §4.1, H100 SXM5, BF16, head dim 128,
# no causal mask: forward TFLOP/s (Fig. 5b) and backward TFLOP/s (Fig. 6b) by sequence
# length; the backward counts 2.5x the forward's FLOPs (five matmuls to two: the
# flash-attention benchmark convention), so backward seconds / forward seconds
# = 2.5 x forward rate / backward rate: 2.94 at 4K, 3.69 at 512. FlashAttention-2 on A100 gives
# the same at long sequences: up to 73% of the peak forward, 63% backward (arXiv 2307.08691
# §4.1): 2.5 x 73 / 63 = 2.90.
FA3_RATES_TFLOPS = ((512, 467.0, 316.0), (1024, 565.0, 424.0), (2048, 625.0, 501.0),
                    (4096, 638.0, 542.0), (8192, 646.0, 559.0), (16384, 648.0, 561.0))
ATTENTION_BACKWARD_FLOP_RATIO = 2.5


# The same figures' FlashAttention-2 rates on the same H100 (Fig. 5b forward, Fig. 6b backward):
# what 2023-era kernels written for Ampere's mma.sync reach on Hopper, 0.57-0.68 of FA3's.
FA2_RATES_TFLOPS = ((512, 309.0, 214.0), (1024, 350.0, 260.0), (2048, 362.0, 291.0),
                    (4096, 368.0, 310.0), (8192, 370.0, 318.0), (16384, 370.0, 322.0))


# FlashAttention in Triton: HazyResearch's flash_attn_triton.py (Dec 2022, triton-pre-mlir),
# LLM Foundry's attn_impl "triton" (llmfoundry/models/layers/attention.py
# triton_flash_attn_fn). Its own header: "Overall Triton forward + backward is slightly slower
# than CUDA forward + backward" of FlashAttention-1. FlashAttention-2 (Dao 2023, arXiv
# 2307.08691) §4.1 on A100: FA2 is "around 1.3-1.5x faster than FlashAttention in Triton in
# the forward pass and around 2x faster in the backward pass" (the middle of the range here);
# §1: FlashAttention-1 "only reaches 30-50%" of the A100's peak forward (Fig. 5) and 25-35%
# backward (Fig. 6), over the figures' 512 to 16K tokens (taken to rise with the sequence, as
# the figures do). The two agree: FA2's best, 73% forward and 63% backward, over 1.4 and 2
# give 52% and 32%.
TRITON_SLOWDOWN_FROM_FA2 = (1.4, 2.0)
FA1_PEAK_FRACTIONS = ((512, 0.30, 0.25), (16384, 0.50, 0.35))
# The dense BF16 peak of the H100 SXM5 the FA3 figures (FA2_RATES_TFLOPS) were measured on.
FA_FIGURES_PEAK_TFLOPS = 989.0


def triton_attention_rates(peak_flop_per_s: float, hopper: bool, seq
                           ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) FLOP/s of FlashAttention in Triton at `seq` tokens per sequence
    (the backward counting ATTENTION_BACKWARD_FLOP_RATIO x the forward's FLOPs) on a GPU of
    `peak_flop_per_s` (dense BF16): on Hopper (`hopper`: a GPU with a legacy_mma_fraction)
    FlashAttention-2's measured Hopper rates scaled to the GPU's peak, over
    TRITON_SLOWDOWN_FROM_FA2; elsewhere FlashAttention-1's share of the peak
    (FA1_PEAK_FRACTIONS, log-linear in the sequence). Worked numbers: an A100 (312 TFLOP/s) at
    2K tokens runs 0.38 x 312 = 119 forward and 0.29 x 312 = 91 backward; an H100 at 16K
    370 / 1.4 = 264 and 322 / 2 = 161."""
    x = np.log2(np.asarray(seq, dtype=float))
    if hopper:
        seqs = np.log2([s for s, _, _ in FA2_RATES_TFLOPS])
        scale = peak_flop_per_s / (FA_FIGURES_PEAK_TFLOPS * 1e12) * 1e12
        forward = np.interp(x, seqs, [f for _, f, _ in FA2_RATES_TFLOPS]) * scale
        backward = np.interp(x, seqs, [b for _, _, b in FA2_RATES_TFLOPS]) * scale
        slow_forward, slow_backward = TRITON_SLOWDOWN_FROM_FA2
        return forward / slow_forward, backward / slow_backward
    seqs = np.log2([s for s, _, _ in FA1_PEAK_FRACTIONS])
    forward = np.interp(x, seqs, [f for _, f, _ in FA1_PEAK_FRACTIONS])
    backward = np.interp(x, seqs, [b for _, _, b in FA1_PEAK_FRACTIONS])
    return forward * peak_flop_per_s, backward * peak_flop_per_s


def legacy_attention_factors(seq) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) rate of FlashAttention-2 over FlashAttention-3 on Hopper at `seq`
    (FA3 paper Fig. 5b/6b): what a 2023-era attention kernel runs at relative to a native one
    (0.57 forward at 4K)."""
    x = np.log2(np.asarray(seq, dtype=float))
    seqs = np.log2([s for s, _, _ in FA3_RATES_TFLOPS])
    forward = [f2 / f3 for (_, f3, _), (_, f2, _) in zip(FA3_RATES_TFLOPS, FA2_RATES_TFLOPS)]
    backward = [b2 / b3 for (_, _, b3), (_, _, b2) in zip(FA3_RATES_TFLOPS, FA2_RATES_TFLOPS)]
    return np.interp(x, seqs, forward), np.interp(x, seqs, backward)


def attention_backward_ratio(seq) -> np.ndarray:
    """Backward over forward seconds of fused attention at `seq` tokens per sequence (FA3's
    measured rates above, interpolated in log2(seq), clamped at 512 and 16K)."""
    seqs = np.log2([s for s, _, _ in FA3_RATES_TFLOPS])
    ratios = [ATTENTION_BACKWARD_FLOP_RATIO * f / b for _, f, b in FA3_RATES_TFLOPS]
    return np.interp(np.log2(np.asarray(seq, dtype=float)), seqs, ratios)
