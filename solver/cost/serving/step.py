"""Compute seconds of one vLLM engine step on one GPU of a pipeline stage: decode rows and
prefill rows batched together (continuous batching with chunked prefill), vectorised over
candidates. Communication is added by the caller (solver.cost.serving.round, with solver.cost.comm.comm).

One step runs m = d + p tokens through the stage's layers: d decoding sequences (one token
each, a KV context of `decode_context` tokens) and p prefill tokens of prompts of
`prefill_context` tokens. Per layer:

  linear layers   the layer's linear weights on the GPU as GEMMs of m rows
                  (solver.cost.kernels.efficiency.estimate_gemm_s: the measured kernel table where the
                  GPU has one, the datasheet roofline with its per-kernel cost otherwise;
                  below the table's 256 rows, where decode steps live, the roofline's weight
                  streaming, at most the table's 256-row time):
                  attention (h -> attention params / h), dense MLP or shared experts
                  (h -> params / h);
  routed experts  solver.cost.serving.experts: the table's fused MoE at the EP group's
                  m x dp tokens where the GPU has rows of the weights' format, else one
                  grouped GEMM launch per projection over the batch's routed rows (MXFP4 and
                  int4 on Hopper: vLLM's dequantising matmul_ogs / Marlin MoE);
  decode attention  one paged-attention kernel per layer: a fixed 11.5 us, then streaming the
                  d sequences' KV cache through HBM. The fixed cost is AIConfigurator's
                  generation-attention tables (commit 095f58a, systems/data/<gpu>/attention/
                  vllm/<version>/generation_attention_perf.parquet; the shared kernel tables
                  leave the generation phase out): batch 1, one token of context, head dim
                  128, bf16 KV: 11.3 us (H200, vLLM 0.24.0, FA3), 11.5 us (H100, 0.24.0,
                  FA3), 12.4 us (A100, 0.14.0, FA2): their median, in the layers that
                  have softmax attention;
  prefill attention the p tokens' causal attention FLOPs against their prompt (2 ctx heads
                  (d_qk + d_v) per token, ctx = prefill_context / 2 on average), at the table's
                  context-attention rate (or the datasheet attention fraction).
and on the last stage the LM head for the sampled rows (d, plus one per prefill that ends).
A block pattern (solver.spec.blocks) takes its average layer: each mixer's linear weights
(Mamba-2 and DeltaNet split by tp) and the dense MLP at their share of the layers; prefill
attention times the pattern's attention share (windows cut it, recurrent layers have none:
solver.cost.serving.block_cache.estimate_prefill_core_share), plus the Mamba-2 and DeltaNet scans at
solver.cost.layers.blocks.SSD_SCAN_PEAK_FRACTION of the bf16 peak.

Weight-only int4 has no table GEMM: it takes the datasheet roofline at its 0.52 bytes per
weight. fp8 weights run fp8 GEMMs (W8A8) where the GPU has fp8, bf16 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.kernels.efficiency import (
    ComputeConstants,
    estimate_attention_core_s,
    estimate_datasheet_gemm_s,
    estimate_gemm_s,
    estimate_streaming_s,
    estimate_table_attention_s,
    gemm_table,
)
from solver.cost.serving.experts import estimate_routed_experts_s, gemm_precision
from solver.cost.serving.block_cache import (
    estimate_mixer_params_per_gpu,
    estimate_prefill_core_share,
    estimate_prefill_scan_flops,
)
from solver.cost.layers.blocks import SSD_SCAN_PEAK_FRACTION
from solver.cost.layers.sparse_attention import (
    estimate_decode_read_tokens,
    estimate_indexer_cache_bytes_per_token,
    estimate_prefill_sparse_flops_per_token,
    indexer_params_per_layer,
)
from solver.spec import GpuSpec, ModelSpec

DECODE_ATTENTION_KERNEL_S = 11.5e-6  # AIConfigurator generation attention (module docstring)
GEMM_TABLE_MIN_ROWS = 256  # the smallest m of the GEMM grids (kernel README: m < 256 dropped)


@dataclass(frozen=True)
class StageShape:
    """What one GPU of the worst pipeline stage holds (arrays over candidates): its layers,
    MoE layers, degrees, weight bytes per element, KV bytes per token of the stage."""

    layers: np.ndarray
    moe_layers: np.ndarray
    tp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    weight_bytes_per_element: float
    kv_bytes_per_token: np.ndarray


@dataclass(frozen=True)
class StepCompute:
    """Seconds of one stage's step by part (arrays)."""

    linear_s: np.ndarray
    experts_s: np.ndarray
    decode_attention_s: np.ndarray
    prefill_attention_s: np.ndarray
    head_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return (self.linear_s + self.experts_s + self.decode_attention_s
                + self.prefill_attention_s + self.head_s)


