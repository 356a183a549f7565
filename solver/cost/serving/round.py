"""One scheduler round of a vLLM engine, vectorised over candidate engines: decode rows and
prefill tokens batched together (continuous batching with chunked prefill). The compute of
each pipeline stage comes from solver.cost.serving.step (the measured kernel tables where the GPU
has them); the TP all-reduces, the MoE dispatch and the pipeline hand-offs from
solver.cost.comm.comm. The rows split over the pp micro-batches in flight and a round is pp stage
steps, so every sequence advances one token per round.

From the round come the closed-batch numbers `parplan serve` reports without a load:

    TPOT(b)   a round of b decoding sequences per DP rank and no prefill;
    TTFT      one prompt on an idle engine: ceil(I / B) rounds of prefill chunks of up to
              max_num_batched_tokens B, each a micro-batch of its own;
    a DP rank that keeps b sequences decoding, each request prefilling once, delivers
              output tokens/s = b x O / (O x TPOT(b) + b x TTFT / pp)
    and each of its users sees TPOT(b) + (b - 1) x TTFT / (pp x O) per output token (the
    other sequences' prefills interleave with its decode steps).

Under a request rate or a concurrency the queueing model (solver.cost.serving.load) uses the same
rounds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from solver.cost.comm.comm import GroupLink, estimate_collective_s
from solver.cost.serving.overhead import EngineOverhead
from solver.cost.serving.step import StageShape, estimate_step_compute_s
from solver.spec import GpuSpec, ModelSpec

ACTIVATION_BYTES = 2.0  # bf16 activations and all-reduce payloads
TP_ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron's row-parallel pair)


def estimate_tp_allreduce_bytes(rows, hidden_size: int) -> np.ndarray:
    """The buffer of one TP all-reduce over `rows` tokens: their hidden states. Per token and
    forward pass, TP_ALLREDUCES_PER_LAYER x L of them (seed 002: 2 x L x h x b; Qwen2-7B,
    28 x 3584: 392 KiB; Llama 70B, 80 x 8192: 2,560 KiB; Llama 405B, 126 x 16384: 8,064 KiB,
    the seed's "KB" being KiB). A ring all-reduce puts 2(n-1)/n of it on each GPU's link
    (solver.cost.comm.comm), and at tp 1 nothing."""
    return np.asarray(rows, dtype=float) * hidden_size * ACTIVATION_BYTES


@dataclass(frozen=True)
class Links:
    """Collective links of each candidate's groups: TP, PP hand-offs, the MoE group."""

    tp: GroupLink
    pp: GroupLink
    moe: GroupLink


def _take_link(link: GroupLink, index: np.ndarray) -> GroupLink:
    return replace(link, bandwidth_bytes_per_s=link.bandwidth_bytes_per_s[index],
                   latency_s=link.latency_s[index],
                   tier_index=None if link.tier_index is None else link.tier_index[index],
                   share=None if link.share is None else link.share[index])


@dataclass(frozen=True)
class ServeEngine:
    """What times a round of each candidate engine (arrays over candidates): the model, the
    GPU, the weights' precision and bytes per element, the degrees, the worst stage's layers
    and MoE layers, its KV bytes per token per GPU, the groups' links and the engine's host
    overhead (solver.cost.serving.overhead)."""

    model_spec: ModelSpec
    gpu: GpuSpec
    precision: str
    weight_bytes_per_element: float
    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    layers: np.ndarray
    moe_layers: np.ndarray
    kv_bytes_per_token: np.ndarray
    links: Links
    overhead: EngineOverhead = EngineOverhead()

    def __len__(self) -> int:
        return len(self.tp)

    def take(self, index: np.ndarray) -> ServeEngine:
        """The engines at `index` (repeats allowed)."""
        index = np.asarray(index)
        arrays = {name: getattr(self, name)[index] for name in
                  ("tp", "pp", "dp", "ep", "layers", "moe_layers", "kv_bytes_per_token")}
        links = Links(*(_take_link(getattr(self.links, k), index) for k in ("tp", "pp", "moe")))
        return replace(self, links=links, **arrays)


@dataclass(frozen=True)
class RoundParts:
    """Seconds of one scheduler round of a DP rank by cause (arrays): the stage's compute
    (linear layers, routed experts, attention, LM head) and its communication, times pp
    stages, and the engine's exposed host time."""

    linear_s: np.ndarray
    experts_s: np.ndarray
    attention_s: np.ndarray
    head_s: np.ndarray
    tp_s: np.ndarray
    moe_s: np.ndarray
    hand_off_s: np.ndarray
    host_s: np.ndarray

    @property
    def gpu_s(self) -> np.ndarray:
        return (self.linear_s + self.experts_s + self.attention_s + self.head_s + self.tp_s
                + self.moe_s + self.hand_off_s)

    @property
    def total_s(self) -> np.ndarray:
        return self.gpu_s + self.host_s

    def parts_ms(self, i: int) -> dict[str, float]:
        return {"linear": float(self.linear_s[i]) * 1e3,
                "experts": float(self.experts_s[i]) * 1e3,
                "attention": float(self.attention_s[i]) * 1e3,
                "lm_head": float(self.head_s[i]) * 1e3, "tp": float(self.tp_s[i]) * 1e3,
                "ep": float(self.moe_s[i]) * 1e3, "pp": float(self.hand_off_s[i]) * 1e3,
                "host": float(self.host_s[i]) * 1e3}


def _moe_comm_s(engine: ServeEngine, tokens: np.ndarray) -> np.ndarray:
    """One MoE layer's extra traffic for `tokens` per DP rank (zero when dp = 1: the TP
    all-reduce combines the experts' outputs, also under expert parallel). Tokens travel at
    moe_token_width (LatentMoE dispatches latent tokens)."""
    m = engine.model_spec
    h, group = m.moe_token_width, engine.tp * engine.dp
    if not m.is_moe:
        return np.zeros(len(engine))
    dispatch = tokens * m.experts_per_token * h * ACTIVATION_BYTES
    a2a = 2.0 * estimate_collective_s("all_to_all", dispatch, group, engine.links.moe)
    gathered = engine.dp * tokens * h * ACTIVATION_BYTES
    naive = (estimate_collective_s("all_gather", gathered, group, engine.links.moe)
             + estimate_collective_s("reduce_scatter", gathered, group, engine.links.moe))
    return np.where(engine.dp > 1, np.where(engine.ep > 1, a2a, naive), 0.0)


def estimate_round_parts(engine: ServeEngine, decode_seqs, decode_context, prefill_tokens,
                         prefill_context) -> RoundParts:
    """One scheduler round of a DP rank: every running sequence advances one token and
    `prefill_tokens` prompt tokens are prefilled. The rows split over the pp micro-batches;
    each stage's step is the compute of solver.cost.serving.step plus the 2 TP all-reduces per
    layer of its rows, the MoE dispatch and combine, and the hand-off to the next stage. The
    engine's exposed host time (solver.cost.serving.overhead) is added once per round, for its
    `decode_seqs` running sequences (the scheduler builds one round's batches; with pp
    micro-batches in flight the others' GPU work hides the rest).

    Worked number: Llama-3.1-8B alone on an H100 (kernel table), one decode row: its GEMMs
    below the table's 256 rows stream the 13.96 GB of linear weights (5.21 ms + 64 x 8.5 us,
    tests/test_serve_load.py) plus the LM head and the KV cache: 6.25 ms."""
    m = engine.model_spec
    pp = engine.pp.astype(float)
    decode = np.asarray(decode_seqs, dtype=float) / pp
    prefill = np.asarray(prefill_tokens, dtype=float) / pp
    shape = StageShape(layers=engine.layers, moe_layers=engine.moe_layers, tp=engine.tp,
                       dp=engine.dp, ep=engine.ep,
                       weight_bytes_per_element=engine.weight_bytes_per_element,
                       kv_bytes_per_token=engine.kv_bytes_per_token)
    compute = estimate_step_compute_s(m, engine.gpu, engine.precision, shape, decode,
                                      decode_context, prefill, prefill_context)
    rows = decode + prefill
    activation = estimate_tp_allreduce_bytes(rows, m.hidden_size)
    links = engine.links
    tp_s = engine.layers * TP_ALLREDUCES_PER_LAYER * estimate_collective_s(
        "all_reduce", activation, engine.tp, links.tp)
    moe_s = engine.moe_layers * _moe_comm_s(engine, rows)
    hand_off = estimate_collective_s("send_recv", activation, engine.pp, links.pp)
    zero = np.zeros(len(engine))
    parts = RoundParts(linear_s=pp * compute.linear_s + zero,
                       experts_s=pp * compute.experts_s + zero,
                       attention_s=pp * (compute.decode_attention_s
                                         + compute.prefill_attention_s),
                       head_s=pp * compute.head_s + zero, tp_s=pp * tp_s, moe_s=pp * moe_s,
                       hand_off_s=pp * hand_off + zero, host_s=zero)
    host = engine.overhead.exposed_s(decode * pp, parts.gpu_s, engine.pp)
    return replace(parts, host_s=host + zero)


def estimate_round_s(engine: ServeEngine, decode_seqs, decode_context, prefill_tokens,
                     prefill_context) -> np.ndarray:
    """Seconds of one scheduler round (estimate_round_parts)."""
    return estimate_round_parts(engine, decode_seqs, decode_context, prefill_tokens,
                                prefill_context).total_s


def estimate_idle_ttft_s(engine: ServeEngine, prompt_tokens: float, budget: int) -> np.ndarray:
    """Time to first token of one prompt on an idle engine: the frontend's time for it
    (solver.cost.serving.overhead), then its chunks of up to `budget` (max_num_batched_tokens)
    one after another, each crossing the pp stages with all its rows (a micro-batch of its
    own), nothing decoding beside them."""
    prompt = float(prompt_tokens)
    full = np.floor((prompt - 1.0) / budget)
    last = prompt - full * budget

    def chunk(size: float) -> np.ndarray:
        return estimate_round_s(engine, 0.0, 0.0, size * engine.pp, prompt)

    return full * chunk(float(budget)) + chunk(last) + engine.overhead.frontend_s(prompt)


def estimate_output_rate(batch: np.ndarray, output_tokens: float, pp: np.ndarray,
                         tpot_s: np.ndarray, ttft_s: np.ndarray
                         ) -> tuple[np.ndarray, np.ndarray]:
    """(output tokens/s of one DP rank, TPOT a user sees) with `batch` sequences in flight,
    each request prefilling once (module docstring). Llama-3.1-70B at tp 8, batch 64 (TPOT
    12.05 ms, TTFT 74.8 ms), 512 output tokens: 64 x 512 / (512 x 12.05 ms + 64 x 74.8 ms)
    = 2,991 tokens/s; a user sees 12.05 + 63 x 74.8 / 512 = 21.25 ms per token."""
    rate = batch * output_tokens / (output_tokens * tpot_s + batch * ttft_s / pp)
    return rate, tpot_s + (batch - 1) * ttft_s / (pp * output_tokens)
