"""The rounds of a vLLM engine under load, tabulated on a grid of decode populations for every
candidate engine: what solver.cost.serving.load reads to compose TTFT and TPOT at a request rate.

Each DP rank (an **engine** here) runs scheduler rounds: every running sequence decodes one
token and the rest of the token budget (max_num_batched_tokens B minus the decoding rows: vLLM
v1 schedules running requests first, then waiting ones, vllm/v1/core/sched/scheduler.py) goes
to prefill chunks. vLLM keeps pp micro-batches in flight, each scheduled with the whole budget:
a round (every sequence one token) has pp x B tokens; a prompt's chunk sits in one micro-batch
beside its d / pp decodes and crosses the pp stages in turn. At d sequences decoding:

  round tau(d)    d decode rows and the prefill tokens the others' prompts bring per round,
                  (d - 1) E[I] / E[O] (one alone decodes with no prefill beside it), timed by
                  solver.cost.serving.round;
  queue work      a prompt of I tokens is I / (pp B - d) of a round whose free budget is full
                  of prefill (the scheduler packs several prompts into one step);
  own latency     once at the head a prompt takes ceil(I / (B - d / pp)) rounds of whole chunks,
                  after the frontend's per-request time (solver.cost.serving.overhead
                  frontend_s): S(I), at the SLO quantile's I and at E[I];
  the TPOT spread the decode round tau_d(d) with no prefill beside it and the seconds a prefill
                  token adds, (tau(full budget) - tau_d) / free tokens: the c_d and c_p of the
                  TPOT variance (solver.cost.serving.queueing).

The frontend is one serial server per engine (a Python process: vLLM's API server, SGLang's
TokenizerManager; one per DP rank is assumed, the most the engines start): no more than
1 / frontend_s(E[I]) requests a second reach an engine (solver.cost.serving.load and closed).

A disaggregated decode engine (`phase` "decode") has no prefill beside its decodes and no
prompt queue; a prefill engine is read at d = 0. Each round carries the engine's exposed host
time (solver.cost.serving.overhead); under multi-step scheduling a prompt joins only when the
engine's n rounds end (steps_per_schedule), and behind an overlapping scheduler's round
already built (lag_rounds; both read by solver.cost.serving.load).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from solver.cost.serving.queueing import estimate_tpot_variance_coefficients
from solver.cost.serving.round import ServeEngine, estimate_round_s

GRID_POINTS = 24


@dataclass(frozen=True)
class LoadShape:
    """The workload and the scheduler as the load model reads them: the input and output
    length distributions (support and weights), the input length at the SLO quantile, the
    quantile, vLLM's max_num_batched_tokens and max_num_seqs."""

    input_lengths: np.ndarray
    input_weights: np.ndarray
    input_quantile_len: float
    output_lengths: np.ndarray
    output_weights: np.ndarray
    quantile: float
    budget: int
    max_seqs: int
    arrival_scv: float = 1.0  # c_a^2 of the open loop's gaps (1: Poisson; solver.cost.serving.queueing)

    @property
    def input_mean(self) -> float:
        return float(np.dot(self.input_lengths, self.input_weights))

    @property
    def output_mean(self) -> float:
        return float(np.dot(self.output_lengths, self.output_weights))


@dataclass(frozen=True)
class LoadCurves:
    """Per candidate (rows) and decode population (grid columns): the round time, the queue's
    work of each input support length and the prompt's own latency, with the workload."""

    d_grid: np.ndarray        # (N, G) decoding sequences, 0 .. what KV and budget allow + 1
    round_s: np.ndarray       # (N, G) tau(d)
    service_s: np.ndarray     # (N, G, K) the prefill queue's work of I_k at d
    service_q_s: np.ndarray   # (N, G) S(I at the SLO quantile): whole rounds
    service_mean_s: np.ndarray  # (N, G) S(E[I]): whole rounds
    weights: np.ndarray       # (K,) of the input lengths
    d_max: np.ndarray         # (N,) most sequences decoding at once
    output_mean: float
    engines: np.ndarray       # (N,) DP ranks sharing the load
    num_gpus: np.ndarray      # (N,)
    decode_round_s: np.ndarray | None = None   # (N, G) tau at d with no prefill beside
    prefill_token_s: np.ndarray | None = None  # (N, G) seconds a prefill token adds at d
    quantile: float = 0.5
    tpot_variance: tuple[float, float, float] = (0.0, 0.0, 1.0)  # A, B, C (cost.queueing)
    steps_per_schedule: int = 1  # rounds between scheduler calls (vLLM V0 multi-step)
    lag_rounds: int = 0  # rounds an overlapping scheduler has already built
    input_mean: float = 0.0  # E[I], the prompt tokens another prompt adds to a round
    arrival_scv: float = 1.0  # c_a^2 of the open loop's gaps between requests
    round_budget: np.ndarray | None = None  # (N,) tokens a round holds: pp x B
    frontend_s: float = 0.0  # the frontend's seconds per request of E[I] tokens (serial)

    def take(self, index) -> LoadCurves:
        """The candidates at `index` (an int keeps one row as a batch of one)."""
        pick = slice(index, index + 1) if isinstance(index, int) else np.asarray(index)
        return replace(self, d_grid=self.d_grid[pick], round_s=self.round_s[pick],
                       service_s=self.service_s[pick], service_q_s=self.service_q_s[pick],
                       service_mean_s=self.service_mean_s[pick], d_max=self.d_max[pick],
                       decode_round_s=None if self.decode_round_s is None
                       else self.decode_round_s[pick],
                       prefill_token_s=None if self.prefill_token_s is None
                       else self.prefill_token_s[pick],
                       engines=self.engines[pick], num_gpus=self.num_gpus[pick],
                       round_budget=None if self.round_budget is None
                       else self.round_budget[pick])


