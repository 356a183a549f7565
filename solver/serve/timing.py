"""Serving time under vLLM, vectorised over candidates: decode steps, prefill, throughput.

Decode (one step of a stage, m sequences per micro-batch) is bound by HBM bandwidth: it
streams the stage's weights once per step (routed experts only if a token of the step picks
them) and the KV cache of its m sequences, unless the GEMMs take longer (large batches):

    t_stage(m) = max((W_dense + W_head + W_experts x touched + m x ctx x kv_per_token)
                     / (hbm_fraction x HBM), 2 x m x active FLOPs / (f_gemm x peak))
                 + 2 all-reduces of m x h x 2 B per layer over TP (Megatron column/row split:
                   after attention and after the MLP)
                 + per MoE layer with dp > 1: dispatch and combine all-to-all of m x k x h x 2 B
                   over tp x dp (expert parallel), or an all-gather and a reduce-scatter of the
                   dp x m tokens (tensor parallel flattened over DP)
    touched = 1 - (1 - k / E)^(dp x m)        (expected share of experts some token picks,
                                               uniform routing; k / E for one token)

A sequence's token crosses the pp stages in turn, and vLLM keeps pp micro-batches in flight
(b / pp sequences each, at least 1): TPOT(b) = pp x (t_stage(max(b / pp, 1)) + hand-off).

Prefill of I input tokens is compute bound (chunks of max_num_batched_tokens; each chunk reads
the weights at least once): TTFT = max(2 x active params x I / (f_gemm x peak x tp)
+ attention FLOPs / (f_attention x peak x tp), chunks x weights / HBM) + TP all-reduces and
hand-offs of the chunk's activations. The engine spends TTFT / pp of its time on each
request's prefill (pp requests prefill at once in the pipeline), so a DP rank that keeps b
sequences decoding delivers

    output tokens/s = b x O / (O x TPOT(b) + b x TTFT / pp)

and each of its users sees TPOT_load(b) = TPOT(b) + (b - 1) x TTFT / (pp x O) per output
token (the other sequences' prefills interleave with its decode steps). Collectives
use solver.cost.comm (nccl-tests bus factors, the tier the group spans).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.comm import GroupLink, estimate_collective_s, estimate_group_link
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, vllm_batch_defaults
from solver.serve.memory import ACTIVATION_BYTES, StageWeights, estimate_stage_weights


def estimate_tp_allreduce_bytes_per_token(num_layers: int, hidden_size: int,
                                          bytes_per_element: float = ACTIVATION_BYTES) -> float:
    """All-reduce payload one token puts through TP per forward pass: 2 all-reduces per layer,
    each of the hidden state (seed 002: 2 x L x h x b). Qwen2-7B (28 x 3584): 401,408 B =
    392 KiB; Llama 70B (80 x 8192): 2,560 KiB; Llama 405B (126 x 16384): 8,064 KiB. The seed
    prints KiB as "KB", and this is the buffer size: a ring all-reduce puts 2(n-1)/n of it on
    each GPU's link (1.75x at tp 8: 4,480 KiB for the 70B), and at tp 1 nothing at all."""
    return 2.0 * num_layers * hidden_size * bytes_per_element


@dataclass(frozen=True)
class Links:
    """Collective links of each candidate's groups (solver.cost.comm.GroupLink)."""

    tp: GroupLink
    pp: GroupLink
    moe: GroupLink


def build_links(problem: ServeProblem, c: ServeCandidates) -> Links:
    """TP groups are consecutive ranks; PP stages are tp ranks apart; the MoE group is the tp x
    dp ranks of a stage (vLLM's rank order dp-pp-tp, TP fastest; with whole-node stages the
    node count it touches is that of tp x dp consecutive ranks)."""
    cluster = problem.cluster
    return Links(tp=estimate_group_link(cluster, 1, c.tp),
                 pp=estimate_group_link(cluster, c.tp, c.pp),
                 moe=estimate_group_link(cluster, 1, c.tp * c.dp))


def _touched(problem: ServeProblem, tokens: np.ndarray) -> np.ndarray:
    m = problem.model_spec
    if not m.is_moe:
        return np.zeros_like(tokens)
    return 1.0 - (1.0 - m.num_experts_per_tok / m.num_experts) ** tokens


