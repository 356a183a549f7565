"""Rendering `optimize` answers: the ranked table, the why, the infeasibility explanation."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_infeasible, echo_ranked
from solver.cli.render_plan import echo_layout_table
from solver.cost.caveats import list_time_caveats


def recompute_label(plan: Any) -> str:
    """The recompute column: "full 40/61" where a layout recomputes only some layers,
    "selective = none" where either setting gives the same step time."""
    layout = plan.layout
    if layout is None or plan.config.recompute != "full":
        return " = ".join([plan.config.recompute] + [e.recompute for e in plan.equivalent])
    recomputed = sum(s.recompute_layers for s in layout.stages)
    return "full" if recomputed == layout.num_layers else f"full {recomputed}/{layout.num_layers}"


def echo_result(result: Any, gpus_for_days: float | None) -> None:
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
    click.echo(heading)
    if result.status == "infeasible":
        echo_infeasible(result, "the model, the job or the cluster")
        return
    budget = problem.job.token_budget is not None
    columns = ["#", "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "mb", "recompute",
               "device GB", "step s", "tokens/s", "MFU %"] + (["days"] if budget else [])
    rows = []
    for i, plan in enumerate(result.plans, start=1):
        c, t = plan.config, plan.time
        assert t is not None
        row = [i, c.tp, c.pp, c.dp, c.cp, c.ep, c.etp, c.vpp, c.zero, c.micro_batch,
               recompute_label(plan), round(plan.worst_stage.total_bytes / 1e9, 1),
               round(t.step_seconds, 3), round(t.tokens_per_second), round(100 * t.mfu, 1)]
        if budget:
            row.append(round(t.train_days or 0.0, 1))
        rows.append(row)
    notes = [n for n in (_twins_note(result.plans), _savers_note(result.plans),
                         _modules_note(result.plans), _offloads_note(result.plans)) if n]
    notes += [f"note: {note}" for note in list_time_caveats(problem.model_spec)]
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
