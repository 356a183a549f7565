"""Rendering `optimize` answers: the ranked table, the why, the infeasibility explanation."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from solver.cli.render import echo_infeasible, echo_ranked
from solver.cli.render_plan import echo_layout_table
from solver.cost.step.caveats import list_time_caveats
from solver.cost.uncertainty import DEFAULT_INTERVAL_LEVEL
from solver.optimize_json import render_plans_uncertainty
from solver.spec.figures import format_significant


def recompute_label(plan: Any) -> str:
    """The recompute column: "full 40/61" where a layout recomputes only some layers,
    "selective = none" where either setting gives the same step time."""
    layout = plan.layout
    if layout is None or plan.config.recompute != "full":
        return " = ".join(_settings(plan, "recompute"))
    recomputed = sum(s.recompute_layers for s in layout.stages)
    return "full" if recomputed == layout.num_layers else f"full {recomputed}/{layout.num_layers}"


def zero_label(plan: Any) -> str:
    """The zero column: "0 = 1" where either stage gives the same plan (dp x cp = 1,
    solver.search.twins)."""
    return " = ".join(str(z) for z in _settings(plan, "zero"))


def _settings(plan: Any, name: str) -> list[Any]:
    """The plan's `name` setting, then the other values its equivalent settings take."""
    values = [getattr(plan.config, name)]
    for twin in plan.equivalent:
        if getattr(twin, name) not in values:
            values.append(getattr(twin, name))
    return values


def echo_result(result: Any, gpus_for_days: float | None,
                level: float = DEFAULT_INTERVAL_LEVEL, scales: Any = None,
                pricing: Any = None) -> None:
    """The heading, the ranking (with $ and kWh per million tokens where `pricing`,
    solver.optimize_counts.Pricing, prices them), its notes and the best plan's layout."""
    problem = result.problem
    heading = (f"{problem.model_spec.name} on {problem.num_gpus} x {problem.cluster.gpu.name} "
               f"({problem.cluster.name}), seq {problem.job.seq_len}, global batch "
               f"{problem.job.global_batch}, {problem.job.precision}, {problem.framework}")
    if problem.time_constants.training_states != "mixed":
        heading += f", {problem.time_constants.training_states} training states"
    if problem.job.finetune.mode != "none":
        heading += f", {problem.job.finetune.label()}"
    if gpus_for_days is not None:
        heading += f" — fewest GPUs for {gpus_for_days:g} days"
    cluster = problem.cluster
    if cluster.memory_headroom.label():
        heading += f"; plans fit {cluster.memory_headroom.describe(cluster.gpu_memory_bytes)}"
    click.echo(heading)
    # The fit rule, stated once (MemoryHeadroom.rule).
    click.echo("memory: " + cluster.memory_headroom.rule(cluster.gpu_memory_bytes))
    if result.status == "infeasible":
        echo_infeasible(result, "the model, the job or the cluster")
        return
    plans = result.plans
    odds = render_plans_uncertainty(plans, problem.model_spec, problem.cluster.gpu.name,
                                    problem.framework, problem.job.precision, level, scales)
    extras = odds["plans"]
    columns = plan_columns(plans, problem.job.token_budget is not None, level)
    if pricing is not None:
        columns += price_columns(pricing, problem.num_gpus, problem.job.token_budget is not None)
    wide = [c for c in columns if c.wide]
    narrow = [c for c in columns if c.narrow]
    rows = [[c.cell(i, plan, extras[i - 1]) for c in wide] for i, plan in enumerate(plans, 1)]
    compact = [[c.cell(i, plan, extras[i - 1]) for c in narrow]
               for i, plan in enumerate(plans, 1)]
    legend = "; ".join(f"{c.header}: {c.meaning}" for c in narrow if c.meaning)
    notes = [n for n in (_twins_note(plans), _savers_note(plans),
                         _modules_note(plans), _offloads_note(plans)) if n]
    notes += [f"note: {note}" for note in list_time_caveats(problem.model_spec)]
    if odds["uncertainty"] is not None:
        notes.append(render_uncertainty_note(odds["uncertainty"]))
    echo_ranked(result, [c.header for c in wide], rows, "\n".join(notes) or None,
                narrow=([c.header for c in narrow], compact, legend))
    best = plans[0]
    if best.config.pp > 1 or (best.config.recompute == "full"
                              and recompute_label(best) != best.config.recompute):
        echo_layout_table(best)


