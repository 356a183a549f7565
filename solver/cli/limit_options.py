"""--time-limit and --work-limit: the limits of a solve (solver.search.limits), shared by
optimize and sweep."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from solver.cli.params import MAX_TIME_LIMIT_S, FiniteFloat
from solver.search.limits import DEFAULT_WORK_S, SAFETY_LIMIT_S, WORK_PER_SECOND

F = TypeVar("F", bound=Callable[..., object])


def solve_limit_options(command: F) -> F:
    """--time-limit (parameter time_limit: seconds or None) and --work-limit (work_limit:
    CP-SAT's deterministic seconds or None)."""
    command = click.option(
        "--work-limit", type=FiniteFloat(0.01, MAX_TIME_LIMIT_S), default=None,
        help=f"CP-SAT's deterministic seconds the layout programs may spend in all (default "
             f"{DEFAULT_WORK_S:g}, or {WORK_PER_SECOND:g} x --time-limit): a count of work, "
             "so an answer it ends is the same on any machine.")(command)
    return click.option(
        "--time-limit", type=FiniteFloat(0.1, MAX_TIME_LIMIT_S), default=None,
        help=f"Wall-clock seconds a solve may take (default: none, a {SAFETY_LIMIT_S:g} s "
             "safety net). Where the work or this limit ends a search the answer is "
             "'feasible', not proven, with what stopped it and how far from the optimum its "
             "best plan may be; an answer the clock cut short depends on the machine."
    )(command)
