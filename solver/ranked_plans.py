"""The plans of a ranking (solver.optimize): each costed by `estimate_plans` on its layout,
with the shortest prefix of the problem's memory savers under which it fits and its equivalent
settings (solver.search.twins), shown as the leanest of them."""

from __future__ import annotations


import numpy as np

from solver.api import estimate_plans
from solver.cost.step.frameworks import FrameworkProfile, with_memory_savers
from solver.cost.step.offload import host_link_bytes_per_s
from solver.cost.memory import MemoryOptions, estimate_layout_memory
from solver.cost.memory.layout import build_default_layout
from solver.cost.step.recompute_modules import named_recompute_modules
from solver.cost.step.steptime import StepTime, estimate_layout_step_time
from solver.cost.layers.time_constants import TimeConstants
from solver.search.enumerate import Ranked
from solver.search.space import Problem
from solver.spec import RECOMPUTE_LEVELS
from solver.spec.figures import format_significant
from solver.spec.features import OFFLOADS
from solver.spec.plan import Equivalent, Plan


def build_ranked_plans(problem: Problem, ranked: Ranked) -> tuple[Plan, ...]:
    """The ranked plans (cost_ranked_plans)."""
    return tuple(plan for plan, _ in cost_ranked_plans(problem, ranked))


def cost_ranked_plans(problem: Problem, ranked: Ranked) -> tuple[tuple[Plan, StepTime], ...]:
    """The ranked plans, each with its own StepTime (one row), with with their stages' memory, the memory savers each needs and its
    equivalent settings; each selective plan names its module set (Plan.recompute_modules).

    Memory savers (Problem.memory_savers): each plan gets the shortest prefix of them under
    which it fits (the search admitted it with all of them), and is costed, memory and step
    time, with exactly that prefix on: the profile `launch --plan` writes and `estimate`
    re-costs (grad_reduce_in_bf16 halves its DP bytes). The step times of plans without savers
    are the ranking's; a saver only shortens the step, so the ranking's time of a plan with
    savers (costed without them) is an upper bound of its own, and the top K of the ranking is
    the top K by those bounds (solver.optimize._answer re-sorts it by the plans' own times)."""
    configs = ranked.candidates.to_configs()
    layouts = list(ranked.layouts or [None] * len(configs))
    plans: list[Plan | None] = [None] * len(configs)
    steps: list[StepTime | None] = [None] * len(configs)
    pending = np.arange(len(configs))
    levels = saver_levels(problem)
    for position, (savers, options) in enumerate(levels):
        constants = saver_constants(problem, savers)
        chosen = [layouts[i] if layouts[i] is not None
                  else build_default_layout(problem.model_spec, configs[i], options)
                  for i in pending]
        step = ranked.step_time.take(pending) if not savers else estimate_layout_step_time(
            problem.model_spec, problem.cluster, problem.job, [configs[i] for i in pending],
            chosen, constants)
        estimated = estimate_plans(problem.model_spec, problem.cluster, problem.job,
                                   [configs[i] for i in pending], options, constants, chosen,
                                   step)
        last = position == len(levels) - 1
        for index, (row, plan) in enumerate(zip(pending, estimated)):
            if plan.fits or last:
                plans[row] = _named(problem, plan.model_copy(update={"memory_savers": savers}))
                steps[row] = step.take(np.array([index]))
        pending = np.array([row for row in pending if plans[row] is None], dtype=np.int64)
        if len(pending) == 0:
            break
    twins = ranked.twins or ((),) * len(plans)
    answer = []
    for plan, step, folded in zip(plans, steps, twins):
        if plan is None:
            continue
        assert step is not None
        options = dict(levels)[plan.memory_savers]
        answer.append((_leanest_first(problem, plan, _equivalents(problem, plan, folded,
                                                                  options), options, step),
                       step))
    return tuple(answer)


def _named(problem: Problem, plan: Plan) -> Plan:
    """The plan naming what its selective recompute recomputes (named_recompute_modules)."""
    return plan.model_copy(update={"recompute_modules": named_recompute_modules(
        problem.time_constants, plan.config.recompute)})


def saver_constants(problem: Problem, savers: tuple[str, ...]) -> TimeConstants:
    """The problem's TimeConstants with `savers` on: what a plan that turns them on is timed
    with (the same profile as its memory, saver_levels)."""
    profile = FrameworkProfile(name=problem.framework, time_constants=problem.time_constants)
    return with_memory_savers(profile, savers).time_constants


# A twin is shown instead of the plan when it needs less memory by more than this share.
LEANER = 1e-9


