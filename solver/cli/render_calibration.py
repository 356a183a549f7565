"""Rendering calibration: the fit tables of `parplan calibrate` and, for `estimate`, which
bandwidths come from measurement."""

from __future__ import annotations

import math
from typing import Any

import click
import numpy as np

from solver.calibrate.fit import fit_report, summarize_curve, worst_residual
from solver.calibrate.profile import CurveSource, FittedCurve
from solver.cli.render import echo_table


def format_bytes(size: int) -> str:
    """1048576 -> '1 MiB'; sizes that are not a whole unit keep one decimal."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{size} B"


def _gb(value: float | None) -> str:
    return "unlimited" if value is None else f"{value:.1f} GB/s"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _summary(f: FittedCurve) -> str:
    c, s = f.curve, summarize_curve(f.curve, f.collective)
    worst = worst_residual(fit_report(c, f.collective))
    per_gpu = ("" if c.num_domains <= 1
               else f" ({_gb(s.plateau_rate_gb_per_s)} per GPU on the tier)")
    residual = "none measured" if worst is None else f"{100 * worst:.1f}%"
    return (f"latency {s.latency_us:.1f} us, plateau busbw {_gb(s.plateau_busbw_gb_per_s)}"
            f"{per_gpu}, {s.num_knots} knots, worst residual at >= 1 MiB: {residual}")


def echo_fit_tables(fitted: list[FittedCurve]) -> None:
    """One table per curve: every measured size, measured and fitted busbw, the residual."""
    for f in fitted:
        rows = [
            (format_bytes(r.size_bytes), round(r.measured_time_us, 2),
             round(r.fitted_time_us, 2), round(r.measured_busbw_gb_per_s, 2),
             round(r.fitted_busbw_gb_per_s, 2), f"{100 * r.residual:+.1f}%",
             "*" if r.is_knot else "")
            for r in fit_report(f.curve, f.collective)
        ]
        c = f.curve
        click.echo(f"{f.tier} {f.collective}: {c.num_ranks} ranks on {c.num_nodes} node(s), "
                   f"{c.source}")
        echo_table(f"fit of {f.tier} {f.collective}", ["size", "time us", "fitted us",
                                                        "busbw GB/s", "fitted GB/s",
                                                        "residual", "knot"], rows)
        click.echo(_summary(f))


def render_fit_json(f: FittedCurve) -> dict[str, Any]:
    s = summarize_curve(f.curve, f.collective)
    rows = fit_report(f.curve, f.collective)
    return {
        "tier": f.tier, "collective": f.collective, "source": f.curve.source,
        "num_ranks": f.curve.num_ranks, "num_nodes": f.curve.num_nodes,
        "latency_us": round(s.latency_us, 3),
        "plateau_busbw_gb_per_s": _round(s.plateau_busbw_gb_per_s, 3),
        "plateau_rate_gb_per_s": _round(s.plateau_rate_gb_per_s, 3),
        "num_knots": s.num_knots,
        "worst_residual_1mib": _round(worst_residual(rows), 5),
        "points": [
            {"size_bytes": r.size_bytes, "measured_busbw_gb_per_s":
             round(r.measured_busbw_gb_per_s, 3),
             "fitted_busbw_gb_per_s": round(r.fitted_busbw_gb_per_s, 3),
             "residual": round(r.residual, 5), "knot": r.is_knot}
            for r in rows
        ],
    }


def _source_label(s: CurveSource) -> str:
    if s.measured_as is None:
        return "preset"
    if s.measured_as == s.collective:
        return "measured"
    return f"measured ({s.measured_as} curve)"


def render_sources_json(calibration: str, sources: tuple[CurveSource, ...]) -> dict[str, Any]:
    """`{"file": ..., "bandwidths": [{tier, collective, source, ...}]}` for the plan JSON."""
    rows = []
    for s in sources:
        row: dict[str, Any] = {"tier": s.tier, "collective": s.collective,
                               "source": "preset" if s.measured_as is None else "measured",
                               "measured_as": s.measured_as}
        if s.curve is None or s.measured_as is None:
            row["bandwidth_gb_per_s"] = s.preset_gb_per_s
        else:
            summary = summarize_curve(s.curve, s.measured_as)
            row["latency_us"] = round(summary.latency_us, 3)
            row["plateau_rate_gb_per_s"] = _round(summary.plateau_rate_gb_per_s, 3)
        rows.append(row)
    return {"file": calibration, "bandwidths": rows}


def echo_sources_table(calibration: str, sources: tuple[CurveSource, ...]) -> None:
    """Which tier bandwidths the estimate took from measurement (--calibration)."""
    rows = []
    for s in sources:
        if s.curve is None or s.measured_as is None:
            rows.append((s.tier, s.collective, "preset", "", f"{s.preset_gb_per_s:g}"))
            continue
        summary = summarize_curve(s.curve, s.measured_as)
        rate = summary.plateau_rate_gb_per_s
        rows.append((s.tier, s.collective, _source_label(s), f"{summary.latency_us:.1f}",
                     "unlimited" if rate is None else f"{rate:.1f}"))
    echo_table(f"bandwidths (calibration {calibration}): measured curves replace the preset",
               ["tier", "collective", "source", "latency us", "GB/s per GPU (plateau)"], rows)
    click.echo("measured: the time follows the fitted curve at each message size")


def _plan_sigmas(prior: Any, posterior: Any, plan: Any) -> tuple[float, float, float]:
    """(calibrated step, sigma before, sigma after) of the logged plan."""
    from solver.cost.uncertainty import estimate_calibrated_step

    parts = {name: np.array([value]) for name, value in plan.parts_s.items()}
    _, before = estimate_calibrated_step(prior, parts)
    step, after = estimate_calibrated_step(posterior, parts)
    return float(step[0]), float(before[0]), float(after[0])


def render_scales_json(prior: Any, posterior: Any, plan: Any) -> dict[str, Any]:
    """`calibrate training-log --json`: the run, per unit the scale and log sigma before and
    after, and the plan's calibrated step with its log sigma before and after."""
    run = posterior.runs[-1]
    step, before, after = _plan_sigmas(prior, posterior, plan)
    units = {}
    for i, unit in enumerate(posterior.units):
        units[unit] = {"scale_before": round(float(math.exp(prior.log_mean[i])), 4),
                       "scale_after": round(float(math.exp(posterior.log_mean[i])), 4),
                       "log_sigma_before": round(prior.log_covariance[i][i] ** 0.5, 4),
                       "log_sigma_after": round(max(posterior.log_covariance[i][i], 0.0) ** 0.5,
                                                4)}
    return {"framework": posterior.framework, "category": posterior.category,
            "run": run.model_dump(mode="json"), "units": units,
            "step_seconds_calibrated": round(step, 6),
            "step_log_sigma_before": round(before, 4), "step_log_sigma_after": round(after, 4),
            "memory_scale": round(float(math.exp(posterior.memory_log_mean)), 4),
            "memory_log_sigma_before": round(float(np.hypot(prior.memory_log_sigma,
                                                            prior.memory_plan_sigma)), 4),
            "memory_log_sigma_after": round(float(np.hypot(posterior.memory_log_sigma,
                                                           posterior.memory_plan_sigma)), 4)}


