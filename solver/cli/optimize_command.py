"""`parplan optimize`: the best parallel configurations, ranked, with why the winner won."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import click

from solver.cli.finetune_options import finetune_options, pop_finetune
from solver.cli.help_groups import GroupedCommand
from solver.cli.limit_options import solve_limit_options
from solver.cli.options import (
    framework_feature_options,
    framework_option,
    make_planning_options,
    pop_framework_features,
    resolve_framework,
)
from solver.cli.params import (
    MAX_DAYS,
    MAX_TOP,
    MAX_ZERO_STAGE,
    BoundedInt,
    FiniteFloat,
    PinSpec,
)
from solver.cli.shared_flags import (
    exit_if_infeasible,
    fail_on_infeasible_option,
    interval_level_option,
    memory_headroom_option,
    min_fit_probability_option,
)
from solver.spec.strict import MAX_BATCH, MAX_LAYERS

PIN_OPTIONS = ("tp", "pp", "cp", "dp", "ep", "etp", "vpp", "zero", "micro_batch")
# What a pin's values may be, where it is not 1 to MAX_GPUS (ParallelConfig's fields).
PIN_TYPES = {"zero": PinSpec(0, MAX_ZERO_STAGE), "vpp": PinSpec(1, MAX_LAYERS),
             "micro_batch": PinSpec(1, MAX_BATCH)}
RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}


def _pin_options(command):
    for name in reversed(PIN_OPTIONS):
        flag = "--" + name.replace("_", "-")
        command = click.option(flag, name, type=PIN_TYPES.get(name, PinSpec(1)), default=None,
                               help=f"Pin {name}: a value, a range A-B or a list.")(command)
    command = click.option("--recompute", type=str, default=None,
                           help="Pin recompute: none, selective, full or a list.")(command)
    for name in ("tp", "pp", "cp", "ep"):
        command = click.option(f"--no-{name}", f"no_{name}", is_flag=True,
                               help=f"Pin {name} to 1.")(command)
    return command


@click.command(cls=GroupedCommand)
@make_planning_options(gpus_required=False, gpu_counts=True)
@_pin_options
@click.option("--top", type=BoundedInt(1, MAX_TOP), default=5, show_default=True,
              help="How many plans to list.")
@click.option("--engine", type=click.Choice(["layout", "even"]), default="layout",
              show_default=True,
              help="layout: every mesh and schedule, and the best pipeline layout (layers and "
                   "recompute per stage, CP-SAT) where it can beat the even split; even: the "
                   "even split of layers only.")
@solve_limit_options
@framework_option("Whose rules the plan must obey and whose timing it assumes (kernels, "
                  "overlaps, recompute semantics, DP overlap, gradient reduce dtype); the "
                  "flags below override single features.")
@framework_feature_options
@finetune_options
@click.option("--objective", type=click.Choice(["time", "memory", "cost", "energy"]),
              default="time", show_default=True,
              help="Minimise step time, per-GPU memory, $ per million tokens (needs "
                   "--price-per-gpu-hour) or kWh per million tokens at the GPUs' board power; "
                   "at one GPU count cost and energy rank as time, over --gpus A,B,... or "
                   "--gpus-for-days they pick the count.")
@click.option("--price-per-gpu-hour", type=FiniteFloat(0, 1e6, min_open=True), default=None,
              help="$ per GPU-hour of the cluster (the catalog carries no prices): adds $ and "
                   "kWh per million tokens (and $ for --token-budget) to every plan.")
@click.option("--allow-tp-across-nodes", is_flag=True,
              help="Let TP/expert-TP groups leave the NVLink domain.")
@click.option("--gpus-for-days", type=FiniteFloat(0, MAX_DAYS, min_open=True), default=None,
              help="Find the fewest GPUs that train --token-budget within this many days.")
@memory_headroom_option
@min_fit_probability_option
@interval_level_option
@fail_on_infeasible_option
def optimize(model: str, cluster: str, num_gpus: int | None, gpus_per_node: int | None,
             segment_gpus: int | None, seq_len: int, global_batch: int, precision: str, token_budget: int | None,
             calibration: str | None, as_json: bool, top: int, engine: str,
             time_limit: float | None, work_limit: float | None, framework: str,
             objective: str, allow_tp_across_nodes: bool,
             gpus_for_days: float | None, recompute: str | None, memory_headroom: Any,
             price_per_gpu_hour: float | None,
             min_fit_probability: float | None, interval_level: float,
             fail_on_infeasible: bool, **pin_values: Any) -> None:
    """Ranked parallel configurations for a model on a cluster, best first."""
    from solver.cli.render import echo_json
    from solver.cli.render_features import (
        render_finetune_assumptions,
        render_profile_assumptions,
    )
    from solver.spec.profiles import render_profile_json
    from solver.cli.render_optimize import echo_result
    from solver.errors import InputError
    from solver.optimize import build_problem, fewest_gpus, solve
    from solver.optimize_counts import Pricing, check_objective, choose_count, search_objective
    from solver.optimize_json import render_result_json
    from solver.cli.shared_flags import check_fit_flags
    from solver.cost.uncertainty import resolve_memory_headroom

    # --framework NAME@RELEASE: the release's features under the flags (solver.spec.profiles).
    resolved, features = resolve_framework(framework, model, pop_framework_features(pin_values),
                                           precision)
    framework = resolved.framework
    # --memory-headroom, by default the memory model's error margin for this framework at
    # --min-fit-probability (0.9 unless given).
    check_fit_flags(memory_headroom, min_fit_probability)
    memory_headroom = resolve_memory_headroom(memory_headroom, framework, min_fit_probability)
    finetune = pop_finetune(pin_values)
    pins = {name: values for name, values in pin_values.items()
            if name in PIN_OPTIONS and values is not None}
    for name in ("tp", "pp", "cp", "ep"):
        if pin_values.get(f"no_{name}"):
            pins[name] = (1,)
    if recompute is not None:
        names = [x.strip() for x in recompute.split(",")]
        unknown = [x for x in names if x not in RECOMPUTE_CODES]
        if unknown:
            raise InputError(f"--recompute {recompute}: unknown level {unknown[0]!r} "
                             "(none, selective, full)")
        pins["recompute"] = tuple(RECOMPUTE_CODES[x] for x in names)
    if num_gpus is None and gpus_for_days is None:
        raise InputError("--gpus is required (or --gpus-for-days with --token-budget)")
    if num_gpus is not None and gpus_for_days is not None:
        raise InputError("--gpus and --gpus-for-days: give one (--gpus-for-days finds the count)")
    counts = tuple(num_gpus or (1,))
    problem = build_problem(
        model, cluster, counts[0], gpus_per_node=gpus_per_node, seq_len=seq_len,
        global_batch=global_batch, precision=precision, token_budget=token_budget,
        framework=framework, objective=search_objective(objective), pins=pins,
        allow_tp_across_nodes=allow_tp_across_nodes, calibration=calibration,
        features=features, memory_headroom=memory_headroom,
        segment_gpus=segment_gpus, finetune=finetune)
    pricing = Pricing(price_per_gpu_hour, problem.cluster.gpu.power_limit_w)
    check_objective(objective, pricing, problem.cluster.gpu.name)

    def solve_count(count: int) -> Any:
        return solve(problem.model_copy(update={"num_gpus": count}), top=top, engine=engine,
                     time_limit_s=time_limit, work_limit_s=work_limit)

    if gpus_for_days is not None:
        found = fewest_gpus(problem, gpus_for_days, engine=engine)
        if found is None:
            raise InputError(f"--gpus-for-days {gpus_for_days:g}: no GPU count up to 65,536 "
                             "trains the token budget in time")
        # cost and energy: the fewest GPUs, or twice or four times as many (faster, as
        # fewest_gpus assumes), whichever is cheapest (solver.optimize_counts).
        counts = (found[0],) if objective in ("time", "memory") else \
            tuple(found[0] * k for k in (1, 2, 4) if found[0] * k <= 65536)
    result = choose_count(objective, pricing, counts, solve_count)
    sources, scales = [], None
    if calibration is not None:
        from solver.calibrate.profile import describe_sources, select_profile_scales

        sources = describe_sources(result.problem.cluster)
        scales = select_profile_scales(calibration, framework, result.problem.model_spec,
                                       result.problem.cluster.gpu.name,
                                       result.problem.job.precision)
        if scales is not None and result.problem.objective == "time":
            # The listed plans ranked by the calibrated step (the search ranked them by the
            # cost model's; a plan beyond --top is not re-costed).
            from solver.calibrate.scales import rank_calibrated

            result = replace(result, plans=rank_calibrated(result.plans, scales))
    # The table shows $ and kWh where asked for: a price given, or the energy objective (the
    # JSON always has them, as a sweep line).
    shown = pricing if price_per_gpu_hour is not None or objective == "energy" else None
    if as_json:
        answer = render_result_json(result, interval_level, scales)
        answer["objective"] = objective
        answer["pricing"] = pricing.as_json(result.plans, result.problem.num_gpus)
        answer["framework_profile"] = render_profile_json(resolved, features.given())
        if calibration is not None:
            from solver.cli.render_calibration import render_sources_json

            answer["calibration"] = render_sources_json(calibration, sources)
        echo_json(answer)
    else:
        echo_result(result, gpus_for_days, interval_level, scales, shown)
        click.echo("\n".join(render_profile_assumptions(resolved, features)))
        for line in render_finetune_assumptions(result.problem.model_spec,
                                                result.problem.job.finetune):
            click.echo(line)
        if calibration is not None:
            from solver.cli.render_calibration import echo_sources_table

            echo_sources_table(calibration, sources)
    exit_if_infeasible(result.status == "infeasible", fail_on_infeasible)
