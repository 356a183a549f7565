"""The parameter types of every numeric flag: bounded integers, finite floats, pins.

click's IntRange takes any integer up to its max (none by default), so `--gpus
99999999999999999999999999` reached the search and never came back; its FloatRange lets nan
through (every comparison with nan is false) and inf past an open upper end. These types refuse
booleans, nan and infinities, and integers above their `Limit` (solver.spec.strict, the limits
the specs use too), with the reason, before anything is loaded or searched.
"""

from __future__ import annotations

import math

import click

from solver.errors import InputError
from solver.spec.headroom import MemoryHeadroom, parse_memory_headroom
from solver.spec.strict import FLOAT_RANGE, MAX_COUNT, MAX_GPUS, Limit

# Limits of options that no spec holds.
MAX_TOP = Limit(100, "plans", "a longer ranking is not read")
MAX_ZERO_STAGE = Limit(3, "", "ZeRO has stages 0 to 3")
MAX_JOBS = Limit(4096, "worker processes", "more than any machine's cores")
MAX_PROBLEMS = Limit(10_000_000, "problems", "a sweep's problems are built in memory, about "
                                            "200 bytes each, before the first is solved")
MAX_TIME_LIMIT_S = 86_400.0  # a day: the layout programs of one problem
MAX_DAYS = 36_500.0  # a century of training


class BoundedInt(click.IntRange):
    """An integer from `low` (None: a spec checks the low end) up to `limit.most`; above it
    the error says why."""

    def __init__(self, low: int | None = 1, limit: Limit = MAX_COUNT) -> None:
        super().__init__(min=low, max=limit.most)
        self.limit = limit

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, bool):
            self.fail(f"{value!r} is not an integer", param, ctx)
        number = click.INT.convert(value, param, ctx)
        if self.min is not None and number < self.min:
            self.fail(f"{number} is below {self.min}", param, ctx)
        problem = self.limit.check(number)
        if problem is not None:
            self.fail(problem, param, ctx)
        return number


class FiniteFloat(click.FloatRange):
    """A finite float (no nan, no inf) inside the given range and, like every float of a spec,
    0 or of a magnitude inside FLOAT_RANGE."""

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number", param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        low, high = FLOAT_RANGE
        if number and not low <= abs(number) <= high:
            self.fail(f"{value!r} is outside what it can be (0, or a magnitude between {low:g} "
                      f"and {high:g})", param, ctx)
        return super().convert(number, param, ctx)


class PinSpec(click.ParamType):
    """A pin: one value (8), a range (1-4) or a list (1,2,4), each from `low` to `limit.most`."""

    name = "N|A-B|A,B"

    def __init__(self, low: int = 0, limit: Limit = MAX_GPUS) -> None:
        self.low, self.limit = low, limit

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        text = str(value).replace(" ", "")
        try:
            if "-" in text:
                low, high = (int(x) for x in text.split("-", 1))
                if low > high or high - low > 1_000_000:
                    raise ValueError
                values = tuple(range(low, high + 1))
            else:
                values = tuple(int(x) for x in text.split(","))
        except ValueError:  # also an integer of more than 4,300 digits
            self.fail(f"{value!r} is not a value, a range A-B or a list A,B,C", param, ctx)
        if not values or min(values) < self.low:
            what = "non-negative values" if self.low == 0 else f"values of {self.low} or more"
            self.fail(f"{value!r} must hold {what}", param, ctx)
        problem = self.limit.check(max(values))
        if problem is not None:
            self.fail(problem, param, ctx)
        return values


class MemoryHeadroomParam(FiniteFloat):
    """--memory-headroom: auto (None), a share (10%, 0.1) or decimal GB (4GB), parsed by
    solver.spec.headroom.parse_memory_headroom (a FiniteFloat, so that the generated bad-flag
    tests try it with every bad number)."""

    name = "auto|SHARE|GB"

    def __init__(self) -> None:
        super().__init__(0.0, 1.0)

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> MemoryHeadroom | None:  # type: ignore[override]
        if isinstance(value, MemoryHeadroom):
            return value
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a share or GB", param, ctx)
        try:
            return parse_memory_headroom(str(value))
        except InputError as exc:
            self.fail(str(exc).removeprefix("--memory-headroom "), param, ctx)
