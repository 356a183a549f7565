"""Solving the problems of a sweep: one function per problem (`solve_sweep_problem`), run in
this process (`jobs=1`), on the local cores (a process pool) or on Ray, all through the same
interface: start a run, iterate its outcomes in completion order, close it.

An infeasible problem is an answer (status `infeasible`); a problem the user's input makes
impossible (an InputError, e.g. fp8 on a GPU without fp8) is an answer too, with status
`error` and the message, so that one bad combination never stops a sweep of thousands. An
unexpected exception (a bug, a worker killed by the OS) is not an answer: its outcome carries
the failure and no line, and a rerun tries the problem again.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Protocol

from solver.errors import ParplanError
from solver.optimize import build_problem, render_result_json, solve
from solver.sweep.problems import SweepProblem

EXECUTORS = ("process", "ray")
PARENT_POLL_S = 0.5


@dataclass(frozen=True)
class SolveSettings:
    """How every problem of a sweep is solved (written on each line)."""

    top: int = 5
    engine: str = "layout"
    time_limit_s: float = 10.0

    def as_line_fields(self) -> dict[str, Any]:
        return {"engine": self.engine, "top": self.top,
                "time_limit_seconds": self.time_limit_s}


@dataclass(frozen=True)
class Outcome:
    """What became of one problem: its results line, or the failure that prevented one."""

    problem: SweepProblem
    line: dict[str, Any] | None
    failure: str | None = None


def solve_sweep_problem(problem: SweepProblem, settings: SolveSettings) -> dict[str, Any]:
    """One results line: the problem's key, the solve settings and the `optimize` JSON
    (status, solve_seconds, plans, conflicts and fixes when infeasible), or status `error`
    and the message of the project error the problem raised."""
    start = time.perf_counter()
    try:
        built = build_problem(problem.model, problem.cluster, problem.gpus,
                              seq_len=problem.seq_len, global_batch=problem.global_batch,
                              precision=problem.precision, framework=problem.framework,
                              objective=problem.objective)
        result = solve(built, top=settings.top, engine=settings.engine,
                       time_limit_s=settings.time_limit_s)
    except ParplanError as exc:
        return {"status": "error", "error": str(exc),
                "solve_seconds": round(time.perf_counter() - start, 3),
                **problem.as_dict(), **settings.as_line_fields(), "plans": []}
    line = render_result_json(result)
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


class SweepRun(Protocol):
    """A started run: iterate outcomes as problems finish, then close."""

    def __iter__(self) -> Iterator[Outcome]: ...

    def close(self) -> None: ...


class InProcessRun:
    """One problem after the other in this process (`--jobs 1`; the serial baseline)."""

    def __init__(self, problems: Sequence[SweepProblem], settings: SolveSettings) -> None:
        self._problems, self._settings = list(problems), settings

    def __iter__(self) -> Iterator[Outcome]:
        for problem in self._problems:
            yield solve_outcome(problem, self._settings)

    def close(self) -> None:
        pass


class ProcessPoolRun:
    """Every problem submitted at once to `jobs` worker processes (forked on Linux, so they
    start with the solver already imported); the pool starts before the caller starts any
    thread (a progress bar), which keeps fork safe."""

    def __init__(self, problems: Sequence[SweepProblem], settings: SolveSettings,
                 jobs: int) -> None:
        import multiprocessing

        context = multiprocessing.get_context("fork" if sys.platform == "linux" else None)
        self._pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context,
                                         initializer=_exit_with_parent,
                                         initargs=(os.getpid(),))
        self._futures = {self._pool.submit(solve_outcome, problem, settings): problem
                         for problem in problems}

    def __iter__(self) -> Iterator[Outcome]:
        for future in as_completed(self._futures):
            try:
                yield future.result()
            except Exception as exc:  # noqa: BLE001 (a worker died: reported, not written)
                yield Outcome(self._futures[future], None, describe_failure(exc))

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _exit_with_parent(parent_pid: int) -> None:
    """Worker initializer: leave when the sweep dies (kill -9 gives a worker no signal, and an
    orphan would go on burning a core)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="parplan-parent-watch").start()


def start_run(problems: Sequence[SweepProblem], settings: SolveSettings, jobs: int,
              executor: str = "process") -> SweepRun:
    """Start solving `problems`: in this process when jobs is 1, else on `jobs` local worker
    processes, or on Ray (`executor="ray"`, an optional dependency)."""
    if executor == "ray":
        from solver.sweep.ray_run import RayRun

        return RayRun(problems, settings, jobs)
    if jobs <= 1 or len(problems) <= 1:
        return InProcessRun(problems, settings)
    return ProcessPoolRun(problems, settings, min(jobs, len(problems)))


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