def estimate_load_curves(engine: ServeEngine, shape: LoadShape, kv_seqs: np.ndarray,
                         engines: np.ndarray, num_gpus: np.ndarray, phase: str = "both"
                         ) -> LoadCurves:
    """Round and service times on a grid of decode populations for every candidate (module
    docstring). `kv_seqs`: sequences of mean length the KV cache holds (0 where the candidate
    does not fit); `phase` "both" (aggregated), "decode" or "prefill"."""
    lengths, weights = shape.input_lengths, shape.input_weights
    input_mean, output_mean = shape.input_mean, shape.output_mean
    budget = shape.budget
    n = len(engine)
    pp = engine.pp.astype(float)[:, None, None]
    round_budget = budget * pp
    share = 0.0 if phase == "decode" else input_mean / output_mean
    d_max = np.minimum(np.minimum(kv_seqs, shape.max_seqs),
                       round_budget[:, 0, 0] / (1.0 + share))
    # The grid spans what the KV cache and the budget allow, not max_num_seqs: a larger limit
    # then moves d_max along the same grid, never the grid under the rounds it reads.
    top = np.maximum(np.minimum(kv_seqs, round_budget[:, 0, 0] / (1.0 + share)), 1.0) + 1.0
    exponents = np.linspace(0.0, 1.0, GRID_POINTS - 1)
    d_grid = np.concatenate([np.zeros((n, 1)), top[:, None] ** exponents[None, :]], axis=1)
    # Columns: the round, the full round, the decodes alone, the full chunk, one remainder per
    # support length, I_q and E[I].
    chunk_lengths = np.concatenate([lengths, [shape.input_quantile_len, input_mean]])
    k = len(chunk_lengths)
    g = GRID_POINTS
    d = d_grid[:, :, None]
    chunk = np.maximum(budget - d / pp, 1.0)
    full = np.floor(np.maximum(chunk_lengths[None, None, :] - 1.0, 0.0) / chunk)
    remainder = chunk_lengths[None, None, :] - full * chunk
    prefill_round = np.minimum(np.maximum(d - 1.0, 0.0) * share,
                               np.maximum(round_budget - d, 0.0))
    free = np.maximum(round_budget - d, 1.0)
    context = np.full(d.shape, input_mean)
    columns = [  # (decode rows, prefill rows of the round, prefill context), (N, G, columns)
        (d, prefill_round, context),
        (d, free, context),
        (d, np.zeros(d.shape), context),
        (d, chunk * pp, context),
        (np.broadcast_to(d, remainder.shape), remainder * pp,
         np.broadcast_to(chunk_lengths[None, None, :], remainder.shape)),
    ]
    widths = (1, 1, 1, 1, k)
    flat = [np.concatenate([np.broadcast_to(col[i], (n, g, w)).reshape(n, g * w)
                            for col, w in zip(columns, widths)], axis=1)
            for i in range(3)]
    width = flat[0].shape[1]
    repeated = engine.take(np.repeat(np.arange(n), width))
    seconds = estimate_round_s(repeated, flat[0].ravel(), input_mean + output_mean / 2.0,
                               flat[1].ravel(), flat[2].ravel()).reshape(n, width)
    round_s = seconds[:, :g]
    free_s = seconds[:, g:2 * g]
    decode_s = seconds[:, 2 * g:3 * g]
    chunk_s = seconds[:, 3 * g:4 * g]
    last_s = seconds[:, 4 * g:].reshape(n, g, k)
    # A prompt's own latency: its chunks, after the frontend's per-request time (tokenizer,
    # API server: solver.cost.serving.overhead), which the GPU's queue does not wait for.
    service = (full * chunk_s[:, :, None] + last_s
               + engine.overhead.frontend_s(chunk_lengths)[None, None, :])
    work = chunk_lengths[None, None, :] / free * free_s[:, :, None]
    prefill_token_s = np.maximum(free_s - decode_s, 0.0) / free[:, :, 0]
    if phase == "decode":  # the prompt arrived prefilled
        service, work = np.zeros_like(service), np.zeros_like(work)
        prefill_token_s = np.zeros_like(prefill_token_s)
    return LoadCurves(d_grid=d_grid, round_s=round_s, service_s=work[:, :, :k - 2],
                      service_q_s=service[:, :, k - 2], service_mean_s=service[:, :, k - 1],
                      decode_round_s=decode_s, prefill_token_s=prefill_token_s,
                      weights=weights, d_max=d_max, output_mean=output_mean,
                      engines=np.asarray(engines, dtype=float),
                      num_gpus=np.asarray(num_gpus, dtype=float), quantile=shape.quantile,
                      steps_per_schedule=engine.overhead.steps_per_schedule,
                      lag_rounds=engine.overhead.lag_rounds, input_mean=input_mean,
                      arrival_scv=shape.arrival_scv, round_budget=round_budget[:, 0, 0],
                      frontend_s=float(engine.overhead.frontend_s(input_mean)),
                      tpot_variance=estimate_tpot_variance_coefficients(
                          lengths, weights, shape.output_lengths, shape.output_weights))
