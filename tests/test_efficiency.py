"""GEMM efficiency model against measured efficiencies (NVIDIA aiconfigurator GEMM tables,
H100 SXM bf16, as tabulated in the research notes §5.3; the full set is in
benchmarks/data/gemm_efficiency.csv and benchmarks/fit_gemm.py reports the fit)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_gpu_spec
from solver.cost.efficiency import ComputeConstants, estimate_gemm_s


def efficiency(gpu_name: str, m: int, n: int, k: int) -> float:
    gpu = load_gpu_spec(gpu_name)
    seconds = float(estimate_gemm_s(gpu, "bf16", m, k, n, ComputeConstants()))
    return 2 * m * n * k / seconds / gpu.peak_flop_per_s("bf16")


@pytest.mark.parametrize(
    ("m", "n", "k", "measured"),
    [(4096, 8192, 8192, 0.83), (8192, 16384, 8192, 0.79), (4096, 1024, 8192, 0.81),
     (8192, 8192, 1024, 0.72), (2048, 512, 8192, 0.56), (1024, 8192, 512, 0.52)],
)
def test_h100_training_shapes_within_15_percent(m: int, n: int, k: int, measured: float) -> None:
    assert efficiency("h100-sxm", m, n, k) == pytest.approx(measured, rel=0.15)


def test_efficiency_falls_as_tensor_parallelism_slices_the_gemm() -> None:
    """Notes §5.3 take-away 1: column-parallel slices (n = 8192/t) lose efficiency at small m."""
    slices = [efficiency("h100-sxm", 1024, 8192 // t, 8192) for t in (1, 2, 4, 8, 16)]
    assert all(a > b for a, b in zip(slices, slices[1:]))


def test_newer_gpus_need_bigger_gemms() -> None:
    """Notes §5.3 take-away 3: B200 sits below H100 at equal shape."""
    assert efficiency("b200", 1024, 1024, 8192) < efficiency("h100-sxm", 1024, 1024, 8192)


def test_small_gemms_collapse() -> None:
    """Notes §5.3: below ~10 GFLOP per GEMM the efficiency collapses (H100 median 0.19 at
    1-10 GFLOP, 0.04 at 0.1-1 GFLOP)."""
    assert efficiency("h100-sxm", 1165, 1165, 1165) < 0.35
    assert efficiency("h100-sxm", 541, 541, 541) < 0.12


def test_zero_work_costs_nothing() -> None:
    gpu = load_gpu_spec("h100-sxm")
    assert float(estimate_gemm_s(gpu, "bf16", 0, 4096, 4096, ComputeConstants())) == 0.0
    assert np.all(estimate_gemm_s(gpu, "bf16", np.array([0, 1]), 4096, 4096,
                                  ComputeConstants()) >= 0)
