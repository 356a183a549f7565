"""Explanations: which constraints conflict when nothing is feasible, and why the winner won.

Conflicts: a deletion filter over the named constraints gives an irreducible set (every
constraint in it is needed for the infeasibility): drop one constraint at a time and keep it
only if the rest become feasible without it. Constraints the user cannot change (the model's
shape, the GPU count) are tried first on their own; the expensive memory check runs once, on
the candidates those allow.

Why: the six steps of the classic decision process (fit check, minimum TP, PP, DP,
communication budget, EP) applied to this problem, what the runner-up loses on, and what the
winner's most surprising choice buys: the best plan without it (say cp = 1 where the winner
splits a 4K-token sequence over 4 GPUs), and the difference in step time, its parts and memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory import estimate_memory_total
from solver.cost.memory.states import (
    estimate_frozen_weight_bytes,
    estimate_sharded_state_bytes_per_param,
    estimate_whole_model_state_bytes,
)
from solver.cost.layers.time_constants import dp_part_overlaps
from solver.search.constraints import (
    MEMORY_CONSTRAINT,
    Constraint,
    build_constraints,
    memory_capacity_bytes,
)
from solver.search.enumerate import Ranked, enumerate_feasible
from solver.search.feasible import LEAN_AXES, leanest_schedules
from solver.search.space import VARIABLES, Problem
from solver.spec.figures import format_significant
from solver.spec.job import ParallelConfig

SOFT_PREFIXES = ("pin_", "megatron_", "torchtitan_", "deepspeed_")
SOFT_NAMES = ("tp_within_nvlink", "etp_within_nvlink", MEMORY_CONSTRAINT)
GB = 1e9


def is_soft(constraint: Constraint) -> bool:
    """A constraint the user can lift (a pin, a framework, the NVLink rule, the GPU memory)."""
    return constraint.name.startswith(SOFT_PREFIXES) or constraint.name in SOFT_NAMES


@dataclass(frozen=True)
class Conflicts:
    """Why a problem is infeasible: `names`, an irreducible set of constraints that cannot
    hold together (empty if the problem is feasible), and `least_memory_bytes`, the least
    worst-stage memory of any configuration meeting every other constraint (None if none
    does): how far the problem is from fitting."""

    names: list[str]
    least_memory_bytes: float | None


def find_conflicts(problem: Problem) -> Conflicts:
    """The conflicting constraints of `problem` (see Conflicts). The memory of the candidates
    the unchangeable constraints allow is computed once, for both answers."""
    constraints = build_constraints(problem)
    hard = [c for c in constraints if not is_soft(c)]
    allowed = enumerate_feasible(problem, hard)
    if len(allowed) == 0:
        names = deletion_filter(hard, lambda kept: len(enumerate_feasible(
            problem, kept, stop_at_first=True)) > 0)
        return Conflicts(names, None)
    soft = [c for c in constraints if is_soft(c)]
    allowed = allowed.take(_leanest(allowed, soft))
    values = {name: getattr(allowed, name) for name in VARIABLES}
    memory = estimate_memory_total(problem.model_spec, problem.job, allowed,
                             problem.memory_options)[0]
    masks = {c.name: np.broadcast_to(np.asarray(c.check(values), bool), allowed.tp.shape)
             for c in soft if c.name != MEMORY_CONSTRAINT}
    masks[MEMORY_CONSTRAINT] = memory <= memory_capacity_bytes(problem)
    others = np.logical_and.reduce([masks[c.name] for c in soft if c.name != MEMORY_CONSTRAINT]
                                   + [np.ones(len(allowed), bool)])
    least = float(memory[others].min()) if others.any() else None
    if (others & masks[MEMORY_CONSTRAINT]).any():
        return Conflicts([], least)

    def feasible(kept: Sequence[Constraint]) -> bool:
        if not kept:
            return True
        return bool(np.logical_and.reduce([masks[c.name] for c in kept]).any())

    return Conflicts(deletion_filter(soft, feasible), least)


def _leanest(allowed: Candidates, soft: Sequence[Constraint]) -> np.ndarray:
    """The rows that stand for all in find_conflicts: the leanest schedules along the
    micro-batch and recompute level where no soft rule but memory reads them (a rule set any
    row meets, its leanest row meets too, with no more memory; the least memory is among them).
    Megatron's interleaving rule reads the micro-batch; pins may read either."""
    read = set().union(*(c.variables for c in soft if c.name != MEMORY_CONSTRAINT))
    return leanest_schedules(allowed, tuple(a for a in LEAN_AXES if a not in read))


