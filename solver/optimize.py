"""`parplan optimize`: the best parallel configurations of a problem, and the fewest GPUs that
train a token budget in time. Library front door beside `solver.api` (cli -> optimize -> search
-> cost -> spec).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np

from solver.api import load_problem_specs
from solver.cost.step.frameworks import (
    build_framework_profile,
    check_feature_precision,
    memory_saver_ladder,
    offload_ladder,
    with_memory_savers,
)
from solver.cost.step.offload import (
    activation_offload_levels,
    check_layer_offload,
    check_offload,
    offload_available,
)
from solver.cost.candidates import Candidates
from solver.cost.step.recompute_modules import recompute_module_sets, with_default_recompute_modules
from solver.cost.row_memo import forget_all
from solver.cost.step.steptime import StepTime
from solver.cost.layers.finetune import check_finetune_framework
from solver.errors import InputError
from solver.search.limits import STOPPED_BY_WORK_LIMIT, Deadline, never
from solver.search.program_memo import WorkBudget
from solver.search.module_variants import (
    Merged,
    RankedSearch,
    Search,
    Searched,
    merged_ranking,
    search_module_sets,
    take_ranked,
)
from solver.search.constraints import MEMORY_CONSTRAINT, build_constraints
from solver.search.enumerate import FirstPass, Ranked, solve_by_enumeration
from solver.search.explain import explain_choice, find_conflicts
from solver.search.layout_search import LayoutSearch, solve_with_layouts
from solver.search.space import VARIABLES, Framework, Objective, Problem
from solver.fixes import suggest_fixes
from solver.ranked_plans import cost_ranked_plans, explain_offloads, explain_savers
from solver.spec.features import FrameworkFeatures
from solver.spec.finetune import FinetuneSpec
from solver.spec.headroom import MemoryHeadroom
from solver.spec.job import RECOMPUTE_LEVELS
from solver.spec.plan import Plan

ENGINES = ("layout", "even")


@dataclass(frozen=True)
class OptimizeResult:
    """The answer of `optimize`: status (optimal | feasible | infeasible), the plans best first,
    and, when infeasible, the conflicting constraints and fixes that would lift them.
    num_feasible: the plans that meet every constraint (None where the oracle stopped checking
    memory once the top plans were certain; num_candidates meet every rule but memory, and
    num_memory_checked of them had their memory checked); for the integer program, the plans
    it evaluated exactly. stopped_by: the limit that ended the search where one did
    (solver.search.limits: "work_limit", the deterministic budget, the same answer on any
    machine; "time_limit", the user's wall clock, or "safety_time_limit", the default one:
    an answer that depends on the machine), None where nothing cut it short."""

    problem: Problem
    status: str
    engine: str
    solve_seconds: float
    num_feasible: int | None
    plans: tuple[Plan, ...]
    why: tuple[str, ...] = ()
    conflicts: tuple[str, ...] = ()
    rules: dict[str, str] = field(default_factory=dict)
    fixes: tuple[str, ...] = ()
    num_candidates: int | None = None
    num_memory_checked: int | None = None
    step_lower_bound_s: float | None = None
    stopped_by: str | None = None

    @property
    def optimality_gap(self) -> float | None:
        """How much slower the best plan may be than the best there is under the cost model,
        as a fraction (0 where proven optimal); None where the objective is not the step
        time or no bound is known."""
        if not self.plans or self.step_lower_bound_s is None or self.step_lower_bound_s <= 0:
            return None
        best = self.plans[0].time
        assert best is not None
        return max(best.step_seconds / self.step_lower_bound_s - 1.0, 0.0)


def build_problem(model: str, cluster: str, num_gpus: int, *, gpus_per_node: int | None = None,
                  seq_len: int | None = None, global_batch: int | None = None,
                  precision: str = "bf16", token_budget: int | None = None,
                  framework: Framework = "megatron", objective: Objective = "time",
                  pins: dict[str, tuple[int, ...]] | None = None,
                  allow_tp_across_nodes: bool = False,
                  calibration: str | None = None, segment_gpus: int | None = None,
                  features: FrameworkFeatures | None = None,
                  memory_headroom: MemoryHeadroom | None = None,
                  finetune: FinetuneSpec | None = None) -> Problem:
    """Load the model and cluster (with a calibration profile's measured curves if given) and
    build the Problem under the framework's profile (solver.cost.step.frameworks) with `features`
    overriding single features, keeping `memory_headroom` free on each GPU; bad input is an
    InputError."""
    model_spec, cluster_spec, job = load_problem_specs(
        model, cluster, gpus_per_node=gpus_per_node, seq_len=seq_len, global_batch=global_batch,
        precision=precision, token_budget=token_budget, calibration=calibration,
        segment_gpus=segment_gpus, memory_headroom=memory_headroom, finetune=finetune)
    for name in pins or {}:
        if name not in VARIABLES:
            raise InputError(f"pin '{name}': not a decision variable ({', '.join(VARIABLES)})")
    check_finetune_framework(framework, job.finetune)
    profile = build_framework_profile(framework, features)
    # The memory savers no flag set are the search's to turn on where a plan needs them
    # (Problem.memory_savers): memory with all of them, time without.
    savers = memory_saver_ladder(framework, features, precision)
    # The recompute module sets the search tries (solver.search.module_variants): the first is the
    # problem's own.
    module_sets = recompute_module_sets(model_spec, framework, profile.time_constants, features)
    profile = with_default_recompute_modules(profile, model_spec, features)
    # The offloads the search tries (solver.search.module_variants), where the catalog has the
    # bandwidths; one a flag turned on holds for every plan, within its rules.
    offloads = tuple(name for name in offload_ladder(framework, features, precision)
                     if offload_available(cluster_spec, name))
    pins = dict(pins or {})
    constants = profile.time_constants
    if constants.activation_offload:  # what is left, or the pin check_offload refuses
        levels = tuple(RECOMPUTE_LEVELS[code] for code in pins.get("recompute", (0, 1, 2)))
        runs = activation_offload_levels(model_spec, constants.recompute_modules, levels)
        pins["recompute"] = tuple(RECOMPUTE_LEVELS.index(level) for level in runs or levels)
    if constants.optimizer_offload and framework == "deepspeed":
        pins["zero"] = tuple(stage for stage in pins.get("zero", (0, 1, 2, 3)) if stage) or (0,)
    if constants.cpu_offloading_num_layers:  # Megatron runs it at pp 1 without recompute
        pins.setdefault("pp", (1,))
        pins.setdefault("recompute", (0,))
        check_layer_offload(constants, model_spec, cluster_spec, pins["pp"],
                            tuple(RECOMPUTE_LEVELS[code] for code in pins["recompute"]))
    check_feature_precision(constants, precision)
    check_offload(constants, cluster_spec, framework,
                  tuple(RECOMPUTE_LEVELS[code] for code in pins.get("recompute", (0,))),
                  pins.get("zero", (1,)), model_spec)
    return Problem(model_spec=model_spec, cluster=cluster_spec, job=job, num_gpus=num_gpus,
                   framework=framework, objective=objective, pins=pins,
                   allow_tp_across_nodes=allow_tp_across_nodes,
                   time_constants=profile.time_constants,
                   memory_options=with_memory_savers(profile, savers).memory_options(
                       cluster=cluster_spec),
                   memory_savers=savers, recompute_module_sets=module_sets, offloads=offloads)


def solve(problem: Problem, top: int = 5, engine: str = "layout",
          time_limit_s: float | None = None, compare: bool = True,
          work_limit_s: float | None = None) -> OptimizeResult:
    """Rank the feasible configurations; explain the winner, or the infeasibility.
    Each of the problem's recompute module sets beyond the first, and each of its offloads, is
    searched apart and its plans ranked with the others, all as one search in order of bound
    (solver.search.module_variants.search_module_sets), within one budget of layout-program
    work (solver.search.program_memo.WorkBudget: `work_limit_s` of CP-SAT's deterministic
    seconds, by default 3.5, or 0.35 per second of a `time_limit_s` the user sets): where the
    budget is spent the programs left are not run (the searches not yet opened still are:
    their even splits), and the answer is then `feasible` (not proved), with a lower bound of
    the best plan's step time (OptimizeResult.step_lower_bound_s: how far from the optimum
    it may be), the same on any machine. The wall clock binds only as `time_limit_s` (None: the safety net,
    solver.search.limits), past which nothing more is run; where it fires the answer says
    so (OptimizeResult.stopped_by).

    Engines (ENGINES): "layout" (the default) searches every mesh and schedule exhaustively
    and, where a pipeline layout can still beat the incumbents, the layout program
    (solver.search.layout_search); it may stop at the time limit with status `feasible` (the
    best plans found, not proved). "even" costs every candidate with its even split of layers
    only (the exhaustive oracle, solver.search.enumerate).

    `compare`: where no listed plan goes without the winner's most surprising choice, the
    explanation finds the best plan that does with a second search (explain_choice); without
    it (sweeps) the explanation compares with the listed plans only."""
    if engine not in ENGINES:
        raise InputError(f"--engine {engine}: available engines are {', '.join(ENGINES)}")
    forget_all()  # the answer depends on the problem alone (solver.cost.row_memo)
    deadline = Deadline.for_time_limit(time_limit_s) if engine == "layout" else never()

    def open_search(variant: Problem, cutoff_s: float, prior: FirstPass | None,
                    deadline: Deadline) -> Search:
        if engine == "layout":
            return LayoutSearch(variant, top, cutoff_s, prior, deadline)
        return RankedSearch(variant, solve_by_enumeration(variant, top))

    budget = WorkBudget(work_limit_s) if work_limit_s is not None \
        else WorkBudget.for_time_limit(time_limit_s)
    merged = search_module_sets(problem, open_search, top, budget, deadline)
    stopped_by = deadline.stopped_by() if deadline.fired else (
        STOPPED_BY_WORK_LIMIT if merged.status == "feasible" else None)
    if not merged.chosen:
        return replace(_infeasible(problem, engine, merged.seconds), stopped_by=stopped_by)
    return replace(_answer(problem, merged, engine, time_limit_s, compare),
                   stopped_by=stopped_by)


def _infeasible(problem: Problem, engine: str, seconds: float) -> OptimizeResult:
    """Where no search found a plan: the constraints that conflict, and what would fix it."""
    found = find_conflicts(problem)
    conflicts = tuple(found.names)
    rules = {c.name: c.rule for c in build_constraints(problem) if c.name in conflicts}
    least = found.least_memory_bytes
    if MEMORY_CONSTRAINT in rules and least is not None:
        rules[MEMORY_CONSTRAINT] += (f"; the leanest configuration the other "
                                     f"constraints allow needs {least / 1e9:.1f} GB")
    return OptimizeResult(problem=problem, status="infeasible", engine=engine,
                          solve_seconds=seconds, num_feasible=0, plans=(),
                          conflicts=conflicts, rules=rules,
                          fixes=tuple(suggest_fixes(problem, conflicts)))


def _answer(problem: Problem, merged: Merged, engine: str, time_limit_s: float | None,
            compare: bool) -> OptimizeResult:
    """The merged top as plans, each costed through its own search's problem, and the
    winner explained by its own search (`compare`: with a second search where the problem's
    own search found the winner, explain_choice)."""
    costed: dict[tuple[int, int], tuple[Plan, StepTime]] = {}
    for searched in {id(s): s for s, _ in merged.chosen}.values():
        positions = [p for s, p in merged.chosen if s is searched]
        assert searched.ranked is not None
        pairs = cost_ranked_plans(searched.problem, take_ranked(searched.ranked, positions))
        named = searched.namer(tuple(plan for plan, _ in pairs))
        costed.update({(id(searched), p): (plan, step)
                       for p, plan, (_, step) in zip(positions, named, pairs)})
    chosen = _by_own_time(problem.objective, merged.chosen, costed)
    ranked_plans = tuple(costed[id(s), p][0] for s, p in chosen)
    winner = chosen[0][0]
    assert winner.ranked is not None
    solve_pinned = (lambda pinned: _solve_top(pinned, engine, time_limit_s)) \
        if compare and winner.problem is problem else None
    steps = [costed[id(s), p][1] for s, p in chosen]
    ranking = as_listed(merged_ranking(chosen), ranked_plans, steps)
    why = list(explain_choice(winner.problem, ranking, solve_pinned))
    # After the fit check: the memory savers the winner turns on to fit, its offloads.
    why = why[:1] + explain_savers(winner.problem, ranked_plans[0]) + explain_offloads(
        winner.problem, ranked_plans[0]) + why[1:]
    # The counts are the problem's own search's (every recompute level); no search counted
    # the feasible ones over the union.
    own = merged.own
    counted = own.ranked if own is not None and own.ranked is not None else winner.ranked
    alone = not merged.searched
    floor = None
    if problem.objective == "time":
        best = ranked_plans[0].time
        assert best is not None
        floor = best.step_seconds if merged.status == "optimal" \
            else min(best.step_seconds, merged.floor_s)
    return OptimizeResult(problem=problem, status=merged.status, engine=engine,
                          solve_seconds=merged.seconds,
                          num_feasible=counted.num_feasible if alone else None,
                          num_candidates=counted.num_candidates,
                          num_memory_checked=counted.num_memory_checked if alone else None,
                          plans=ranked_plans, why=tuple(why), step_lower_bound_s=floor)


def _by_own_time(objective: str, chosen: tuple[tuple[Searched, int], ...],
                 costed: dict[tuple[int, int], tuple[Plan, StepTime]]
                 ) -> tuple[tuple[Searched, int], ...]:
    """The merged top re-ranked by the plans' own step times: a plan that turns memory savers
    on is costed with them (solver.ranked_plans.cost_ranked_plans), its ranking time without
    (an upper bound). By time then fewer offloads (module_variants._rank_key), stable where
    they tie; a memory ranking keeps its order (savers do not move its memory)."""
    if objective != "time":
        return chosen

    def key(entry: tuple[Searched, int]) -> tuple[float, int]:
        plan = costed[id(entry[0]), entry[1]][0]
        assert plan.time is not None
        return plan.time.step_seconds, len(plan.offloads)
    return tuple(sorted(chosen, key=key))


def as_listed(ranking: Ranked, plans: tuple[Plan, ...], steps: list[StepTime]) -> Ranked:
    """`ranking` as its plans are listed, for the explanation: each plan's own configuration
    (the leanest of its twins), step time (with the memory savers it turns on) and
    worst-stage memory (under those savers), so that the why reads the table's and the
    JSON's numbers (issue 39: the why gave the winner 80.8 GB, the ranking's memory with every
    saver on, where the table said 83.1)."""
    return replace(ranking, candidates=Candidates.from_configs([p.config for p in plans]),
                   step_time=StepTime(**{f.name: np.concatenate([getattr(s, f.name)
                                                                 for s in steps])
                                         for f in fields(StepTime)}),
                   memory_bytes=np.array([p.worst_stage.total_bytes for p in plans]))


def _solve_top(problem: Problem, engine: str, time_limit_s: float | None) -> Ranked | None:
    """The best plan of `problem` with `engine` (for the explanation's comparisons), as
    `optimize` with the same pins would list it (as_listed)."""
    ranked = solve_with_layouts(problem, 1, time_limit_s)[0] if engine == "layout" \
        else solve_by_enumeration(problem, 1)
    if ranked is None:
        return None
    costed = cost_ranked_plans(problem, ranked)
    return as_listed(ranked, tuple(plan for plan, _ in costed), [step for _, step in costed])


def fewest_gpus(problem: Problem, days: float, engine: str = "layout",
                max_gpus: int = 65536) -> tuple[int, OptimizeResult] | None:
    """The fewest GPUs, a multiple of the node size, whose best plan trains the job's token
    budget within `days` (the seed's "train on 2T tokens in 30 days"); None if even max_gpus
    cannot. Doubling, then bisection over node multiples (more GPUs never train slower here
    once they fit, up to communication overheads, which the final check accounts for)."""
    if problem.job.token_budget is None:
        raise InputError("--gpus-for-days needs --token-budget (tokens to train on)")
    node = problem.cluster.gpus_per_node

    def days_with(num_gpus: int) -> tuple[float, OptimizeResult]:
        result = solve(problem.model_copy(update={"num_gpus": num_gpus}), top=1, engine=engine)
        if result.status == "infeasible":
            return float("inf"), result
        plan_time = result.plans[0].time
        assert plan_time is not None and plan_time.train_days is not None
        return plan_time.train_days, result

    low, high = 0, node
    while days_with(high)[0] > days:
        low, high = high, high * 2
        if high > max_gpus:
            return None
    while high - low > node:
        middle = (low + high) // 2 // node * node
        if middle in (low, high):
            break
        if days_with(middle)[0] <= days:
            high = middle
        else:
            low = middle
    return high, days_with(high)[1]
