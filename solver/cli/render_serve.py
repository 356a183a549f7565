"""Rendering `serve` answers: the JSON of DESIGN.md, the ranked table, the why, the vLLM
command, and the infeasibility explanation. Memory in decimal GB (1e9 bytes), per GPU, in
items and in the three views users measure it in (MEMORY_VIEWS, solver.cost.serving.memory)."""

from __future__ import annotations

import math
from typing import Any

import click
import numpy as np

from solver.cli.render import echo_infeasible, echo_ranked
from solver.cli.render_plan import render_views_text
from solver.cli.render_serve_cost import (
    COST_COLUMNS,
    plan_output_tokens_per_s,
    render_cost,
    render_cost_cells,
)
from solver.cost.uncertainty import (
    estimate_serve_interval,
    load_error_model,
)
from solver.spec.plan import MEMORY_VIEWS, OBSERVED_VIEWS
from solver.spec.plan_json import (
    render_answer_head,
    render_infeasible_json,
    render_memory_views_json,
    to_gb,
)


def _sglang_engine(problem: Any, degrees: dict[str, int],
                   scheduler: dict[str, int] | None) -> Any:
    from solver.emit.sglang import SglangEngine
    from solver.serve.plan import model_id

    job, cluster = problem.job, problem.cluster
    share = job.gpu_memory_utilization * cluster.usable_memory_bytes / cluster.gpu_memory_bytes
    return SglangEngine(
        model_id=model_id(problem), tp=degrees["tp"], pp=degrees["pp"], dp=degrees["dp"],
        ep=degrees["ep"], context=job.context, memory_share=share, precision=job.precision,
        kv_cache_dtype=job.kv_cache_dtype,
        max_running_requests=None if scheduler is None else scheduler["max_num_seqs"],
        chunked_prefill_size=None if scheduler is None else scheduler["max_num_batched_tokens"])


def sglang_command(problem: Any, plan: Any) -> str:
    """The plan as SGLang's launch_server (solver.emit.sglang)."""
    from solver.emit.sglang import render_sglang

    degrees = {"tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep}
    loaded = problem.job.load.kind != "none"
    return render_sglang(_sglang_engine(problem, degrees, plan.scheduler if loaded else None))


def render_serve_intervals(plan: Any, level: float) -> dict[str, list[float]]:
    """Issue 36: `level` intervals of TTFT, TPOT (ms) and throughput from the serving error
    model (solver.cost.uncertainty, one sigma per metric)."""
    error_model = load_error_model()
    values = {"ttft_ms": ("ttft", plan.ttft_s * 1e3), "tpot_ms": ("tpot", plan.tpot_s * 1e3),
              "tokens_per_second": ("throughput", plan.tokens_per_s),
              "tokens_per_second_per_gpu": ("throughput", plan.tokens_per_s_per_gpu)}
    answer = {}
    for name, (metric, value) in values.items():
        if not math.isfinite(value):
            continue
        low, high = estimate_serve_interval(error_model, metric, np.array([value]), level)
        answer[f"{name}_interval"] = [round(float(low[0]), 3), round(float(high[0]), 3)]
    return answer


def render_serve_interval_text(plan: Any, level: float) -> str:
    """"80% intervals of plan 1: TTFT 20.8-85.9 ms, TPOT 28.8-70.5 ms, 18,879-62,332 tokens/s"
    (render_serve_intervals)."""
    intervals = render_serve_intervals(plan, level)
    parts = [f"{label} {intervals[name][0]:,.1f}-{intervals[name][1]:,.1f} ms"
             for label, name in (("TTFT", "ttft_ms_interval"), ("TPOT", "tpot_ms_interval"))
             if name in intervals]
    if "tokens_per_second_interval" in intervals:
        low, high = intervals["tokens_per_second_interval"]
        parts.append(f"{low:,.0f}-{high:,.0f} tokens/s")
    return (f"{level:.0%} intervals of plan 1 (serving error model of the public vLLM and "
            f"SGLang runs): " + ", ".join(parts))


def _plan_json(plan: Any, problem: Any, level: float = 0.8,
               price: float | None = None) -> dict[str, Any]:
    cost = {} if price is None else {"cost": render_cost(
        price, problem.cluster.gpu, plan.num_gpus, plan_output_tokens_per_s(plan, problem),
        problem.job)}
    return {
        "tp": plan.tp, "pp": plan.pp, "dp": plan.dp, "ep": plan.ep, "replicas": plan.replicas,
        "gpus": plan.num_gpus, "expert_parallel": plan.ep > 1, "fits": plan.fits,
        "memory_gb": {k: round(v / 1e9, 3) for k, v in plan.memory_bytes.items()},
        **{f"{view}_gb": to_gb(plan.views_bytes[view]) for view in MEMORY_VIEWS},
        # On this GPU the counters read the views themselves: vLLM empties the allocator's
        # cache before and after its profile run and gives the KV cache all of
        # util x HBM less the profiled peak (vllm/v1/worker/gpu_worker.py
        # determine_available_memory), so no cache grows into the room left.
        **{f"{view}_gb_observed": to_gb(plan.views_bytes[view]) for view in OBSERVED_VIEWS},
        "kv_bytes_per_token": round(plan.kv_bytes_per_token, 1),
        "kv_cache_tokens": plan.kv_tokens,
        "max_concurrent_sequences": plan.max_sequences,
        "batch": plan.batch,
        "ttft_ms": round(plan.ttft_s * 1e3, 3),
        "tpot_ms": round(plan.tpot_s * 1e3, 3),
        "tpot_idle_ms": round(plan.tpot_idle_s * 1e3, 3),
        "request_latency_s": round(plan.latency_s, 4),
        "tokens_per_second": round(plan.tokens_per_s, 2),
        "tokens_per_second_per_gpu": round(plan.tokens_per_s_per_gpu, 2),
        "decode_step_ms": {k: round(v * 1e3, 4) for k, v in plan.decode_step_s.items()},
        "vllm_command": plan.command,
        "sglang_command": sglang_command(problem, plan),
        "notes": list(plan.notes),
        "load": _load_json(plan.load),
        "scheduler": dict(plan.scheduler),
        **render_serve_intervals(plan, level),
        **cost,
    }


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1e3, 3)


