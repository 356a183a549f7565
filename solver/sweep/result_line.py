"""One line of a results file, checked before the report or a resumed sweep reads it.

A results line is the JSON of `optimize --json` plus the problem's key and the solve settings
(solver.sweep.outcome). A file can be edited by hand or damaged, so each line is checked
against the fields the report and the resume read: the key (KEY_FIELDS), the status, and per
plan the degrees and the metrics, and the optional fields it shows (why, rules,
optimality_gap, memory_headroom, min_fit_probability; a plan's memory views and their observed readings,
usable_memory_gb, time_seconds, equivalent, layout, memory_savers, offloads,
recompute_modules, and issue 36's intervals, fit_probability and p_fastest), in pydantic's
strict mode and within the limits of any input (solver.spec.strict: no `true` for a GPU
count, no string for a number, no nan or infinity, no count beyond its limit; other fields
are kept as they are).
A bad line is one error naming the file, the line and the field: `results.jsonl:3: field
'plans': Input should be a valid list`.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    NonNegativeFloat,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from solver.errors import InputError, format_validation_error
from solver.spec.features import MEMORY_SAVERS, OFFLOADS
from solver.spec.framework import RECOMPUTE_MODULES
from solver.spec.strict import (
    MAX_BATCH,
    MAX_SEQ_LEN,
    GpuCount,
    InputSpec,
    describe_parse_error,
    parse_json,
)

STATUSES = ("optimal", "feasible", "infeasible", "error")
KNOWN_NAMES = {"memory_savers": MEMORY_SAVERS, "offloads": OFFLOADS,
               "recompute_modules": RECOMPUTE_MODULES}


class _Line(InputSpec):
    model_config = ConfigDict(frozen=True, extra="allow", strict=True, allow_inf_nan=False)


class MemoryRow(_Line):
    """A plan's `memory_gb`: decimal GB per item (the tables show the total, the plots the
    items)."""

    weights: float = Field(default=0.0, ge=0)
    grads: float = Field(default=0.0, ge=0)
    optimizer: float = Field(default=0.0, ge=0)
    activations: float = Field(default=0.0, ge=0)
    other: float = Field(default=0.0, ge=0)
    total: float = Field(ge=0)


class EquivalentRow(_Line):
    """One of a plan's `equivalent` settings (the same step time): the report names its
    recompute."""

    recompute: str


class LayoutRow(_Line):
    """A plan's pipeline `layout`: the report shows and launches its Megatron `syntax`."""

    syntax: str | None = None


Interval = Annotated[list[NonNegativeFloat], Field(min_length=2, max_length=2)]


class PlanRow(_Line):
    """The fields of a plan the report reads; the optional ones as `optimize --json` writes
    them (solver.spec.plan_json), or absent, or null."""

    tp: GpuCount = Field(gt=0)
    pp: GpuCount = Field(gt=0)
    dp: GpuCount = Field(gt=0)
    cp: GpuCount = Field(gt=0)
    ep: GpuCount = Field(gt=0)
    etp: GpuCount = Field(gt=0)
    vpp: GpuCount = Field(gt=0)
    zero: int = Field(ge=0, le=3)
    micro_batch: Annotated[int, MAX_BATCH] = Field(gt=0)
    recompute: str
    memory_gb: MemoryRow
    # The views (solver.spec.plan.MEMORY_VIEWS; device_gb is memory_gb.total): lines written
    # before issue 43 have none.
    allocated_gb: float | None = Field(default=None, ge=0)
    reserved_gb: float | None = Field(default=None, ge=0)
    device_gb: float | None = Field(default=None, ge=0)
    # The same views on the plan's GPU (solver.spec.plan.OBSERVED_VIEWS): lines written
    # before have none.
    reserved_gb_observed: float | None = Field(default=None, ge=0)
    device_gb_observed: float | None = Field(default=None, ge=0)
    gpu_memory_gb: float = Field(ge=0)
    step_seconds: float = Field(ge=0)
    tokens_per_second: float = Field(ge=0)
    tokens_per_second_per_gpu: float = Field(ge=0)
    mfu: float = Field(ge=0)
    usable_memory_gb: float | None = Field(default=None, ge=0)
    time_seconds: dict[str, NonNegativeFloat] | None = None
    equivalent: list[EquivalentRow] | None = None
    layout: LayoutRow | None = None
    memory_savers: list[str] | None = None
    offloads: list[str] | None = None
    recompute_modules: list[str] | None = None
    # Issue 36 (solver.cost.uncertainty): [low, high] intervals, the chance the plan fits and
    # that it is the fastest of its line; lines written before have none.
    step_seconds_interval: Interval | None = None
    tokens_per_second_per_gpu_interval: Interval | None = None
    memory_gb_interval: Interval | None = None
    fit_probability: float | None = Field(default=None, ge=0, le=1)
    p_fastest: float | None = Field(default=None, ge=0, le=1)
    tied_with_best: bool | None = None

    @field_validator("memory_savers", "offloads", "recompute_modules")
    @classmethod
    def _check_names(cls, names: list[str] | None, info: ValidationInfo) -> list[str] | None:
        # The report's launch line turns each name into a flag (`--` + name): only the
        # features parplan knows (solver.spec.framework), so that a name like "model=x" cannot
        # become another option of the line.
        known = KNOWN_NAMES[info.field_name or ""]
        unknown = [name for name in names or [] if name not in known]
        if unknown:
            raise ValueError(f"'{unknown[0]}' is not one of {', '.join(known)}")
        return names


class ResultLine(_Line):
    """The fields of a results line the report and the resume read."""

    model: str
    cluster: str
    gpus: GpuCount = Field(gt=0)
    seq_len: Annotated[int, MAX_SEQ_LEN] = Field(gt=0)
    global_batch: Annotated[int, MAX_BATCH] = Field(gt=0)
    precision: str
    framework: str
    objective: str
    status: Literal["optimal", "feasible", "infeasible", "error"]
    plans: list[PlanRow] = []
    conflicts: list[str] = []
    fixes: list[str] = []
    error: str = ""
    why: list[str] | None = None
    rules: dict[str, str] | None = None
    optimality_gap: NonNegativeFloat | None = None
    memory_headroom: str | None = None
    # --min-fit-probability the line was solved under (absent on earlier lines: 0.5).
    min_fit_probability: float | None = Field(None, ge=0.5, lt=1.0)

    @model_validator(mode="after")
    def _solved_has_a_plan(self) -> ResultLine:
        if self.status in ("optimal", "feasible") and not self.plans:
            raise ValueError(f"a line of status {self.status} needs at least one plan")
        return self


def parse_result_line(raw: bytes, source: str) -> dict[str, Any]:
    """The JSON object of one line (`source` is "file:line"), checked (module docstring)."""
    try:
        data = parse_json(raw)
    except json.JSONDecodeError as exc:
        raise InputError(f"{source}: not JSON ({exc.msg} at column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8, 4,300 digits, deep arrays
        raise InputError(f"{source}: not JSON ({describe_parse_error(exc)})") from None
    if not isinstance(data, dict):
        raise InputError(f"{source}: field '(top level)': must be an object, as `parplan "
                         "sweep` writes")
    try:
        ResultLine.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
    return data
