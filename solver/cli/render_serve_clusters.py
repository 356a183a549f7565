"""Rendering `parplan serve --objective gpus --cluster A --cluster B`: one row per cluster
(GPU, fewest GPUs, plan, $/h where priced, $ per million output tokens, tokens per joule) and
which was chosen and why (solver.serve.across); the chosen cluster's full answer follows."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_table
from solver.cli.render_serve_cost import plan_output_tokens_per_s, render_cost

BY = {"dollars_per_hour": "the lowest $ an hour (every cluster priced)",
      "gpus": "the fewest GPUs"}


def _row(option: Any) -> dict[str, Any]:
    result = option.result
    problem = result.problem
    row: dict[str, Any] = {"cluster": option.name, "gpu": problem.cluster.gpu.name,
                           "status": result.status, "fewest_gpus": option.fewest_gpus}
    if option.fewest_gpus is None:
        row.update(plan=None, conflicts=list(result.conflicts))
        return row
    plan = result.plans[0]
    row["plan"] = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep,
                   "replicas": plan.replicas}
    if option.price_per_gpu_hour is not None:
        row["cost"] = render_cost(option.price_per_gpu_hour, problem.cluster.gpu,
                                  plan.num_gpus, plan_output_tokens_per_s(plan, problem),
                                  problem.job)
    return row


def render_clusters_json(choice: Any) -> dict[str, Any]:
    """The comparison: the chosen cluster (None if none serves the job), by what, each row."""
    chosen = None if choice.chosen < 0 else choice.options[choice.chosen].name
    return {"chosen": chosen, "by": choice.by,
            "clusters": [_row(option) for option in choice.options]}


def echo_clusters(choice: Any) -> None:
    """The comparison as a table, then the line saying which cluster is shown below."""
    rows = []
    for option in choice.options:
        row = _row(option)
        plan, cost = row.get("plan"), row.get("cost")
        degrees = ("-" if plan is None else
                   f"tp {plan['tp']} pp {plan['pp']} dp {plan['dp']} ep {plan['ep']}"
                   + (f" x{plan['replicas']}" if plan["replicas"] > 1 else ""))
        money = "-" if cost is None or cost["dollars_per_hour"] is None else \
            f"{cost['dollars_per_hour']:,.2f}"
        per_million = ("-" if cost is None or cost["dollars_per_million_output_tokens"] is None
                       else f"{cost['dollars_per_million_output_tokens']:,.3f}")
        joules = ("-" if cost is None or cost["output_tokens_per_joule"] is None
                  else f"{cost['output_tokens_per_joule']:,.3f}")
        rows.append([option.name, row["gpu"],
                     "none meets the targets" if plan is None else row["fewest_gpus"],
                     degrees, money, per_million, joules])
    echo_table("across clusters (objective gpus: each cluster's fewest GPUs meeting the "
               "targets)", ["cluster", "GPU", "fewest GPUs", "plan", "$/h", "$/M out",
                            "tok/J"], rows)
    if choice.chosen < 0:
        click.echo("no cluster meets the targets; the first cluster's answer follows")
    else:
        click.echo(f"chosen: {choice.options[choice.chosen].name}, by {BY[choice.by]}; its "
                   "answer follows")
