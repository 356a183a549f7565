"""Rendering `optimize` answers: the ranked table, the why, the infeasibility explanation."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_infeasible, echo_ranked
from solver.cli.render_plan import echo_layout_table
from solver.cost.caveats import list_time_caveats
from solver.cost.uncertainty import DEFAULT_INTERVAL_LEVEL, DEFAULT_MIN_FIT_PROBABILITY
from solver.optimize_json import render_plans_uncertainty


def recompute_label(plan: Any) -> str:
    """The recompute column: "full 40/61" where a layout recomputes only some layers,
    "selective = none" where either setting gives the same step time."""
    layout = plan.layout
    if layout is None or plan.config.recompute != "full":
        return " = ".join([plan.config.recompute] + [e.recompute for e in plan.equivalent])
    recomputed = sum(s.recompute_layers for s in layout.stages)
    return "full" if recomputed == layout.num_layers else f"full {recomputed}/{layout.num_layers}"


def echo_result(result: Any, gpus_for_days: float | None,
                level: float = DEFAULT_INTERVAL_LEVEL,
                min_fit_probability: float = DEFAULT_MIN_FIT_PROBABILITY) -> None:
    problem = result.problem
    heading = (f"{problem.model_spec.name} on {problem.num_gpus} x {problem.cluster.gpu.name} "
               f"({problem.cluster.name}), seq {problem.job.seq_len}, global batch "
               f"{problem.job.global_batch}, {problem.job.precision}, {problem.framework}")
    if problem.time_constants.training_states != "mixed":
        heading += f", {problem.time_constants.training_states} training states"
    if gpus_for_days is not None:
        heading += f" — fewest GPUs for {gpus_for_days:g} days"
    cluster = problem.cluster
    if cluster.memory_headroom.label():
        heading += f"; plans fit {cluster.memory_headroom.describe(cluster.gpu_memory_bytes)}"
    if min_fit_probability != DEFAULT_MIN_FIT_PROBABILITY:
        heading += (f" (with --min-fit-probability {min_fit_probability:g}: what fits with that "
                    "chance under the memory error model)")
    click.echo(heading)
    if result.status == "infeasible":
        echo_infeasible(result, "the model, the job or the cluster")
        return
    budget = problem.job.token_budget is not None
    odds = render_plans_uncertainty(result.plans, problem.model_spec, problem.cluster.gpu.name,
                                    problem.framework, problem.job.precision, level,
                                    min_fit_probability)
    columns = ["#", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "mb", "recompute",
               "device GB", "step s", f"{level:.0%} step s", "tokens/s", "MFU %", "fits",
               "p fastest"] + (["days"] if budget else [])
    rows = []
    for i, (plan, extra) in enumerate(zip(result.plans, odds["plans"]), start=1):
        c, t = plan.config, plan.time
        assert t is not None
        row = [i, c.tp, c.pp, c.dp, c.cp, c.ep, c.etp, c.vpp, c.zero, c.micro_batch,
               recompute_label(plan), round(plan.worst_stage.total_bytes / 1e9, 1),
               round(t.step_seconds, 3), render_interval(extra.get("step_seconds_interval")),
               round(t.tokens_per_second), round(100 * t.mfu, 1), render_fits(plan, extra),
               render_p_fastest(extra)]
        if budget:
            row.append(round(t.train_days or 0.0, 1))
        rows.append(row)
    notes = [n for n in (_twins_note(result.plans), _savers_note(result.plans),
                         _modules_note(result.plans), _offloads_note(result.plans)) if n]
    notes += [f"note: {note}" for note in list_time_caveats(problem.model_spec)]
    notes.append(render_uncertainty_note(odds["uncertainty"]))
    echo_ranked(result, columns, rows, "\n".join(notes) or None)
    best = result.plans[0]
    if best.config.pp > 1 or (best.config.recompute == "full"
                              and recompute_label(best) != best.config.recompute):
        echo_layout_table(best)


def _twins_note(plans: Any) -> str | None:
    """What "a = b" in the recompute column means, with the most memory the second costs."""
    extra = [e.total_bytes - p.worst_stage.total_bytes for p in plans for e in p.equivalent]
    if not extra:
        return None
    return (f"recompute a = b: the same step time with either setting (the first listed needs "
            f"the least memory; the other up to {max(extra) / 1e9:.2f} GB more)")


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
    profile's selective is core_attn, with no flag)."""
    used = [(i, p.recompute_modules) for i, p in enumerate(plans, start=1)
            if p.recompute_modules]
    if not used:
        return None
    return "selective recomputes: " + "; ".join(
        f"#{i} {','.join(modules)}" for i, modules in used)


def render_interval(interval: list[float] | None) -> str:
    """"5.36-7.08" (empty without an interval)."""
    if interval is None:
        return ""
    return f"{interval[0]:#.3g}-{interval[1]:#.3g}"


def render_fits(plan: Any, extra: dict[str, Any]) -> str:
    """"fits (93%)" or "OOM (12%)": the verdict and the chance it fits (issue 36)."""
    verdict = "fits" if plan.fits else "OOM"
    return f"{verdict} ({extra['fit_probability']:.0%})"


def render_p_fastest(extra: dict[str, Any]) -> str:
    """"24% =" for a plan tied with the best within the model's error, "3%" otherwise."""
    if "p_fastest" not in extra:
        return ""
    return f"{extra['p_fastest']:.0%}" + (" =" if extra["tied_with_best"] else "")


def render_uncertainty_note(summary: dict[str, Any]) -> str:
    """What the interval, fits and p fastest columns mean (solver.cost.uncertainty)."""
    rule = ("the predicted total within the usable memory, today's rule" if
            summary["min_fit_probability"] == 0.5 else
            f"a chance of at least {summary['min_fit_probability']:.0%}")
    text = (f"uncertainty: {summary['interval_level']:.0%} intervals and chances from the "
            f"error model of the public runs ({summary['category']}; benchmarks/error_model.py);"
            f" plans listed fit by {rule} (--min-fit-probability "
            f"{summary['min_fit_probability']:g}); '=': tied with #1 within the model's error")
    if summary["winner_change"]:
        text += f"; {summary['winner_change']}"
    return text