def _load_json(load: dict[str, Any]) -> dict[str, Any]:
    """The plan's load report with seconds as milliseconds (`_ms` keys), None where a load is
    not carried (queues grow without bound)."""
    def convert(part: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in part.items():
            if "_per_s" in key:  # a rate: tokens per second, as the plan's own keys
                out[key.replace("_per_s", "_per_second")] = (
                    None if value is None else round(value, 4))
            elif key.endswith("_s"):
                out[key.removesuffix("_s") + "_ms"] = _ms(value)
            else:
                out[key] = round(value, 4) if isinstance(value, float) else value
        return out

    return {name: convert(part) for name, part in load.items()}


def _point_cost(point: Any, problem: Any, price: float) -> dict[str, Any]:
    return render_cost(price, problem.cluster.gpu, point.num_gpus,
                       point.tokens_per_s_per_gpu * point.num_gpus, problem.job)


def _pareto_json(front: Any, problem: Any, price: float | None) -> list[dict[str, Any]]:
    return [{**point.degrees, "gpus": point.num_gpus, "kind": point.kind,
             **({"prefill": point.prefill} if point.prefill is not None else {}),
             "request_rate": round(point.request_rate, 4),
             "tokens_per_second_per_user": round(point.tokens_per_s_per_user, 3),
             "tokens_per_second_per_gpu": round(point.tokens_per_s_per_gpu, 3),
             "ttft_ms": _ms(point.ttft_s), "tpot_ms": _ms(point.tpot_s),
             "meets_slo": point.meets_slo,
             **({} if price is None else {"cost": _point_cost(point, problem, price)})}
            for point in front]


def _workload_json(job: Any) -> dict[str, Any]:
    def lengths(dist: Any) -> dict[str, Any]:
        return {"kind": dist.kind, "low": dist.low, "high": dist.high,
                "mean": round(dist.mean, 3)}

    load = job.load
    return {"input": lengths(job.input_distribution),
            "output": lengths(job.output_distribution),
            "request_rate": load.request_rate, "concurrency": load.concurrency,
            "client": load.client_name,
            "burstiness": (load.burstiness or 1.0) if load.client_name == "gamma" else None,
            "slo_percentile": load.slo_percentile,
            "max_num_seqs": job.max_num_seqs,
            "max_num_batched_tokens": job.max_num_batched_tokens}


def render_serve_json(result: Any, level: float = 0.8) -> dict[str, Any]:
    """DESIGN.md: status, solve_seconds, plans (best first); conflicts and fixes if
    infeasible; the winner's vLLM command; the interval level and the fit chance the
    headroom was sized for (--min-fit-probability; 0.5 without an error margin)."""
    problem = result.problem
    job = problem.job
    answer: dict[str, Any] = {
        **render_answer_head(result),
        "gpu": problem.cluster.gpu.name,
        "context": job.context,
        "context_source": job.context_source,
        "input_len": job.input_len,
        "output_len": job.output_len,
        "precision": job.precision,
        "kv_cache_dtype": job.kv_cache_dtype,
        "gpu_memory_utilization": job.gpu_memory_utilization,
        # The fit rule in words (MemoryHeadroom.rule), as the table states it.
        "memory_rule": render_serve_memory_rule(problem),
        "objective": job.objective,
        "max_ttft_ms": job.max_ttft_ms,
        "max_tpot_ms": job.max_tpot_ms,
        "min_tokens_per_s": job.min_tokens_per_s,
        "workload": _workload_json(job),
        "num_feasible": result.num_feasible,
        "plans": [_plan_json(plan, problem, level, result.price_per_gpu_hour)
                  for plan in result.plans],
        "interval_level": level,
        "min_fit_probability": problem.cluster.memory_headroom.fit_probability or 0.5,
        # What reports each view of a plan's memory: the view a measured number is compared
        # with (vLLM's own log splits it the same way: solver.cost.serving.memory).
        "memory_views": render_memory_views_json(),
    }
    if result.pareto is not None:
        answer["pareto"] = _pareto_json(result.pareto, problem, result.price_per_gpu_hour)
    if result.disaggregated is not None:
        answer["disaggregated"] = _disagg_json(result)
    if result.status == "infeasible":
        answer.update(render_infeasible_json(result))
    else:
        answer.update(why=list(result.why), vllm_command=result.plans[0].command)
    return answer


def render_serve_memory_rule(problem: Any) -> str:
    """The fit rule of a serving answer: a headroom --memory-headroom gives
    (MemoryHeadroom.rule), else the engine's memory share, which is its own headroom."""
    cluster, job = problem.cluster, problem.job
    if cluster.memory_headroom.label():
        return cluster.memory_headroom.rule(cluster.gpu_memory_bytes)
    return (f"the engine's memory share ({job.gpu_memory_utilization:g}) is the headroom: vLLM "
            "measures the weights and activations in its profile run and gives the KV cache "
            "what is left (gpu_worker.determine_available_memory), and the memory error model "
            "has no serving rows, so no error margin is added; --memory-headroom 10% or 4GB "
            "adds one")


def echo_serve_result(result: Any, level: float = 0.8) -> None:
    problem = result.problem
    job = problem.job
    click.echo(f"{problem.model_spec.name} on {problem.num_gpus} x {problem.cluster.gpu.name} "
               f"({problem.cluster.name}), context {job.context:,}{_context_note(problem)}, "
               f"requests of "
               f"{job.input_len:,} + {job.output_len:,} tokens, {job.precision} weights, "
               f"objective {job.objective}")
    cluster = problem.cluster
    click.echo("memory: " + render_serve_memory_rule(problem))
    if job.load.kind != "none" or job.input_lengths or job.output_lengths:
        click.echo(f"workload: {_describe_workload(job)}")
    if result.status == "infeasible":
        echo_infeasible(result, "the model, the context or the cluster")
        if result.pareto is not None:
            _echo_pareto(result)
        return
    replicas = any(plan.replicas > 1 for plan in result.plans)
    loaded = job.load.kind != "none"  # the load table below replaces the batch columns
    price = result.price_per_gpu_hour
    priced = price is not None
    columns = (["#", "tp", "pp", "dp", "ep"] + (["replicas"] if replicas else [])
               + ["GPUs", "weights GB", "KV GB", *VIEW_COLUMNS.values(), "% GPU",
                  f"seqs @{job.context:,}"]
               + ([] if loaded else ["batch", "TTFT ms alone", "TPOT ms @batch", "tokens/s",
                                     "tokens/s/GPU"])
               + (COST_COLUMNS if priced else []))
    rows = []
    for i, plan in enumerate(result.plans, start=1):
        row = [i, plan.tp, plan.pp, plan.dp, plan.ep] + ([plan.replicas] if replicas else [])
        row += [plan.num_gpus, round(plan.memory_bytes["weights"] / 1e9, 1),
                round(plan.memory_bytes["kv_cache"] / 1e9, 1),
                *(round(plan.views_bytes[view] / 1e9, 1) for view in VIEW_COLUMNS),
                round(100 * plan.views_bytes["device"] / cluster.gpu_memory_bytes, 1),
                plan.max_sequences]
        if not loaded:
            row += [plan.batch, round(plan.ttft_s * 1e3, 1), round(plan.tpot_s * 1e3, 1),
                    round(plan.tokens_per_s), round(plan.tokens_per_s_per_gpu)]
        if priced:
            row += render_cost_cells(render_cost(price, problem.cluster.gpu, plan.num_gpus,
                                                 plan_output_tokens_per_s(plan, problem), job))
        rows.append(row)
    echo_ranked(result, columns, rows,
                note="memory per GPU of plan 1: " + render_views_text(result.plans[0].views_bytes))
    _echo_load(result)
    click.echo(render_serve_interval_text(result.plans[0], level))
    if result.pareto is not None:
        _echo_pareto(result)
    if result.disaggregated is not None:
        _echo_disagg(result)
    best = result.plans[0]
    click.echo("vllm:")
    click.echo(f"  {best.command}")
    for note in best.notes:
        click.echo(f"  note: {note}")
    click.echo("sglang:")
    click.echo(f"  {sglang_command(problem, best)}")


# The ranked table's memory view: device (the total the fit is judged on), as in optimize's
# table; the line under the table gives plan 1 in every view, the JSON every plan's.
VIEW_COLUMNS = {"device": "device GB"}


def _context_note(problem: Any) -> str:
    """Where the context came from when --context was not given (solver.serve.context)."""
    source = problem.job.context_source
    longest = problem.model_spec.max_position_embeddings
    if source == "model":
        return " (the model's max_position_embeddings; no --context given)"
    if source == "fits":
        return (f" (the longest any plan's KV cache holds: the model's {longest:,} does not "
                "fit; no --context given)")
    return ""


def _describe_workload(job: Any) -> str:
    from solver.serve.workload import CLIENTS

    load = job.load
    client = load.client_name
    how = CLIENTS[client] if client is not None else ""
    if client == "gamma":
        how += f", burstiness {load.burstiness or 1.0:g}"
    offered = (f"{load.request_rate:g} requests/s, {how}" if load.request_rate is not None
               else f"{load.concurrency:,} concurrent users, {how}"
               if load.concurrency is not None else "no load given")
    return (f"input {job.input_distribution.describe()}, output "
            f"{job.output_distribution.describe()} tokens, {offered}, SLO at "
            f"p{load.slo_percentile}, engine {job.engine_release.label}")


def _fmt(value: float | None, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}"


def _echo_load(result: Any) -> None:
    """Idle latency (one request alone), the latency at the offered load, and the most load
    each plan carries within the SLO, as a second table."""
    job = result.problem.job
    q = f"p{job.load.slo_percentile}"
    active = job.load.kind != "none"
    head = (["#", "idle TTFT ms", "idle TPOT ms"]
            + ([f"TTFT {q} ms", f"TPOT {q} ms", "meets SLO"] if active else [])
            + ["max req/s in SLO", "max users in SLO", "--max-num-seqs"])
    rows = []
    for i, plan in enumerate(result.plans, start=1):
        load = plan.load
        at, within, idle = load["at_load"], load["within_slo"], load["idle"]
        row = [str(i), _fmt(idle["ttft_s"], 1e3), _fmt(idle["tpot_s"], 1e3)]
        if active:
            row += [_fmt(at["ttft_s"], 1e3), _fmt(at["tpot_s"], 1e3),
                    "yes" if at["meets_slo"] else "no"]
        row += [_fmt(within["max_request_rate"], 1.0, 2), _fmt(within["max_concurrency"], 1.0, 0),
                str(plan.scheduler["max_num_seqs"])]
        rows.append(row)
    click.echo("latency: idle = one request alone; under load = the offered load, queueing "
               "model of solver/cost/serving/load.py")
    widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(head)]
    click.echo("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for row in rows:
        click.echo("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _echo_pareto(result: Any) -> None:
    front, price = result.pareto, result.price_per_gpu_hour
    click.echo("pareto front (tokens/s/user vs tokens/s/GPU; * meets the SLO; a prefill pool "
               "marks a disaggregated plan, its decode pool in the degree columns):")
    head = ["", "prefill pool", "tp", "pp", "dp", "ep", "replicas", "GPUs", "req/s",
            "tok/s/user", "tok/s/GPU", "TTFT ms", "TPOT ms"]
    if price is not None:
        head += COST_COLUMNS

    def pool(p: Any) -> str:
        if p.prefill is None:
            return "-"
        d = p.prefill
        return f"tp {d['tp']} pp {d['pp']} dp {d['dp']} x{d['copies']}"

    rows = [["*" if p.meets_slo else " ", pool(p), *(str(p.degrees[n]) for n in
             ("tp", "pp", "dp", "ep", "replicas")), str(p.num_gpus), f"{p.request_rate:,.2f}",
             f"{p.tokens_per_s_per_user:,.1f}", f"{p.tokens_per_s_per_gpu:,.1f}",
             f"{p.ttft_s * 1e3:,.1f}", f"{p.tpot_s * 1e3:,.1f}"]
            + ([] if price is None else
               render_cost_cells(_point_cost(p, result.problem, price))) for p in front]
    widths = [max(len(h), *(len(r[k]) for r in rows)) if rows else len(h)
              for k, h in enumerate(head)]
    click.echo("  ".join(h.rjust(w) for h, w in zip(head, widths)))
    for row in rows:
        click.echo("  ".join(v.rjust(w) for v, w in zip(row, widths)))


def _split_json(plan: Any) -> dict[str, Any]:
    def pool(p: Any) -> dict[str, Any] | None:
        return None if p is None else {**p.degrees, "copies": p.copies, "gpus": p.num_gpus}

    return {"kind": plan.kind, "prefill": pool(plan.prefill), "decode": pool(plan.decode),
            "gpus": plan.num_gpus, "max_request_rate": round(plan.max_rate_per_s, 4),
            "ttft_ms": _ms(_finite(plan.ttft_s)), "tpot_ms": _ms(_finite(plan.tpot_s)),
            "kv_transfer_ms": _ms(plan.transfer_s),
            "kv_transfer_tier": "nvlink" if plan.same_domain else "network"}


def _finite(value: float) -> float | None:
    return value if value == value and abs(value) != float("inf") else None


def _pair_commands(result: Any, split: Any) -> tuple[list[str], list[str]]:
    """(vLLM lines, SGLang lines) of a disaggregated plan: each pool's engine once (run
    `copies` of it) and the proxy / router in front."""
    from solver.emit.sglang import render_sglang_pair
    from solver.serve.job import scheduler_limits
    from solver.serve.plan import build_vllm_pair_commands

    problem = result.problem
    tokens, _ = scheduler_limits(problem)
    scheduler = {"max_num_seqs": split.decode_max_num_seqs, "max_num_batched_tokens": tokens}
    vllm = build_vllm_pair_commands(problem, split.prefill.degrees, split.decode.degrees,
                                    scheduler)
    sglang = render_sglang_pair(_sglang_engine(problem, split.prefill.degrees, None),
                                _sglang_engine(problem, split.decode.degrees, scheduler))
    return vllm, sglang


def _disagg_json(result: Any) -> dict[str, Any]:
    from solver.serve.disagg import explain_disaggregation

    d = result.disaggregated
    answer: dict[str, Any] = {
        "winner": None if d.winner is None else d.winner.kind,
        "why": explain_disaggregation(d),
        "plans": [_split_json(p) for p in d.plans],
        "best_aggregated": None if d.best_aggregated is None else _split_json(d.best_aggregated),
        "best_disaggregated": (None if d.best_disaggregated is None
                               else _split_json(d.best_disaggregated)),
    }
    if d.best_disaggregated is not None:
        vllm, sglang = _pair_commands(result, d.best_disaggregated)
        answer.update(vllm_commands=vllm, sglang_commands=sglang)
    return answer


def _echo_disagg(result: Any) -> None:
    from solver.serve.disagg import describe_split, explain_disaggregation

    d = result.disaggregated
    click.echo("aggregated or disaggregated (most requests/s within the SLO):")
    for i, plan in enumerate(d.plans, start=1):
        click.echo(f"  {i}. {describe_split(plan)}: {plan.max_rate_per_s:.2f} req/s, TTFT "
                   f"{_fmt(_finite(plan.ttft_s), 1e3)} ms, TPOT {_fmt(_finite(plan.tpot_s), 1e3)} "
                   f"ms" + (f", KV transfer {plan.transfer_s * 1e3:.2f} ms"
                            if plan.prefill is not None else ""))
    click.echo(f"  {explain_disaggregation(d)}")
    if d.best_disaggregated is not None:
        vllm, sglang = _pair_commands(result, d.best_disaggregated)
        click.echo("  disaggregated pair, vllm:")
        for line in vllm:
            click.echo(f"    {line}")
        click.echo("  disaggregated pair, sglang:")
        for line in sglang:
            click.echo(f"    {line}")


def write_serve_report(result: Any, directory: str) -> None:
    """The Pareto front of `parplan serve --pareto` as a chart of the report page
    (solver.sweep.report: DIR/index.html): tokens/s per GPU against tokens/s per user, one
    series per kind of plan and whether it meets the SLO, each point's plan and load in its
    label."""
    from solver.errors import InputError
    from solver.sweep.report import write_report
    from solver.sweep.report_fronts import FrontPoint, build_front

    def label(p: Any) -> str:
        d = p.degrees
        plan = f"tp {d['tp']} pp {d['pp']} dp {d['dp']} ep {d['ep']} x{d['replicas']}"
        if p.prefill is not None:
            q = p.prefill
            plan = f"prefill tp {q['tp']} pp {q['pp']} dp {q['dp']} x{q['copies']} + decode {plan}"
        text = (f"{plan}, {p.num_gpus} GPUs, {p.request_rate:,.2f} req/s, TTFT "
                f"{_fmt(_finite(p.ttft_s), 1e3)} ms, TPOT {_fmt(_finite(p.tpot_s), 1e3)} ms")
        if result.price_per_gpu_hour is None:
            return text
        cost = _point_cost(p, result.problem, result.price_per_gpu_hour)
        money, energy = cost["dollars_per_million_output_tokens"], cost["output_tokens_per_joule"]
        return (text + f", ${_fmt(money, 1, 3)} per million output tokens"
                + ("" if energy is None else f", {energy:,.3f} output tokens/J at board power"))

    points = [FrontPoint(f"{p.kind}{', meets the SLO' if p.meets_slo else ''}",
                         p.tokens_per_s_per_user, p.tokens_per_s_per_gpu, label(p))
              for p in result.pareto]
    problem = result.problem
    front = build_front(f"Serving {problem.model_spec.name} on {problem.num_gpus} "
                        f"{problem.cluster.gpu.name}", "output tokens/s per user",
                        "output tokens/s per GPU", "higher", "higher", points)
    try:
        write_report([], directory, fronts=[front])
    except InputError as exc:  # the report's own message names its -o flag
        raise InputError(str(exc).replace(f"-o {directory}", f"--report {directory}", 1)) from None