# The mark of a plan tied with the best in the # column.
TIE_MARK = "≈"


@dataclass(frozen=True)
class Column:
    """A column of the ranking: its header, the cell of plan #i (from the plan and its issue-36
    fields: intervals, fit probability, p_fastest, tied_with_best), and
    in which layouts it shows (wide: one column per degree; narrow: below the terminal's
    width, degrees merged), with what its header means in the narrow layout's legend."""

    header: str
    cell: Callable[[int, Any, dict[str, Any]], Any]
    wide: bool = True
    narrow: bool = True
    meaning: str = ""


MERGED = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp")


def plan_columns(plans: Any, budget: bool,
                 level: float = DEFAULT_INTERVAL_LEVEL) -> list[Column]:
    """The ranking's columns; "modules" where the listed selective plans recompute different
    module sets (issue 39: rows that looked the same differed only there)."""
    degree = [Column(name, lambda i, p, t, n=name: getattr(p.config, n), narrow=False)
              for name in MERGED]
    columns = [
        Column("#", lambda i, p, x: f"{i}{TIE_MARK}" if x.get("tied_with_best") and i > 1
               else i),
        *degree,
        Column("degrees", lambda i, p, t: "/".join(str(getattr(p.config, n)) for n in MERGED),
               wide=False, meaning="/".join(MERGED)),
        Column("zero", lambda i, p, t: _number_or_label(zero_label(p))),
        Column("mb", lambda i, p, t: p.config.micro_batch),
        Column("recompute", lambda i, p, t: recompute_label(p)),
    ]
    if _modules_differ(plans):
        columns.append(Column("modules", lambda i, p, t: ", ".join(p.recompute_modules)
                              if p.config.recompute == "selective" else ""))
    columns += [
        Column("device GB", lambda i, p, t: round(p.worst_stage.total_bytes / 1e9, 1),
               narrow=False),
        Column("GB", lambda i, p, t: round(p.worst_stage.total_bytes / 1e9, 1), wide=False,
               meaning="device GB of the worst stage"),
        Column("% GPU", lambda i, p, t: round(100 * _gpu_share(p), 1), narrow=False),
        Column("%", lambda i, p, t: round(100 * _gpu_share(p)), wide=False,
               meaning="GB as a whole percentage of the GPU's memory"),
        Column("step s", lambda i, p, t: round(p.time.step_seconds, 3)),
        Column(f"{level:.0%} step s",
               lambda i, p, x: render_interval(x.get("step_seconds_interval")), narrow=False),
        Column("tokens/s", lambda i, p, t: round(p.time.tokens_per_second)),
        Column("MFU %", lambda i, p, t: round(100 * p.time.mfu, 1)),
        Column("fits", lambda i, p, x: render_fits(p, x)),
        Column("p fastest", lambda i, p, x: render_p_fastest(x)),
    ]
    if budget:
        columns.append(Column("days", lambda i, p, t: round(p.time.train_days or 0.0, 1)))
    return columns


def _gpu_share(plan: Any) -> float:
    """The worst stage's memory over the GPU's whole memory (the % GPU column)."""
    return plan.worst_stage.total_bytes / plan.gpu_memory_bytes


def price_columns(pricing: Any, num_gpus: int, budget: bool) -> list[Column]:
    """$ per million tokens where priced (and $ for the token budget), kWh per million tokens
    where the catalog has the GPU's board power (solver.optimize_counts.Pricing)."""
    columns = []
    if pricing.price_per_gpu_hour is not None:
        columns.append(Column("$/M tok", lambda i, p, t: format_significant(
            pricing.dollars_per_million_tokens(p, num_gpus)),
            meaning=f"$ per million tokens at ${pricing.price_per_gpu_hour:g} per GPU-hour"))
        if budget:
            columns.append(Column(
                "$", lambda i, p, t: f"{pricing.dollars_for_budget(p, num_gpus):,.0f}",
                meaning="$ to train the token budget"))
    if pricing.board_power_w is not None:
        columns.append(Column("kWh/M tok", lambda i, p, t: format_significant(
            pricing.kwh_per_million_tokens(p, num_gpus)),
            meaning=f"kWh per million tokens at {pricing.board_power_w:g} W board power a GPU "
                    "(an upper bound)"))
    return columns