def _gemm_s(gpu: GpuSpec, weights: str, m, k, n, weight_bytes: float,
            constants: ComputeConstants) -> np.ndarray:
    """A GEMM of m rows: the table (or datasheet) time; below the table's smallest row count
    (256, kernel README "What was dropped") the datasheet roofline at the real m, which is
    the weight streaming a decode step does, capped by the table's time at 256 rows (a GEMM
    of fewer rows is not slower)."""
    precision = gemm_precision(gpu, weights)
    if precision is None:
        return estimate_datasheet_gemm_s(gpu, "bf16", m, k, n, constants, weight_bytes)
    table = estimate_gemm_s(gpu, precision, m, k, n, constants, training=False)
    if gemm_table(gpu, precision) is None:
        return table
    m = np.asarray(m, dtype=float)
    streaming = estimate_datasheet_gemm_s(gpu, precision, m, k, n, constants, weight_bytes)
    return np.where(m < GEMM_TABLE_MIN_ROWS, np.minimum(streaming, table), table)


def estimate_step_compute_s(model_spec: ModelSpec, gpu: GpuSpec, weights: str,
                            shape: StageShape, decode_seqs, decode_context, prefill_tokens,
                            prefill_context, constants: ComputeConstants = ComputeConstants()
                            ) -> StepCompute:
    """One stage's compute for a step of `decode_seqs` + `prefill_tokens` rows (module
    docstring). Worked number (datasheet roofline, H100 SXM 3.35 TB/s x 0.8, bf16): one
    Llama-3.1-8B decode row at tp 1 streams its 32 layers' 6.98e9 linear weights (13.96 GB)
    in 5.21 ms, plus 64 GEMMs x 8.5 us = 0.54 ms: 5.75 ms."""
    m_ = model_spec
    h = m_.hidden_size
    d = np.asarray(decode_seqs, dtype=float)
    p = np.asarray(prefill_tokens, dtype=float)
    rows = d + p
    tp = shape.tp.astype(float)
    wb = shape.weight_bytes_per_element
    dense_layers = shape.layers - shape.moe_layers

    def linear(params_per_gpu) -> np.ndarray:
        n = np.asarray(params_per_gpu, dtype=float) / h
        return np.where(n > 0, _gemm_s(gpu, weights, rows, h, np.maximum(n, 1.0), wb, constants),
                        0.0)

    attention = linear(attention_params_per_gpu(m_, tp))
    core_share, scan_s = 1.0, 0.0
    if m_.has_block_kinds:  # the block pattern's average layer (module docstring)
        layers = m_.num_hidden_layers
        attention = sum(m_.layer_mixers.count(mixer) / layers * linear(
            estimate_mixer_params_per_gpu(m_, mixer, tp, attention_params_per_gpu(m_, tp)))
            for mixer in set(m_.layer_mixers) - {"none"})
        dense_layers = shape.layers * m_.layer_mlps.count("dense") / layers
        core_share = estimate_prefill_core_share(m_, np.asarray(prefill_context, dtype=float))
        scan_s = (p * estimate_prefill_scan_flops(m_) / tp
                  / (SSD_SCAN_PEAK_FRACTION * gpu.peak_flop_per_s("bf16")))
    dense_mlp = linear(m_.dense_mlp_params_per_layer / tp) if m_.num_dense_layers else 0.0
    # LatentMoE's projections are replicated on every TP rank (vLLM nemotron_h.py
    # ReplicatedLinear), read with the shared experts.
    latent = m_.latent_projection_params_per_layer
    shared = (linear(m_.shared_expert_params_per_layer / tp + latent)
              if m_.is_moe and (m_.shared_expert_params_per_layer or latent) else 0.0)
    linear_s = (shape.layers * attention + dense_layers * dense_mlp + shape.moe_layers * shared)
    experts_s = shape.moe_layers * estimate_routed_experts_s(
        m_, gpu, weights, tp=shape.tp, dp=shape.dp, ep=shape.ep,
        weight_bytes_per_element=wb, rows=rows, constants=constants)
    kv_per_layer = shape.kv_bytes_per_token / np.maximum(shape.layers, 1.0)
    context = np.asarray(decode_context, dtype=float)
    # DSA reads MLA's cache of the top-k tokens and the indexer keys of the whole context.
    indexer_cache = estimate_indexer_cache_bytes_per_token(m_)
    read = (estimate_decode_read_tokens(m_, context) * (kv_per_layer - indexer_cache)
            + context * indexer_cache)
    kv_read_s = estimate_streaming_s(gpu, d * read, constants)
    kernels = DECODE_ATTENTION_KERNEL_S * m_.num_attention_layers / m_.num_hidden_layers
    decode_attention_s = shape.layers * np.where(d > 0, kernels + kv_read_s, 0.0)
    prefill_attention_s = shape.layers * (core_share * _prefill_attention_s(
        m_, gpu, p, np.asarray(prefill_context, dtype=float), tp, constants) + scan_s)
    sampled = d + np.minimum(p, 1.0)
    head_s = np.where(sampled > 0, _gemm_s(gpu, "bf16", np.maximum(sampled, 1.0), h,
                                           m_.vocab_size / tp, 2.0, constants), 0.0)
    return StepCompute(linear_s=linear_s + 0.0 * rows, experts_s=experts_s + 0.0 * rows,
                       decode_attention_s=decode_attention_s,
                       prefill_attention_s=prefill_attention_s, head_s=head_s)


