"""Calibration from one real run (issue 36): a Bayesian update of the error model's priors by
a training log's measured step time and memory (`parplan calibrate training-log`).

Time. The error model (solver.cost.uncertainty) says log(measured / predicted) of a step of
unit times c_k is sum_k g_k e_k + u, with g_k = c_k / step, every unit's error e_k ~ N(0,
(s sigma_k)^2) shared by the plans of a cluster and framework (s the category's scale,
sigma_k its group's sigma) and u ~ N(0, (s plan_sigma)^2) the plan's own. A run measured
y = log(measured / predicted) with noise n ~ N(0, noise^2) is one observation of that linear
Gaussian model; the posterior of e (Bishop, Pattern Recognition and Machine Learning, 2006,
eqs. 2.113-2.117; the Kalman update) is

    S = g' P g + (s plan_sigma)^2 + noise^2        K = P g / S
    mean' = mean + K (y - g' mean)                  P' = P - K g' P

linearised at the prior mean when one is already calibrated (g_k then weighs c_k exp(mean_k):
the extended Kalman filter), so a second run updates the first's posterior. u does not shrink:
it is what another plan does not share. Worked number: a step all compute at scale 1 (sigma
0.089, plan 0.0706) measured 10% slower (y = log 1.1 = 0.0953): S = 0.007921 + 0.004984 =
0.012905, K = 0.6138, mean 0.0585 (x1.060), sd sqrt(0.007921 (1 - 0.6138)) = 0.0553, so
another compute-bound plan's sigma falls from 0.1136 to sqrt(0.0553^2 + 0.0706^2) = 0.0897.

noise: the median of n kept steps has standard error sqrt(pi / 2) sd / sqrt(n) for a normal
of sd `sd` (the median's asymptotic variance, Kenney & Keeping 1962; Rice, Mathematical
Statistics, 3rd ed., example 10.E.3) with sd the sample sd of the log steps; 0 with one step.

Memory. The same update with g = 1 on the shared part of the memory's log error. The shared
share of its variance is 0 (MEMORY_SHARED_SHARE): a run's memory is recorded but moves no other
plan's prediction. Split by source (benchmarks/calibration_check.py fit_memory_shared_share:
torchtitan 0.93, BLOOM's DeepSpeed 0.23), the check's memory rows (one source table, model and
GPU) got worse on the median group, 2.2% -> 2.8%, though torchao's B200 table went 15.8% ->
1.1%.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from solver.calibrate.training_log import (
    DEFAULT_WARMUP_STEPS,
    FORMAT_FRAMEWORKS,
    MEMORY_VIEW,
    TrainingLog,
)
from solver.cost.uncertainty import (
    UNIT_GROUP,
    ErrorModel,
    error_units,
    estimate_calibrated_step,
    lookup_scale,
    memory_sigma,
    model_arch_kind,
    time_category,
)
from solver.errors import InputError
from solver.spec.calibration import CalibratedScales, CalibrationRun
from solver.spec.job import JobSpec
from solver.spec.model import ModelSpec
from solver.spec.plan import TIME_PARTS, Plan

# sqrt(pi / 2): the standard error of a normal sample's median over that of its mean.
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2.0)
# The share of the framework's memory variance taken as shared by its plans (docstring: none;
# the fitted shares made the calibration check's median worse).
MEMORY_SHARED_SHARE = 0.0
# A Megatron log's arguments -> the plan's values (CalibrationPlan fields).
STATED_FIELDS = {"tensor_model_parallel_size": "tp", "pipeline_model_parallel_size": "pp",
                 "context_parallel_size": "cp", "expert_model_parallel_size": "ep",
                 "micro_batch_size": "micro_batch", "global_batch_size": "global_batch",
                 "seq_length": "seq_len", "world_size": "num_gpus"}


@dataclass(frozen=True)
class CalibrationPlan:
    """What the prediction of the logged run is: its configuration and job (to check the log
    and turn rates into steps), its TIME_PARTS seconds and step, and its memory per view."""

    framework: str
    category: str
    model: str
    values: Mapping[str, int]  # tp pp cp ep micro_batch global_batch seq_len num_gpus
    parts_s: Mapping[str, float]
    step_s: float
    memory_bytes: Mapping[str, float]  # MEMORY_VIEWS -> bytes of the worst stage


@dataclass(frozen=True)
class MeasuredRun:
    """The logs' kept steps (seconds, in log order) and peak memory (bytes or None)."""

    steps_s: tuple[float, ...]
    memory_bytes: float | None
    log_format: str