def deletion_filter(constraints: Sequence[Constraint], feasible) -> list[str]:
    """Names of an irreducible subset of `constraints` that `feasible(kept)` (a function of a
    list of constraints) finds infeasible: drop one at a time, keep it only if needed."""
    kept = list(constraints)
    for constraint in list(constraints):
        trial = [c for c in kept if c is not constraint]
        if not feasible(trial):
            kept = trial
    return [c.name for c in kept]


def explain_choice(problem: Problem, ranked: Ranked,
                   solve_pinned: Callable[[Problem], Ranked | None] | None = None) -> list[str]:
    """The six steps of the classic decision process for this problem, the runner-up, and the
    best plan without the winner's most surprising choice (`compare_without_surprise`;
    `solve_pinned`, if given, solves a problem with one more pin, with the engine that ranked
    `ranked`)."""
    m = problem.model_spec
    capacity = problem.cluster.usable_memory_bytes
    params = m.total_params
    best = ranked.candidates.config(0)
    lines = []
    options = problem.memory_options
    state_bytes = estimate_sharded_state_bytes_per_param(options)
    per_param = sum(state_bytes)
    static = model_state_bytes(problem)
    finetune = problem.job.finetune
    states = (f"{params / 1e9:.1f}B parameters need {static / GB:.0f} GB of weights, "
              f"gradients and optimizer state ({per_param:g} bytes each: "
              f"{' + '.join(f'{b:g}' for b in state_bytes)})")
    if finetune.has_adapters:  # the base frozen (solver.cost.layers.finetune)
        states = (f"{params / 1e9:.1f}B frozen parameters "
                  f"({'NF4 layers' if finetune.quantized_base else 'bf16'}) and their "
                  f"adapters ({per_param:g} bytes each) need {static / GB:.0f} GB")
    lines.append(
        f"1. fit check: {states} "
        f"against {format_significant(capacity / GB)} GB per GPU: "
        + ("fits one GPU" if static < capacity else
           f"shard over at least {math.ceil(static / capacity)} GPUs"))
    min_tp = minimum_tp(problem)
    weight_words = "NF4 layer weights" if finetune.quantized_base else "bf16 weights"
    lines.append(
        f"2. minimum TP ({weight_words} in 70% of a GPU): {min_tp}; chosen tp = {best.tp} "
        f"(NVLink domain {problem.cluster.scale_up_gpus}), with ZeRO {best.zero} sharding "
        "the rest")
    lines.append(
        f"3. pipeline: pp = {best.pp}" + (f" with {best.vpp} virtual stages" if best.vpp > 1
                                          else "")
        + (f"; cp = {best.cp} splits each {problem.job.seq_len}-token sequence"
           if best.cp > 1 else ""))
    lines.append(f"4. data parallel: dp = {best.dp} = {problem.num_gpus} / (tp x cp x pp)")
    time = ranked.step_time.breakdown(0)
    step = float(ranked.step_time.step_s[0])
    comm = sum(time[k] for k in ("tp", "cp", "ep", "dp", "pp"))
    lines.append(
        f"5. communication budget: {100 * comm / step:.1f}% of the "
        f"{format_significant(step)} s step is exposed "
        f"communication, {100 * time['bubble'] / step:.1f}% pipeline bubble"
        + _dp_overlap_note(problem, best))
    if m.is_moe:
        lines.append(f"6. experts: ep = {best.ep} ({m.num_experts // best.ep} of "
                     f"{m.num_experts} experts per GPU), etp = {best.etp}")
    else:
        lines.append("6. experts: dense model, no EP")
    if len(ranked.candidates) > 1:
        lines.append(_runner_up(ranked))
    surprise = compare_without_surprise(problem, ranked, solve_pinned)
    if surprise is not None:
        lines.append(surprise)
    return lines


def model_state_bytes(problem: Problem) -> float:
    """Weights, gradients and optimizer state of the whole model, unsharded (the fit check;
    solver.cost.memory.states.estimate_whole_model_state_bytes)."""
    return estimate_whole_model_state_bytes(problem.model_spec, problem.job,
                                            problem.memory_options)


