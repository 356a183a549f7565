"""The serving problem's memory as solver.cost.serving.memory counts it: vLLM's budget on the
cluster's GPU, the job's precisions, context and profiling batch, the constants' reserves.
"""

from __future__ import annotations

import numpy as np

from solver.cost.serving import memory as serve_memory
from solver.cost.serving.memory import (
    ServeMemory,
    ServeReserves,
    StageWeights,
    estimate_min_tp,
)
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, vllm_batch_defaults

__all__ = ["ServeMemory", "StageWeights", "estimate_kv_bytes_per_token", "estimate_min_tp",
           "estimate_model_weight_bytes", "estimate_serving_memory", "estimate_stage_weights"]


def estimate_stage_weights(problem: ServeProblem, c: ServeCandidates) -> StageWeights:
    """Weights per GPU on each candidate's worst stage (solver.cost.serving.memory)."""
    return serve_memory.estimate_stage_weights(
        problem.model_spec, problem.constants.weight_bytes(problem.job.precision), c.tp, c.pp,
        c.dp)


def estimate_kv_bytes_per_token(problem: ServeProblem, tp: np.ndarray, pp: np.ndarray
                                ) -> np.ndarray:
    """KV-cache bytes one token takes on one GPU of the worst stage, at the job's KV dtype
    and context (solver.cost.serving.memory)."""
    job = problem.job
    return serve_memory.estimate_kv_bytes_per_token(problem.model_spec, job.context,
                                                    job.kv_bytes_per_element, tp, pp)


def estimate_serving_memory(problem: ServeProblem, c: ServeCandidates) -> ServeMemory:
    """The per-GPU budget, its items and the KV capacity of each candidate: vLLM's share of
    the GPU's usable memory, its profiling run at the cluster's batch defaults."""
    job, constants = problem.job, problem.constants
    tokens, sequences = vllm_batch_defaults(problem.cluster)
    reserves = ServeReserves(cuda_context_gib=constants.cuda_context_gib,
                             cuda_graph_gib=constants.cuda_graph_gib,
                             nccl_gib=constants.nccl_gib)
    return serve_memory.estimate_serving_memory(
        problem.model_spec, job.gpu_memory_utilization * problem.cluster.usable_memory_bytes,
        job.context, constants.weight_bytes(job.precision), job.kv_bytes_per_element, tokens,
        sequences, constants.logits_bytes, reserves, c.tp, c.pp, c.dp)


def estimate_model_weight_bytes(problem: ServeProblem) -> float:
    """The whole model's weights at the serving precision (one copy, tp = pp = dp = 1)."""
    one = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    return float(estimate_stage_weights(problem, one).total_bytes[0])
