"""One rollout on one inference engine (a DP rank of vLLM), vectorised over candidate engines.

Each of `seqs` sequences (prompt of P tokens, response of L tokens drawn from the response
distribution) is prefilled once and then decodes one token per scheduler round
(solver.cost.serving.round times a round). At most `slots` sequences run at once (vLLM's
max_num_seqs, or the KV cache's room); the others wait. Three parts:

    prefill   every prompt once, in chunks of max_num_batched_tokens B:
              floor((n P - 1) / B) rounds of B tokens and one of the rest (an upper bound:
              vLLM mixes chunks into decode rounds, which share the weight reads)
    queued    while prompts wait, `slots` sequences decode; sequences finish at slots / E[L]
              per round, so the n - slots waiting ones are admitted over
              (n - slots) E[L] / slots rounds, each at batch `slots` and KV length
              P + E[L^2] / (2 E[L]) (the mean age of a running sequence: a renewal
              process's length-biased draw, half decoded on average)
    tail      the last m = min(n, slots) sequences decode to the end: in a cell of d tokens
              starting at t, max(m S(t), 1) sequences run (S(t) = P(L > t), the share not yet
              finished at the cell's start; at least the longest one), at KV length P + t + d;
              the tail lasts until the longest response of the whole rollout ends
              (estimate_longest_response). Cells are a fixed grid of the maximum response
              length, so a distribution whose survival is everywhere larger, or a longer
              longest response, never takes less time (rounds grow with batch and length).

The tail treats the last m sequences as starting together: with a queue they started at
different rounds, so it is an upper bound there.

Worked number: one response length L = 1000 (S = 1 below 1000, maximum 1024), 64 prompts
of 500 tokens on an engine with 256 slots and B = 8192: prefill 32,000 tokens in 4 rounds
(3 x 8192 + 7424), no queue, tail 1000 rounds at batch 64 in 125 cells of 8 tokens, the
first at KV length 508, the last 1500.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.serving.round import ServeEngine, estimate_round_s

NUM_TAIL_CELLS = 128  # cells of the maximum response length the tail is summed over


@dataclass(frozen=True)
class GenerationTime:
    """Seconds of one rollout on each candidate engine (arrays), by part; `decoded_tokens`:
    response tokens the engine generates."""

    prefill_s: np.ndarray
    queued_s: np.ndarray
    tail_s: np.ndarray
    decoded_tokens: np.ndarray

    @property
    def total_s(self) -> np.ndarray:
        return self.prefill_s + self.queued_s + self.tail_s


def estimate_longest_response(quantile, num_samples: int, max_response_tokens: int) -> float:
    """The expected longest of `num_samples` responses, as a quantile of the response
    distribution: the CDF at the largest of n draws is Beta(n, 1), whose mean is n / (n + 1)
    (order statistics, David and Nagaraja 2003 §2.1), capped at the maximum response length.
    `quantile` maps q to the q-quantile. 3 draws of uniform 1..1000: q = 0.75, 750 tokens;
    one draw: the median, 500; 1023 draws: q = 0.99902, past 999's CDF of 0.999: 1000."""
    q = num_samples / (num_samples + 1.0)
    return float(min(quantile(q), max_response_tokens))


def tail_cells(max_response_tokens: int, longest: float) -> tuple[np.ndarray, np.ndarray]:
    """(cell starts, cell lengths) in tokens: NUM_TAIL_CELLS equal cells of the maximum
    response length, cut at `longest`. 1024 tokens, longest 100: starts 0, 8, ..., 96 and
    lengths 8, ..., 8, 4."""
    width = max_response_tokens / NUM_TAIL_CELLS
    starts = np.arange(NUM_TAIL_CELLS) * width
    starts = starts[starts < longest]
    return starts, np.minimum(width, longest - starts)


def estimate_generation_s(engine: ServeEngine, seqs, slots, prompt_tokens: float,
                          mean_response: float, mean_age: float, cell_starts: np.ndarray,
                          cell_tokens: np.ndarray, cell_alive: np.ndarray,
                          chunk_tokens: int) -> GenerationTime:
    """A rollout of `seqs` sequences on each engine (module docstring): `slots` running at
    most, prompts of `prompt_tokens`, responses of mean `mean_response` and mean running age
    `mean_age` (E[L^2] / (2 E[L])); the tail's cells (starts and lengths in tokens) and the
    share of responses longer than each start (`cell_alive`, S(t)); prefill chunks of
    `chunk_tokens` (max_num_batched_tokens)."""
    n = len(engine)
    seqs = np.asarray(seqs, dtype=float) * np.ones(n)
    running = np.minimum(seqs, np.maximum(np.asarray(slots, dtype=float), 1.0))
    prompt = float(prompt_tokens)

    prompt_total = seqs * prompt
    full = np.floor(np.maximum(prompt_total - 1.0, 0.0) / chunk_tokens)
    last = prompt_total - full * chunk_tokens
    prefill_s = (full * estimate_round_s(engine, 0.0, 0.0, float(chunk_tokens), prompt)
                 + estimate_round_s(engine, 0.0, 0.0, last, prompt))

    queued_rounds = (seqs - running) * mean_response / running
    queued_s = queued_rounds * estimate_round_s(engine, running, prompt + mean_age, 0.0, prompt)

    cells = len(cell_starts)
    tail_s = np.zeros(n)
    if cells:
        rows = np.repeat(np.arange(n), cells)
        batch = np.maximum(running[rows] * np.tile(cell_alive, n), 1.0)
        context = prompt + np.tile(cell_starts + cell_tokens, n)
        per_round = estimate_round_s(engine.take(rows), batch, context, 0.0, prompt)
        tail_s = (per_round * np.tile(cell_tokens, n)).reshape(n, cells).sum(axis=1)
    return GenerationTime(prefill_s=prefill_s, queued_s=queued_s, tail_s=tail_s,
                          decoded_tokens=seqs * mean_response)
