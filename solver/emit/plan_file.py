"""Reading a plan back from the JSON that `parplan optimize --json` or `estimate --json` wrote.

DESIGN.md ("Interfaces"): a top-level object with `plans` (best first), each plan carrying the
degrees `tp pp dp cp ep etp vpp zero micro_batch recompute`; the answer also names the `model`,
`cluster`, `gpus`, `seq_len`, `global_batch` and `precision` it was made for. Every problem is
one line naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from solver.errors import InputError, format_validation_error
from solver.spec import ParallelConfig

DEGREES = tuple(ParallelConfig.model_fields)  # tp pp dp cp ep etp vpp zero micro_batch recompute
PROBLEM_FIELDS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision")


@dataclass(frozen=True)
class PlanFile:
    """The chosen plan's degrees and the problem fields the file states (absent ones omitted)."""

    path: str
    index: int
    config: ParallelConfig
    problem: dict[str, Any]


def _read_json(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"--plan {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--plan {path}: cannot read it ({exc.__class__.__name__})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--plan {path}: not JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}); give the output of `parplan optimize --json`") from None


def load_plan_file(path: str, rank: int = 1) -> PlanFile:
    """The `rank`-th plan (1 = the first, the best) of an optimize/estimate JSON file."""
    answer = _read_json(path)
    if not isinstance(answer, dict):
        raise InputError(f"{path}: field '(top level)': must be an object with 'plans', as "
                         "`parplan optimize --json` writes")
    plans = answer.get("plans")
    if not isinstance(plans, list):
        what = "required field is missing" if plans is None else "must be a list of plans"
        raise InputError(f"{path}: field 'plans': {what}")
    if not 1 <= rank <= len(plans):
        status = f" (status {answer['status']})" if "status" in answer else ""
        choose = f"; choose 1 to {len(plans)}" if plans else ""
        raise InputError(f"--rank {rank}: {path} holds {len(plans)} plan(s){status}{choose}")
    plan = plans[rank - 1]
    where = f"plans.{rank - 1}"
    if not isinstance(plan, dict):
        raise InputError(f"{path}: field '{where}': must be an object with the degrees")
    missing = [name for name in DEGREES if name not in plan]
    if missing:
        raise InputError(f"{path}: field '{where}.{missing[0]}': required field is missing")
    try:
        config = ParallelConfig.model_validate({name: plan[name] for name in DEGREES})
    except ValidationError as exc:
        raise InputError(format_validation_error(f"{path} {where}", exc)) from None
    gpus = answer.get("gpus")
    if isinstance(gpus, int) and gpus != config.num_gpus:
        raise InputError(f"{path}: field '{where}': tp x cp x pp x dp ({config.num_gpus}) "
                         f"differs from the file's gpus ({gpus})")
    problem = {name: answer[name] for name in PROBLEM_FIELDS if name in answer}
    return PlanFile(path=path, index=rank, config=config, problem=problem)