def minimum_tp(problem: Problem) -> int:
    """The rule of thumb's smallest TP: bf16 weights (QLoRA's NF4 layers) in 70% of a GPU
    (solver.cost.memory.states.estimate_frozen_weight_bytes)."""
    weights = estimate_frozen_weight_bytes(
        problem.model_spec, problem.job,
        problem.memory_options.model_copy(update={"param_bytes": 2.0}))
    return max(1, math.ceil(weights / (0.7 * problem.cluster.usable_memory_bytes)))


def _dp_overlap_note(problem: Problem, best) -> str:
    """What of the winner's DP traffic the framework does not overlap with compute
    (TimeConstants: dp_overlap, zero0_grad_overlap, params_gather_overlap)."""
    if best.dp * best.cp == 1:
        return ""
    backward, forward = (bool(x[0]) for x in dp_part_overlaps(
        problem.time_constants, np.array([best.zero]), np.array([best.pp])))
    if not backward and not (forward or best.zero == 0):
        return f" (the {problem.framework} framework overlaps none of its DP traffic)"
    if not backward:
        return f" (the {problem.framework} framework does not overlap the gradient reduction)"
    if not forward and best.zero > 0:
        return (f" (the {problem.framework} framework does not overlap the parameter "
                "all-gather)")
    return ""


STRUCTURE = ("tp", "cp", "pp", "ep", "etp", "zero")


def _runner_up(ranked: Ranked) -> str:
    """Compare with the best plan of another structure (tp, cp, pp, ep, etp, zero): plans that
    differ only in micro-batch or recompute often tie."""
    c = ranked.candidates
    same = np.logical_and.reduce([getattr(c, n) == getattr(c, n)[0] for n in STRUCTURE])
    others = np.flatnonzero(~same)
    if len(others) == 0:
        return "every listed plan shares the winner's tp, cp, pp, ep, etp and ZeRO stage"
    index = int(others[0])
    first, second = ranked.step_time.breakdown(0), ranked.step_time.breakdown(index)
    config = c.config(index)
    gap = float(ranked.step_time.step_s[index] - ranked.step_time.step_s[0])
    worst = max(first, key=lambda k: second[k] - first[k])
    described = ", ".join(f"{n} {getattr(config, n)}" for n in VARIABLES)
    if gap <= 1e-9 * float(ranked.step_time.step_s[0]):
        return (f"runner-up #{index + 1} ({described}) ties with the winner under the model; "
                "the order between them is by memory, then by the degrees")
    return (f"runner-up #{index + 1} ({described}) is {format_significant(gap)} s slower per "
            f"step; it loses most on {TIME_WORDS[worst]} "
            f"({_signed_seconds(second[worst] - first[worst])})")


@dataclass(frozen=True)
class Choice:
    """A choice a reader questions: `questioned(problem, best)` says whether the winner made
    it against the rule of thumb; `usual` are the values the rule of thumb would take."""

    name: str
    usual: tuple[int, ...]
    words: str
    questioned: Callable[[Problem, ParallelConfig], bool]


# Most surprising first, each against the rule of thumb of the steps above: CP is meant for
# long sequences; pipeline stages for weights that TP over one NVLink domain cannot hold; TP
# for weights that do not fit one GPU; ZeRO 3 (weights gathered every step) trades traffic for
# memory. A choice the rule of thumb expects (pp 8 for a 405B model) is not questioned.
SURPRISES = (
    Choice("cp", (1,), "context parallelism", lambda p, best: best.cp > 1),
    Choice("pp", (1,), "pipeline parallelism", lambda p, best: best.pp > 1 and
           minimum_tp(p) <= p.cluster.scale_up_gpus),
    Choice("tp", (1,), "tensor parallelism", lambda p, best: best.tp > 1 and
           minimum_tp(p) == 1),
    Choice("zero", (0, 1, 2), "ZeRO 3", lambda p, best: best.zero == 3),
)
TIME_WORDS = {"compute": "compute", "recompute": "recompute", "tp": "TP traffic",
              "cp": "CP traffic", "ep": "EP traffic", "offload": "host transfers",
              "dp": "DP traffic", "pp": "PP traffic",
              "bubble": "pipeline bubble", "optimizer": "optimizer step"}


