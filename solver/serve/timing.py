"""Serving time under vLLM, vectorised over candidates: one model of a scheduler round
(estimate_mixed_parts: decode rows and prefill tokens batched together, the compute of
solver.cost.serve_step from the kernel tables where the GPU has them, plus the TP all-reduces,
the MoE dispatch and the pipeline hand-offs of solver.cost.comm), and what it gives:

    TPOT(b)   a round of b decoding sequences per DP rank and no prefill (the pp micro-batches
              in flight carry b / pp each);
    TTFT      one --input-len prompt on an idle engine: ceil(I / B) rounds of prefill chunks of
              up to max_num_batched_tokens B.

A DP rank that keeps b sequences decoding, each request prefilling once, delivers

    output tokens/s = b x O / (O x TPOT(b) + b x TTFT / pp)

and each of its users sees TPOT_load(b) = TPOT(b) + (b - 1) x TTFT / (pp x O) per output
token (the other sequences' prefills interleave with its decode steps): the closed batch
`parplan serve` reports without a load. Under a request rate or a concurrency the queueing
model of solver.serve.load uses the same rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.comm import GroupLink, estimate_collective_s, estimate_group_link
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, scheduler_limits
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


def estimate_decode_round(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                          links: Links, kv_bytes_per_token: np.ndarray, batch: np.ndarray
                          ) -> MixedStep:
    """A round of `batch` decoding sequences per DP rank at the mean KV length of a decode
    (input + output / 2), no prefill."""
    job = problem.job
    context = job.input_distribution.mean + job.output_distribution.mean / 2.0
    return estimate_mixed_parts(problem, c, weights, links, kv_bytes_per_token,
                                np.asarray(batch, dtype=float), context, 0.0,
                                job.input_distribution.mean)


def estimate_ttft_s(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                    links: Links, kv_bytes_per_token: np.ndarray) -> np.ndarray:
    """Time to first token of one --input-len prompt on an idle engine: its chunks of up to
    max_num_batched_tokens one after another, each crossing the pp stages with all its rows
    (a micro-batch of its own), nothing decoding beside them."""
    tokens, _ = scheduler_limits(problem)
    prompt = float(problem.job.input_len)
    full = np.floor((prompt - 1.0) / tokens)
    last = prompt - full * tokens

    def chunk(size: float) -> np.ndarray:
        return estimate_mixed_step_s(problem, c, weights, links, kv_bytes_per_token, 0.0, 0.0,
                                     size * c.pp, prompt)

    return full * chunk(float(tokens)) + chunk(last)


def estimate_tpot_s(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                    links: Links, kv_bytes_per_token: np.ndarray, batch: np.ndarray
                    ) -> np.ndarray:
    """Seconds per output token of each sequence with `batch` sequences decoding per DP rank
    (no prefill interleaved): the decode round."""
    return estimate_decode_round(problem, c, weights, links, kv_bytes_per_token,
                                 np.maximum(np.asarray(batch, dtype=float), 1.0)).total_s


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


@dataclass(frozen=True)
class MixedStep:
    """Seconds of one scheduler round of a DP rank by cause (arrays): the stage's compute
    (solver.cost.serve_step: linear layers, routed experts, attention, LM head) and its
    communication, times pp stages."""

    linear_s: np.ndarray
    experts_s: np.ndarray
    attention_s: np.ndarray
    head_s: np.ndarray
    tp_s: np.ndarray
    moe_s: np.ndarray
    hand_off_s: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return (self.linear_s + self.experts_s + self.attention_s + self.head_s + self.tp_s
                + self.moe_s + self.hand_off_s)

    def parts_ms(self, i: int) -> dict[str, float]:
        return {"linear": float(self.linear_s[i]) * 1e3,
                "experts": float(self.experts_s[i]) * 1e3,
                "attention": float(self.attention_s[i]) * 1e3,
                "lm_head": float(self.head_s[i]) * 1e3, "tp": float(self.tp_s[i]) * 1e3,
                "ep": float(self.moe_s[i]) * 1e3, "pp": float(self.hand_off_s[i]) * 1e3}


def estimate_mixed_parts(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                         links: Links, kv_bytes_per_token: np.ndarray, decode_seqs,
                         decode_context, prefill_tokens, prefill_context) -> MixedStep:
    """One scheduler round of a DP rank: every running sequence advances one token and
    `prefill_tokens` prompt tokens are prefilled (continuous batching with chunked prefill).
    The rows split over the pp micro-batches in flight; each stage's step is the compute of
    solver.cost.serve_step plus the 2 TP all-reduces per layer of its rows, the MoE dispatch
    and combine, and the hand-off to the next stage: the round is pp such steps.

    Worked number: Llama-3.1-8B alone on an H100 (kernel table), one decode row: its GEMMs
    below the table's 256 rows stream the 13.96 GB of linear weights (5.21 ms + 64 x 8.5 us,
    tests/test_serve_load.py) plus the LM head and the KV cache: 6.25 ms."""
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
    zero = np.zeros(len(c))
    return MixedStep(linear_s=pp * compute.linear_s + zero, experts_s=pp * compute.experts_s + zero,
                     attention_s=pp * (compute.decode_attention_s + compute.prefill_attention_s),
                     head_s=pp * compute.head_s + zero, tp_s=pp * tp_s, moe_s=pp * moe_s,
                     hand_off_s=pp * hand_off + zero)


def estimate_mixed_step_s(problem: ServeProblem, c: ServeCandidates, weights: StageWeights,
                          links: Links, kv_bytes_per_token: np.ndarray, decode_seqs,
                          decode_context, prefill_tokens, prefill_context) -> np.ndarray:
    """Seconds of one scheduler round (estimate_mixed_parts)."""
    return estimate_mixed_parts(problem, c, weights, links, kv_bytes_per_token, decode_seqs,
                                decode_context, prefill_tokens, prefill_context).total_s
