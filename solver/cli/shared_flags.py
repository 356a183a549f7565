"""Flags that several planning commands share apart from the common planning options
(solver.cli.options): the memory headroom, and the exit status scripts may ask for."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from solver.cli.params import FiniteFloat, MemoryHeadroomParam

F = TypeVar("F", bound=Callable[..., object])
# The exit status of --fail-on-infeasible (2 is bad input, 1 an unexpected failure).
INFEASIBLE_EXIT = 3


def memory_headroom_option(command: F) -> F:
    """--memory-headroom (parameter memory_headroom: a MemoryHeadroom or None)."""
    return click.option(
        "--memory-headroom", type=MemoryHeadroomParam(), default=None,
        help="GPU memory every plan leaves free: auto (the default for training: the share "
             "the memory model's error asks a plan to leave for it to fit with >= 90% "
             "probability, stated in the output's 'memory:' line; serving: none beyond the "
             "engine's memory share), a share (10% or 0.1), decimal GB (4GB), or 0 (none); "
             "plans must fit the GPU's memory less this.")(command)


def fail_on_infeasible_option(command: F) -> F:
    """--fail-on-infeasible (parameter fail_on_infeasible)."""
    return click.option(
        "--fail-on-infeasible", is_flag=True,
        help=f"Exit with status {INFEASIBLE_EXIT} when no plan is feasible (the answer and "
             "its explanation are printed first); default: status 0.")(command)


def exit_if_infeasible(infeasible: bool, fail_on_infeasible: bool) -> None:
    """Leave with INFEASIBLE_EXIT when asked to and the answer is infeasible."""
    if infeasible and fail_on_infeasible:
        sys.exit(INFEASIBLE_EXIT)


def interval_level_option(command: F) -> F:
    """--interval-level (parameter interval_level): the two-sided level of every interval."""
    return click.option(
        "--interval-level", type=FiniteFloat(0.5, 0.99), default=0.8, show_default=True,
        help="Level of the intervals on step time, throughput and memory (and serving's "
             "TTFT, TPOT, throughput), from the error model of the public runs "
             "(benchmarks/error_model.py).")(command)



def min_fit_probability_option(command: F) -> F:
    """--min-fit-probability (parameter min_fit_probability; None: the default 0.9)."""
    return click.option(
        "--min-fit-probability", type=FiniteFloat(0.5, 0.99), default=None,
        help="The chance plans must fit with under the memory error model: the default "
             "headroom (--memory-headroom auto) is the margin that gives it (default 0.9; 0.5 "
             "is the predicted total within the GPU's memory). Not with an explicit "
             "--memory-headroom.")(command)


def check_fit_flags(memory_headroom: Any, min_fit_probability: float | None) -> None:
    """One fit rule: --min-fit-probability sizes the default headroom, so it does not go with
    a headroom the user gives."""
    if memory_headroom is not None and min_fit_probability is not None:
        from solver.errors import InputError

        raise InputError("--min-fit-probability with --memory-headroom: give one; "
                         "--min-fit-probability P sets the default headroom to the margin at "
                         "which plans fit with P, --memory-headroom replaces that margin")