def render_scales_lines(prior: Any, posterior: Any, plan: Any, warmup_steps: int) -> list[str]:
    """The text of `calibrate training-log`: what was measured, what moved."""
    data = render_scales_json(prior, posterior, plan)
    run = posterior.runs[-1]
    lines = [f"{posterior.framework} / {posterior.category}: {run.log_format} log, median of "
             f"{run.num_iterations} iteration(s) after the first {warmup_steps}: step "
             f"{run.measured_step_s:.4g} s measured, {run.predicted_step_s:.4g} s predicted "
             f"(x{run.measured_step_s / run.predicted_step_s:.3f}; noise sigma "
             f"{run.noise_sigma:.4f})"]
    if run.measured_memory_gb is not None:
        line = (f"memory ({run.memory_view}): {run.measured_memory_gb:.2f} GB measured, "
                f"{run.predicted_memory_gb:.2f} GB predicted "
                f"(x{run.measured_memory_gb / run.predicted_memory_gb:.3f})")
        if posterior.memory_log_sigma == prior.memory_log_sigma:
            line += ("; recorded, other plans' memory unchanged (the error model has no shared "
                     "memory error: solver.calibrate.scales)")
        else:
            line += (f"; scale x{data['memory_scale']:.3f}, sigma "
                     f"{data['memory_log_sigma_before']:.3f} -> "
                     f"{data['memory_log_sigma_after']:.3f}")
        lines.append(line)
    else:
        lines.append("memory: the log reports none")
    shown = [(u, d) for u, d in data["units"].items()
             if d["log_sigma_before"] != d["log_sigma_after"]]
    lines.append("scales: " + ", ".join(
        f"{u} x{d['scale_after']:.3f} (sigma {d['log_sigma_before']:.3f} -> "
        f"{d['log_sigma_after']:.3f})" for u, d in shown))
    lines.append(f"this plan: step {data['step_seconds_calibrated']:.4g} s, sigma "
                 f"{data['step_log_sigma_before']:.3f} -> {data['step_log_sigma_after']:.3f}")
    return lines
