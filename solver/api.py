"""The library's front door: what the CLI calls (cli -> api -> cost -> spec).

`estimate` turns the command-line values of `parplan estimate` into specs, checks that the
degrees make sense for the model and the GPU count (bad input is an InputError naming the
option, its value and the rule), and evaluates the memory model on every pipeline stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import ValidationError

from solver.calibrate.profile import CurveSource, describe_sources, load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cost.step.block_breakdown import BlockKindCost, estimate_block_breakdown
from solver.cost.candidates import Candidates
from solver.cost.memory import (
    MAIN_ITEMS,
    OTHER_ITEMS,
    MemoryBreakdown,
    MemoryOptions,
    estimate_layout_memory,
    estimate_memory_total,
)
from solver.cost.memory.layout import build_default_layout
from solver.cost.kernels.precision import check_precision_supported
from solver.cost.step.steptime import StepTime, estimate_layout_step_time, estimate_step_time
from solver.cost.step.frameworks import (
    FrameworkProfile,
    build_framework_profile,
    check_feature_precision,
    check_training_states_zero,
)
from solver.cost.step.offload import check_layer_offload, check_offload
from solver.cost.step.recompute_modules import (
    named_recompute_modules,
    with_default_recompute_modules,
)
from solver.cost.layers.finetune import check_finetune_framework, check_finetune_supported
from solver.cost.layers.time_constants import TimeConstants
from solver.emit.target import check_pipeline_layout, parse_launch_pipeline
from solver.errors import InputError, format_validation_error
from solver.search.constraints import structural_constraints
from solver.spec.layout_syntax import render_pipeline_layout
from solver.search.space import VARIABLES
from solver.spec import (
    RECOMPUTE_LEVELS,
    ClusterSpec,
    JobSpec,
    ModelSpec,
    ParallelConfig,
    PipelineLayout,
)
from solver.spec.features import FrameworkFeatures
from solver.spec.finetune import FinetuneSpec
from solver.spec.headroom import MemoryHeadroom
from solver.spec.plan import Plan, PlanTime, StageMemory

GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    """What `parplan estimate` reports: the problem and the plan of the given degrees.
    `fixes` lists single changes that make a plan that does not fit fit (empty when it fits)."""

    model_spec: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    num_gpus: int
    plan: Plan
    fixes: tuple[str, ...]
    calibration: str | None = None
    curve_sources: tuple[CurveSource, ...] = ()
    profile: FrameworkProfile | None = None
    blocks: tuple[BlockKindCost, ...] = ()  # a block pattern's time and memory by kind


def check_parallel_config(model_spec: ModelSpec, job: JobSpec, num_gpus: int,
                          config: ParallelConfig) -> None:
    """Raise InputError for degrees the model, the job or the GPU count cannot take: the first
    of the structural rules `optimize` searches under (solver.search.constraints) that
    `config` breaks, with the options it reads and their values."""
    values = {name: np.array([RECOMPUTE_LEVELS.index(config.recompute) if name == "recompute"
                              else getattr(config, name)]) for name in VARIABLES}
    for constraint in structural_constraints(model_spec, job, num_gpus):
        if not np.all(constraint.check(values)):
            given = ", ".join(f"--{name.replace('_', '-')} {int(values[name][0])}"
                              for name in constraint.variables)
            raise InputError(f"{given}: {constraint.rule} [{constraint.name}]")


def build_parallel_config(num_gpus: int, **degrees: int | str) -> ParallelConfig:
    """A ParallelConfig whose dp is the rest of the GPUs: num_gpus / (tp*pp*cp)."""
    tp, pp, cp = (int(degrees.get(k, 1)) for k in ("tp", "pp", "cp"))
    model_parallel = tp * pp * cp
    if num_gpus % model_parallel:
        raise InputError(f"--gpus ({num_gpus}) must be a multiple of tp x pp x cp "
                         f"({tp} x {pp} x {cp} = {model_parallel}); dp is the rest of the GPUs")
    try:
        return ParallelConfig(dp=num_gpus // model_parallel, **degrees)
    except ValidationError as exc:
        raise InputError(format_validation_error("parallel degrees", exc)) from None


def _stage_memory(breakdown: MemoryBreakdown, row: int, views: dict[str, np.ndarray],
                  observed: dict[str, np.ndarray]) -> StageMemory:
    """Row `row` of `breakdown` (whose views are `views`, and `observed` on the plan's GPU:
    MemoryBreakdown.views_with_room) as a StageMemory."""
    values = {name: float(breakdown.items[name][row]) for name in MAIN_ITEMS + OTHER_ITEMS}
    return StageMemory(
        stage=int(breakdown.stage[row]),
        **{f"{name}_bytes": values[name] for name in MAIN_ITEMS},
        other_bytes={name: values[name] for name in OTHER_ITEMS},
        allocated_bytes=float(views["allocated"][row]),
        reserved_bytes=float(views["reserved"][row]),
        observed_reserved_bytes=float(observed["reserved"][row]),
        observed_device_bytes=float(observed["device"][row]),
    )


def estimate_train_days(token_budget: float, tokens_per_second: float, num_gpus: int
                        ) -> tuple[float, float]:
    """Days and GPU-hours to train on `token_budget` tokens at `tokens_per_second` (the whole
    job's rate) on `num_gpus` GPUs: 1e12 tokens at 1e6 tokens/s is 11.57 days, x 24 x GPUs."""
    train_days = token_budget / tokens_per_second / 86400.0
    return train_days, train_days * 24.0 * num_gpus


def _plan_time(job: JobSpec, config: ParallelConfig, step, row: int) -> PlanTime:
    """Row `row` of a StepTime as the PlanTime of `config` (days and GPU-hours of the budget)."""
    tokens_per_second = float(step.tokens_per_s[row])
    train_days = gpu_hours = None
    if job.token_budget is not None:
        train_days, gpu_hours = estimate_train_days(job.token_budget, tokens_per_second,
                                                    config.num_gpus)
    return PlanTime(
        step_seconds=float(step.step_s[row]),
        tokens_per_second=tokens_per_second,
        tokens_per_second_per_gpu=float(step.tokens_per_s_per_gpu[row]),
        tflops_per_gpu=float(step.tflops_per_gpu[row]),
        mfu=float(step.mfu[row]),
        time_seconds=step.breakdown(row),
        train_days=train_days,
        gpu_hours=gpu_hours,
    )


def estimate_plan_time(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                       config: ParallelConfig, constants: TimeConstants | None = None
                       ) -> PlanTime:
    """Step time, throughput and MFU of `config`; days and GPU-hours of the token budget."""
    step = estimate_step_time(model_spec, cluster, job, Candidates.from_configs([config]),
                              constants)
    return _plan_time(job, config, step, 0)


def estimate_plans(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                   configs: Sequence[ParallelConfig], options: MemoryOptions | None = None,
                   constants: TimeConstants | None = None,
                   layouts: Sequence[PipelineLayout | None] | None = None,
                   step: StepTime | None = None) -> tuple[Plan, ...]:
    """Memory of every pipeline stage of each of `configs` on the cluster's GPU under its
    layout (None: the even split), and its step time: one vectorised call of the step time for
    all of them, or `step` when the caller has it (row i for configs[i])."""
    if not configs:
        return ()
    given = layouts if layouts is not None else [None] * len(configs)
    options = options or MemoryOptions()
    chosen = [layout if layout is not None
              else build_default_layout(model_spec, config, options)
              for config, layout in zip(configs, given)]
    if step is None:
        step = estimate_layout_step_time(model_spec, cluster, job, configs, chosen, constants)
    plans = []
    for index, (config, layout) in enumerate(zip(configs, chosen)):
        stages = estimate_layout_memory(model_spec, job, config, layout, options)
        views = stages.views
        # What the counters read on this GPU: the allocator's cache grown into the room of
        # the whole GPU (the headroom is the user's margin; the allocator does not see it).
        observed = stages.views_with_room(cluster.gpu_memory_bytes)
        plans.append(Plan(
            config=config, gpu_memory_bytes=cluster.gpu_memory_bytes,
            memory_headroom=cluster.memory_headroom,
            stages=tuple(_stage_memory(stages, i, views, observed) for i in range(config.pp)),
            time=_plan_time(job, config, step, index), layout=layout))
    return tuple(plans)


def estimate_plan(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                  config: ParallelConfig, options: MemoryOptions | None = None,
                  constants: TimeConstants | None = None,
                  layout: PipelineLayout | None = None) -> Plan:
    """Memory of every pipeline stage of `config` on the cluster's GPU under `layout` (None:
    the even split), and its step time."""
    return estimate_plans(model_spec, cluster, job, [config], options, constants, [layout])[0]


def suggest_memory_fixes(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                         num_gpus: int, config: ParallelConfig,
                         options: MemoryOptions | None = None) -> tuple[str, ...]:
    """Single changes of `config` after which it fits (valid ones only), e.g. "--zero 3
    (61.2 GB)"; the memory model decides, in one vectorised call. Under Megatron's layer-level
    CPU offloading, which runs at pp 1 without recompute, no change of pp or recompute but the
    fewest offloaded layers that fit (memory falls with each one)."""
    changes: list[tuple[str, ParallelConfig]] = []
    offloaded = options.cpu_offloading_num_layers if options is not None else 0

    def add(label: str, **update: int | str) -> None:
        if offloaded and ("pp" in update or "recompute" in update):
            return
        variant = config.model_copy(update=update)
        try:
            check_parallel_config(model_spec, job, num_gpus, variant)
        except InputError:
            return
        changes.append((label, variant))

    for zero in range(config.zero + 1, 4):
        add(f"--zero {zero}", zero=zero)
    if config.recompute != "full":
        add("--recompute full", recompute="full")
    if config.micro_batch > 1:
        add("--micro-batch 1", micro_batch=1)
    if config.dp % 2 == 0:
        add(f"--tp {2 * config.tp}", tp=2 * config.tp, dp=config.dp // 2)
        add(f"--pp {2 * config.pp}", pp=2 * config.pp, dp=config.dp // 2)
    capacity = cluster.usable_memory_bytes
    fixes: tuple[str, ...] = ()
    if changes:
        candidates = Candidates.from_configs([variant for _, variant in changes])
        totals = estimate_memory_total(model_spec, job, candidates, options)[0]
        fixes = tuple(f"{label} ({total / 1e9:.1f} GB)"
                      for (label, _), total in zip(changes, totals) if total <= capacity)
    if offloaded:
        fixes += _fewest_offloaded_layers(model_spec, job, config, options, capacity)
    return fixes


def _fewest_offloaded_layers(model_spec: ModelSpec, job: JobSpec, config: ParallelConfig,
                             options: MemoryOptions, capacity: float) -> tuple[str, ...]:
    """"--cpu-offloading-num-layers N (X GB)" for the fewest layers above the options' that
    fit, if any (bisection: memory falls with each layer offloaded)."""
    candidates = Candidates.from_configs([config])

    def total(layers: int) -> float:
        update = {"cpu_offloading_num_layers": layers}
        return float(estimate_memory_total(model_spec, job, candidates,
                                           options.model_copy(update=update))[0][0])

    low, high = options.cpu_offloading_num_layers, model_spec.num_hidden_layers - 1
    if total(high) > capacity:
        return ()
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if total(middle) <= capacity else (middle, high)
    return (f"--cpu-offloading-num-layers {high} ({total(high) / 1e9:.1f} GB)",)


def load_problem_specs(model: str, cluster: str, *, gpus_per_node: int | None = None,
                       seq_len: int | None = None, global_batch: int | None = None,
                       precision: str = "bf16", token_budget: int | None = None,
                       calibration: str | None = None, segment_gpus: int | None = None,
                       memory_headroom: MemoryHeadroom | None = None,
                       finetune: FinetuneSpec | None = None
                       ) -> tuple[ModelSpec, ClusterSpec, JobSpec]:
    """The model, the cluster (with a calibration profile applied, allocated in segments of
    `segment_gpus` GPUs when given, keeping `memory_headroom` free) and the job of a planning
    command (fine-tuning with `finetune`: solver.spec.finetune); option values left as None
    take the JobSpec defaults."""
    model_spec = load_model_spec(model)
    cluster_spec = load_calibrated_cluster(cluster, gpus_per_node, calibration)
    if segment_gpus is not None:
        try:
            cluster_spec = cluster_spec.with_segment_gpus(segment_gpus)
        except ValidationError as exc:
            raise InputError(format_validation_error(f"--segment-gpus {segment_gpus}",
                                                     exc)) from None
    if memory_headroom is not None:
        cluster_spec = cluster_spec.with_memory_headroom(memory_headroom)
    job_values = {"seq_len": seq_len, "global_batch": global_batch, "precision": precision,
                  "token_budget": token_budget, "finetune": finetune}
    try:
        job = JobSpec(**{k: v for k, v in job_values.items() if v is not None})
    except ValidationError as exc:
        raise InputError(format_validation_error("job", exc)) from None
    check_precision_supported(cluster_spec.gpu, job.precision)
    check_finetune_supported(model_spec, job.finetune)
    if job.finetune.quantized_base and job.precision != "bf16":
        raise InputError(f"--finetune qlora: its NF4 base is dequantized to bf16 for every GEMM; "
                         f"--precision {job.precision} does not apply (use bf16)")
    # Windows no shorter than the sequence are full attention (ModelSpec.at_length).
    return model_spec.at_length(job.seq_len), cluster_spec, job


def estimate(model: str, cluster: str, num_gpus: int, *, gpus_per_node: int | None = None,
             seq_len: int | None = None, global_batch: int | None = None,
             precision: str = "bf16", token_budget: int | None = None,
             calibration: str | None = None, framework: str = "megatron",
             options: MemoryOptions | None = None, layout: str | None = None,
             recompute_num_layers: int | None = None, segment_gpus: int | None = None,
             features: FrameworkFeatures | Mapping[str, Any] | None = None,
             memory_headroom: MemoryHeadroom | None = None,
             pipeline_layout: PipelineLayout | None = None, layout_source: str = "--plan",
             finetune: FinetuneSpec | None = None,
             **degrees: int | str) -> Estimate:
    """`parplan estimate`: load the model and cluster, build the job and the configuration
    (dp = num_gpus / (tp*pp*cp)), check it, and estimate its memory stage by stage.
    `calibration` is a profile of `parplan calibrate`: its measured curves replace the preset
    bandwidths and latencies of the tiers it covers; `framework` brings its profile
    (solver.cost.step.frameworks: timing and what `selective` keeps) with `features` overriding
    single features, as in `parplan optimize`. `layout`: Megatron's
    --pipeline-model-parallel-layout text (default: the even split), with
    `recompute_num_layers` recomputed in each virtual stage under --recompute full, or
    `pipeline_layout` (a plan file's, checked against the model and degrees with errors naming
    `layout_source`) where no `layout` text is given; `memory_headroom`: memory the plan must
    leave free on each GPU."""
    model_spec, cluster_spec, job = load_problem_specs(
        model, cluster, gpus_per_node=gpus_per_node, seq_len=seq_len, global_batch=global_batch,
        precision=precision, token_budget=token_budget, calibration=calibration,
        segment_gpus=segment_gpus, memory_headroom=memory_headroom, finetune=finetune)
    # What `selective` recomputes: the module set `optimize` starts from (one definition).
    check_finetune_framework(framework, job.finetune)
    profile = with_default_recompute_modules(build_framework_profile(framework, features),
                                             model_spec, features)
    options = profile.memory_options(options, cluster_spec)
    config = build_parallel_config(num_gpus, **degrees)
    check_parallel_config(model_spec, job, num_gpus, config)
    check_offload(profile.time_constants, cluster_spec, framework, (config.recompute,),
                  (config.zero,), model_spec)
    check_layer_offload(profile.time_constants, model_spec, cluster_spec, (config.pp,),
                        (config.recompute,))
    check_feature_precision(profile.time_constants, job.precision)
    check_training_states_zero(framework, profile.time_constants, (config.zero,))
    pipeline = None
    if layout is not None or recompute_num_layers is not None:
        even = build_default_layout(model_spec, config, options or MemoryOptions())
        text = layout if layout is not None else render_pipeline_layout(even)
        pipeline = parse_launch_pipeline(text, model_spec, config, recompute_num_layers)
    elif pipeline_layout is not None:
        pipeline = check_pipeline_layout(pipeline_layout, model_spec, config, layout_source)
    plan = estimate_plan(model_spec, cluster_spec, job, config, options,
                         profile.time_constants, pipeline)
    plan = plan.model_copy(update={"recompute_modules": named_recompute_modules(
        profile.time_constants, config.recompute)})
    fixes = () if plan.fits else suggest_memory_fixes(
        model_spec, cluster_spec, job, num_gpus, config, options)
    sources = tuple(describe_sources(cluster_spec)) if calibration is not None else ()
    blocks = tuple(estimate_block_breakdown(model_spec, cluster_spec, job, config, options,
                                            profile.time_constants, pipeline)
                   ) if model_spec.is_hybrid else ()
    return Estimate(model_spec=model_spec, cluster=cluster_spec, job=job, num_gpus=num_gpus,
                    plan=plan, fixes=fixes, calibration=calibration, curve_sources=sources,
                    profile=profile, blocks=blocks)
