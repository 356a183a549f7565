"""Running a sweep on Ray (`--executor ray`, the optional extra `parplan[ray]`): the same
per-problem function as the local pool, one Ray task per problem.

`ray.init()` joins the cluster at `--address` (HOST:PORT, as `ray start --head` prints it) or
named by the RAY_ADDRESS environment variable, or starts a local instance with `jobs` CPUs; the
nodes of a cluster need parplan installed. Results come back to this process, which alone
writes the results file, so progress, resume and the lines are the local executor's
(tests/test_ray_cluster.py checks them against a head and two workers started apart).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

from solver.errors import InputError
from solver.runtime import tune_allocator
from solver.sweep.outcome import Outcome, SolveSettings, describe_failure, solve_outcome
from solver.sweep.problems import SweepProblem


def _solve_in_ray_worker(problem: SweepProblem, settings: SolveSettings) -> Any:
    """solve_outcome in a Ray worker, with the allocator settings the local workers inherit
    from the CLI (solver.runtime)."""
    tune_allocator()
    return solve_outcome(problem, settings)


def import_ray() -> Any:
    """The ray module, or the InputError that says how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError("--executor ray: ray is not installed (pip install 'parplan[ray]')"
                         ) from None
    return ray


class RayRun:
    """Every problem submitted as a Ray task; outcomes as tasks finish."""

    def __init__(self, problems: Sequence[SweepProblem], settings: SolveSettings,
                 jobs: int, address: str | None = None) -> None:
        ray = self._ray = import_ray()
        self._started_ray = not ray.is_initialized()
        if self._started_ray:
            joined = address is not None or "RAY_ADDRESS" in os.environ
            try:
                ray.init(address=address, num_cpus=None if joined else jobs,
                         include_dashboard=False, log_to_driver=False)
            except ConnectionError as exc:  # no cluster there: the user's address
                raise InputError(f"--address {address or os.environ.get('RAY_ADDRESS')}: no "
                                 f"Ray cluster answers there ({' '.join(str(exc).split())})"
                                 ) from None
        task = ray.remote(num_cpus=1)(_solve_in_ray_worker)
        self._pending = {task.remote(problem, settings): problem for problem in problems}

    def __iter__(self) -> Iterator[Outcome]:
        ray = self._ray
        while self._pending:
            # Block for one, then take every other finished task in the same pass.
            ray.wait(list(self._pending), num_returns=1)
            done, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)
            for ref in done:
                problem = self._pending.pop(ref)
                try:
                    yield ray.get(ref)
                except Exception as exc:  # noqa: BLE001 (a task or node died: reported)
                    yield Outcome(problem, None, describe_failure(exc))

    def close(self) -> None:
        for ref in self._pending:
            self._ray.cancel(ref)
        self._pending.clear()
        if self._started_ray:
            self._ray.shutdown()

