"""Fitting measured collective times to a piecewise alpha-beta curve, and its residuals.

The form (solver.spec.calibration): a continuous, piecewise-linear time t(S) over message
size S, i.e. one alpha-beta segment t = alpha_i + S * factor(n) / busbw_i between consecutive
knots. Small messages sit on a flat latency floor, mid sizes on steep segments (the protocol
and algorithm switches of NCCL: LL, LL128, Simple; tree, ring, NVLS), and the last segment's
busbw is the plateau, which also extrapolates beyond the largest measured size.

The fit, per collective and per tier:

1. per size, the measured time is the faster of nccl-tests' out-of-place and in-place columns
   (two measurements of one collective; the slower one saw interference, like the 68 us
   out-of-place 32 B row of the DGX H100 log);
2. the times are replaced by their monotone lower envelope t_j = min(t_k, k >= j): a message
   never costs more than a larger one it could be padded to;
3. knots are placed greedily: start with the smallest and largest size; the knot times are the
   weighted least-squares fit (weights 1/t, i.e. relative error) of the piecewise-linear curve
   to all points (made non-decreasing); while some point is off by more than `tolerance`
   (relative time), the worst one becomes a knot. With every size a knot the curve
   interpolates, so the loop ends.

Residuals are reported in bus bandwidth: fitted busbw / measured busbw - 1 = measured time /
fitted time - 1, per measured size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.calibrate.nccl_tests import NcclTable
from solver.cost.comm.comm import collective_factor, estimate_curve_s
from solver.errors import InputError
from solver.spec.calibration import Collective, CollectiveCurve, CurveKnot, MeasuredPoint

DEFAULT_TOLERANCE = 0.03
LARGE_MESSAGE_BYTES = 2**20  # the 10% accuracy promise holds from 1 MiB on


@dataclass(frozen=True)
class Measurement:
    """Collective times over message sizes on one group: sizes ascending and distinct."""

    collective: Collective
    num_ranks: int
    num_nodes: int
    size_bytes: np.ndarray
    time_s: np.ndarray
    source: str

    @property
    def busbw_bytes_per_s(self) -> np.ndarray:
        return self.size_bytes * collective_factor(self.collective, self.num_ranks) / self.time_s


@dataclass(frozen=True)
class FitRow:
    """One measured size against the fitted curve."""

    size_bytes: int
    measured_time_us: float
    fitted_time_us: float
    measured_busbw_gb_per_s: float
    fitted_busbw_gb_per_s: float
    is_knot: bool

    @property
    def residual(self) -> float:
        """Fitted over measured bus bandwidth, minus 1."""
        return self.measured_time_us / self.fitted_time_us - 1.0


def build_measurement(table: NcclTable, collective: Collective | None = None,
                      num_ranks: int | None = None, num_nodes: int | None = None
                      ) -> Measurement:
    """The faster half of every row with a positive size; sizes measured twice keep the
    faster time. Checks the log's busbw / algbw against the nccl-tests factor of n ranks."""
    collective = collective or table.collective
    num_ranks = num_ranks or table.num_ranks
    num_nodes = num_nodes or table.num_nodes
    where = f"{table.source}: table at line {table.header_line}"
    if collective is None:
        raise InputError(f"{where}: cannot tell which collective this is (no 'Collective test "
                         "starting' line, no test name in the file name); pass --collective")
    if num_ranks is None or num_nodes is None:
        raise InputError(f"{where}: no 'Using devices' block to count ranks and nodes; pass "
                         "--ranks and --nodes")
    if num_ranks < 2 or not 1 <= num_nodes <= num_ranks:
        raise InputError(f"{where}: {num_ranks} ranks on {num_nodes} nodes: a collective needs "
                         "at least 2 ranks and at most one node per rank")
    best: dict[int, float] = {}
    for row in table.rows:
        if row.size_bytes > 0:
            time_us = row.best.time_us
            best[row.size_bytes] = min(time_us, best.get(row.size_bytes, time_us))
    if len(best) < 2:
        raise InputError(f"{where}: needs at least 2 message sizes above 0 bytes to fit, "
                         f"found {len(best)}")
    _check_factor(table, collective, num_ranks, where)
    sizes = np.array(sorted(best), dtype=np.int64)
    times = np.array([best[int(s)] for s in sizes]) * 1e-6
    return Measurement(collective=collective, num_ranks=num_ranks, num_nodes=num_nodes,
                       size_bytes=sizes, time_s=times, source=table.source)


def _check_factor(table: NcclTable, collective: Collective, num_ranks: int, where: str) -> None:
    """busbw = algbw * factor(n): a wrong rank count or collective shows in the ratio."""
    rows = [r.best for r in table.rows if r.best.algbw_gb_per_s >= 1.0]
    if not rows:
        return
    largest = max(rows, key=lambda t: t.algbw_gb_per_s)
    ratio = largest.busbw_gb_per_s / largest.algbw_gb_per_s
    expected = float(collective_factor(collective, num_ranks))
    if abs(ratio / expected - 1.0) > 0.02:
        raise InputError(f"{where}: busbw / algbw is {ratio:.3f} in the log, but {collective} "
                         f"over {num_ranks} ranks has the factor {expected:.3f}: check --ranks "
                         "and --collective")