def _moe_comm_s(problem: ServeProblem, c: ServeCandidates, links: Links,
                tokens: np.ndarray) -> np.ndarray:
    """One MoE layer's extra traffic for `tokens` per DP rank (zero when dp = 1: the TP
    all-reduce combines the experts' outputs, also under expert parallel)."""
    m = problem.model_spec
    h, group = m.hidden_size, c.tp * c.dp
    if not m.is_moe:
        return np.zeros(len(c))
    dispatch = tokens * m.num_experts_per_tok * h * ACTIVATION_BYTES
    a2a = 2.0 * estimate_collective_s("all_to_all", dispatch, group, links.moe)
    gathered = c.dp * tokens * h * ACTIVATION_BYTES
    naive = (estimate_collective_s("all_gather", gathered, group, links.moe)
             + estimate_collective_s("reduce_scatter", gathered, group, links.moe))
    return np.where(c.dp > 1, np.where(c.ep > 1, a2a, naive), 0.0)


def _peaks(problem: ServeProblem) -> tuple[float, float, float]:
    """(GEMM FLOP/s, attention FLOP/s, HBM B/s) achievable: fp8 weights run fp8 GEMMs where
    the GPU has them (W8A8), int4 and fp8 without hardware support are weight-only (bf16)."""
    gpu, constants = problem.cluster.gpu, problem.constants
    precision = "fp8" if problem.job.precision == "fp8" and gpu.peak_tflops_fp8 else "bf16"
    fraction = gpu.mamf_fraction(precision) or constants.gemm_peak_fraction
    gemm = fraction * gpu.peak_flop_per_s(precision)
    attention = constants.attention_peak_fraction * gpu.peak_flop_per_s("bf16")
    return gemm, attention, constants.hbm_fraction * gpu.hbm_gb_per_s * 1e9


@dataclass(frozen=True)
class DecodeStep:
    """Seconds of one decode step of the worst stage, by cause (arrays)."""

    memory_s: np.ndarray
    compute_s: np.ndarray
    tp_s: np.ndarray
    moe_s: np.ndarray
    hand_off_s: np.ndarray

    @property
    def step_s(self) -> np.ndarray:
        return np.maximum(self.memory_s, self.compute_s) + self.tp_s + self.moe_s + self.hand_off_s


def estimate_decode_step(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                         links: Links, kv_bytes_per_token: np.ndarray,
                         micro_batch: np.ndarray) -> DecodeStep:
    """One stage's decode step for `micro_batch` sequences (module docstring).

    Worked number: Llama-3.1-70B at tp 8 on a DGX H100, 2,048 + 512 tokens (mean context
    2,304), one sequence: (17.378 GB of weights + 2,304 x 40,960 B of KV) / (0.8 x 3.35 TB/s)
    = 6.52 ms, plus 160 all-reduces of 16 KiB at 15.6 us + 0.08 us = 2.51 ms: 9.03 ms. With
    64 sequences: (17.378 + 6.040) GB -> 8.74 ms (GEMMs 1.46 ms), all-reduces of 1 MiB
    3.31 ms: 12.05 ms."""
    m, job = problem.model_spec, problem.job
    gemm, _, hbm = _peaks(problem)
    tp = c.tp.astype(float)
    context = job.input_len + job.output_len / 2.0  # mean KV length while decoding
    streamed = (weights.dense_bytes + weights.head_bytes
                + weights.expert_bytes * _touched(problem, c.dp * micro_batch)
                + micro_batch * context * kv_bytes_per_token)
    share = weights.layers / m.num_hidden_layers
    width = (2 * m.kv_lora_rank + m.qk_rope_head_dim if m.is_mla  # type: ignore[operator]
             else m.qk_head_dim + m.value_head_dim)
    attention = weights.layers * 2.0 * context * m.num_attention_heads * width
    flops = micro_batch * (2.0 * m.matmul_params_active * share + attention) / tp
    activation = micro_batch * m.hidden_size * ACTIVATION_BYTES
    tp_s = weights.layers * 2 * estimate_collective_s("all_reduce", activation, c.tp, links.tp)
    hand_off = estimate_collective_s("send_recv", activation, c.pp, links.pp)
    return DecodeStep(memory_s=streamed / hbm, compute_s=flops / gemm, tp_s=tp_s,
                      moe_s=weights.moe_layers * _moe_comm_s(problem, c, links, micro_batch),
                      hand_off_s=hand_off)