def attention_params_per_gpu(model_spec: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Attention parameters of one layer on one TP rank: MLA's down-projections replicated,
    GQA's KV heads replicated when tp exceeds them (as solver.serve.memory counts them)."""
    m = model_spec
    h, total = m.hidden_size, m.attention_params_per_layer
    if m.is_mla:
        q_down = h * m.q_lora_rank + m.q_lora_rank if m.q_lora_rank else 0
        kv_down = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank  # type: ignore
        # DSA's indexer: vLLM ReplicatedLinear (solver.cost.layers.sparse_attention)
        replicated = q_down + kv_down + indexer_params_per_layer(m)
        return replicated + (total - replicated) / tp
    qo = m.num_attention_heads * (m.qk_head_dim + m.value_head_dim)
    kv_width = m.kv_heads * (m.qk_head_dim + m.value_head_dim)
    kv_per_rank = np.maximum(m.kv_heads / tp, 1.0)
    return total * (qo / tp + kv_width * kv_per_rank / m.kv_heads) / (qo + kv_width)


def _prefill_attention_s(model_spec: ModelSpec, gpu: GpuSpec, tokens: np.ndarray,
                         context: np.ndarray, tp: np.ndarray, constants: ComputeConstants
                         ) -> np.ndarray:
    """One layer's causal attention of `tokens` prefill tokens of `context`-token prompts."""
    m = model_spec
    heads = m.num_attention_heads / tp
    width = m.qk_head_dim + m.value_head_dim
    flops = tokens * 2.0 * (context / 2.0) * heads * width
    if m.is_sparse_attention:  # top-k keys, the indexer's scores on every TP rank
        flops = tokens * estimate_prefill_sparse_flops_per_token(m, context, tp)
    kv_heads = np.maximum(m.kv_heads / tp, 1.0)
    measured = estimate_table_attention_s(
        gpu, flops, batch=1, seq=np.maximum(context, 1.0), heads=heads, kv_heads=kv_heads,
        qk_head_dim=m.qk_head_dim, v_head_dim=m.value_head_dim)
    if measured is not None:
        return np.where(tokens > 0, measured[0], 0.0)
    return estimate_attention_core_s(gpu, "bf16", flops, constants)
