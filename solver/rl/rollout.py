"""The rollout engines of a pool: vLLM's memory under the budget the phase leaves it, the
sequences each engine runs at once, and the rollout's generation time
(solver.cost.rl.generation), vectorised over the engine layouts a pool can take.

Layouts: tp a power of two within a node that divides the attention heads (vLLM refuses
others: "Total number of attention heads must be divisible by tensor parallel size"), pp 1, and
independent engines (replicas) over the pool; a mixture of experts also as one engine of
tp x dp GPUs with expert parallel (vLLM --data-parallel-size --enable-expert-parallel).
Scheduler limits are verl's rollout defaults (ppo_trainer.yaml at verl b178a3cd:
max_num_seqs 256, max_num_batched_tokens 8192).

An engine fits when its KV cache holds one longest sequence (longest prompt +
max_response_len): vLLM refuses to start otherwise (vllm/v1/core/kv_cache_utils.py
check_enough_kv_cache_memory). Its slots are min(max_num_seqs, KV tokens / the tokens a running
sequence holds on average: the prompt and its mean age).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.rl.generation import (
    GenerationTime,
    estimate_generation_s,
    estimate_longest_response,
    tail_cells,
)
from solver.cost.serving.memory import ServeMemory
from solver.rl.job import RlJob
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeJob, ServeProblem
from solver.serve.memory import estimate_serving_memory
from solver.serve.timing import build_engine
from solver.serve.workload import LengthDistribution
from solver.spec import ClusterSpec, ModelSpec

VERL_MAX_NUM_SEQS = 256
VERL_MAX_NUM_BATCHED_TOKENS = 8192
MAX_EXPERT_GROUP = 64  # GPUs of one expert-parallel engine tried


@dataclass(frozen=True)
class Rollouts:
    """The engine layouts of a pool (arrays over layouts): degrees, memory, whether each
    fits, its slots and sequences per DP rank, and its generation time."""

    candidates: ServeCandidates
    memory: ServeMemory
    fits: np.ndarray
    slots: np.ndarray
    seqs_per_rank: np.ndarray
    generation: GenerationTime
    problem: ServeProblem


def estimate_survival(lengths: LengthDistribution, t: np.ndarray) -> np.ndarray:
    """P(L > t) of a length distribution, exactly: fixed (1 below its length), uniform over
    low..high ((high - floor(t)) / count, clipped to 0..1) or empirical (the share of its values
    above t). Uniform 1..1000 at t = 250: 0.75."""
    t = np.asarray(t, dtype=float)
    if lengths.kind == "fixed":
        return (t < lengths.low).astype(float)
    if lengths.kind == "uniform":
        count = lengths.high - lengths.low + 1
        above = lengths.high - np.maximum(np.floor(t), lengths.low - 1)
        return np.clip(above / count, 0.0, 1.0)
    values = np.asarray(lengths.values, dtype=float)
    return 1.0 - np.searchsorted(values, t, side="right") / len(values)


def mean_running_age(lengths: LengthDistribution) -> float:
    """E[L^2] / (2 E[L]): the mean decoded length of a running sequence in steady state
    (solver.cost.rl.generation). Fixed 1000: 500; uniform 1..1000: 333,833.5 / 1001 = 333.5."""
    points, weights = lengths.support()
    if lengths.kind == "uniform":  # exact moments of the integers low..high
        values = np.arange(lengths.low, lengths.high + 1, dtype=float)
        return float(np.mean(values ** 2) / (2.0 * np.mean(values)))
    return float(np.dot(points ** 2, weights) / (2.0 * np.dot(points, weights)))


def build_rollout_candidates(model_spec: ModelSpec, cluster: ClusterSpec, num_gpus: int
                             ) -> ServeCandidates:
    """Engine layouts on `num_gpus` GPUs (module docstring)."""
    rows = []
    tp = 1
    while tp <= min(cluster.gpus_per_node, num_gpus):
        if num_gpus % tp == 0 and model_spec.num_attention_heads % tp == 0:
            engines = num_gpus // tp
            rows.append((tp, 1, 1, engines))
            if model_spec.is_moe:
                rows.append((tp, 1, tp, engines))
                if engines > 1 and tp * engines <= MAX_EXPERT_GROUP:
                    rows.append((tp, engines, tp * engines, 1))
        tp *= 2
    tp_, dp, ep, replicas = (np.array(column, dtype=np.int64) for column in zip(*rows)) \
        if rows else (np.zeros(0, dtype=np.int64),) * 4
    return ServeCandidates(tp=tp_, pp=np.ones_like(tp_), dp=dp, ep=ep, replicas=replicas)


def build_rollout_problem(model_spec: ModelSpec, cluster: ClusterSpec, job: RlJob,
                          num_gpus: int, budget_bytes: float,
                          max_num_seqs: int = VERL_MAX_NUM_SEQS) -> ServeProblem:
    """The rollout as a serving problem: context the longest sequence, the mean lengths,
    vLLM's share `budget_bytes` of each GPU's usable memory, its max_num_seqs (verl's by
    default) and verl's max_num_batched_tokens."""
    usable = cluster.usable_memory_bytes
    prompt = max(1, round(job.prompt_lengths.mean))
    response = max(1, min(round(job.response_lengths.mean), job.max_sequence - prompt))
    serve_job = ServeJob(context=job.max_sequence, input_len=prompt, output_len=response,
                         gpu_memory_utilization=min(max(budget_bytes / usable, 1e-6), 1.0),
                         max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=VERL_MAX_NUM_BATCHED_TOKENS)
    return ServeProblem(model_spec=model_spec, cluster=cluster, num_gpus=num_gpus,
                        job=serve_job)


