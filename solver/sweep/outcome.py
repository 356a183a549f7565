"""One sweep problem solved: the settings every problem shares, the results line of a problem,
and the outcome (the line, or the failure that prevented one). Apart from the runners
(solver.sweep.execute, solver.sweep.ray_run), which both use it, so neither imports the other.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from solver.cost.uncertainty import (
    DEFAULT_HEADROOM_FIT_PROBABILITY,
    DEFAULT_INTERVAL_LEVEL,
    resolve_memory_headroom,
)
from solver.errors import ParplanError
from solver.optimize import build_problem, solve
from solver.optimize_counts import Pricing, check_objective, search_objective
from solver.optimize_json import render_result_json
from solver.spec.features import FrameworkFeatures
from solver.spec.headroom import AUTO, MemoryHeadroom
from solver.spec.profiles import render_profile_json, resolve_profile
from solver.sweep.problems import SweepProblem


# The solve settings lines of earlier sweeps lack, as they were solved (check_settings).
# A line of a sweep before the fit rule had no headroom: plans fit with one chance in two.
ABSENT_LINE_FIELDS = {"min_fit_probability": 0.5}


@dataclass(frozen=True)
class SolveSettings:
    """How every problem of a sweep is solved (written on each line), and the memory every
    plan leaves free on each GPU (None: `auto`, the memory model's error margin for each
    problem's framework, as `optimize` takes it)."""

    top: int = 5
    engine: str = "layout"
    # The user's wall clock (None: the safety net only) and the layout programs' work
    # (None: the default, solver.search.limits).
    time_limit_s: float | None = None
    work_limit_s: float | None = None
    memory_headroom: MemoryHeadroom | None = None
    # The level of each plan's intervals (issue 36; the line's uncertainty.interval_level).
    interval_level: float = DEFAULT_INTERVAL_LEVEL
    # Plans kept fit with at least this chance under the framework's memory error (issue 36;
    # 0.5: the predicted total within the usable memory, as optimize --min-fit-probability).
    min_fit_probability: float | None = None
    # `--price-per-gpu-hour` per cluster as named (issue 42): each line's "pricing" gives its
    # plans' $ per million tokens; not a solve setting (at one GPU count the search ranks cost
    # as time), so a file resumes under other prices.
    prices: tuple[tuple[str, float], ...] = ()

    def as_line_fields(self) -> dict[str, Any]:
        headroom = AUTO if self.memory_headroom is None else self.memory_headroom.setting()
        return {"engine": self.engine, "top": self.top,
                "time_limit_seconds": self.time_limit_s,
                "work_limit_seconds": self.work_limit_s, "memory_headroom": headroom or None,
                "min_fit_probability": self.fit_probability}

    def fit_headroom(self, framework: str) -> MemoryHeadroom:
        """The headroom a problem of `framework` is searched under: memory_headroom, else the
        memory model's error margin at min_fit_probability (resolve_memory_headroom)."""
        return resolve_memory_headroom(self.memory_headroom, framework, self.min_fit_probability)

    @property
    def fit_probability(self) -> float | None:
        """The chance the headroom is sized for (None under a headroom the user gave)."""
        if self.memory_headroom is not None:
            return None
        return (DEFAULT_HEADROOM_FIT_PROBABILITY if self.min_fit_probability is None
                else self.min_fit_probability)


@dataclass(frozen=True)
class Outcome:
    """What became of one problem: its results line, or the failure that prevented one."""

    problem: SweepProblem
    line: dict[str, Any] | None
    failure: str | None = None


def solve_sweep_problem(problem: SweepProblem, settings: SolveSettings) -> dict[str, Any]:
    """One results line: the problem's key, the solve settings and the `optimize` JSON
    (status, solve_seconds, plans, conflicts and fixes when infeasible), or status `error`
    and the message of the project error the problem raised. The `why` of a line leaves out
    the comparison with the best plan without the winner's most surprising choice: it takes a
    second search per problem (`parplan optimize` of the problem gives it)."""
    start = time.perf_counter()
    try:
        # --framework NAME@RELEASE: the release's features for the model and precision, as
        # optimize resolves them (solver.spec.profiles).
        resolved = resolve_profile(problem.framework, problem.model, problem.precision)
        built = build_problem(problem.model, problem.cluster, problem.gpus,
                              seq_len=problem.seq_len, global_batch=problem.global_batch,
                              precision=problem.precision, framework=resolved.framework,
                              objective=search_objective(problem.objective),
                              features=FrameworkFeatures(**resolved.features),
                              memory_headroom=settings.fit_headroom(resolved.framework))
        pricing = Pricing(dict(settings.prices).get(problem.cluster),
                          built.cluster.gpu.power_limit_w)
        check_objective(problem.objective, pricing, built.cluster.gpu.name)
        result = solve(built, top=settings.top, engine=settings.engine,
                       time_limit_s=settings.time_limit_s, compare=False,
                       work_limit_s=settings.work_limit_s)
    except ParplanError as exc:
        return {"status": "error", "error": str(exc),
                "solve_seconds": round(time.perf_counter() - start, 3),
                **problem.as_dict(), **settings.as_line_fields(), "plans": []}
    line = render_result_json(result, settings.interval_level)
    line["pricing"] = pricing.as_json(result.plans, built.num_gpus)
    # The profile, as optimize --json names it.
    line["framework_profile"] = render_profile_json(resolved)
    line.update(problem.as_dict())  # the names as given (a file path stays a path)
    line.update(settings.as_line_fields())
    return line


def solve_outcome(problem: SweepProblem, settings: SolveSettings) -> Outcome:
    """`solve_sweep_problem`, with an unexpected exception turned into a failed outcome."""
    try:
        return Outcome(problem, solve_sweep_problem(problem, settings))
    except Exception as exc:  # noqa: BLE001 (reported, and the sweep goes on)
        return Outcome(problem, None, describe_failure(exc))


def describe_failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:500]
