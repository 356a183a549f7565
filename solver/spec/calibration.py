"""Calibration profile: measured collective-time curves, per tier of a cluster, per collective.

A **curve** is a continuous piecewise-linear time t(S) over message size S (nccl-tests "size"
bytes), given by its knots (S_k, t_k): between two knots it is one alpha-beta segment
t = alpha_i + S * factor(n) / busbw_i, with busbw_i in nccl-tests' bus-bandwidth units for the
measured group of `num_ranks` ranks. Below the first knot the time is the latency floor t_0;
above the last knot the last segment continues (its busbw is the plateau). How the knots are
chosen is `solver.calibrate.fit`; how the comm model uses a curve is `solver.cost.comm.comm`.

`num_domains` is the number of inner-tier domains (nodes, for the fabric) the measured group
spanned: a group of n ranks over k > 1 nodes sends only (k-1)/(n-1) of its bus traffic over the
fabric (notes §1.4), so busbw * (k-1)/(n-1) is the per-GPU rate of the tier itself — the unit of
`TierSpec.bandwidth_gb_per_s`. An intra-node curve has num_domains = 1 (no conversion).

A profile file (`parplan calibrate ... -o profile.json`) is a `CalibrationProfile` as JSON.

Beside the curves a profile may hold **scales** (`parplan calibrate training-log`, issue 36):
per framework profile, error-model category and model of this cluster, the posterior of the step
time's log error per unit (solver.cost.uncertainty UNIT_GROUP: compute, each communication
kind, the bubble) as a mean vector and covariance, the plan's own sigma it leaves, and the
memory's log error; solver.cost.uncertainty applies them to plans of that model
(benchmarks/calibration_check.py: a run of one model narrows the intervals of its other
configurations with their coverage kept, but over-narrows other models'). Files without
scales still load.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, model_validator

from solver.spec.strict import MAX_MESSAGE_BYTES, GpuCount, InputSpec

MessageBytes = Annotated[int, MAX_MESSAGE_BYTES]

Collective = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"
]
COLLECTIVES: tuple[Collective, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"
)
# A collective without a curve of its own on a calibrated tier uses the first curve of this
# list that the tier has: busbw is normalised so that all collectives compare with the same
# link bandwidth (nccl-tests doc/PERFORMANCE.md), which makes it the best stand-in we have.
CURVE_FALLBACK: tuple[Collective, ...] = (
    "all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send_recv", "broadcast"
)
PROFILE_FORMAT = "parplan-calibration/1"


class CurveKnot(InputSpec):
    """One knot of a fitted curve: the time of one collective of `size_bytes` bytes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size_bytes: MessageBytes = Field(gt=0)
    time_us: float = Field(gt=0)


class MeasuredPoint(InputSpec):
    """One measured size (the faster of nccl-tests' out-of-place and in-place columns)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size_bytes: MessageBytes = Field(gt=0)
    time_us: float = Field(gt=0)
    busbw_gb_per_s: float = Field(ge=0)


class CollectiveCurve(InputSpec):
    """The fitted time curve of one collective on one tier, and the points it was fitted to."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    num_ranks: GpuCount = Field(ge=2)
    num_nodes: GpuCount = Field(ge=1)
    num_domains: GpuCount = Field(ge=1)
    knots: tuple[CurveKnot, ...] = Field(min_length=2)
    measured: tuple[MeasuredPoint, ...] = ()
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> CollectiveCurve:
        sizes = [k.size_bytes for k in self.knots]
        times = [k.time_us for k in self.knots]
        if any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError("knots: size_bytes must increase strictly")
        if any(b < a for a, b in zip(times, times[1:])):
            raise ValueError("knots: time_us must not decrease as size_bytes grows")
        if self.num_nodes > self.num_ranks:
            raise ValueError(f"num_nodes ({self.num_nodes}) exceeds num_ranks ({self.num_ranks})")
        if self.num_domains > self.num_ranks:
            raise ValueError(f"num_domains ({self.num_domains}) exceeds num_ranks "
                             f"({self.num_ranks})")
        return self

    @property
    def measured_share(self) -> float:
        """Bus bandwidth over the tier's per-GPU rate for the measured group: (n-1)/(k-1)."""
        if self.num_domains <= 1:
            return 1.0
        return (self.num_ranks - 1) / (self.num_domains - 1)


TierCurves = dict[Collective, CollectiveCurve]


class CalibrationRun(InputSpec):
    """One measured run a scale was updated with: its log(s), the plan's and the measured
    step (median of the kept iterations) and memory (max of the reports, in `memory_view`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    logs: tuple[str, ...] = Field(min_length=1)
    log_format: str = Field(min_length=1)
    num_iterations: int = Field(ge=1)
    predicted_step_s: float = Field(gt=0)
    measured_step_s: float = Field(gt=0)
    noise_sigma: float = Field(ge=0)
    predicted_memory_gb: float | None = Field(default=None, gt=0)
    measured_memory_gb: float | None = Field(default=None, gt=0)
    memory_view: str | None = None


class CalibratedScales(InputSpec):
    """The posterior of the log errors of one framework profile, category and model on this
    cluster (module docstring): `units` names the entries of `log_mean` and the rows and columns of
    `log_covariance`; a unit's time is multiplied by exp(log_mean)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    framework: str = Field(min_length=1)
    category: str = Field(min_length=1)
    model: str = Field(min_length=1)
    units: tuple[str, ...] = Field(min_length=1)
    log_mean: tuple[float, ...]
    log_covariance: tuple[tuple[float, ...], ...]
    plan_sigma: float = Field(ge=0)
    memory_log_mean: float = 0.0
    memory_log_sigma: float = Field(ge=0)
    memory_plan_sigma: float = Field(ge=0)
    runs: tuple[CalibrationRun, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> CalibratedScales:
        size = len(self.units)
        if len(self.log_mean) != size:
            raise ValueError(f"log_mean: {len(self.log_mean)} values for {size} units")
        if len(self.log_covariance) != size or any(len(r) != size for r in self.log_covariance):
            raise ValueError(f"log_covariance: must be {size} x {size} (one row per unit)")
        if any(self.log_covariance[i][i] < 0 for i in range(size)):
            raise ValueError("log_covariance: a variance on the diagonal is negative")
        return self


class CalibrationProfile(InputSpec):
    """Per tier name of `cluster`, per collective, the fitted curve."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["parplan-calibration/1"] = PROFILE_FORMAT
    cluster: str = Field(min_length=1)
    method: str = ""
    tiers: dict[str, TierCurves] = {}
    scales: tuple[CalibratedScales, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> CalibrationProfile:
        if not any(self.tiers.values()) and not self.scales:
            raise ValueError("the profile holds no curve and no scales")
        keys = [(s.framework, s.category, s.model) for s in self.scales]
        if len(set(keys)) != len(keys):
            raise ValueError("scales: two entries for one framework, category and model")
        return self

    def find_scales(self, framework: str, category: str, model: str) -> CalibratedScales | None:
        """The scales of a framework profile (bare name), category path and model, if
        measured."""
        return next((s for s in self.scales if (s.framework, s.category, s.model)
                     == (framework, category, model)), None)


def select_curve(curves: TierCurves | None, collective: Collective
                 ) -> tuple[Collective, CollectiveCurve] | None:
    """The curve a collective uses on a tier: its own, else the first of CURVE_FALLBACK the
    tier has (returned with the collective it was measured for); None when uncalibrated."""
    if not curves:
        return None
    if collective in curves:
        return collective, curves[collective]
    for other in CURVE_FALLBACK:
        if other in curves:
            return other, curves[other]
    return None
