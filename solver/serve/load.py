"""The serving problem under load: its workload and scheduler limits handed to the load model
of solver.cost.serving (curves tabulates the rounds, load composes TTFT and TPOT at a
rate), and what `parplan serve` reports of each candidate: idle latency, the operating point
(the offered request rate or concurrency; without one, the most load within the SLO) and the
most load it carries within the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.serving import load as serve_load
from solver.cost.serving.closed import estimate_closed_point
from solver.cost.serving.curves import LoadCurves, LoadShape, estimate_load_curves as _curves
from solver.cost.serving.load import (
    LoadPoint,
    estimate_load_point,
    interpolate_curve,
    largest_rate,
    within_slo,
)
from solver.serve.candidates import ServeCandidates
from solver.serve.job import ServeProblem, scheduler_limits
from solver.serve.memory import estimate_serving_memory
from solver.serve.timing import build_engine

# Loads the front samples, as fractions of the most each plan carries stably: up to 0.9 (the
# M/G/1 wait grows as 1 / (1 - rho) beyond, and no SLO is met there).
PARETO_FRACTIONS = tuple(float(x) for x in np.geomspace(0.02, 0.9, 12))


def build_load_shape(problem: ServeProblem) -> LoadShape:
    """The job's length distributions, SLO quantile and scheduler limits."""
    job = problem.job
    inputs, outputs = job.input_distribution, job.output_distribution
    lengths, weights = inputs.support()
    out_lengths, out_weights = outputs.support()
    budget, max_seqs = scheduler_limits(problem)
    return LoadShape(input_lengths=lengths, input_weights=weights,
                     input_quantile_len=inputs.quantile(job.load.quantile),
                     output_lengths=out_lengths, output_weights=out_weights,
                     quantile=job.load.quantile, budget=budget, max_seqs=max_seqs,
                     arrival_scv=job.load.arrival_scv)


def estimate_load_curves(problem: ServeProblem, c: ServeCandidates,
                         phase: str = "both") -> LoadCurves:
    """The rounds of every candidate on a grid of decode populations (solver.cost.serving.curves);
    `phase` "both" (aggregated), "decode" or "prefill" (a disaggregated pool's engine)."""
    shape = build_load_shape(problem)
    memory = estimate_serving_memory(problem, c)
    kv_seqs = np.where(memory.fits, np.floor(memory.kv_tokens
                                             / (shape.input_mean + shape.output_mean)), 0)
    engine = build_engine(problem, c, memory.kv_bytes_per_token)
    return _curves(engine, shape, kv_seqs, c.dp * c.replicas, c.num_gpus, phase)


def slo_limits_s(problem: ServeProblem) -> tuple[float | None, float | None]:
    """(--max-ttft-ms, --max-tpot-ms) in seconds, None where not given."""
    job = problem.job
    return (None if job.max_ttft_ms is None else job.max_ttft_ms * 1e-3,
            None if job.max_tpot_ms is None else job.max_tpot_ms * 1e-3)


def meets_slo(problem: ServeProblem, point: LoadPoint) -> np.ndarray:
    """Stable and within --max-ttft-ms / --max-tpot-ms at the SLO percentile."""
    return within_slo(point, *slo_limits_s(problem))


@dataclass(frozen=True)
class ServeLoad:
    """What the load model says about each candidate: idle latency, the operating point (the
    requested rate or concurrency; without one, the most load within the SLO), and the most
    load each carries within the SLO (deployment requests/s and concurrency)."""

    ttft_idle_s: np.ndarray
    tpot_idle_s: np.ndarray
    point: LoadPoint
    meets_slo: np.ndarray
    max_rate_per_s: np.ndarray
    max_concurrency: np.ndarray
    curves: LoadCurves


def estimate_serving_load(problem: ServeProblem, c: ServeCandidates) -> ServeLoad:
    """The load model for every candidate (module docstring)."""
    job = problem.job
    curves = estimate_load_curves(problem, c)
    feasible = largest_rate(curves, lambda p: meets_slo(problem, p))
    best = estimate_load_point(curves, feasible)
    ok_best = meets_slo(problem, best) & (feasible > 0)
    max_rate = np.where(ok_best, best.rate_per_s, 0.0)
    max_concurrency = np.where(ok_best, best.concurrency, 0.0)
    if job.load.request_rate is not None:
        point = estimate_load_point(curves, job.load.request_rate / curves.engines)
    elif job.load.concurrency is not None:
        point = estimate_closed_point(curves, job.load.concurrency / curves.engines)
    else:
        point = best
    zero = np.zeros(len(c))
    return ServeLoad(ttft_idle_s=curves.service_mean_s[:, 0],
                     tpot_idle_s=interpolate_curve(curves, curves.round_s, zero + 1.0),
                     point=point, meets_slo=meets_slo(problem, point) & (point.rate_per_s > 0),
                     max_rate_per_s=max_rate, max_concurrency=max_concurrency, curves=curves)


def estimate_max_num_seqs(problem: ServeProblem, load: ServeLoad | LoadCurves) -> np.ndarray:
    """The --max-num-seqs to launch with (solver.cost.serving.load.estimate_max_num_seqs)."""
    _, max_seqs = scheduler_limits(problem)
    curves = load if isinstance(load, LoadCurves) else load.curves
    return serve_load.estimate_max_num_seqs(curves, max_seqs, slo_limits_s(problem)[1])