def check_log_plan(log: TrainingLog, plan: CalibrationPlan) -> None:
    """An InputError naming the log line whose stated configuration is not the plan's, or
    the log's format when no run of the plan's framework prints it."""
    framework = plan.framework.split("@")[0]
    if framework not in FORMAT_FRAMEWORKS[log.log_format]:
        line = log.records[0].line
        raise InputError(f"{log.path}: line {line}: a {log.log_format} log, but the plan is "
                         f"costed under framework '{framework}' (give --framework "
                         f"{FORMAT_FRAMEWORKS[log.log_format][0]} or that run's plan)")
    for name, (value, line) in sorted(log.stated.items(), key=lambda kv: kv[1][1]):
        ours = plan.values.get(STATED_FIELDS[name])
        if ours is not None and ours != value:
            raise InputError(f"{log.path}: line {line}: the log's {name} is {value}, the "
                             f"plan's {STATED_FIELDS[name]} is {ours}: give the run's own "
                             "configuration (--plan FILE or the degree flags)")


def measure_logs(logs: Sequence[TrainingLog], plan: CalibrationPlan,
                 warmup_steps: int = DEFAULT_WARMUP_STEPS) -> MeasuredRun:
    """Every log's kept records as step seconds (tokens/s per GPU: global_batch * seq_len /
    (num_gpus * tps); samples/s: global_batch / rate) and the largest memory reported."""
    formats = {log.log_format for log in logs}
    if len(formats) > 1:
        raise InputError(f"{logs[-1].path}: a {logs[-1].log_format} log beside "
                         f"{logs[0].log_format} ones; give logs of one run")
    steps: list[float] = []
    for log in logs:
        check_log_plan(log, plan)
        for record in log.kept(warmup_steps):
            steps.append(_record_step_s(record.unit, record.value, plan.values))
    peaks = [log.memory_bytes for log in logs if log.memory_bytes is not None]
    return MeasuredRun(steps_s=tuple(steps), memory_bytes=max(peaks) if peaks else None,
                       log_format=logs[0].log_format)


def _record_step_s(unit: str, value: float, values: Mapping[str, int]) -> float:
    if unit == "step_s":
        return value
    if unit == "tokens_per_s_per_gpu":
        return values["global_batch"] * values["seq_len"] / (values["num_gpus"] * value)
    assert unit == "samples_per_s", unit
    return values["global_batch"] / value


def estimate_noise_sigma(steps_s: Sequence[float]) -> float:
    """The standard error of the log median step (docstring): sqrt(pi/2) sd / sqrt(n).
    Steps 1.0, 1.1, 0.9 s: sd of the logs 0.1004, noise 1.2533 * 0.1004 / sqrt(3) = 0.0726."""
    if len(steps_s) < 2:
        return 0.0
    logs = np.log(np.asarray(steps_s, dtype=float))
    return MEDIAN_EFFICIENCY * float(np.std(logs, ddof=1)) / math.sqrt(len(logs))


def build_prior_scales(error_model: ErrorModel, framework: str, levels: Sequence[str],
                       model: str, memory_shared_share: float = MEMORY_SHARED_SHARE
                       ) -> CalibratedScales:
    """The error model's prior for a category (levels: solver.cost.uncertainty.time_category)
    as uncalibrated scales: mean 0, covariance diag((s sigma_k)^2), plan sigma s plan_sigma,
    memory: `memory_shared_share` of the framework's variance shared, the rest the plan's."""
    scale = lookup_scale(error_model.time_scale, levels)
    units = tuple(UNIT_GROUP)
    variances = [(scale * error_model.group_sigma[UNIT_GROUP[u]]) ** 2 for u in units]
    sigma_m = memory_sigma(error_model, framework)
    return CalibratedScales(
        framework=framework.split("@")[0], category="/".join(levels), model=model, units=units,
        log_mean=tuple(0.0 for _ in units),
        log_covariance=tuple(tuple(v if i == j else 0.0 for j in range(len(units)))
                             for i, v in enumerate(variances)),
        plan_sigma=scale * error_model.plan_sigma,
        memory_log_sigma=sigma_m * math.sqrt(memory_shared_share),
        memory_plan_sigma=sigma_m * math.sqrt(1.0 - memory_shared_share))