def estimate_rollouts(model_spec: ModelSpec, cluster: ClusterSpec, job: RlJob, num_gpus: int,
                      budget_bytes: float, max_num_seqs: int = VERL_MAX_NUM_SEQS) -> Rollouts:
    """Every engine layout of a pool of `num_gpus` GPUs whose vLLM may take `budget_bytes`
    of each GPU and run `max_num_seqs` sequences at once, with its generation time for the
    step's samples spread evenly over the DP ranks (the pool's slowest rank has the longest
    response)."""
    candidates = build_rollout_candidates(model_spec, cluster, num_gpus)
    problem = build_rollout_problem(model_spec, cluster, job, num_gpus, budget_bytes,
                                    max_num_seqs)
    memory = estimate_serving_memory(problem, candidates)
    fits = (budget_bytes > 0) & (memory.kv_tokens >= job.max_sequence)
    prompt = job.prompt_lengths.mean
    age = mean_running_age(job.response_lengths)
    slots = np.minimum(max_num_seqs, np.floor(memory.kv_tokens / (prompt + age)))
    ranks = candidates.replicas * candidates.dp
    seqs = np.ceil(job.num_samples / ranks)
    longest = estimate_longest_response(job.response_lengths.quantile, job.num_samples,
                                        job.max_response_len)
    starts, widths = tail_cells(job.max_response_len, longest)
    generation = estimate_generation_s(
        build_engine(problem, candidates), seqs, np.maximum(slots, 1.0), prompt,
        job.response_lengths.mean, age, starts, widths,
        estimate_survival(job.response_lengths, starts), VERL_MAX_NUM_BATCHED_TOKENS)
    return Rollouts(candidates=candidates, memory=memory, fits=fits, slots=slots,
                    seqs_per_rank=seqs, generation=generation, problem=problem)


def describe_layout(candidates: ServeCandidates, index: int) -> str:
    """"tp 2 x 4 engines" or "tp 4 dp 8 ep 32" (one expert-parallel engine)."""
    row = candidates.row(index)
    text = f"tp {row['tp']}"
    if row["dp"] > 1:
        text += f" dp {row['dp']}"
    if row["ep"] > 1:
        text += f" ep {row['ep']}"
    if row["replicas"] > 1:
        text += f" x {row['replicas']} engines"
    return text


__all__ = ["Rollouts", "build_rollout_candidates", "describe_layout", "estimate_rollouts",
           "estimate_survival", "mean_running_age"]
