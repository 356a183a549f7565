"""Fit the step-time model's end-to-end constants on the public runs.

The constants, each with a physical meaning (solver/cost/kernels/efficiency.py):
  elementwise_traffic_factor   element-wise HBM traffic over the minimal count
  table_rate_fraction          the share of a measured kernel's rate (timed alone, under CUDA
                               graphs) that it reaches inside a training step
Everything else is counted (FLOPs, bytes, kernels) or measured elsewhere: GEMM and fused
attention times from the kernel tables of the GPUs that have one (solver/cost/kernels/kernels.py), the
datasheet path's MAMF fractions and GEMM kernel cost (benchmarks/fit_gemm.py), bandwidths from
the cluster presets.

attention_peak_fraction (0.35) is no longer fitted here: since the kernel tables it serves only
GPUs without a table and unfused attention, and the only runs left on that path are BLOOM's
(one source); it keeps the value it was fitted to on all dense runs before the tables
(--with-attention refits both, for comparison).

The fit uses the dense runs of benchmarks/data/published_runs.jsonl only; MoE runs are kept
out as a check. Every run is predicted as time_accuracy.py predicts it (its source's framework
profile and stated switches), with only the compute constants varied. Each source counts equally (LLM Foundry has 216 runs, Megatron-LM 9), and the
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

from solver.cost.kernels.efficiency import ComputeConstants  # noqa: E402


def loss(runs, compute: ComputeConstants) -> float:
    results = evaluate(runs, compute=compute)
    by_source: dict[str, list[float]] = {}
    for run, predicted in results:
        by_source.setdefault(run.source_group, []).append(
            np.log(predicted / run.tokens_per_sec_per_gpu) ** 2)
    return float(np.mean([np.mean(v) for v in by_source.values()]))


def constants_for(attention: float, traffic: float, fraction: float) -> ComputeConstants:
    return ComputeConstants(attention_peak_fraction=attention,
                            elementwise_traffic_factor=traffic, table_rate_fraction=fraction)


def grid_search(dense, attentions, traffics, fractions) -> tuple[float, float, float, float]:
    """(loss, attention, traffic, fraction) at the least loss over the grid."""
    best = (np.inf, 0.0, 0.0, 0.0)
    for attention in attentions:
        for traffic in traffics:
            for fraction in fractions:
                value = loss(dense, constants_for(attention, traffic, fraction))
                best = min(best, (value, attention, traffic, fraction))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--with-attention", action="store_true",
                        help="also refit attention_peak_fraction (at the fitted table rate)")
    args = parser.parse_args()
    runs, _ = load_published_runs()
    dense = [r for r in runs if r.arch_kind == "dense"]
    default = ComputeConstants()
    a0 = default.attention_peak_fraction
    _, _, t0, f0 = grid_search(dense, [a0], np.arange(1.0, 12.1, 1.0),
                               np.round(np.arange(0.70, 1.001, 0.05), 2))
    # refine around the coarse optimum
    best = grid_search(dense, [a0], np.arange(max(t0 - 1.0, 1.0), t0 + 1.01, 0.25),
                       np.round(np.arange(max(f0 - 0.05, 0.5), min(f0 + 0.05, 1.0) + 1e-9, 0.01), 2))
    if args.with_attention:
        _, _, t1, f1 = best
        best = min(best, grid_search(dense, np.arange(0.20, 0.71, 0.05), [t1], [f1]))
    value, attention, traffic, fraction = best
    print(f"attention_peak_fraction    = {attention:.2f}"
          + ("" if args.with_attention else " (not fitted)"))
    print(f"elementwise_traffic_factor = {traffic:.2f}")
    print(f"table_rate_fraction        = {fraction:.2f}")
    print(f"rms log error (dense, sources weighted equally) = {np.sqrt(value):.3f}")
    fitted = evaluate(runs, compute=constants_for(attention, traffic, fraction))
    for kind in ("dense", "moe"):
        errors = np.array([abs(p / r.tokens_per_sec_per_gpu - 1) for r, p in fitted
                           if r.arch_kind == kind])
        print(f"{kind:<6} n={len(errors):>3}  median |err| {np.median(errors):6.1%}  "
              f"p90 {np.percentile(errors, 90):6.1%}")


if __name__ == "__main__":
    main()
