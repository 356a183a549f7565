"""Fit the datasheet path's one GEMM constant, t_kernel (the fixed cost of one GEMM), to
measured efficiencies.

Reads benchmarks/data/gemm_efficiency.csv (NVIDIA aiconfigurator measurements, A100/H100/H200/
B200, by shape), predicts each with solver.cost.kernels.efficiency.estimate_datasheet_gemm_s (best-shape
fraction from the GPU catalog's MAMF measurement), and picks t_kernel minimising the squared
log error over all rows. Prints the per-GPU median/p90 error at the chosen value.

These four GPUs now take their GEMMs from the kernel tables (solver/cost/kernels/kernels.py); t_kernel
serves the GPUs without a table (and the per-kernel cost of element-wise passes), and is fitted
on these as the representative measured set. Rerun:

    .venv/bin/python benchmarks/fit_gemm.py
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from solver.catalog import load_gpu_spec
from solver.cost.kernels.efficiency import ComputeConstants, estimate_datasheet_gemm_s

DATA = Path(__file__).resolve().parent / "data" / "gemm_efficiency.csv"


def load_rows() -> list[dict]:
    lines = [line for line in DATA.read_text().splitlines() if not line.startswith("#")]
    return [
        {"gpu": r["gpu"], "m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]),
         "efficiency": float(r["efficiency"])}
        for r in csv.DictReader(lines)
    ]


def predict(rows: list[dict], kernel_s: float) -> np.ndarray:
    constants = ComputeConstants(gemm_kernel_s=kernel_s)
    out = []
    for row in rows:
        gpu = load_gpu_spec(row["gpu"])
        seconds = float(estimate_datasheet_gemm_s(gpu, "bf16", row["m"], row["k"], row["n"],
                                                  constants))
        out.append(2 * row["m"] * row["n"] * row["k"] / seconds / gpu.peak_flop_per_s("bf16"))
    return np.array(out)


def main() -> None:
    rows = load_rows()
    measured = np.array([r["efficiency"] for r in rows])
    grid = np.arange(0.0, 40.5e-6, 0.5e-6)
    losses = [float(np.mean(np.log(predict(rows, t) / measured) ** 2)) for t in grid]
    best = float(grid[int(np.argmin(losses))])
    predicted = predict(rows, best)
    print(f"t_kernel = {best * 1e6:.1f} us (rms log error {np.sqrt(min(losses)):.3f})")
    print(f"{'gpu':<10} {'rows':>4} {'median |err|':>13} {'p90 |err|':>10} {'bias':>7}")
    for gpu in sorted({r["gpu"] for r in rows}):
        mask = np.array([r["gpu"] == gpu for r in rows])
        err = predicted[mask] / measured[mask] - 1
        print(f"{gpu:<10} {mask.sum():>4} {np.median(np.abs(err)):>13.1%} "
              f"{np.percentile(np.abs(err), 90):>10.1%} {np.median(err):>+7.1%}")
    print("\nworst rows (gpu m n k measured predicted):")
    order = np.argsort(-np.abs(np.log(predicted / measured)))
    for i in order[:8]:
        r = rows[i]
        print(f"  {r['gpu']:<10} {r['m']:>6} {r['n']:>6} {r['k']:>6} "
              f"{measured[i]:.2f} {predicted[i]:.2f}")


if __name__ == "__main__":
    main()