def find_surprise(problem: Problem, ranked: Ranked) -> Choice | None:
    """The winner's most surprising choice (SURPRISES order), skipping any the user pinned."""
    best = ranked.candidates.config(0)
    for choice in SURPRISES:
        if choice.questioned(problem, best) and choice.name not in problem.pins:
            return choice
    return None


def compare_without_surprise(problem: Problem, ranked: Ranked,
                             solve_pinned: Callable[[Problem], Ranked | None] | None
                             ) -> str | None:
    """The best plan without the winner's most surprising choice, and what the difference
    costs: step time (with its three largest changes) and memory.
    The best such plan is the first of the ranking that has it (the ranking is in objective
    order), else the answer to the problem with the usual values pinned: `solve_pinned` (a
    solve per questioned problem, about 0.1-0.4 s; the optimize command asks for it, sweeps
    do not), or without it the pin that would show it."""
    choice = find_surprise(problem, ranked)
    if choice is None:
        return None
    best = ranked.candidates.config(0)
    values = " or ".join(filter(None, [", ".join(str(v) for v in choice.usual[:-1]),
                                       str(choice.usual[-1])]))
    head = f"7. without {choice.words} ({choice.name} {getattr(best, choice.name)}):"
    listed = np.flatnonzero(np.isin(getattr(ranked.candidates, choice.name), choice.usual))
    if len(listed):
        other, index, where = ranked, int(listed[0]), f" (#{int(listed[0]) + 1} listed)"
    elif solve_pinned is None:
        flag = f"--{choice.name} {choice.usual[-1]}" if len(choice.usual) == 1 else \
            f"--{choice.name} {choice.usual[0]}-{choice.usual[-1]}"
        return (f"{head} none of the {len(ranked.candidates)} listed plans goes without it "
                f"(parplan optimize {flag} shows the best that does)")
    else:
        pinned = problem.model_copy(update={"pins": {**problem.pins, choice.name: choice.usual}})
        found = solve_pinned(pinned)
        if found is None or len(found.candidates) == 0:
            return f"{head} {_why_none(pinned, choice, values)}"
        other, index, where = found, 0, ""
    config = other.candidates.config(index)
    described = ", ".join(f"{n} {getattr(config, n)}" for n in VARIABLES)
    ours, theirs = ranked.step_time.breakdown(0), other.step_time.breakdown(index)
    step = float(ranked.step_time.step_s[0])
    gap = float(other.step_time.step_s[index]) - step
    changes = sorted(ours, key=lambda k: -abs(theirs[k] - ours[k]))[:3]
    parts = ", ".join(f"{TIME_WORDS[k]} {_signed_seconds(theirs[k] - ours[k])}"
                      for k in changes if abs(theirs[k] - ours[k]) > 1e-6 * step)
    slower = "slower" if gap >= 0 else "faster"
    memory = (f"; worst stage {float(other.memory_bytes[index]) / GB:.1f} GB against "
              f"{float(ranked.memory_bytes[0]) / GB:.1f} GB")
    return (f"{head} the best plan with {choice.name} = {values} is {described}{where}: "
            f"{format_significant(abs(gap))} s ({100 * abs(gap) / step:.1f}%) {slower} per step"
            + (f" ({parts})" if parts else "") + memory)


def _why_none(pinned: Problem, choice: Choice, values: str) -> str:
    """Why no plan has the usual values: the constraints they clash with, and how far the
    leanest such plan is from fitting when memory is one of them."""
    found = find_conflicts(pinned)
    names = [n for n in found.names if n != f"pin_{choice.name}"]
    text = (f"no plan with {choice.name} = {values} meets every rule on {pinned.num_gpus} GPUs"
            + (f" ({', '.join(names)})" if names else ""))
    if MEMORY_CONSTRAINT in names and found.least_memory_bytes is not None:
        text += (f": the leanest needs {found.least_memory_bytes / GB:.1f} GB of "
                 f"{memory_capacity_bytes(pinned) / GB:.1f} GB")
    return text


def _signed_seconds(value: float) -> str:
    return ("+" if value >= 0 else "-") + format_significant(abs(value)) + " s"
