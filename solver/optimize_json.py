"""The JSON of an `optimize` answer (DESIGN.md): status, solve_seconds, the problem, how far
from the optimum an unproven answer may be, the plans (best first), what the step time leaves
out for the model (notes: solver.cost.caveats), and conflicts, rules and fixes when infeasible
(else why). `optimize --json` prints it; each line of a sweep is one."""

from __future__ import annotations

from typing import Any

from solver.cost.caveats import list_time_caveats
from solver.cost.frameworks import FrameworkProfile
from solver.optimize import OptimizeResult
from solver.ranked_plans import TIE_TOLERANCE, tied_with_best
from solver.spec.plan_json import render_answer_head, render_infeasible_json, render_plan_json


def render_result_json(result: OptimizeResult) -> dict[str, Any]:
    """The JSON of `optimize` (DESIGN.md): status, solve_seconds, the problem, plans (best
    first), and conflicts, rules and fixes when infeasible (else why). One line of a sweep."""
    problem = result.problem
    answer: dict[str, Any] = {
        **render_answer_head(result),
        "seq_len": problem.job.seq_len,
        "global_batch": problem.job.global_batch,
        "precision": problem.job.precision,
        "framework": problem.framework,
        "framework_features": FrameworkProfile(
            name=problem.framework, time_constants=problem.time_constants).features(),
        "objective": problem.objective,
        "memory_headroom": problem.cluster.memory_headroom.label() or None,
        "num_feasible": result.num_feasible,
        "num_candidates": result.num_candidates,
        "num_memory_checked": result.num_memory_checked,
        "step_seconds_lower_bound": None if result.step_lower_bound_s is None
        else round(result.step_lower_bound_s, 6),
        "optimality_gap": None if result.optimality_gap is None
        else round(result.optimality_gap, 4),
        "tie_tolerance": TIE_TOLERANCE,
        "plans": [{**render_plan_json(plan), "tied_with_best": tied}
                  for plan, tied in zip(result.plans, tied_with_best(result.plans))],
        "notes": list(list_time_caveats(problem.model_spec)),
    }
    if result.status == "infeasible":
        answer.update(render_infeasible_json(result))
    else:
        answer["why"] = list(result.why)
    return answer
