"""`parplan launch`: a plan's rank layout and process groups, or a framework's settings for it."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any

import click

from solver.cli.finetune_options import finetune_options, pop_finetune
from solver.cli.options import (
    degree_options,
    framework_feature_options,
    make_planning_options,
    pop_framework_features,
)
from solver.cli.plan_option import (
    check_plan_problem,
    plan_file_options,
    plan_framework_features,
    plan_problem_names,
    read_plan_option,
)
from solver.cli.shared_flags import memory_headroom_option
from solver.emit import DEFAULT_ORDER, FORMAT_ALIASES, FORMATS, TARGETS
from solver.spec.profiles import profile_names

# Formats that are a framework with a profile (solver.cost.step.frameworks).
PROFILED_FORMATS = ("megatron", "torchtitan", "deepspeed")
# Formats that write another form of a profiled framework's settings.
PROFILES_OF = {"torchtitan-python": "torchtitan", "megatron-bridge": "megatron"}
# Formats that serve the model: a training step's memory (optimizer, gradients, activations)
# does not describe them, so launch does not check its fit there (`parplan serve` sizes them).
SERVING_FORMATS = ("vllm",)


def _format_and_version(launch_format: str | None, target_text: str | None) -> tuple[str, str]:
    """--format and --target FORMAT@VERSION as one format and the version it is written for
    ("" for the formats of no framework)."""
    from solver.errors import InputError

    if launch_format is not None:
        launch_format = FORMAT_ALIASES.get(launch_format, launch_format)
    if target_text is None:
        launch_format = launch_format or "groups"
        return launch_format, TARGETS.get(launch_format, ("",))[0]
    name, _, version = target_text.partition("@")
    name = FORMAT_ALIASES.get(name, name)
    if name not in TARGETS:
        raise InputError(f"--target {target_text}: unknown framework '{name}' (targets: "
                         f"{', '.join(f'{n}@{v}' for n, vs in TARGETS.items() for v in vs)})")
    if launch_format is not None and launch_format != name:
        raise InputError(f"--target {target_text} with --format {launch_format}: give one "
                         "framework")
    versions = TARGETS[name]
    version = version or versions[0]
    if version not in versions:
        raise InputError(f"--target {target_text}: {name} version '{version}' is not written "
                         f"(versions: {', '.join(versions)}; the first is the default)")
    return name, version


def _profile_version(framework_text: str, launch_format: str, version: str) -> str:
    """The version `launch_format` is written for under --framework NAME@RELEASE: the
    release's own (megatron-bridge@26.02 -> 0.3) where the format is that framework's."""
    from solver.spec.profiles import resolve_profile

    resolved = resolve_profile(framework_text)
    family = resolved.label.partition("@")[0]
    return resolved.release.target if family == launch_format and resolved.release.target \
        else version


def _release_features(framework_text: str, framework: str, launch_format: str, version: str,
                      target_text: str | None, model: str | None, precision: str | None
                      ) -> dict[str, Any]:
    """The features --framework's release sets for `model` trained in `precision`, after
    checking that it runs the framework --format writes and that the release is the version
    written (--target)."""
    from solver.errors import InputError
    from solver.spec.profiles import resolve_profile

    resolved = resolve_profile(framework_text, model, precision)
    if resolved.framework != framework:
        raise InputError(f"--framework {framework_text} with --format {launch_format}: the "
                         f"profile runs {resolved.framework}, the format writes {framework}'s "
                         "settings")
    family = resolved.label.partition("@")[0]
    if family == launch_format and resolved.release.target != version:
        written = ", ".join(TARGETS.get(launch_format, ()))
        runs = resolved.release.target or "a version launch does not write"
        raise InputError(f"--framework {framework_text}: launch writes {launch_format} "
                         f"{version}, the profile's release runs {runs} (written: {written})")
    return dict(resolved.features)


def _check_plan_framework(plan_file: Any, framework: str, framework_text: str | None,
                          launch_format: str, problem: dict[str, Any]) -> None:
    """An InputError where --format writes another framework's settings than the plan was
    costed under: its memory and step time hold for that framework's semantics (what
    `selective` keeps, which offloads exist), so launch does not re-cost it as another's (it
    writes a plan, it does not search); the message gives the `parplan optimize` command that
    plans the same problem for --format's framework. `problem`: the flags given (None: not
    given; the file's model, cluster and GPUs fill those)."""
    from solver.errors import InputError

    if plan_file.framework in (None, framework) or launch_format not in (*PROFILED_FORMATS,
                                                                         *PROFILES_OF):
        return
    words = ["parplan", "optimize"]
    for flag, value in problem.items():
        value = plan_file.problem.get(flag) if value is None else value
        if value is not None:
            words += [f"--{flag}", str(value)]
    words += ["--framework", framework_text or framework]
    raise InputError(f"--format {launch_format} with --plan {plan_file.path}: the plan was "
                     f"costed under {plan_file.framework}, not {framework}; plan it for "
                     f"{framework} with: {shlex.join(words)}")