def _modules_differ(plans: Any) -> bool:
    """Whether the listed selective plans recompute more than one module set."""
    return len({p.recompute_modules for p in plans if p.config.recompute == "selective"}) > 1


def _number_or_label(label: str) -> int | str:
    """A label that is one number as that number (right-aligned with the others)."""
    return int(label) if label.isdigit() else label


def _twins_note(plans: Any) -> str | None:
    """What "a = b" in the recompute column means, with the most memory the second costs."""
    extra = [e.total_bytes - p.worst_stage.total_bytes for p in plans for e in p.equivalent]
    if not extra:
        return None
    return (f"recompute or zero a = b: the same step time with either setting (the first listed "
            f"needs the least memory; the other up to {max(extra) / 1e9:.2f} GB more; a ZeRO "
            "stage shards nothing at dp x cp = 1)")


def _savers_note(plans: Any) -> str | None:
    """The memory savers each plan turns on to fit (Plan.memory_savers), as launch flags."""
    return _flags_note(plans, "memory_savers",
                       "memory savers (on where a plan needs them to fit): ")


def _offloads_note(plans: Any) -> str | None:
    """The offloads to the host each plan uses (Plan.offloads), as launch flags."""
    return _flags_note(plans, "offloads", "offloads to the host: ")


def _flags_note(plans: Any, field: str, head: str) -> str | None:
    """`head` and, per plan that sets any, the feature names of its `field` as flags."""
    used = [(i, getattr(p, field)) for i, p in enumerate(plans, start=1) if getattr(p, field)]
    if not used:
        return None
    return head + "; ".join(f"#{i} " + ", ".join("--" + name.replace("_", "-") for name in names)
                            for i, names in used)


def _modules_note(plans: Any) -> str | None:
    """What each selective plan recomputes (Plan.recompute_modules: Megatron's
    --recompute-modules, which `launch --plan` writes; Megatron-DeepSpeed's and the generic
    profile's selective is core_attn, with no flag); none where the table has them in a
    column (plan_columns: the sets differ)."""
    used = [(i, p.recompute_modules) for i, p in enumerate(plans, start=1)
            if p.recompute_modules]
    if not used or _modules_differ(plans):
        return None
    return "selective recomputes: " + "; ".join(
        f"#{i} {','.join(modules)}" for i, modules in used)


def render_interval(interval: list[float] | None) -> str:
    """"5.36-7.08", "370-488" (three significant figures; empty without an interval)."""
    if interval is None:
        return ""
    return f"{format_significant(interval[0])}-{format_significant(interval[1])}"


def render_fits(plan: Any, extra: dict[str, Any]) -> str:
    """"fits (93%)" or "OOM (12%)": the verdict and the chance it fits (issue 36)."""
    verdict = "fits" if plan.fits else "OOM"
    return f"{verdict} ({extra['fit_probability']:.0%})"


def render_p_fastest(extra: dict[str, Any]) -> str:
    """"24%": the chance the plan is the fastest (its tie with #1 is the # column's mark)."""
    if "p_fastest" not in extra:
        return ""
    return f"{extra['p_fastest']:.0%}"


def render_uncertainty_note(summary: dict[str, Any]) -> str:
    """What the interval, fits and p fastest columns mean (solver.cost.uncertainty)."""
    text = (f"uncertainty: {summary['interval_level']:.0%} intervals and chances from the "
            f"error model of the public runs ({summary['category']}; benchmarks/error_model.py);"
            f" fits (N%): within the usable memory, and the chance it fits the GPU; "
            f"{TIE_MARK}: tied with #1 within the model's error")
    if summary["winner_change"]:
        text += f"; {summary['winner_change']}"
    if "calibrated" in summary:  # `calibrate training-log` (solver.calibrate.scales)
        runs = summary["calibrated"]["num_runs"]
        text += (f"; calibrated by {runs} run{'s' if runs != 1 else ''} of this model "
                 "(--calibration): plans ranked by the calibrated step, the step intervals, fit "
                 "chances and p fastest are around the measured scale, `step s` is the cost "
                 "model's")
    return text
