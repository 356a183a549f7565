"""GEMM efficiency against measured efficiencies (NVIDIA aiconfigurator GEMM tables, H100 SXM
bf16, as tabulated in the research notes §5.3; the full set is in
benchmarks/data/gemm_efficiency.csv and benchmarks/fit_gemm.py reports the datasheet path's
fit). H100 has a kernel table, so its GEMMs are those measurements (solver.cost.kernels.kernels); the
datasheet path (roofline x MAMF fraction + t_kernel) is checked on a copy of the H100 without
its table and on H800 (same GH100 compute, no table)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_gpu_spec
from solver.cost.kernels.efficiency import (
    ComputeConstants,
    estimate_datasheet_gemm_s,
    estimate_gemm_backward_s,
    estimate_gemm_s,
)
from solver.spec import GpuSpec


def datasheet_h100() -> GpuSpec:
    return load_gpu_spec("h100-sxm").model_copy(update={"kernel_table": None})


def efficiency(gpu: GpuSpec | str, m: int, n: int, k: int) -> float:
    gpu = load_gpu_spec(gpu) if isinstance(gpu, str) else gpu
    seconds = float(estimate_gemm_s(gpu, "bf16", m, k, n, ComputeConstants()))
    return 2 * m * n * k / seconds / gpu.peak_flop_per_s("bf16")


SHAPES = [(4096, 8192, 8192, 0.83), (8192, 16384, 8192, 0.79), (4096, 1024, 8192, 0.81),
          (8192, 8192, 1024, 0.72), (2048, 512, 8192, 0.56), (1024, 8192, 512, 0.52)]


@pytest.mark.parametrize(("m", "n", "k", "measured"), SHAPES)
def test_h100_table_gives_the_measured_efficiency(m: int, n: int, k: int,
                                                  measured: float) -> None:
    assert efficiency("h100-sxm", m, n, k) == pytest.approx(measured, abs=0.01)


@pytest.mark.parametrize(("m", "n", "k", "measured"), SHAPES)
def test_datasheet_path_within_15_percent(m: int, n: int, k: int, measured: float) -> None:
    assert efficiency(datasheet_h100(), m, n, k) == pytest.approx(measured, rel=0.15)


def test_efficiency_falls_as_tensor_parallelism_slices_the_gemm() -> None:
    """Notes §5.3 take-away 1: column-parallel slices (n = 8192/t) lose efficiency at small m;
    measured from t = 2 on (at t = 1 the measured n = 8192 sits below n = 4096: tiling)."""
    for gpu in (datasheet_h100(), load_gpu_spec("h800")):
        slices = [efficiency(gpu, 1024, 8192 // t, 8192) for t in (1, 2, 4, 8, 16)]
        assert all(a > b for a, b in zip(slices, slices[1:]))
    measured = [efficiency("h100-sxm", 1024, 8192 // t, 8192) for t in (2, 4, 8, 16)]
    assert all(a > b for a, b in zip(measured, measured[1:]))


def test_newer_gpus_need_bigger_gemms() -> None:
    """Notes §5.3 take-away 3: B200 sits below H100 at equal shape (both measured)."""
    assert efficiency("b200", 1024, 1024, 8192) < efficiency("h100-sxm", 1024, 1024, 8192)


def test_small_gemms_collapse() -> None:
    """Notes §5.3: below ~10 GFLOP per GEMM the efficiency collapses (H100 median 0.19 at
    1-10 GFLOP, 0.04 at 0.1-1 GFLOP): the datasheet path's fixed cost per kernel."""
    assert efficiency(datasheet_h100(), 1165, 1165, 1165) < 0.35
    assert efficiency(datasheet_h100(), 541, 541, 541) < 0.12
    assert efficiency("h100-sxm", 541, 541, 541) < 0.12  # measured at 512^3 and 768^3


def test_zero_work_costs_nothing() -> None:
    for gpu in (load_gpu_spec("h100-sxm"), datasheet_h100()):
        assert float(estimate_gemm_s(gpu, "bf16", 0, 4096, 4096, ComputeConstants())) == 0.0
        assert np.all(estimate_gemm_s(gpu, "bf16", np.array([0, 1]), 4096, 4096,
                                      ComputeConstants()) >= 0)


def test_fallback_is_the_datasheet_formula() -> None:
    """A GPU without a table keeps the old roofline: H800 (989 TFLOP/s bf16, H100's MAMF
    fraction 0.803) at M = 8192, K = 4096, N = 14336: 9.62e11 FLOP / (0.803 x 989e12) =
    1.2114 ms + t_kernel 8.5 us; backward twice that."""
    gpu, cc = load_gpu_spec("h800"), ComputeConstants()
    assert gpu.kernel_table is None
    forward = float(estimate_gemm_s(gpu, "bf16", 8192, 4096, 14336, cc))
    expected = 2 * 8192 * 4096 * 14336 / (0.803 * 989e12) + 8.5e-6
    assert forward == pytest.approx(expected, rel=1e-12)
    assert forward == float(estimate_datasheet_gemm_s(gpu, "bf16", 8192, 4096, 14336, cc))
    assert float(estimate_gemm_backward_s(gpu, "bf16", 8192, 4096, 14336, cc)) == 2 * forward
    # fp8 streams 1 byte per element on the datasheet path, as before the recipes
    fp8 = estimate_datasheet_gemm_s(gpu, "fp8", 256, 8192, 8192, cc)
    assert float(estimate_gemm_s(gpu, "fp8", 256, 8192, 8192, cc)) == float(fp8)
