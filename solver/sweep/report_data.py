"""What the interactive page of a report shows, as one JSON object (the page's script reads it):
every problem with its ranked plans, the launch line of each plan, the groups, and the Pareto
fronts of each group.

Per problem: the key, the status, the GPU's memory (and what plans may use of it), the conflicts
and fixes of an infeasible problem, the error of a failed one, the explanation of a solved one.
Per plan: the degrees, the worst stage's memory by item ("other" item by item), as % of the
GPU's memory, and in its three views (allocated,
reserved, device: `memory_views` says what reports each; null in lines written before them)
and the reserved and device views on the problem's GPU (`views_observed`, OBSERVED_VIEWS:
`observed_views` says what reports each; null in lines written before them),
the step time by part, tokens/s, MFU,
the days and GPU-hours for the report's token budget, the recompute settings of the same step
time (twins), and the `parplan launch` command that writes its framework settings.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from solver.api import estimate_train_days
from solver.cost.serving.price import estimate_energy_kwh
from solver.spec.plan import MEMORY_VIEWS, OBSERVED_VIEWS
from solver.spec.plan_json import DEGREES
from solver.sweep.report_fronts import Front, FrontPoint, build_front
from solver.sweep.tables import JOB_FIELDS, Group, count_statuses, group_slug, memory_percent, \
    render_config, select_problem_lines

MEMORY_ITEMS = ("weights", "grads", "optimizer", "activations", "other")
TIME_PARTS = ("compute", "recompute", "tp", "cp", "ep", "offload", "dp", "pp", "bubble",
              "optimizer")
# The name of each TIME_PARTS series in the step-time chart and the plan details (a part
# without one showed as Plotly's "trace 4": offload).
TIME_WORDS = {"compute": "compute", "recompute": "recompute", "tp": "TP traffic",
              "cp": "CP traffic", "ep": "EP traffic", "offload": "host offload",
              "dp": "DP traffic", "pp": "PP traffic", "bubble": "pipeline bubble",
              "optimizer": "optimizer step"}
# `parplan launch --format` of each framework (generic: torch.distributed's process groups).
LAUNCH_FORMATS = {"megatron": "megatron", "torchtitan": "torchtitan", "deepspeed": "deepspeed"}
SOLVED = ("optimal", "feasible")


def render_tokens(tokens: float) -> str:
    """2e12 -> "2T", 3e11 -> "300B", 1.5e12 -> "1.5T" (the --token-budget spelling)."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:g}{suffix}"
    return f"{tokens:g}"


def render_launch_line(line: dict[str, Any], plan: dict[str, Any]) -> str:
    """The `parplan launch` command of a plan: its problem, degrees and pipeline layout, in the
    framework's format; shell-quoted, so a copied line runs as it is."""
    words = ["parplan", "launch", "--model", line["model"], "--cluster", line["cluster"],
             "--gpus", str(line["gpus"]), "--seq-len", str(line["seq_len"]),
             "--global-batch", str(line["global_batch"]), "--precision", line["precision"]]
    for name in DEGREES:  # dp is the rest of the GPUs; cp, ep, etp and vpp default to 1
        if name != "dp" and not (name in ("cp", "ep", "etp", "vpp") and plan[name] == 1):
            words += ["--" + name.replace("_", "-"), str(plan[name])]
    layout = plan.get("layout")
    if isinstance(layout, dict) and layout.get("syntax"):
        words += ["--layout", str(layout["syntax"])]
    # The memory savers the plan turned on to fit (Plan.memory_savers), as their flags.
    words += ["--" + str(name).replace("_", "-") for name in plan.get("memory_savers") or []]
    words += ["--" + str(name).replace("_", "-") for name in plan.get("offloads") or []]
    # What its selective recompute recomputes where the search chose it (Plan.recompute_modules).
    if plan.get("recompute_modules"):
        words += ["--recompute-modules", ",".join(str(m) for m in plan["recompute_modules"])]
    # A release profile (megatron-bridge@26.04) runs its framework's format and names itself,
    # so launch writes the release's features the plan was costed with.
    profile = str(line.get("framework"))
    runs = (line.get("framework_profile") or {}).get("framework", profile)
    words += ["--format", LAUNCH_FORMATS.get(str(runs), "torch")]
    if profile not in LAUNCH_FORMATS and profile != "generic":
        words += ["--framework", profile]
    return " ".join(shlex.quote(word) for word in words)


