"""A finite batch: N requests sent at once (`vllm bench serve --num-prompts N` at request rate
inf, the default; sglang.bench_serving likewise), run round by round as a vLLM V1 engine runs
them, until the last one ends. Not a steady state: the batch starts empty, fills, and drains.

The client sends all N at t = 0; the serial frontend (solver.cost.serving.overhead frontend_s)
hands them to the engine one at a time, the k-th (k = 1..N) at k x frontend_s. Each round
(vllm/v1/core/sched/scheduler.py Scheduler.schedule, first come first served, chunked prefill):

  1. the running requests, in the order they were admitted, take their tokens from the round's
     budget B (max_num_batched_tokens, x pp micro-batches): 1 for a decoding one, the rest of
     its prompt (up to what is left of B) for one still prefilling;
  2. where the KV cache cannot hold a running request's new tokens, the last admitted running
     request is preempted (recompute: its KV is freed, it goes back to the front of the queue
     and later prefills its prompt and the tokens it had generated: `_preempt_request`);
  3. waiting requests that have reached the engine are admitted in order while fewer than
     max_num_seqs run, budget is left and the KV cache holds their chunk; the first that does
     not fit stops admission;
  4. the round lasts round_s(decode rows, prefill tokens, their contexts), the cost model's
     round (solver.cost.serving.round); a request whose prompt completes in it gets its first
     token at its end (the step samples one), a decoding request one more token.

What the benchmark reports (vllm/benchmarks/serve.py calculate_metrics): TTFT from the send to
the first token; TPOT = (latency - TTFT) / (output - 1), the first token excluded, averaged over
the requests with more than one output token; the duration from the first send until the last
request ends; request throughput N / duration; output throughput N x O / duration.

Worked number (tests/test_serve_burst.py): 4 requests of 100 + 3 tokens, B = 256, no frontend,
rounds of 10 ms + 0.1 ms per prefill token. Round 1 prefills requests 1, 2 and 56 tokens of 3
(10 + 25.6 = 35.6 ms); round 2 decodes 1 and 2 beside the last 44 of 3 and all 100 of 4
(10 + 14.4 = 24.4 ms, t = 60 ms); round 3 decodes all four (t = 70 ms: 1 and 2 end), round 4
the last two (t = 80 ms). TTFT 35.6, 35.6, 60, 60 ms (mean 47.8); TPOT (70 - 35.6) / 2 =
17.2 and (80 - 60) / 2 = 10 ms (mean 13.6); 4 requests in 80 ms: 50 requests/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from solver.cost.serving.round import ServeEngine, estimate_round_s

# round_s(decode_rows, prefill_tokens, decode_context, prefill_context) -> seconds
RoundTime = Callable[[float, float, float, float], float]


@dataclass(frozen=True)
class BurstResult:
    """What `vllm bench serve` reports of a finite batch (module docstring)."""

    requests: int
    output_len: float  # the mean
    duration_s: float
    ttft_mean_s: float
    tpot_mean_s: float
    rounds: int
    preemptions: int
    most_running: int
    ttft_s: np.ndarray | None = None  # per request, in sending order
    tpot_s: np.ndarray | None = None  # per request (0 where it generates one token)

    @property
    def request_rate_per_s(self) -> float:
        return self.requests / self.duration_s

    @property
    def output_tokens_per_s(self) -> float:
        return self.requests * self.output_len / self.duration_s


TABLE_POINTS = 33  # decode populations the round table is tabulated on (geometric, and 0)


def tabulate_rounds(engine: ServeEngine, budget: int, max_seqs: int, prompt_mean: float,
                    decode_context: float) -> RoundTime:
    """The engine's round as a table: round_s(d, p) = tau_d(d) + p c_p(d), with tau_d the round
    of d decodes alone and c_p(d) = (round(d, B - d) - tau_d(d)) / (B - d) what a prefill token
    adds beside them (solver.cost.serving.curves' construction, here up to min(max_seqs, B)
    decodes), at one decode context (the mean over a request's life, E[I] + E[O] / 2) and
    prompts of the mean length; linear between the table's populations. One vectorised call
    of solver.cost.serving.round instead of one a round."""
    top = float(min(max_seqs, budget))
    grid = np.concatenate([[0.0], np.unique(np.round(np.geomspace(1.0, top, TABLE_POINTS - 1)))])
    free = np.maximum(budget - grid, 1.0)
    rows = np.concatenate([grid, grid])
    prefill = np.concatenate([np.zeros_like(grid), free])
    seconds = estimate_round_s(engine.take(np.zeros(len(rows), dtype=int)), rows,
                               decode_context, prefill, prompt_mean)
    decode_s, full_s = seconds[:len(grid)], seconds[len(grid):]
    token_s = np.maximum(full_s - decode_s, 0.0) / free

    def round_s(d: float, p: float, _decode_context: float, _prefill_context: float) -> float:
        return float(np.interp(d, grid, decode_s) + p * np.interp(d, grid, token_s))

    return round_s


def _allot(need: np.ndarray, left: int) -> np.ndarray:
    """Tokens each of a queue in order takes from `left`: its need, or what is left (a prompt's
    chunk), nothing once the budget is spent."""
    before = np.cumsum(need) - need
    return np.clip(left - before, 0, need)


def simulate_burst(round_s: RoundTime, requests: int, input_len, output_len,
                   budget: int, max_seqs: int, kv_tokens: float,
                   frontend_s: float = 0.0) -> BurstResult:
    """N = `requests` prompts of `input_len` tokens, each generating `output_len` (ints, or
    arrays of N in sending order), sent at once to one engine of round budget `budget` tokens,
    at most `max_seqs` running and a KV cache of `kv_tokens` (module docstring). Raises
    ValueError where one request alone does not fit the KV cache (the engine refuses it)."""
    n = int(requests)
    prompt = np.broadcast_to(np.asarray(input_len, dtype=np.int64), (n,)).copy()
    out = np.broadcast_to(np.asarray(output_len, dtype=np.int64), (n,)).copy()
    if n < 1 or prompt.min() < 1 or out.min() < 1 or budget < 1 or max_seqs < 1:
        raise ValueError("a burst needs requests, input, output, budget and max_seqs >= 1")
    if (prompt + out).max() > kv_tokens:
        raise ValueError(f"a request of {(prompt + out).max()} tokens does not fit the KV "
                         f"cache of {kv_tokens:.0f} tokens")
    arrive = np.arange(1, n + 1) * float(frontend_s)
    target = prompt.copy()               # tokens to prefill (+ those generated, once preempted)
    done = np.zeros(n, dtype=np.int64)   # tokens prefilled
    kv = np.zeros(n, dtype=np.int64)     # tokens in the KV cache: those prefilled and decoded
    generated = np.zeros(n, dtype=np.int64)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    running = np.zeros(0, dtype=np.int64)  # in admission order
    queue = np.arange(n)                 # waiting in order; preempted ones go to the front
    t, rounds, preemptions, most = 0.0, 0, 0, 0
    while len(running) or len(queue):
        if not len(running) and arrive[queue[0]] > t:
            t = float(arrive[queue[0]])  # the engine idles until the next request arrives
        # 1-2. The running requests take their tokens in order; the tail is preempted where
        # the KV cache cannot hold the scheduled prefix's tokens.
        decoding = done[running] >= target[running]
        take = _allot(np.where(decoding, 1, target[running] - done[running]), budget)
        keep = int(np.searchsorted(np.cumsum(kv[running] + take), kv_tokens, side="right"))
        if keep < len(running):
            victims = running[keep:][::-1]   # the last admitted leaves first
            target[victims] = prompt[victims] + generated[victims]
            done[victims], kv[victims] = 0, 0
            queue = np.concatenate([victims[::-1], queue])
            preemptions += len(victims)
            running, take, decoding = running[:keep], take[:keep], decoding[:keep]
        used = float(np.sum(kv[running] + take))
        left = budget - int(take.sum())
        # 3. Waiting requests that have arrived join in order while seats, budget and KV last.
        seats = max_seqs - len(running)
        if seats > 0 and left > 0 and len(queue):
            head = queue[:seats]
            arrived = arrive[head] <= t
            ready = head[: len(head) if arrived.all() else int(np.argmin(arrived))]
            joins = _allot(target[ready] - done[ready], left)
            fits = used + np.cumsum(joins) <= kv_tokens
            count = int(np.argmin(fits)) if not fits.all() else len(ready)
            count = min(count, int(np.count_nonzero(joins)))
            running = np.concatenate([running, ready[:count]])
            take = np.concatenate([take, joins[:count]])
            decoding = np.concatenate([decoding, np.zeros(count, dtype=bool)])
            queue = queue[count:]
        most = max(most, len(running))
        # 4. The round.
        active = take > 0
        d = float(np.count_nonzero(decoding & active))
        p = float(take[~decoding].sum())
        context = prompt[running] + generated[running]
        decode_context = float(np.mean(context[decoding & active])) if d else 0.0
        prefill_context = float(np.mean(prompt[running][~decoding & active])) if p else 0.0
        t += float(round_s(d, p, decode_context, prefill_context))
        rounds += 1
        ids, tokens = running[active], take[active]
        was_decoding = decoding[active]
        done[ids[~was_decoding]] += tokens[~was_decoding]
        kv[ids] += tokens
        sampled = ids[was_decoding | (done[ids] >= target[ids])]
        generated[sampled] += 1
        new = sampled[np.isnan(first[sampled])]
        first[new] = t
        ended = sampled[generated[sampled] >= out[sampled]]
        finish[ended] = t
        running = running[~np.isin(running, ended)]
    many = out > 1
    each = np.where(many, (finish - first) / np.maximum(out - 1, 1), 0.0)
    tpot = float(np.mean(each[many])) if many.any() else 0.0
    return BurstResult(requests=n, output_len=float(out.mean()),
                       duration_s=float(np.max(finish)), ttft_mean_s=float(np.mean(first)),
                       tpot_mean_s=tpot, rounds=rounds, preemptions=preemptions,
                       most_running=most, ttft_s=first, tpot_s=each)
