"""`parplan estimate`: memory (stage by stage) and step time of one parallel configuration."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.finetune_options import finetune_options, pop_finetune
from solver.cli.help_groups import GroupedCommand
from solver.cli.options import (
    degree_options,
    framework_feature_options,
    framework_option,
    make_planning_options,
    pop_framework_features,
    resolve_framework,
)
from solver.cli.params import BoundedInt
from solver.cli.plan_option import DEGREE_NAMES, plan_file_options
from solver.cli.shared_flags import interval_level_option, memory_headroom_option
from solver.spec.strict import MAX_LAYERS


@click.command(cls=GroupedCommand)
@make_planning_options(gpus_required=False, model_required=False)
@degree_options
@plan_file_options("Re-estimate a plan of this `optimize --json` / `estimate --json` output "
                   "(--rank N), a single plan object, or line N of a `sweep -o` results file "
                   "(--line N): its model, cluster, GPUs, job, framework and features, "
                   "degrees, memory savers, offloads, recompute modules and layout; flags "
                   "given override the file's.")
@click.option("--per-stage", is_flag=True, help="Show every pipeline stage, not only the worst.")
@click.option("--layout", metavar="SPEC", default=None,
              help="Layers per virtual stage in Megatron's --pipeline-model-parallel-layout "
                   "syntax (e.g. 'E|(t|)*126,L': the embedding and the loss in stages of "
                   "their own); default: the even split.")
@click.option("--recompute-num-layers", type=BoundedInt(1, MAX_LAYERS), default=None,
              help="With --recompute full: the layers of each virtual stage that recompute "
                   "(Megatron's block method); default: all.")
@framework_option("Whose timing to assume (kernels, overlaps, recompute semantics, DP "
                  "overlap, gradient reduce dtype); the flags below override single features.")
@framework_feature_options
@finetune_options
@memory_headroom_option
@interval_level_option
def estimate(model: str | None, cluster: str | None, num_gpus: int | None,
             gpus_per_node: int | None, segment_gpus: int | None, seq_len: int,
             global_batch: int, precision: str, token_budget: int | None,
             calibration: str | None, as_json: bool, plan_path: str | None, plan_rank: int,
             plan_line: int | None, per_stage: bool, layout: str | None,
             recompute_num_layers: int | None, framework: str, memory_headroom: Any,
             interval_level: float, **degrees: Any) -> None:
    """Memory per GPU (and whether it fits) and step time of one configuration; dp is the rest
    of the GPUs (with --plan FILE, --model, --cluster and --gpus default to the file's)."""
    from solver.search.constraints import MEMORY_CONSTRAINT
    from solver.cli.render import echo_json
    from solver.spec.profiles import render_profile_json
    from solver.cli.render_plan import (
        echo_fixes,
        echo_layout_table,
        echo_memory_table,
        echo_stage_table,
        echo_time_table,
    )
    from solver.cost.step.caveats import list_time_caveats
    from solver.spec.plan_json import render_memory_views_json, render_plan_json

    job_values: dict[str, Any] = {"seq_len": seq_len, "global_batch": global_batch,
                                  "precision": precision, "finetune": pop_finetune(degrees)}
    result, resolved, features, values = estimate_options(
        model, cluster, num_gpus, gpus_per_node=gpus_per_node, segment_gpus=segment_gpus,
        job_values=job_values, token_budget=token_budget, calibration=calibration,
        plan_path=plan_path, plan_rank=plan_rank, plan_line=plan_line, layout=layout,
        recompute_num_layers=recompute_num_layers, framework=framework,
        memory_headroom=memory_headroom, degrees=degrees)
    plan = result.plan
    from solver.optimize_json import render_plans_uncertainty

    from solver.calibrate.profile import select_profile_scales

    scales = select_profile_scales(calibration, result.profile.name, result.model_spec,
                                   result.cluster.gpu.name, result.job.precision)
    odds = render_plans_uncertainty([plan], result.model_spec, result.cluster.gpu.name,
                                    result.profile.name, result.job.precision, interval_level,
                                    scales=scales)
    fixes = result.fixes
    if not plan.fits:  # the search's advice first (solver.estimate_fixes), then single changes
        fixes = _search_fixes(result, values, job_values, gpus_per_node=gpus_per_node,
                              token_budget=token_budget, calibration=calibration,
                              segment_gpus=segment_gpus) + fixes
    if as_json:
        answer: dict[str, Any] = {
            "status": "feasible" if plan.fits else "infeasible",
            "solve_seconds": 0,
            "model": result.model_spec.name,
            "cluster": result.cluster.name,
            "gpus": result.num_gpus,
            "seq_len": result.job.seq_len,
            "global_batch": result.job.global_batch,
            "precision": result.job.precision,
            "framework": result.profile.name,
            "framework_features": result.profile.features(),
            "framework_profile": render_profile_json(resolved, features.given()),
            "plans": [{**render_plan_json(plan), **odds["plans"][0]}],
            # The fit rule in words (MemoryHeadroom.rule), as the table states it.
            "memory_rule": plan.memory_headroom.rule(plan.gpu_memory_bytes),
            "uncertainty": odds["uncertainty"],
            # What reports each view of a plan's memory (`allocated_gb`, `reserved_gb`,
            # `device_gb`): the view a measured number is compared with.
            "memory_views": render_memory_views_json(),
            "notes": list(list_time_caveats(result.model_spec)),
        }
        if result.job.finetune.mode != "none":  # what trains (solver.spec.finetune)
            answer["finetune"] = result.job.finetune.describe()
        if result.blocks:  # a block pattern: time and memory by block kind
            answer["block_kinds"] = [dict(vars(kind)) for kind in result.blocks]
        if not plan.fits:
            answer["conflicts"] = [MEMORY_CONSTRAINT]
            answer["fixes"] = list(fixes)
        if result.calibration is not None:
            from solver.cli.render_calibration import render_sources_json

            answer["calibration"] = render_sources_json(result.calibration,
                                                        result.curve_sources)
        echo_json(answer)
        return
    heading = (f"{result.model_spec.name} on {result.num_gpus} x {result.cluster.gpu.name} "
               f"({result.cluster.name}), seq {result.job.seq_len}, global batch "
               f"{result.job.global_batch}, {result.job.precision}")
    states = result.profile.time_constants.training_states
    if states != "mixed":
        heading += f", {states} training states"
    if result.job.finetune.mode != "none":
        heading += f", {result.job.finetune.label()}"
    if plan_path is not None:
        heading += f"; plan {plan_rank} of {plan_path}" + (f":{plan_line}" if plan_line else "")
    if per_stage:
        echo_stage_table(plan, heading)
    else:
        echo_memory_table(plan, heading)
    echo_time_table(plan)
    click.echo(render_estimate_uncertainty(plan, odds))
    for note in list_time_caveats(result.model_spec):
        click.echo(f"note: {note}")
    if result.blocks:
        from solver.cli.render import echo_table

        echo_table("per block kind (seconds per micro-batch; GB on the worst stage)",
                   ["kind", "layers", "s / layer", "recompute s", "share of work",
                    "GB / layer", "on worst stage"],
                   [(k.kind, k.layers, f"{k.seconds_per_layer:.4g}",
                     f"{k.recompute_seconds_per_layer:.4g}", f"{100 * k.work_share:.1f}%",
                     f"{k.bytes_per_layer / 1e9:.3f}", k.layers_on_worst_stage)
                    for k in result.blocks])
    from solver.cli.render_features import (
        render_finetune_assumptions,
        render_memory_assumptions,
        render_profile_assumptions,
    )

    click.echo("\n".join(render_memory_assumptions(result.profile, result.job.precision,
                                                     plan.config.recompute)))
    for line in render_finetune_assumptions(result.model_spec, result.job.finetune):
        click.echo(line)
    click.echo("\n".join(render_profile_assumptions(resolved, features)))
    if plan.config.pp > 1 or plan.layout is not None and any(
            s.recompute_layers not in (0, s.layers) for s in plan.layout.stages):
        echo_layout_table(plan)
    if result.calibration is not None:
        from solver.cli.render_calibration import echo_sources_table

        echo_sources_table(result.calibration, result.curve_sources)
    if not plan.fits:
        echo_fixes(fixes)


def estimate_options(model: str | None, cluster: str | None, num_gpus: int | None, *,
                     gpus_per_node: int | None, segment_gpus: int | None,
                     job_values: dict[str, Any], token_budget: int | None,
                     calibration: str | None, plan_path: str | None, plan_rank: int,
                     plan_line: int | None, layout: str | None,
                     recompute_num_layers: int | None, framework: str, memory_headroom: Any,
                     degrees: dict[str, Any]) -> tuple[Any, Any, Any, dict[str, Any]]:
    """`estimate`'s options (or --plan FILE's problem and plan, the flags given overriding
    it) estimated: (the api's EstimateResult, the resolved framework, its feature overrides,
    the values passed). `job_values` (seq_len, global_batch, precision) takes the file's job;
    `degrees` holds the degree and framework-feature flags (the latter are popped)."""
    from solver.api import estimate as run_estimate
    from solver.cli.plan_option import plan_problem_names
    from solver.cost.uncertainty import resolve_memory_headroom

    # --framework NAME@RELEASE: the release's features under the flags (solver.spec.profiles).
    resolved, features = resolve_framework(framework, model, pop_framework_features(degrees),
                                           job_values.get("precision"))
    values: dict[str, Any] = {"model": model, "cluster": cluster, "num_gpus": num_gpus,
                              "framework": resolved.framework, "features": features,
                              "memory_headroom": memory_headroom, **degrees}
    if plan_path is None:
        values["model"], values["cluster"], values["num_gpus"] = plan_problem_names(
            None, model, cluster, num_gpus)
    values.update(_plan_values(values, plan_path, plan_rank, plan_line, job_values,
                               recompute_num_layers))
    # --memory-headroom (or the plan file's), by default the memory model's error margin.
    values["memory_headroom"] = resolve_memory_headroom(values["memory_headroom"],
                                                        values["framework"])
    result = run_estimate(
        gpus_per_node=gpus_per_node, token_budget=token_budget, calibration=calibration,
        layout=layout, recompute_num_layers=recompute_num_layers, segment_gpus=segment_gpus,
        **job_values, **values)
    return result, resolved, features, values


def _search_fixes(result: Any, values: dict[str, Any], job_values: dict[str, Any],
                  **problem: Any) -> tuple[str, ...]:
    """The search's fixes for an estimate that does not fit (solver.estimate_fixes), on the
    problem of its flags (or plan file): the same model, cluster, GPUs, job and features."""
    from solver.estimate_fixes import suggest_estimate_fixes
    from solver.optimize import build_problem
    from solver.spec.features import FrameworkFeatures

    features = values["features"]
    if features is not None and not isinstance(features, FrameworkFeatures):  # a plan file's
        features = FrameworkFeatures(**{k: v for k, v in features.items() if v is not None})
    searched = build_problem(values["model"], values["cluster"], result.num_gpus,
                             framework=values["framework"], features=features,
                             memory_headroom=values["memory_headroom"], **problem,
                             **job_values)
    return tuple(suggest_estimate_fixes(searched, result.plan.config,
                                        result.plan.recompute_modules))


def _plan_values(values: dict[str, Any], plan_path: str | None, plan_rank: int,
                 plan_line: int | None, job_values: dict[str, Any],
                 recompute_num_layers: int | None) -> dict[str, Any]:
    """With --plan FILE, what replaces `values` (the flags': model, cluster, num_gpus,
    framework, features, memory_headroom and the degrees): the problem, the framework and the
    feature overrides, the memory headroom, the degrees and the pipeline layout (with its field,
    for messages) the plan was costed with, the options given overriding the file's;
    `job_values` takes the file's job. Nothing without --plan."""
    from solver.catalog import load_cluster_spec, load_model_spec
    from solver.cli.plan_option import (
        check_plan_problem,
        given,
        plan_framework_features,
        plan_problem_names,
        read_plan_option,
    )
    from solver.errors import InputError
    from solver.spec.headroom import parse_memory_headroom

    ctx = click.get_current_context()
    plan_file = read_plan_option(ctx, plan_path, plan_rank, plan_line, job_values)
    if plan_file is None:
        return {}
    if recompute_num_layers is not None:
        raise InputError(f"--recompute-num-layers with --plan {plan_path}: the plan's layout "
                         "says what each virtual stage recomputes")
    model, cluster, num_gpus = values["model"], values["cluster"], values["num_gpus"]
    # A --model or --cluster given names the file's (by the spec's name, as the file does).
    named = {"model": model and load_model_spec(model).name,
             "cluster": cluster and load_cluster_spec(cluster).name}
    model, cluster, num_gpus = plan_problem_names(plan_file, model, cluster, num_gpus)
    check_plan_problem(plan_file, named["model"] or plan_file.problem.get("model"),
                       named["cluster"] or plan_file.problem.get("cluster"), num_gpus)
    config = plan_file.config
    if config.num_gpus != num_gpus:
        raise InputError(f"--gpus {num_gpus}: the plan of {plan_file.path} runs on tp x cp x "
                         f"pp x dp = {config.num_gpus} GPUs")
    framework = values["framework"]
    if plan_file.framework is not None:
        if given(ctx, "framework") and framework != plan_file.framework:
            raise InputError(f"--framework {framework} with --plan {plan_path}: the plan was "
                             f"costed under {plan_file.framework}")
        framework = plan_file.framework
    headroom = values["memory_headroom"]
    if headroom is None and plan_file.memory_headroom:
        try:
            headroom = parse_memory_headroom(plan_file.memory_headroom)
        except InputError as exc:
            field = ".".join(filter(None, (plan_file.where, "memory_headroom")))
            raise InputError(f"{plan_file.path}: field '{field}': {exc}") from None
    layout_field = ".".join(filter(None, (plan_file.where, "layout")))
    return {"model": model, "cluster": cluster, "num_gpus": num_gpus, "framework": framework,
            "features": plan_framework_features(plan_file, framework,
                                                values["features"].given()),
            "memory_headroom": headroom, "pipeline_layout": plan_file.layout,
            "layout_source": f"{plan_file.path}: field '{layout_field}'",
            **{name: getattr(config, name) for name in DEGREE_NAMES}}


def render_estimate_uncertainty(plan: Any, odds: dict[str, Any]) -> str:
    """"80% interval: step 5.36-7.08 s, 9,256-12,237 tokens/s per GPU, memory 71.5-89.8 GB;
    77% chance it fits" (solver.cost.uncertainty)."""
    extra, summary = odds["plans"][0], odds["uncertainty"]
    parts = []
    if "step_seconds_interval" in extra:
        low, high = extra["step_seconds_interval"]
        tokens = extra["tokens_per_second_per_gpu_interval"]
        parts += [f"step {low:#.3g}-{high:#.3g} s",
                  f"{tokens[0]:,.0f}-{tokens[1]:,.0f} tokens/s per GPU"]
    low, high = extra["memory_gb_interval"]
    parts.append(f"memory {low:.1f}-{high:.1f} GB")
    model = f"{summary['category']} error model"
    if "calibrated" in summary:  # `calibrate training-log` scales (solver.calibrate.scales)
        runs = summary["calibrated"]["num_runs"]
        model += f", calibrated by {runs} run{'s' if runs != 1 else ''}"
        if "step_seconds_calibrated" in extra:
            parts.insert(0, f"calibrated step {extra['step_seconds_calibrated']:#.4g} s")
    return (f"{summary['interval_level']:.0%} interval ({model}): "
            f"{', '.join(parts)}; {extra['fit_probability']:.0%} chance it fits")