def _twin_text(plan: dict[str, Any], twin: dict[str, Any]) -> str:
    """What an `equivalent` setting changes: "recompute none", "zero 1" (results written
    before issue 39 name the recompute only)."""
    changed = [f"{name} {twin[name]}" for name in ("recompute", "zero")
               if name in twin and twin[name] != plan.get(name)]
    return ", ".join(changed) or f"recompute {twin.get('recompute')}"


def _plan_data(line: dict[str, Any], plan: dict[str, Any], token_budget: float
               ) -> dict[str, Any]:
    rate = float(plan["tokens_per_second"])
    days, gpu_hours = (estimate_train_days(token_budget, rate, int(line["gpus"])) if rate > 0
                       else (None, None))
    equivalent = plan.get("equivalent") or []
    return {
        "config": render_config({**plan, "status": "optimal"}),
        **{name: plan[name] for name in DEGREES},
        "memory": {name: float(plan["memory_gb"].get(name, 0.0))
                   for name in (*MEMORY_ITEMS, "total")},
        "memory_other": _other_items(plan),
        "memory_percent": memory_percent(plan) if plan.get("gpu_memory_gb") else None,
        "views": _views(plan),
        "views_observed": {view: None if plan.get(f"{view}_gb_observed") is None
                           else float(plan[f"{view}_gb_observed"]) for view in OBSERVED_VIEWS},
        "time": {name: float((plan.get("time_seconds") or {}).get(name, 0.0))
                 for name in TIME_PARTS},
        "step": float(plan["step_seconds"]),
        "rate": rate,
        "rate_per_gpu": float(plan["tokens_per_second_per_gpu"]),
        "mfu": float(plan["mfu"]),
        "days": days,
        "gpu_hours": gpu_hours,
        "twins": " or ".join(_twin_text(plan, e) for e in equivalent if isinstance(e, dict)),
        "layout": (plan.get("layout") or {}).get("syntax") or "",
        "launch": render_launch_line(line, plan),
        # Issue 36 (absent from lines written before it: None).
        "step_interval": plan.get("step_seconds_interval"),
        "memory_interval": plan.get("memory_gb_interval"),
        "fit_probability": plan.get("fit_probability"),
        "p_fastest": plan.get("p_fastest"),
    }


def _other_items(plan: dict[str, Any]) -> dict[str, float]:
    """What "other" holds in the worst stage, item by item (`other_gb`: logits, buffers, the
    CUDA context...), largest first; one item "other" in lines written before the items."""
    items = plan.get("other_gb")
    if not isinstance(items, dict) or not items:
        return {"other": float(plan["memory_gb"].get("other", 0.0))}
    return dict(sorted(((str(k), float(v)) for k, v in items.items()),
                       key=lambda item: (-item[1], item[0])))


def _views(plan: dict[str, Any]) -> dict[str, float | None]:
    """The plan's allocated, reserved and device GB (MEMORY_VIEWS); a line written before the
    views has none but the device view, its total."""
    views = {view: plan.get(f"{view}_gb") for view in MEMORY_VIEWS}
    if views["device"] is None:
        views["device"] = float(plan["memory_gb"]["total"])
    return {view: None if value is None else float(value) for view, value in views.items()}


def _problem_data(line: dict[str, Any], token_budget: float) -> dict[str, Any]:
    plans = line.get("plans") or []
    best = plans[0] if plans else {}
    job = {name: line[name] for name in JOB_FIELDS}
    return {
        "model": line["model"], "cluster": line["cluster"], "gpus": line["gpus"],
        **job,
        "group": group_slug(line["model"], job),
        "status": line["status"],
        "gpu_memory_gb": best.get("gpu_memory_gb"),
        "usable_memory_gb": best.get("usable_memory_gb", best.get("gpu_memory_gb")),
        "headroom": line.get("memory_headroom") or "",
        # The fit rule the line was solved under, in words (MemoryHeadroom.rule).
        "memory_rule": str(line.get("memory_rule") or ""),
        "why": [str(x) for x in line.get("why") or []],
        "conflicts": [str(x) for x in line.get("conflicts") or []],
        "rules": {str(k): str(v) for k, v in (line.get("rules") or {}).items()},
        "fixes": [str(x) for x in line.get("fixes") or []],
        "error": str(line.get("error", "")),
        # Issue 42: the cluster's price per GPU-hour and its GPUs' board power (lines written
        # before it, or unpriced: None), for the $ and kWh fronts.
        "price_per_gpu_hour": (line.get("pricing") or {}).get("price_per_gpu_hour"),
        "board_power_w": (line.get("pricing") or {}).get("board_power_w"),
        "plans": [_plan_data(line, plan, token_budget) for plan in plans],
    }