def fit_scales(prior: CalibratedScales, parts_s: Mapping[str, float], measured_step_s: float,
               noise_sigma: float, measured_memory_bytes: float | None = None,
               predicted_memory_bytes: float | None = None,
               run: CalibrationRun | None = None) -> CalibratedScales:
    """The posterior of `prior` after one run (module docstring): its unit seconds as the
    cost model predicted them (`parts_s`: TIME_PARTS), the measured median step and its
    noise, and the measured and predicted memory (both or neither)."""
    units = error_units({k: np.asarray([v]) for k, v in parts_s.items()})
    mean = np.array(prior.log_mean)
    cov = np.array(prior.log_covariance)
    weighted = np.array([float(units[u][0]) for u in prior.units]) * np.exp(mean)
    step = float(weighted.sum())
    if step <= 0:
        raise InputError("the plan's predicted step time is 0: nothing to calibrate")
    g = weighted / step
    innovation = math.log(measured_step_s / step)
    total = float(g @ cov @ g) + prior.plan_sigma ** 2 + noise_sigma ** 2
    gain = cov @ g / total
    mean = mean + gain * innovation
    cov = cov - np.outer(gain, g @ cov)
    cov = (cov + cov.T) / 2.0  # exact symmetry against rounding
    update: dict = {"log_mean": tuple(float(x) for x in mean),
                    "log_covariance": tuple(tuple(float(x) for x in row) for row in cov)}
    if measured_memory_bytes is not None and predicted_memory_bytes is not None:
        shift = math.log(measured_memory_bytes / predicted_memory_bytes) - prior.memory_log_mean
        variance = prior.memory_log_sigma ** 2
        total_memory = variance + prior.memory_plan_sigma ** 2
        memory_gain = variance / total_memory if total_memory > 0 else 0.0
        update["memory_log_mean"] = prior.memory_log_mean + memory_gain * shift
        update["memory_log_sigma"] = math.sqrt(variance * (1.0 - memory_gain))
    if run is not None:
        update["runs"] = (*prior.runs, run)
    return prior.model_copy(update=update)


def build_calibration_run(logs: Sequence[TrainingLog], plan: CalibrationPlan,
                          measured: MeasuredRun) -> tuple[CalibrationRun, float, float | None]:
    """The run's record, its noise sigma and the predicted memory in the log's view."""
    view = MEMORY_VIEW[measured.log_format]
    predicted_memory = plan.memory_bytes.get(view) if measured.memory_bytes else None
    noise = estimate_noise_sigma(measured.steps_s)
    run = CalibrationRun(
        logs=tuple(log.path for log in logs), log_format=measured.log_format,
        num_iterations=len(measured.steps_s), predicted_step_s=plan.step_s,
        measured_step_s=float(np.median(measured.steps_s)), noise_sigma=round(noise, 6),
        predicted_memory_gb=None if predicted_memory is None else predicted_memory / 1e9,
        measured_memory_gb=None if predicted_memory is None
        else measured.memory_bytes / 1e9,  # type: ignore[operator]
        memory_view=None if predicted_memory is None else view)
    return run, noise, predicted_memory


def build_calibration_plan(plan: Plan, model_spec: ModelSpec, gpu_name: str, job: JobSpec,
                           num_gpus: int, framework: str) -> CalibrationPlan:
    """The logged run's prediction from its estimated plan (an InputError without a time)."""
    if plan.time is None:
        raise InputError("the plan has no step time to compare the log with")
    levels = time_category(framework, model_arch_kind(model_spec), gpu_name, job.precision)
    stage = plan.worst_stage
    config = plan.config
    return CalibrationPlan(
        framework=framework.split("@")[0], category="/".join(levels), model=model_spec.name,
        values={"tp": config.tp, "pp": config.pp, "cp": config.cp, "ep": config.ep,
                "micro_batch": config.micro_batch, "global_batch": job.global_batch,
                "seq_len": job.seq_len, "num_gpus": num_gpus},
        parts_s={name: plan.time.time_seconds.get(name, 0.0) for name in TIME_PARTS},
        step_s=plan.time.step_seconds,
        memory_bytes={"allocated": stage.view_bytes("allocated"),
                      "reserved": stage.observed_view_bytes("reserved")})


def calibrate_from_logs(logs: Sequence[TrainingLog], plan: CalibrationPlan,
                        prior: CalibratedScales, warmup_steps: int = DEFAULT_WARMUP_STEPS
                        ) -> CalibratedScales:
    """The posterior of `prior` after the logged run of `plan` (measure_logs, fit_scales)."""
    measured = measure_logs(logs, plan, warmup_steps)
    run, noise, predicted_memory = build_calibration_run(logs, plan, measured)
    return fit_scales(prior, plan.parts_s, run.measured_step_s, noise,
                      measured.memory_bytes if predicted_memory else None, predicted_memory,
                      run)


def rank_calibrated(plans: Sequence[Plan], scales: CalibratedScales) -> tuple[Plan, ...]:
    """The plans fastest first by their calibrated step (estimate_calibrated_step: each unit's
    time times exp(its posterior mean)); a stable sort, so equal steps keep the search's order,
    and plans without a step time stay after the timed ones. A calibration that found
    communication slower than modelled moves a plan that exposes less of it up."""
    timed = [p for p in plans if p.time is not None]
    if len(timed) < 2:
        return tuple(plans)
    parts = {name: np.array([p.time.time_seconds.get(name, 0.0) for p in timed])
             for name in TIME_PARTS}
    step, _ = estimate_calibrated_step(scales, parts)
    order = sorted(range(len(timed)), key=lambda i: float(step[i]))
    return (*(timed[i] for i in order), *(p for p in plans if p.time is None))
