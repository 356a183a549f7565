"""Fit the step-time model's end-to-end constant on the public runs.

The constant, with a physical meaning (solver/cost/efficiency.py):
  elementwise_traffic_factor   element-wise HBM traffic over the minimal count
Everything else is counted (FLOPs, bytes, kernels) or measured elsewhere: GEMM and fused
attention times from the kernel tables of the GPUs that have one (solver/cost/kernels.py), the
datasheet path's MAMF fractions and GEMM kernel cost (benchmarks/fit_gemm.py), bandwidths from
the cluster presets.

attention_peak_fraction (0.35) is no longer fitted here: since the kernel tables it serves only
GPUs without a table and unfused attention, and the only runs left on that path are BLOOM's
(one source); it keeps the value it was fitted to on all dense runs before the tables
(--with-attention refits both, for comparison).

The fit uses the dense runs of benchmarks/data/published_runs.jsonl only; MoE runs are kept
out as a check. Each source counts equally (LLM Foundry has 216 runs, Megatron-LM 9), and the
loss is the mean squared log ratio predicted/measured of tokens/s per GPU. No constant is per
row, per source or per GPU. Rerun:

    .venv/bin/python benchmarks/fit_time.py [--with-attention]
"""

from __future__ import annotations

import argparse
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with-attention", action="store_true",
                        help="also refit attention_peak_fraction (two-constant grid)")
    args = parser.parse_args()
    runs, _ = load_published_runs()
    dense = [r for r in runs if r.arch_kind == "dense"]
    default = ComputeConstants()
    attentions = (np.arange(0.20, 0.71, 0.05) if args.with_attention
                  else [default.attention_peak_fraction])
    best = (np.inf, 0.0, 0.0)
    for attention in attentions:
        for traffic in np.arange(1.0, 12.1, 1.0):
            value = loss(dense, constants_for(attention, traffic))
            best = min(best, (value, attention, traffic))
    # refine around the coarse optimum
    _, a0, t0 = best
    fine = (np.arange(max(a0 - 0.05, 0.05), a0 + 0.051, 0.01) if args.with_attention
            else [a0])
    for attention in fine:
        for traffic in np.arange(max(t0 - 1.0, 1.0), t0 + 1.01, 0.25):
            value = loss(dense, constants_for(attention, traffic))
            best = min(best, (value, attention, traffic))
    value, attention, traffic = best
    print(f"attention_peak_fraction    = {attention:.2f}"
          + ("" if args.with_attention else " (not fitted)"))
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