def build_group_fronts(group: Group, problems: Sequence[dict[str, Any]], budget_label: str
                       ) -> list[Front]:
    """A group's fronts over its solved problems' best plans: tokens/s against GPUs, and
    GPU-hours against days for the token budget; where lines carry a price or a board power
    (sweep --price-per-gpu-hour, issue 42), $ and kWh against days too (price x GPU-hours,
    GPU-hours x board power: solver.cost.serving.price)."""
    rate: list[FrontPoint] = []
    cost: list[FrontPoint] = []
    dollars: list[FrontPoint] = []
    energy: list[FrontPoint] = []
    for index, problem in enumerate(problems):
        if problem["group"] != group.slug or problem["status"] not in SOLVED:
            continue
        best = problem["plans"][0]
        label = f"{problem['cluster']}, {problem['gpus']} GPUs: {best['config']}"
        rate.append(FrontPoint(problem["cluster"], problem["gpus"], best["rate"], label, index))
        if best["days"] is not None:
            cost.append(FrontPoint(problem["cluster"], best["days"], best["gpu_hours"], label,
                                   index))
            if problem["price_per_gpu_hour"] is not None:
                dollars.append(FrontPoint(problem["cluster"], best["days"], float(
                    problem["price_per_gpu_hour"] * best["gpu_hours"]), label, index))
            if problem["board_power_w"] is not None:
                energy.append(FrontPoint(problem["cluster"], best["days"], float(
                    estimate_energy_kwh(best["gpu_hours"], problem["board_power_w"])), label,
                    index))
    if not rate:
        return []
    fronts = [build_front("tokens/s against GPUs", "GPUs", "tokens/s (whole job)", "lower",
                          "higher", rate, group.slug, x_log=True, y_log=True),
              build_front(f"GPU-hours against days for {budget_label} tokens",
                          f"days for {budget_label} tokens", "GPU-hours", "lower", "lower",
                          cost, group.slug, x_log=True)]
    for points, what in ((dollars, "$"), (energy, "kWh at board power")):
        if points:
            fronts.append(build_front(f"{what} against days for {budget_label} tokens",
                                      f"days for {budget_label} tokens", what, "lower",
                                      "lower", points, group.slug, x_log=True))
    return fronts


def build_page_data(lines: Sequence[dict[str, Any]], groups: Sequence[Group],
                    token_budget: float, fronts: Sequence[Front] = ()) -> dict[str, Any]:
    """The page's JSON: `problems` in report order, `constant` (the job fields every problem
    shares: the page names them once instead of repeating a column), `groups` (slug -> title),
    `fronts` (each group's two, then `fronts` given by the caller), the status counts and the
    token budget."""
    problems = [_problem_data(line, token_budget) for line in select_problem_lines(lines)]
    budget_label = render_tokens(token_budget)
    all_fronts = [f for g in groups for f in build_group_fronts(g, problems, budget_label)]
    all_fronts += list(fronts)
    constant = {name: problems[0][name] for name in JOB_FIELDS
                if problems and len({p[name] for p in problems}) == 1}
    return {
        "problems": problems,
        "constant": constant,
        "groups": {g.slug: g.title for g in groups},
        "fronts": [f.as_json() for f in all_fronts],
        "counts": count_statuses(problems),
        "token_budget": token_budget,
        "token_budget_label": budget_label,
        "memory_items": list(MEMORY_ITEMS),
        "memory_views": dict(MEMORY_VIEWS),
        "observed_views": dict(OBSERVED_VIEWS),
        "time_parts": list(TIME_PARTS),
        "time_words": dict(TIME_WORDS),
    }
