"""A serving problem's finite batch, `requests` prompts sent at once (solver.cost.serving.burst):
each candidate's engine rounds (solver.cost.serving.round), its KV cache (solver.serve.memory),
the scheduler limits (solver.serve.job.scheduler_limits) and the frontend's time per request.
The requests split evenly over the candidate's DP ranks (vllm's DP coordinator balances the
waiting queues), so the slowest rank, ceil(N / ranks) requests, sets the duration.

Lengths: a rank's n requests take the job's input and output distributions at the n mid
quantiles (k + 1/2) / n, in an order drawn once by a seeded permutation, each side its own (the
random dataset of `vllm bench serve` draws the two lengths of a request independently); a fixed
length is that length for all.
"""

from __future__ import annotations

import math

import numpy as np

from solver.cost.serving.burst import BurstResult, simulate_burst, tabulate_rounds
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, scheduler_limits
from solver.serve.memory import estimate_serving_memory
from solver.serve.timing import build_engine
from solver.serve.workload import LengthDistribution


def burst_lengths(lengths: LengthDistribution, n: int, seed: int) -> np.ndarray:
    """n request lengths of `lengths`: its mid quantiles in a seeded order (module docstring)."""
    quantiles = np.array([lengths.quantile((k + 0.5) / n) for k in range(n)], dtype=np.int64)
    return np.random.default_rng(seed).permutation(quantiles)


def estimate_burst(problem: ServeProblem, c: ServeCandidates, requests: int
                   ) -> list[BurstResult | None]:
    """Per candidate, the burst of `requests` prompts of the job's input and output lengths
    (module docstring; None where the candidate does not fit). The result's requests and rate
    are the whole deployment's."""
    job = problem.job
    budget, max_seqs = scheduler_limits(problem)
    memory = estimate_serving_memory(problem, c)
    engine = build_engine(problem, c, memory.kv_bytes_per_token)
    ranks = (c.dp * c.replicas).astype(int)
    results: list[BurstResult | None] = []
    for i in range(len(engine)):
        if not memory.fits[i]:
            results.append(None)
            continue
        one = engine.take([i])
        prompt = burst_lengths(job.input_distribution, math.ceil(requests / ranks[i]), seed=1)
        out = burst_lengths(job.output_distribution, len(prompt), seed=2)
        round_s = tabulate_rounds(one, budget * int(one.pp[0]), max_seqs, float(prompt.mean()),
                                  float(prompt.mean() + out.mean() / 2.0))
        result = simulate_burst(round_s, len(prompt), prompt, out,
                                budget * int(one.pp[0]), max_seqs, float(memory.kv_tokens[i]),
                                float(one.overhead.frontend_s(float(prompt.mean()))))
        results.append(BurstResult(requests=requests, output_len=result.output_len,
                                   duration_s=result.duration_s,
                                   ttft_mean_s=result.ttft_mean_s,
                                   tpot_mean_s=result.tpot_mean_s, rounds=result.rounds,
                                   preemptions=result.preemptions,
                                   most_running=result.most_running))
    return results
