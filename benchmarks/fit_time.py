"""Fit the step-time model's two end-to-end constants on the public runs.

The constants, each with a physical meaning (solver/cost/efficiency.py):
  attention_peak_fraction      the fraction of the dense peak FlashAttention reaches
  elementwise_traffic_factor   element-wise HBM traffic over the minimal count
Everything else is counted (FLOPs, bytes, kernels) or measured elsewhere (MAMF fractions, the
GEMM kernel cost from benchmarks/fit_gemm.py, bandwidths from the cluster presets).

The fit uses the dense runs of benchmarks/data/published_runs.jsonl only; MoE runs are kept
out as a check. Each source counts equally (LLM Foundry has 216 runs, Megatron-LM 9), and the
loss is the mean squared log ratio predicted/measured of tokens/s per GPU. No constant is per
row, per source or per GPU. Rerun:

    .venv/bin/python benchmarks/fit_time.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published import load_published_runs  # noqa: E402
from time_accuracy import evaluate  # noqa: E402

from solver.cost.efficiency import ComputeConstants  # noqa: E402
from solver.cost.steptime import TimeConstants  # noqa: E402


def loss(runs, constants: TimeConstants) -> float:
    results = evaluate(runs, constants)
    by_source: dict[str, list[float]] = {}
    for run, predicted in results:
        by_source.setdefault(run.source_group, []).append(
            np.log(predicted / run.tokens_per_sec_per_gpu) ** 2)
    return float(np.mean([np.mean(v) for v in by_source.values()]))


def constants_for(attention: float, traffic: float) -> TimeConstants:
    compute = ComputeConstants(attention_peak_fraction=attention,
                               elementwise_traffic_factor=traffic)
    return TimeConstants(compute=compute)


def main() -> None:
    runs, _ = load_published_runs()
    dense = [r for r in runs if r.arch_kind == "dense"]
    best = (np.inf, 0.0, 0.0)
    for attention in np.arange(0.20, 0.71, 0.05):
        for traffic in np.arange(1.0, 12.1, 1.0):
            value = loss(dense, constants_for(attention, traffic))
            best = min(best, (value, attention, traffic))
    # refine around the coarse optimum
    _, a0, t0 = best
    for attention in np.arange(max(a0 - 0.05, 0.05), a0 + 0.051, 0.01):
        for traffic in np.arange(max(t0 - 1.0, 1.0), t0 + 1.01, 0.25):
            value = loss(dense, constants_for(attention, traffic))
            best = min(best, (value, attention, traffic))
    value, attention, traffic = best
    print(f"attention_peak_fraction    = {attention:.2f}")
    print(f"elementwise_traffic_factor = {traffic:.2f}")
    print(f"rms log error (dense, sources weighted equally) = {np.sqrt(value):.3f}")
    fitted = evaluate(runs, constants_for(attention, traffic))
    for kind in ("dense", "moe"):
        errors = np.array([abs(p / r.tokens_per_sec_per_gpu - 1) for r, p in fitted
                           if r.arch_kind == kind])
        print(f"{kind:<6} n={len(errors):>3}  median |err| {np.median(errors):6.1%}  "
              f"p90 {np.percentile(errors, 90):6.1%}")


if __name__ == "__main__":
    main()
