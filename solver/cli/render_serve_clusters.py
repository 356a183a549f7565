"""Rendering `parplan serve --objective gpus --cluster A --cluster B`: one row per cluster
(GPU, fewest GPUs, plan, $/h where priced, $ per million output tokens, tokens per joule) and
which was chosen and why (solver.serve.across); the chosen cluster's full answer follows."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_table
from solver.cli.render_serve_cost import plan_output_tokens_per_s, render_cost, render_pools_cost

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


def _two_cluster_cost(two: Any, plan: Any) -> dict[str, Any]:
    """$ and joules of a two-cluster plan at the offered rate: the pools' $ an hour and board
    power summed (None where a cluster is unpriced or its GPU has no board power)."""
    job = two.prefill_problem.job
    gpus = (two.prefill_problem.cluster.gpu, two.decode_problem.cluster.gpu)
    power = (None if any(g.power_limit_w is None for g in gpus) else
             gpus[0].power_limit_w * plan.prefill.num_gpus
             + gpus[1].power_limit_w * plan.decode.num_gpus)
    return render_pools_cost(two.dollars_per_hour(plan), power,
                             job.load.request_rate * job.output_distribution.mean, job)


def _two_cluster_commands(two: Any, plan: Any) -> tuple[list[str], list[str]]:
    """(vLLM lines, SGLang lines): the prefill engine with the first cluster's memory, the
    decode engine with the second's, and the proxy / router in front."""
    from solver.cli.render_serve import _sglang_engine
    from solver.emit.sglang import render_sglang_pair
    from solver.serve.job import scheduler_limits
    from solver.serve.plan import build_vllm_pair_commands

    tokens, _ = scheduler_limits(two.decode_problem)
    scheduler = {"max_num_seqs": plan.decode_max_num_seqs, "max_num_batched_tokens": tokens}
    vllm = build_vllm_pair_commands(two.prefill_problem, plan.prefill.degrees,
                                    plan.decode.degrees, scheduler, two.decode_problem)
    sglang = render_sglang_pair(
        _sglang_engine(two.prefill_problem, plan.prefill.degrees, None),
        _sglang_engine(two.decode_problem, plan.decode.degrees, scheduler))
    return vllm, sglang


def render_two_clusters_json(two: Any) -> dict[str, Any]:
    """Prefill on the first cluster, decode on the second: the link, the plans best first with
    their cost, and the best plan's launch lines."""
    from solver.cli.render_serve import _split_json

    answer: dict[str, Any] = {
        "prefill_cluster": two.prefill_problem.cluster.name,
        "prefill_gpu": two.prefill_problem.cluster.gpu.name,
        "decode_cluster": two.decode_problem.cluster.name,
        "decode_gpu": two.decode_problem.cluster.gpu.name,
        "kv_transfer_link": {"gb_per_s": round(two.link_bytes_per_s / 1e9, 3),
                             "network_of": two.link_cluster},
        "plans": [{**_split_json(plan), "kv_transfer_tier": "network between clusters",
                   "cost": _two_cluster_cost(two, plan)} for plan in two.plans],
    }
    if two.plans:
        vllm, sglang = _two_cluster_commands(two, two.plans[0])
        answer.update(vllm_commands=vllm, sglang_commands=sglang)
    return answer


def echo_two_clusters(two: Any) -> None:
    """The two-cluster plans as lines, the link, and the best plan's launch lines."""
    from solver.serve.disagg import describe_split

    p, d = two.prefill_problem.cluster, two.decode_problem.cluster
    click.echo(f"disaggregated across clusters: prefill on {p.name} ({p.gpu.name}), decode on "
               f"{d.name} ({d.gpu.name}); KV over the {two.link_cluster} network between "
               f"nodes, {two.link_bytes_per_s / 1e9:,.1f} GB/s per GPU (the slower side's)")
    if not two.plans:
        click.echo("  no pair of engines carries the request rate within the SLOs on --gpus "
                   "GPUs of each cluster")
        return
    for i, plan in enumerate(two.plans, start=1):
        cost = _two_cluster_cost(two, plan)
        money = ("" if cost["dollars_per_hour"] is None else
                 f", ${cost['dollars_per_hour']:,.2f}/h, "
                 f"${cost['dollars_per_million_output_tokens']:,.3f}/M output tokens")
        joules = ("" if cost["output_tokens_per_joule"] is None else
                  f", {cost['output_tokens_per_joule']:,.3f} tok/J at board power")
        click.echo(f"  {i}. {describe_split(plan)}: {plan.num_gpus} GPUs, carries up to "
                   f"{plan.max_rate_per_s:.2f} req/s; TTFT {plan.ttft_s * 1e3:,.1f} ms "
                   f"(KV transfer {plan.transfer_s * 1e3:.2f} ms), TPOT "
                   f"{plan.tpot_s * 1e3:,.1f} ms{money}{joules}")
    vllm, sglang = _two_cluster_commands(two, two.plans[0])
    click.echo("  plan 1, vllm (prefill on the first cluster, decode on the second):")
    for line in vllm:
        click.echo(f"    {line}")
    click.echo("  plan 1, sglang:")
    for line in sglang:
        click.echo(f"    {line}")
    click.echo("  the pools run on different clusters: put the prefill and decode hosts in the "
               "proxy / router line in place of localhost")