def estimate_ttft_s(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                    links: Links) -> np.ndarray:
    """Time to first token of one --input-len request on an idle engine (module docstring).

    Worked number: Llama-3.1-70B, 2,048 tokens, one H100 node at tp 8: 2 x 69.5e9 x 2048 /
    (0.803 x 989e12 x 8) = 44.8 ms of GEMMs, 80 x 2 x 1024 x 64 x 256 x 2048 / (0.5 x 989e12
    x 8) = 1.4 ms of attention, 160 all-reduces of 33.5 MB at 15.6 us + 33.5 MB x 1.75 /
    360 GB/s = 28.6 ms: 74.8 ms."""
    m, job = problem.model_spec, problem.job
    gemm, attention_peak, hbm = _peaks(problem)
    tokens, _ = vllm_batch_defaults(problem.cluster)
    chunks = np.ceil(job.input_len / tokens)
    chunk = float(min(job.input_len, tokens))
    tp = c.tp.astype(float)
    compute = (2.0 * m.matmul_params_active * job.input_len / (gemm * tp)
               + m.attention_flops_per_token(job.input_len) * job.input_len
               / (attention_peak * tp))
    streamed = chunks * c.pp * (weights.dense_bytes + weights.expert_bytes + weights.head_bytes)
    activation = chunk * m.hidden_size * ACTIVATION_BYTES
    per_chunk = (m.num_hidden_layers * 2
                 * estimate_collective_s("all_reduce", activation, c.tp, links.tp)
                 + (c.pp - 1) * estimate_collective_s("send_recv", activation, c.pp, links.pp)
                 + m.num_moe_layers * _moe_comm_s(problem, c, links, np.full(len(c), chunk)))
    return np.maximum(compute, streamed / hbm) + chunks * per_chunk


def estimate_tpot_s(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                    links: Links, kv_bytes_per_token: np.ndarray, batch: np.ndarray
                    ) -> np.ndarray:
    """Seconds per output token of each sequence with `batch` sequences decoding per DP rank
    (no prefill interleaved): pp x the stage step of max(batch / pp, 1) sequences (at pp 1
    the step itself: 9.03 ms for the 70B above alone, 12.05 ms with 64 sequences)."""
    micro = np.maximum(np.asarray(batch, dtype=float) / c.pp, 1.0)
    step = estimate_decode_step(problem, c, weights, links, kv_bytes_per_token, micro)
    return c.pp * step.step_s


def estimate_output_rate(problem: ServeProblem, c: ServeCandidates, batch: np.ndarray,
                         tpot_s: np.ndarray, ttft_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(output tokens/s of one DP rank, TPOT a user sees) with `batch` sequences in flight,
    each request prefilling once (module docstring). The 70B above at batch 64 (TPOT 12.05 ms,
    TTFT 74.8 ms): 64 x 512 / (512 x 12.05 ms + 64 x 74.8 ms) = 2,991 tokens/s; a user sees
    12.05 + 63 x 74.8 / 512 = 21.25 ms per token."""
    output = problem.job.output_len
    rate = batch * output / (output * tpot_s + batch * ttft_s / c.pp)
    return rate, tpot_s + (batch - 1) * ttft_s / (c.pp * output)


def estimate_weights_and_links(problem: ServeProblem, c: ServeCandidates
                               ) -> tuple[StageWeights, Links]:
    return estimate_stage_weights(problem, c), build_links(problem, c)


def estimate_mixed_step_s(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                          links: Links, kv_bytes_per_token: np.ndarray, decode_seqs,
                          decode_context, prefill_tokens, prefill_context) -> np.ndarray:
    """Seconds of one scheduler round of a DP rank: every running sequence advances one token
    and `prefill_tokens` prompt tokens are prefilled (continuous batching with chunked
    prefill). The rows split over the pp micro-batches in flight; each stage's step is the
    compute of solver.cost.serve_step plus the 2 TP all-reduces per layer of its rows, the MoE
    dispatch and combine, and the hand-off to the next stage: the round is pp such steps
    (as estimate_tpot_s composes a decode step)."""
    from solver.cost.serve_step import StageShape, estimate_step_compute_s

    m = problem.model_spec
    pp = c.pp.astype(float)
    decode = np.asarray(decode_seqs, dtype=float) / pp
    prefill = np.asarray(prefill_tokens, dtype=float) / pp
    shape = StageShape(layers=weights.layers, moe_layers=weights.moe_layers, tp=c.tp, dp=c.dp,
                       ep=c.ep, weight_bytes_per_element=problem.constants.weight_bytes(
                           problem.job.precision), kv_bytes_per_token=kv_bytes_per_token)
    compute = estimate_step_compute_s(m, problem.cluster.gpu, problem.job.precision, shape,
                                      decode, decode_context, prefill, prefill_context)
    rows = decode + prefill
    activation = rows * m.hidden_size * ACTIVATION_BYTES
    tp_s = weights.layers * 2 * estimate_collective_s("all_reduce", activation, c.tp, links.tp)
    moe_s = weights.moe_layers * _moe_comm_s(problem, c, links, rows)
    hand_off = estimate_collective_s("send_recv", activation, c.pp, links.pp)
    return pp * (compute.total_s + tp_s + moe_s + hand_off)
