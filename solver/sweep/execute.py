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
from typing import Protocol

from solver.sweep.outcome import Outcome, SolveSettings, describe_failure, solve_outcome
from solver.sweep.problems import SweepProblem

EXECUTORS = ("process", "ray")
PARENT_POLL_S = 0.5


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
              executor: str = "process", address: str | None = None) -> SweepRun:
    """Start solving `problems`: in this process when jobs is 1, else on `jobs` local worker
    processes, or on Ray (`executor="ray"`, an optional dependency; `address`: the cluster's,
    solver.sweep.ray_run)."""
    if executor == "ray":
        from solver.sweep.ray_run import RayRun

        return RayRun(problems, settings, jobs, address)
    if jobs <= 1 or len(problems) <= 1:
        return InProcessRun(problems, settings)
    return ProcessPoolRun(problems, settings, min(jobs, len(problems)))


def default_jobs() -> int:
    """The cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
