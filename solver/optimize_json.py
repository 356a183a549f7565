"""The JSON of an `optimize` answer (DESIGN.md): status, solve_seconds, the problem, how far
from the optimum an unproven answer may be, the plans (best first), what the step time leaves
out for the model (notes: solver.cost.step.caveats), and conflicts, rules and fixes when infeasible
(else why). `optimize --json` prints it; each line of a sweep is one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from solver.cost.step.caveats import list_time_caveats
from solver.cost.step.frameworks import FrameworkProfile
from solver.cost.uncertainty import (
    DEFAULT_INTERVAL_LEVEL,
    describe_flip,
    estimate_calibrated_fastest_odds,
    estimate_fastest_odds,
    estimate_fit_probability,
    estimate_interval,
    estimate_calibrated_step,
    estimate_step_sigma,
    load_error_model,
    memory_sigma,
    model_arch_kind,
    time_category,
)
from solver.optimize import OptimizeResult
from solver.spec.calibration import CalibratedScales
from solver.spec.model import ModelSpec
from solver.spec.plan import TIME_PARTS, Plan
from solver.spec.plan_json import (
    render_answer_head,
    render_infeasible_json,
    render_memory_views_json,
    render_plan_json,
)


def render_result_json(result: OptimizeResult, level: float = DEFAULT_INTERVAL_LEVEL,
                       scales: CalibratedScales | None = None) -> dict[str, Any]:
    """The JSON of `optimize` (DESIGN.md): status, solve_seconds, the problem, plans (best
    first) with their `level` intervals, fit probability and p_fastest (issue 36), and
    conflicts, rules and fixes when infeasible (else why). One line of a sweep."""
    problem = result.problem
    odds = render_plans_uncertainty(result.plans, problem.model_spec, problem.cluster.gpu.name,
                                    problem.framework, problem.job.precision, level, scales)
    cluster = problem.cluster
    answer: dict[str, Any] = {
        **render_answer_head(result),
        "seq_len": problem.job.seq_len,
        "global_batch": problem.job.global_batch,
        "precision": problem.job.precision,
        "framework": problem.framework,
        "framework_features": FrameworkProfile(
            name=problem.framework, time_constants=problem.time_constants).features(),
        "objective": problem.objective,
        "memory_headroom": cluster.memory_headroom.setting() or None,
        # The fit rule in words (MemoryHeadroom.rule), as the table states it.
        "memory_rule": cluster.memory_headroom.rule(cluster.gpu_memory_bytes),
        "num_feasible": result.num_feasible,
        "num_candidates": result.num_candidates,
        "num_memory_checked": result.num_memory_checked,
        "step_seconds_lower_bound": None if result.step_lower_bound_s is None
        else round(result.step_lower_bound_s, 6),
        "optimality_gap": None if result.optimality_gap is None
        else round(result.optimality_gap, 4),
        # The limit that ended the search (solver.search.limits), None where none did.
        "stopped_by": result.stopped_by,
        "plans": [{**render_plan_json(plan), **extra}
                  for plan, extra in zip(result.plans, odds["plans"])],
        "notes": list(list_time_caveats(problem.model_spec)),
        "uncertainty": odds["uncertainty"],
        # What reports each view of a plan's memory, the needed and the observed ones.
        "memory_views": render_memory_views_json(),
    }
    if problem.job.finetune.mode != "none":  # what trains (solver.spec.finetune)
        answer["finetune"] = problem.job.finetune.describe()
    if result.status == "infeasible":
        answer.update(render_infeasible_json(result))
    else:
        answer["why"] = list(result.why)
    return answer


def render_plans_uncertainty(plans: Sequence[Plan], model_spec: ModelSpec, gpu_name: str,
                             framework: str, precision: str,
                             level: float = DEFAULT_INTERVAL_LEVEL,
                             scales: CalibratedScales | None = None) -> dict[str, Any]:
    """Issue 36's fields (solver.cost.uncertainty): per plan `step_seconds_interval`,
    `tokens_per_second_per_gpu_interval`, `memory_gb_interval` ([low, high] at `level`),
    `fit_probability` (against the memory the plan must truly fit:
    MemoryHeadroom.fit_target_bytes), and with more than one timed plan `p_fastest` and
    `tied_with_best`; `uncertainty`: the level, the category the error model used, the fit
    probability the headroom is sized for (`min_fit_probability`: 0.5 without the error
    margin) and what would change the winner. With `scales` (a calibration of this framework and category:
    solver.calibrate.scales) the intervals and fit probability are the posterior's, around
    `step_seconds_calibrated` and `memory_gb_calibrated` (the cost model's numbers scaled by
    the measured run), and p_fastest, ties and the winner's change are the posterior's (rank
    the plans with solver.calibrate.scales.rank_calibrated first)."""
    extras: list[dict[str, Any]] = [{} for _ in plans]
    if not plans:
        return {"plans": extras, "uncertainty": None}
    error_model = load_error_model()
    levels = time_category(framework, model_arch_kind(model_spec), gpu_name, precision)
    total = np.array([p.worst_stage.total_bytes for p in plans])
    sigma_memory = memory_sigma(error_model, framework)
    usable = np.array([p.memory_headroom.fit_target_bytes(p.gpu_memory_bytes) for p in plans])
    headroom = plans[0].memory_headroom
    if scales is not None:
        total = total * float(np.exp(scales.memory_log_mean))
        sigma_memory = float(np.hypot(scales.memory_log_sigma, scales.memory_plan_sigma))
        for i, extra in enumerate(extras):
            extra["memory_gb_calibrated"] = round(float(total[i]) / 1e9, 3)
    low, high = estimate_interval(total, np.full(len(plans), sigma_memory), level)
    fit = estimate_fit_probability(total, usable, sigma_memory)
    for i, extra in enumerate(extras):
        extra["memory_gb_interval"] = [round(float(low[i]) / 1e9, 3), round(float(high[i]) / 1e9, 3)]
        extra["fit_probability"] = round(float(fit[i]), 4)
    timed = [i for i, p in enumerate(plans) if p.time is not None]
    summary: dict[str, Any] = {
        "interval_level": level, "category": "/".join(levels),
        "memory_sigma": sigma_memory,
        "min_fit_probability": headroom.fit_probability or 0.5,
        "winner_change": None}
    if scales is not None:
        summary["calibrated"] = {"framework": scales.framework, "category": scales.category,
                                 "num_runs": len(scales.runs)}
    if timed:
        parts = {name: np.array([plans[i].time.time_seconds.get(name, 0.0) for i in timed])
                 for name in TIME_PARTS}
        step = np.array([plans[i].time.step_seconds for i in timed])
        sigma = estimate_step_sigma(error_model, levels, parts)
        if scales is not None:
            calibrated, sigma = estimate_calibrated_step(scales, parts)
            # The plan's step scaled as its parts are (every TIME_PART is in an error unit).
            raw = sum(parts.values())
            step = step * calibrated / np.where(raw > 0, raw, 1.0)
        step_low, step_high = estimate_interval(step, sigma, level)
        for k, i in enumerate(timed):
            if scales is not None:
                extras[i]["step_seconds_calibrated"] = round(float(step[k]), 6)
            tokens = plans[i].time.tokens_per_second_per_gpu * plans[i].time.step_seconds
            extras[i]["step_seconds_interval"] = [round(float(step_low[k]), 6),
                                                  round(float(step_high[k]), 6)]
            extras[i]["tokens_per_second_per_gpu_interval"] = [
                round(float(tokens / step_high[k]), 3), round(float(tokens / step_low[k]), 3)]
        if len(timed) > 1:
            odds = (estimate_fastest_odds(error_model, levels, parts, level) if scales is None
                    else estimate_calibrated_fastest_odds(scales, parts, level))
            for k, i in enumerate(timed):
                extras[i]["p_fastest"] = round(float(odds.p_fastest[k]), 4)
                extras[i]["tied_with_best"] = bool(odds.tied_with_best[k])
            summary["winner_change"] = describe_flip(odds)
    return {"plans": extras, "uncertainty": summary}
