"""Fix advice for an `estimate` that does not fit, from the search (issue 39 item 3), cheapest
first: every degree of the estimate pinned on the same GPUs, the memory features (savers,
offloads) the search's to turn on; else the mesh (tp, pp, cp, ep, etp) pinned and the schedule
(virtual stages, ZeRO stage, micro-batch, recompute) the search's too, as `parplan optimize`
with those pins would; where nothing fits so, the fixes of solver.fixes for that pinned
problem (drop a pin, the fewest GPUs, a GPU with more memory), in the words `optimize` and
`sweep` use.

Issue 39's example: Llama 3.1 70B at tp 8 pp 1 on 8 H100 was told "add GPUs", while
`optimize --tp 8 --pp 1` fits those 8 GPUs with --grad-reduce-in-bf16 and --optimizer-offload.
"""

from __future__ import annotations

from solver.fixes import suggest_fixes
from solver.optimize import solve
from solver.search.explain import find_conflicts
from solver.search.space import Problem
from solver.spec import ParallelConfig
from solver.spec.job import RECOMPUTE_LEVELS
from solver.spec.plan import Plan

# The degrees of an estimate kept as pins: its mesh. The schedule and the memory features
# are what the search changes first (they change no process group).
MESH = ("tp", "pp", "cp", "ep", "etp")
# The schedule settings a fix names where the search's plan differs from the estimate's.
SCHEDULE = ("vpp", "zero", "micro_batch", "recompute")


def suggest_estimate_fixes(problem: Problem, config: ParallelConfig,
                           modules: tuple[str, ...] = ()) -> list[str]:
    """The cheapest change after which `config` fits `problem`'s GPUs, by the search: the
    memory features it turns on with every degree kept, else its best plan with the mesh kept
    (the settings and features it changes), else the fixes of that pinned problem
    (solver.fixes.suggest_fixes). `problem`: the estimate's problem, unpinned; `modules`: what
    the estimate's selective recompute recomputes."""
    for kept in (MESH + SCHEDULE, MESH):
        pinned = problem.model_copy(update={"pins": {**problem.pins, **{
            name: (_code(name, getattr(config, name)),) for name in kept}}})
        result = solve(pinned, top=1, compare=False)
        if result.plans:
            return [describe_change(config, modules, result.plans[0])]
    conflicts = tuple(find_conflicts(pinned).names)
    return suggest_fixes(pinned, conflicts)


def _code(name: str, value: int | str) -> int:
    """A degree's value as a pin holds it (recompute by its level's index)."""
    return RECOMPUTE_LEVELS.index(value) if name == "recompute" else int(value)


def describe_change(config: ParallelConfig, modules: tuple[str, ...], plan: Plan) -> str:
    """What the search changes for `config` (selective recompute of `modules`) to fit: the
    features it turns on, "(63.4 GB, the same degrees)"; where it changes the schedule too,
    "keep tp 8 pp 1 (parplan optimize --tp 8 --pp 1): --zero 0 --micro-batch 4 --recompute
    none --grad-reduce-in-bf16 --optimizer-offload (79.0 GB)"."""
    changes = [f"--{name.replace('_', '-')} {getattr(plan.config, name)}" for name in SCHEDULE
               if getattr(plan.config, name) != getattr(config, name)]
    if plan.config.recompute == "selective" and plan.recompute_modules not in ((), modules):
        changes.append("--recompute-modules " + ",".join(plan.recompute_modules))
    schedule = bool(changes)
    changes += ["--" + name.replace("_", "-") for name in plan.memory_savers + plan.offloads]
    if not changes:  # the same settings: the layers split otherwise
        changes.append("the search's pipeline layout")
    memory = f"{plan.worst_stage.total_bytes / 1e9:.1f} GB"
    if not schedule:
        return " ".join(changes) + f" ({memory}, the same degrees)"
    mesh = [name for name in MESH if getattr(config, name) != 1 or name in ("tp", "pp")]
    kept = " ".join(f"{name} {getattr(config, name)}" for name in mesh)
    pins = " ".join(f"--{name} {getattr(config, name)}" for name in mesh)
    return f"keep {kept} (parplan optimize {pins}): " + " ".join(changes) + f" ({memory})"
