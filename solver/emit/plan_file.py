"""Reading a plan back from the JSON that `parplan optimize --json` or `estimate --json` wrote.

DESIGN.md ("Interfaces"): a top-level object with `plans` (best first), each plan carrying the
degrees `tp pp dp cp ep etp vpp zero micro_batch recompute`; the answer also names the `model`,
`cluster`, `gpus`, `seq_len`, `global_batch` and `precision` it was made for. A plan may carry
a `layout` (solver.spec.plan_json.render_layout_json): `pp`, `vpp`, the Megatron text `syntax`
and per virtual stage `virtual_stage stage layers recompute_layers embedding loss mtp_layers`,
and `memory_savers`: the framework features it turns on to fit (solver.spec.framework), and
`recompute_modules`: what its selective recompute recomputes where the search chose it.
Every problem is one line naming the file and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from solver.errors import InputError, format_validation_error
from solver.spec import ParallelConfig, PipelineLayout
from solver.spec.framework import MEMORY_SAVERS, OFFLOADS, RECOMPUTE_MODULES
from solver.spec.layout_syntax import max_layout_chars, parse_layout_stages
from solver.spec.strict import describe_parse_error, parse_json, read_input_file

DEGREES = tuple(ParallelConfig.model_fields)  # tp pp dp cp ep etp vpp zero micro_batch recompute
PROBLEM_FIELDS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision")
LAYOUT_FIELDS = ("pp", "vpp", "syntax", "stages")
# Fields of a virtual stage that follow from its position (v, and v % pp).
DERIVED_FIELDS = ("virtual_stage", "stage")


@dataclass(frozen=True)
class PlanFile:
    """The chosen plan's degrees and the problem fields the file states (absent ones omitted)."""

    path: str
    index: int
    config: ParallelConfig
    problem: dict[str, Any]
    layout: PipelineLayout | None = None
    memory_savers: tuple[str, ...] = ()
    recompute_modules: tuple[str, ...] = ()
    offloads: tuple[str, ...] = ()


def _read_json(path: str) -> Any:
    try:
        text = read_input_file(path).decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"--plan {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--plan {path}: cannot read it ({exc.__class__.__name__}"
                         f"{': ' + exc.strerror if getattr(exc, 'strerror', None) else ''})"
                         ) from None
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"--plan {path}: not JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}); give the output of `parplan optimize --json`") from None
    except (ValueError, RecursionError) as exc:  # an integer of 4,300 digits, deep arrays
        raise InputError(f"--plan {path}: not JSON the plan reader takes "
                         f"({describe_parse_error(exc)})") from None


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
    layout = None
    if plan.get("layout") is not None:
        layout = _read_layout(plan["layout"], path, f"{where}.layout", config)
    savers = _read_names(plan.get("memory_savers", []), path, f"{where}.memory_savers",
                         MEMORY_SAVERS, "memory saver")
    modules = _read_names(plan.get("recompute_modules", []), path,
                          f"{where}.recompute_modules", RECOMPUTE_MODULES, "recompute module")
    offloads = _read_names(plan.get("offloads", []), path, f"{where}.offloads", OFFLOADS,
                           "offload")
    return PlanFile(path=path, index=rank, config=config, problem=problem, layout=layout,
                    memory_savers=savers, recompute_modules=modules, offloads=offloads)


def _read_names(value: Any, path: str, field: str, known: tuple[str, ...], what: str
                ) -> tuple[str, ...]:
    """A plan's list of names from `known`: `memory_savers` (MEMORY_SAVERS, the features it
    turns on to fit) or `recompute_modules` (RECOMPUTE_MODULES, what selective recomputes)."""
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InputError(f"{path}: field '{field}': must be a list of names")
    unknown = [name for name in value if name not in known]
    if unknown:
        raise InputError(f"{path}: field '{field}': unknown {what} {unknown[0]!r} "
                         f"(known: {', '.join(known)})")
    return tuple(value)


def _read_layout(value: Any, path: str, field: str, config: ParallelConfig) -> PipelineLayout:
    """A plan's `layout` object (`field` is "plans.i.layout")."""
    if not isinstance(value, dict):
        raise InputError(f"{path}: field '{field}': must be an object with pp, vpp and stages")
    unknown = [name for name in value if name not in LAYOUT_FIELDS]
    if unknown:
        raise InputError(f"{path}: field '{field}.{unknown[0]}': unknown field (a layout has "
                         f"{', '.join(LAYOUT_FIELDS)})")
    stages = value.get("stages")
    if not isinstance(stages, list) or not all(isinstance(s, dict) for s in stages):
        raise InputError(f"{path}: field '{field}.stages': must be a list of virtual stages "
                         "(objects)")
    try:
        layout = PipelineLayout.model_validate({
            "pp": value.get("pp"), "vpp": value.get("vpp"),
            "stages": [{k: v for k, v in stage.items() if k not in DERIVED_FIELDS}
                       for stage in stages]})
    except ValidationError as exc:
        raise InputError(format_validation_error(f"{path} {field}", exc)) from None
    if (layout.pp, layout.vpp) != (config.pp, config.vpp):
        raise InputError(f"{path}: field '{field}': pp {layout.pp} x vpp {layout.vpp}, but the "
                         f"plan has pp {config.pp} x vpp {config.vpp}")
    for index, stage in enumerate(stages):
        for name, wanted in zip(DERIVED_FIELDS, (index, layout.stage_of(index))):
            if name in stage and stage[name] != wanted:
                raise InputError(f"{path}: field '{field}.stages.{index}.{name}': "
                                 f"{stage[name]!r}, but virtual stage {index} of pp {layout.pp} "
                                 f"has {name} {wanted}")
    syntax = value.get("syntax")
    if syntax is not None:
        if not isinstance(syntax, str):
            raise InputError(f"{path}: field '{field}.syntax': must be a string")
        bound = max_layout_chars(layout.num_layers, layout.stages[-1].mtp_layers,
                                 len(layout.stages))
        read = parse_layout_stages(syntax, bound, source=f"{path}: field '{field}.syntax':")
        if [(s.count("t"), "E" in s, "L" in s, s.count("m")) for s in read] != [
                (s.layers, s.embedding, s.loss, s.mtp_layers) for s in layout.stages]:
            raise InputError(f"{path}: field '{field}.syntax': {syntax!r} places the layers "
                             "otherwise than 'stages'")
    return layout
