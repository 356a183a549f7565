"""The serving problem's engines as the cost model times them: each candidate's degrees, its
worst stage's layers and KV bytes, and the links of its groups (solver.cost.serving.round holds
the round, the idle TTFT and TPOT and the closed-batch rate; solver.cost.serving.load the load).
"""

from __future__ import annotations

import numpy as np

from solver.cost.comm.comm import estimate_group_link
from solver.cost.serving.overhead import engine_overhead
from solver.cost.serving.round import (
    Links,
    RoundParts,
    ServeEngine,
    estimate_idle_ttft_s,
    estimate_round_parts,
)
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, scheduler_limits
from solver.serve.memory import estimate_kv_bytes_per_token, estimate_stage_weights


def build_links(problem: ServeProblem, c: ServeCandidates) -> Links:
    """TP groups are consecutive ranks; PP stages are tp ranks apart; the MoE group is the tp x
    dp ranks of a stage (vLLM's rank order dp-pp-tp, TP fastest; with whole-node stages the
    node count it touches is that of tp x dp consecutive ranks)."""
    cluster = problem.cluster
    return Links(tp=estimate_group_link(cluster, 1, c.tp),
                 pp=estimate_group_link(cluster, c.tp, c.pp),
                 moe=estimate_group_link(cluster, 1, c.tp * c.dp))


def build_engine(problem: ServeProblem, c: ServeCandidates,
                 kv_bytes_per_token: np.ndarray | None = None) -> ServeEngine:
    """The candidates as solver.cost.serving.round times them (KV bytes per token: vLLM's, from
    solver.serve.memory, unless given), with the job's engine overhead."""
    weights = estimate_stage_weights(problem, c)
    if kv_bytes_per_token is None:
        kv_bytes_per_token = estimate_kv_bytes_per_token(problem, c.tp, c.pp)
    return ServeEngine(model_spec=problem.model_spec, gpu=problem.cluster.gpu,
                       precision=problem.job.precision,
                       weight_bytes_per_element=problem.constants.weight_bytes(
                           problem.job.precision),
                       tp=c.tp, pp=c.pp, dp=c.dp, ep=c.ep, layers=weights.layers,
                       moe_layers=weights.moe_layers,
                       kv_bytes_per_token=np.asarray(kv_bytes_per_token, dtype=float)
                       * np.ones(len(c)), links=build_links(problem, c),
                       overhead=engine_overhead(problem.job.engine_release.generation,
                                                problem.job.num_scheduler_steps))


def estimate_decode_round(problem: ServeProblem, engine: ServeEngine, batch) -> RoundParts:
    """A round of `batch` decoding sequences per DP rank at the mean KV length of a decode
    (input + output / 2), no prefill."""
    job = problem.job
    context = job.input_distribution.mean + job.output_distribution.mean / 2.0
    return estimate_round_parts(engine, np.asarray(batch, dtype=float), context, 0.0,
                                job.input_distribution.mean)


def estimate_ttft_s(problem: ServeProblem, engine: ServeEngine) -> np.ndarray:
    """Time to first token of one --input-len prompt on an idle engine."""
    budget, _ = scheduler_limits(problem)
    return estimate_idle_ttft_s(engine, float(problem.job.input_len), budget)


def estimate_tpot_s(problem: ServeProblem, engine: ServeEngine, batch) -> np.ndarray:
    """Seconds per output token of each sequence with `batch` sequences decoding per DP rank
    (no prefill interleaved): the decode round."""
    return estimate_decode_round(problem, engine,
                                 np.maximum(np.asarray(batch, dtype=float), 1.0)).total_s