def _less_headroom(fit: Any) -> str:
    """" (the GPU's 85.5 GB less the 9.0% headroom)", or "" without headroom."""
    label = fit.memory_headroom.label()
    return (f" (the GPU's {fit.gpu_memory_bytes / 1e9:.1f} GB less the {label} headroom)"
            if label else "")


def with_memory_warning(launch_format: str, emitted: Any, fit: Any) -> Any:
    """`emitted` with a warning where `fit` (the plan as written, estimated: a Plan; None: not
    checked) does not fit its GPU: needed and usable GB, as `parplan estimate` judges it
    (Plan.fits). The groups document carries it in its "warnings" as well."""
    if fit is None or fit.fits:
        return emitted
    worst = fit.worst_stage
    stage = f" (pipeline stage {fit.stages.index(worst)})" if len(fit.stages) > 1 else ""
    line = (f"memory: as written this plan needs {worst.device_bytes / 1e9:.1f} GB per GPU"
            f"{stage}, {fit.usable_memory_bytes / 1e9:.1f} GB are usable{_less_headroom(fit)}: "
            "it does not fit (the cost model of `parplan estimate`)")
    if launch_format != "groups":
        return dataclasses.replace(emitted, warnings=(*emitted.warnings, line))
    from solver.emit.groups import render_compact_json

    document = {**emitted.settings, "warnings": [*emitted.settings["warnings"], line]}
    return dataclasses.replace(emitted, text=render_compact_json(document) + "\n",
                               settings=document, warnings=tuple(document["warnings"]))


@click.command()
@make_planning_options(gpus_required=False, model_required=False)
@degree_options
@plan_file_options("Launch a plan of this `optimize --json` / `estimate --json` output, "
                   "a single plan object or a `sweep -o` results file (with --line).")
@click.option("--layout", "layout_text", metavar="SPEC", default=None,
              help="What each virtual pipeline stage holds, in Megatron's "
                   "--pipeline-model-parallel-layout syntax (e.g. 'E|(t|)*126,L'); replaces the "
                   "even split or the plan file's layout.")
@click.option("--format", "launch_format", type=click.Choice((*FORMATS, *FORMAT_ALIASES)),
              default=None,
              help="What to write (default: groups).")
@click.option("--target", "target_text", metavar="FRAMEWORK@VERSION", default=None,
              help="A framework's settings for that version: "
                   + ", ".join(f"{n}@{v}" for n, vs in TARGETS.items() for v in vs)
                   + " (--format FRAMEWORK: the first of its versions).")
@click.option("--framework", "framework_text", type=click.Choice(profile_names()), default=None,
              help="The profile the plan was costed under (NAME@RELEASE, as estimate and "
                   "optimize take it): its release's features are written; it must run "
                   "--format's framework and agree with --target.")
@click.option("--order", default=DEFAULT_ORDER, show_default=True,
              help="Rank order, innermost axis first (tp-cp-ep-pp-dp is Megatron's "
                   "--use-tp-pp-dp-mapping).")
@click.option("--validate", is_flag=True,
              help="Also run the framework's own checks on the settings, where installed.")
