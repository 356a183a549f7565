"""One evaluation of serving candidates: memory, the batch each DP rank runs, latency and
throughput, with the batch chosen as the largest the KV cache holds (at most vLLM's
max_num_seqs) whose TPOT under load meets --max-tpot-ms. TPOT under load grows with the batch
and throughput does too (solver.cost.serving.round), so a bisection over the batch finds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, scheduler_limits
from solver.serve.memory import ServeMemory, estimate_serving_memory
from solver.cost.serving.round import RoundParts, estimate_output_rate
from solver.serve.timing import (
    build_engine,
    estimate_decode_round,
    estimate_tpot_s,
    estimate_ttft_s,
)


@dataclass(frozen=True)
class ServeEstimate:
    """What the serving model says about each candidate (arrays; times in seconds).

    batch            sequences decoding at once per DP rank (0 when the context does not fit)
    ttft_s           time to first token of one request on an idle engine
    tpot_idle_s      time per output token of a lone sequence (batch 1)
    tpot_s           time per output token at `batch`, prefills interleaved (what users see)
    tokens_per_s     output tokens per second of the whole deployment
    latency_s        one request alone: ttft + output_len x tpot_idle
    """

    memory: ServeMemory
    batch: np.ndarray
    ttft_s: np.ndarray
    tpot_idle_s: np.ndarray
    tpot_s: np.ndarray
    tokens_per_s: np.ndarray
    latency_s: np.ndarray
    decode: RoundParts
    num_gpus: np.ndarray

    @property
    def tokens_per_s_per_gpu(self) -> np.ndarray:
        return self.tokens_per_s / self.num_gpus


def estimate_serving(problem: ServeProblem, c: ServeCandidates) -> ServeEstimate:
    """Evaluate every candidate (see the module docstring).

    Worked number: Llama-3.1-70B at tp 8 on a DGX H100, 2,048 + 512 tokens: the KV cache holds
    1,361,902 / 2,560 = 531 sequences (under max_num_seqs 1,024), which give 4,426 tokens/s at
    a TPOT of 119.8 ms (a decode round of 531 rows: linear layers 12.8 ms, attention reading
    the KV cache 18.7 ms, TP all-reduces 9.3 ms; TTFT alone 76.2 ms); --max-tpot-ms 20 cuts
    the batch to 49: 2,448 tokens/s at 19.9 ms."""
    job = problem.job
    memory = estimate_serving_memory(problem, c)
    engine = build_engine(problem, c, memory.kv_bytes_per_token)
    ttft = estimate_ttft_s(problem, engine)
    _, max_seqs = scheduler_limits(problem)
    cap = np.minimum(np.floor(memory.kv_tokens / (job.input_len + job.output_len)), max_seqs)
    cap = np.where(memory.fits, cap, 0.0)

    def loaded_tpot(batch: np.ndarray) -> np.ndarray:
        tpot = estimate_tpot_s(problem, engine, batch)
        return estimate_output_rate(batch, job.output_len, c.pp, tpot, ttft)[1]

    batch = cap
    if job.max_tpot_ms is not None:
        batch = _largest_batch(loaded_tpot, cap, job.max_tpot_ms * 1e-3)
    running = np.maximum(batch, 1.0)
    tpot = estimate_tpot_s(problem, engine, running)
    rate, tpot_loaded = estimate_output_rate(running, job.output_len, c.pp, tpot, ttft)
    tpot_idle = estimate_tpot_s(problem, engine, np.ones(len(c)))
    decode = estimate_decode_round(problem, engine, running)
    engines = c.dp * c.replicas
    return ServeEstimate(memory=memory, batch=batch, ttft_s=ttft, tpot_idle_s=tpot_idle,
                         tpot_s=tpot_loaded, tokens_per_s=np.where(batch > 0, rate * engines, 0.0),
                         latency_s=ttft + job.output_len * tpot_idle, decode=decode,
                         num_gpus=c.num_gpus)


def _largest_batch(loaded_tpot, cap: np.ndarray, limit_s: float) -> np.ndarray:
    """The largest batch b in [1, cap] with loaded_tpot(b) <= limit_s (0 if none), for every
    candidate at once; loaded_tpot grows with b."""
    ok_at_one = loaded_tpot(np.ones(cap.shape)) <= limit_s
    low = np.where(ok_at_one & (cap >= 1), 1.0, 0.0)  # known to meet the limit (0: none)
    high = np.where(low > 0, cap, 0.0)                 # the largest that still might
    while np.any(high > low):
        middle = np.ceil((low + high) / 2.0)
        good = loaded_tpot(np.maximum(middle, 1.0)) <= limit_s
        active = high > low
        low = np.where(active & good, middle, low)
        high = np.where(active & ~good, middle - 1.0, high)
    return low