def _leanest_first(problem: Problem, plan: Plan, equivalents: tuple[Equivalent, ...],
                   options: MemoryOptions, step: StepTime) -> Plan:
    """The plan with its equivalent settings, shown as the one of them that needs the least
    memory: re-costed under the plan's own savers and layout (_equivalents), a twin may need
    less than the setting the search kept (it compared each under all savers and its own
    layout); the twins take the same step time."""
    leanest = min(equivalents, key=lambda e: e.total_bytes, default=None)
    # Leaner by more than rounding: the search's twin bytes (summed over candidate arrays) and
    # the plan's (its layout's stages) differ in the last bits for the same configuration
    # (41,896,599,654.399994 against .4 for ZeRO 0 and 1 at dp 1), which must not swap them.
    if leanest is None or leanest.total_bytes >= plan.worst_stage.total_bytes * (1 - LEANER):
        return plan.model_copy(update={"equivalent": equivalents})
    config = plan.config.model_copy(update={"recompute": leanest.recompute,
                                            "zero": leanest.zero})
    swapped = estimate_plans(problem.model_spec, problem.cluster, problem.job, [config],
                             options, saver_constants(problem, plan.memory_savers),
                             [plan.layout], step)[0]
    others = tuple(e for e in equivalents if e is not leanest) + (
        Equivalent(recompute=plan.config.recompute, zero=plan.config.zero,
                   total_bytes=plan.worst_stage.total_bytes),)
    return _named(problem, swapped).model_copy(update={
        "memory_savers": plan.memory_savers,
        "equivalent": tuple(sorted(others, key=lambda e: e.total_bytes))})


def _equivalents(problem: Problem, plan: Plan, twins: tuple[tuple[int, int, float], ...],
                 options: MemoryOptions) -> tuple[Equivalent, ...]:
    """The plan's twins (recompute code, ZeRO stage, worst-stage bytes under the search's
    options) as Equivalent settings under the plan's own savers: re-costed where the plan
    turns fewer on than the search assumed, and kept where they fit with them."""
    if options is problem.memory_options:
        return tuple(Equivalent(recompute=RECOMPUTE_LEVELS[code], zero=zero,
                                total_bytes=memory_bytes) for code, zero, memory_bytes in twins)
    assert plan.layout is not None  # estimate_plans gives every plan its layout
    kept = []
    for code, zero, _ in twins:
        config = plan.config.model_copy(update={"recompute": RECOMPUTE_LEVELS[code],
                                                "zero": zero})
        total = float(estimate_layout_memory(problem.model_spec, problem.job, config,
                                             plan.layout, options).total.max())
        if total <= plan.usable_memory_bytes:
            kept.append(Equivalent(recompute=config.recompute, zero=zero, total_bytes=total))
    return tuple(kept)


def explain_savers(problem: Problem, plan: Plan) -> list[str]:
    """Why the winner turns memory savers on: its worst stage without them."""
    if not plan.memory_savers:
        return []
    assert plan.layout is not None  # estimate_plans gives every plan its layout
    without = estimate_layout_memory(problem.model_spec, problem.job, plan.config, plan.layout,
                                     saver_levels(problem)[0][1]).total.max()
    flags = " and ".join("--" + name.replace("_", "-") for name in plan.memory_savers)
    return [f"memory savers: {flags} (without them the worst stage needs "
            f"{without / 1e9:.1f} GB of the {plan.usable_memory_bytes / 1e9:.1f} GB usable; "
            "the step is costed with them on, as launched)"]


def explain_offloads(problem: Problem, plan: Plan) -> list[str]:
    """Why the winner offloads to the host: its worst stage without the offloads, and the step
    time they add (solver.cost.step.offload)."""
    constants = problem.time_constants
    offloads = tuple(name for name in OFFLOADS if getattr(constants, name))
    if not offloads:
        return []
    assert plan.layout is not None and plan.time is not None
    plain = {name: False for name in offloads}
    options = problem.memory_options.model_copy(update=plain)
    without = estimate_layout_memory(problem.model_spec, problem.job, plan.config, plan.layout,
                                     options).total.max()
    # The same plan without its offloads, timed with its own memory savers (as plan.time is).
    timed = saver_constants(problem, plan.memory_savers).model_copy(update=plain)
    faster = estimate_layout_step_time(problem.model_spec, problem.cluster, problem.job,
                                       [plan.config], [plan.layout], timed).step_s[0]
    flags = " and ".join("--" + name.replace("_", "-") for name in offloads)
    gpu = problem.cluster.gpu
    link = (f"{format_significant(host_link_bytes_per_s(problem.cluster) / 1e9)} GB/s "
            + ("measured" if gpu.host_link_measured_gb_per_s else "datasheet, no measurement"))
    added = plan.time.step_seconds - faster
    # Bytes move either way: where no time shows, say what hides them rather than "adds 0 s".
    cost = (f"they add {format_significant(added)} s to the step at the host link's {link}"
            if added > 0 else f"their copies at the host link's {link} hide behind the "
            "layers' compute: no step time shows")
    return [f"offloads: {flags} (without them the worst stage needs {without / 1e9:.1f} GB of "
            f"the {plan.usable_memory_bytes / 1e9:.1f} GB usable; {cost})"]


def saver_levels(problem: Problem) -> list[tuple[tuple[str, ...], MemoryOptions]]:
    """(savers on, memory options) for each prefix of the problem's memory savers, none
    first; the last is the problem's own options (all of them on)."""
    profile = FrameworkProfile(name=problem.framework, time_constants=problem.time_constants)
    savers = problem.memory_savers
    return [(savers[:count], with_memory_savers(profile, savers[:count]).memory_options(
        cluster=problem.cluster))
            for count in range(len(savers))] + [(savers, problem.memory_options)]