@click.option("-o", "--output", metavar="FILE", default=None, help="Write to FILE.")
@memory_headroom_option
@framework_feature_options
@finetune_options
def launch(model: str | None, cluster: str | None, num_gpus: int | None,
           gpus_per_node: int | None, segment_gpus: int | None, seq_len: int,
           global_batch: int, precision: str, token_budget: int | None,
           calibration: str | None, as_json: bool, plan_path: str | None, plan_rank: int,
           plan_line: int | None, layout_text: str | None, launch_format: str | None,
           target_text: str | None, framework_text: str | None,
           order: str, validate: bool, output: str | None, memory_headroom: Any,
           **degrees: Any) -> None:
    """Rank layout and process groups of a plan (--format groups), a runnable torch module
    that builds them, or the settings of Megatron-LM, Megatron-Bridge, torchtitan, DeepSpeed or
    vLLM (with
    --plan FILE, --model, --cluster and --gpus default to the plan file's)."""
    from solver.api import (
        build_parallel_config,
        check_parallel_config,
        estimate_plan,
        load_problem_specs,
    )
    from solver.cli.render_launch import echo_launch
    from solver.emit.formats import render_launch
    from solver.emit.layout import build_rank_layout
    from solver.emit.target import LaunchTarget, check_pipeline_layout, parse_launch_pipeline

    from solver.cost.step.frameworks import build_framework_profile
    from solver.cost.step.offload import check_activation_offload, check_layer_offload
    from solver.cost.step.recompute_modules import with_default_recompute_modules
    from solver.errors import InputError

    ctx = click.get_current_context()
    launch_format, version = _format_and_version(launch_format, target_text)
    # The settings of --format's framework (Megatron's for the others), with the flags'
    # features: what `estimate` and `optimize` cost under the same flags.
    framework = PROFILES_OF.get(launch_format, launch_format)
    framework = framework if framework in PROFILED_FORMATS else "megatron"
    if framework_text is not None and target_text is None:
        version = _profile_version(framework_text, launch_format, version)
    job_values: dict[str, Any] = {"seq_len": seq_len, "global_batch": global_batch,
                                  "precision": precision, "finetune": pop_finetune(degrees)}
    plan_file = read_plan_option(ctx, plan_path, plan_rank, plan_line, job_values)
    if plan_file is not None:
        _check_plan_framework(plan_file, framework, framework_text, launch_format, {
            "model": model, "cluster": cluster, "gpus": num_gpus,
            "gpus-per-node": gpus_per_node, "segment-gpus": segment_gpus,
            "seq-len": job_values["seq_len"], "global-batch": job_values["global_batch"],
            "precision": job_values["precision"], "token-budget": token_budget,
            "calibration": calibration, "memory-headroom": None
            if plan_file.memory_headroom == "auto" else plan_file.memory_headroom})
    # The memory savers the plan turned on to fit, unless a flag says otherwise.
    savers: dict[str, Any] = {name: True for name in ((plan_file.memory_savers
                                                       + plan_file.offloads)
                                                      if plan_file else ())}
    # ... and what its selective recompute recomputes where the search chose it.
    if plan_file is not None and plan_file.recompute_modules and framework == "megatron":
        savers["recompute_modules"] = plan_file.recompute_modules
    flags = pop_framework_features(degrees).given()
    if plan_file is not None and plan_file.framework == framework:
        # Exactly what the plan was costed with: its features, savers, offloads and modules.
        features = plan_framework_features(plan_file, framework, flags)
    else:
        features = {**savers, **flags}
    if framework_text is not None:
        release_features = _release_features(framework_text, framework, launch_format,
                                             version, target_text, model,
                                             job_values["precision"])
        features = {**release_features, **features}
    profile = build_framework_profile(framework, features)
    model, cluster, num_gpus = plan_problem_names(plan_file, model, cluster, num_gpus)
    headroom = memory_headroom
    if headroom is None and plan_file is not None and plan_file.memory_headroom:
        from solver.spec.headroom import parse_memory_headroom

        headroom = parse_memory_headroom(plan_file.memory_headroom)  # its planned margin
    from solver.cost.uncertainty import resolve_memory_headroom

    # The re-check's margin: --memory-headroom, else the plan's, else the memory model's
    # error margin (the default).
    headroom = resolve_memory_headroom(headroom, framework)
    model_spec, cluster_spec, job = load_problem_specs(
        model, cluster, gpus_per_node=gpus_per_node, token_budget=token_budget,
        calibration=calibration, segment_gpus=segment_gpus, memory_headroom=headroom,
        **job_values)
    if job.finetune.has_adapters and launch_format != "megatron-bridge":
        raise InputError(f"the plan fine-tunes with {job.finetune.label()}: launch writes no "
                         f"adapter settings for --format {launch_format} (--format "
                         "megatron-bridge writes its PEFT recipe; TRL SFTTrainer with PEFT is "
                         "not written yet): its files would train every weight")
    # What `selective` recomputes where neither the plan nor a flag says: estimate's and
    # optimize's default set (with_default_recompute_modules).
    profile = with_default_recompute_modules(profile, model_spec, features)
    if plan_file is not None:
        check_plan_problem(plan_file, model_spec.name, cluster_spec.name, num_gpus)
        config = plan_file.config
    else:
        config = build_parallel_config(num_gpus, **degrees)
    check_parallel_config(model_spec, job, num_gpus, config)
    check_layer_offload(profile.time_constants, model_spec, None, (config.pp,),
                        (config.recompute,))
    check_activation_offload(profile.time_constants, model_spec, (config.recompute,))
    pipeline = None
    if layout_text is not None:
        pipeline = parse_launch_pipeline(layout_text, model_spec, config)
    elif plan_file is not None and plan_file.layout is not None:
        pipeline = check_pipeline_layout(
            plan_file.layout, model_spec, config,
            f"{plan_file.path}: field 'plans.{plan_file.index - 1}.layout'")
    layout = build_rank_layout(config, model_spec.is_moe, order)
    target = LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job, config=config,
                          layout=layout, pipeline=pipeline,
                          time_constants=profile.time_constants, version=version)
    # The plan as written, estimated as `estimate` does: an override (a feature flag, the
    # degrees given) may no longer fit, and the file is written with a warning then.
    fit = None if launch_format in SERVING_FORMATS else estimate_plan(
        model_spec, cluster_spec, job, config, profile.memory_options(None, cluster_spec),
        profile.time_constants, pipeline)
    emitted = with_memory_warning(launch_format, render_launch(launch_format, target), fit)
    validation = None
    if validate:
        from solver.emit.validate import validate_emitted

        validation = validate_emitted(launch_format, target, emitted)
    echo_launch(launch_format, target, emitted, as_json=as_json, output=output,
                validation=validation)