def _hat_basis(size: np.ndarray, knots: np.ndarray) -> np.ndarray:
    """Rows: points; columns: the piecewise-linear hat function of each knot (linear in S),
    constant beyond the first and last knot."""
    clipped = np.clip(size, knots[0], knots[-1])
    basis = np.zeros((len(size), len(knots)))
    segment = np.clip(np.searchsorted(knots, clipped, side="right") - 1, 0, len(knots) - 2)
    left, right = knots[segment], knots[segment + 1]
    weight = (clipped - left) / (right - left)
    rows = np.arange(len(size))
    basis[rows, segment] = 1.0 - weight
    basis[rows, segment + 1] += weight
    return basis


def fit_knots(size_bytes: np.ndarray, time_s: np.ndarray,
              tolerance: float = DEFAULT_TOLERANCE) -> tuple[np.ndarray, np.ndarray]:
    """Knot sizes and times of the piecewise-linear fit (steps 2-3 of the module docstring)."""
    size = np.asarray(size_bytes, dtype=float)
    envelope = np.minimum.accumulate(np.asarray(time_s, dtype=float)[::-1])[::-1]
    chosen = {0, len(size) - 1}
    while True:
        index = np.array(sorted(chosen))
        basis = _hat_basis(size, size[index])
        weights = 1.0 / envelope
        knot_times, *_ = np.linalg.lstsq(basis * weights[:, None], envelope * weights,
                                         rcond=None)
        knot_times = np.maximum.accumulate(np.maximum(knot_times, envelope.min()))
        error = np.abs(basis @ knot_times / envelope - 1.0)
        free = np.where(np.isin(np.arange(len(size)), index), -1.0, error)
        worst = int(np.argmax(free))
        if error.max() <= tolerance or free[worst] < 0:
            return size[index], knot_times
        chosen.add(worst)


def fit_curve(measurement: Measurement, num_domains: int,
              tolerance: float = DEFAULT_TOLERANCE) -> CollectiveCurve:
    """The fitted curve of one measurement (see the module docstring). `num_domains` is the
    number of inner-tier domains the measured group spans (1 for an intra-node tier)."""
    knot_sizes, knot_times = fit_knots(measurement.size_bytes, measurement.time_s, tolerance)
    busbw = measurement.busbw_bytes_per_s
    return CollectiveCurve(
        num_ranks=measurement.num_ranks,
        num_nodes=measurement.num_nodes,
        num_domains=num_domains,
        knots=tuple(CurveKnot(size_bytes=int(s), time_us=round(float(t) * 1e6, 4))
                    for s, t in zip(knot_sizes, knot_times)),
        measured=tuple(
            MeasuredPoint(size_bytes=int(s), time_us=round(float(t) * 1e6, 4),
                          busbw_gb_per_s=round(float(b) / 1e9, 4))
            for s, t, b in zip(measurement.size_bytes, measurement.time_s, busbw)
        ),
        source=measurement.source,
    )


def fit_report(curve: CollectiveCurve, collective: Collective) -> tuple[FitRow, ...]:
    """Every measured size of the curve against the fitted curve."""
    sizes = np.array([p.size_bytes for p in curve.measured], dtype=float)
    fitted_s = estimate_curve_s(curve, collective, sizes)
    factor = float(collective_factor(collective, curve.num_ranks))
    knots = {k.size_bytes for k in curve.knots}
    return tuple(
        FitRow(size_bytes=p.size_bytes, measured_time_us=p.time_us,
               fitted_time_us=float(t) * 1e6,
               measured_busbw_gb_per_s=p.size_bytes * factor / (p.time_us * 1e3),
               fitted_busbw_gb_per_s=p.size_bytes * factor / (float(t) * 1e9),
               is_knot=p.size_bytes in knots)
        for p, t in zip(curve.measured, fitted_s)
    )


def worst_residual(rows: tuple[FitRow, ...], min_size_bytes: int = LARGE_MESSAGE_BYTES
                   ) -> float | None:
    """The largest |residual| among sizes >= min_size_bytes (None when there is none)."""
    return max((abs(r.residual) for r in rows if r.size_bytes >= min_size_bytes), default=None)


@dataclass(frozen=True)
class CurveSummary:
    """The headline numbers of a curve: latency floor, plateau (last segment) bus bandwidth
    of the measured group, the same as the tier's per-GPU rate, and the knot count. The
    plateau is None when the last segment is flat (no bandwidth limit was measured)."""

    latency_us: float
    plateau_busbw_gb_per_s: float | None
    plateau_rate_gb_per_s: float | None
    num_knots: int


def summarize_curve(curve: CollectiveCurve, collective: Collective) -> CurveSummary:
    *_, before, last = curve.knots
    factor = float(collective_factor(collective, curve.num_ranks))
    rise_us = last.time_us - before.time_us
    busbw = (factor * (last.size_bytes - before.size_bytes) / (rise_us * 1e3)
             if rise_us > 0 else None)
    return CurveSummary(latency_us=curve.knots[0].time_us, plateau_busbw_gb_per_s=busbw,
                        plateau_rate_gb_per_s=None if busbw is None
                        else busbw / curve.measured_share,
                        num_knots=len(curve.knots))
