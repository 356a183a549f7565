"""Reading a plan back from the JSON that `parplan optimize --json` or `estimate --json` wrote.

DESIGN.md ("Interfaces"): a top-level object with `plans` (best first), each plan carrying the
degrees `tp pp dp cp ep etp vpp zero micro_batch recompute`; the answer also names the `model`,
`cluster`, `gpus`, `seq_len`, `global_batch` and `precision` it was made for. A plan may carry
a `layout` (solver.spec.plan_json.render_layout_json): `pp`, `vpp`, the Megatron text `syntax`
and per virtual stage `virtual_stage stage layers recompute_layers embedding loss mtp_layers`,
and `memory_savers`: the framework features it turns on to fit (solver.spec.framework), and
`recompute_modules`: what its selective recompute recomputes where the search chose it.
The answer also names the `framework`, its `framework_features` (FrameworkProfile.features)
and the `memory_headroom` the plans were costed with, which `estimate --plan` reuses.

What a file may hold (one reader for `launch --plan` and `estimate --plan`): the whole answer
(the plan is picked with `--rank N`, 1 = the best), a single plan object (`jq '.plans[0]'`:
no problem fields, so --model, --cluster and --gpus are given again), or a `sweep -o` results
file, one answer per line (`--line N` picks the line, 1 = the first; messages name
`file:N`). Every problem is one line naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from pydantic import ValidationError

from solver.errors import InputError, format_validation_error
from solver.spec import ParallelConfig, PipelineLayout
from solver.spec.features import FEATURES, MEMORY_SAVERS, OFFLOADS, FrameworkFeatures
from solver.spec.framework import RECOMPUTE_MODULES
from solver.spec.job import FRAMEWORKS
from solver.spec.layout_syntax import max_layout_chars, parse_layout_stages
from solver.spec.profiles import profile_names, resolve_profile
from solver.spec.strict import describe_parse_error, parse_json, read_input_file

DEGREES = tuple(ParallelConfig.model_fields)  # tp pp dp cp ep etp vpp zero micro_batch recompute
PROBLEM_FIELDS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision", "finetune")
LAYOUT_FIELDS = ("pp", "vpp", "syntax", "stages")
# Fields of a virtual stage that follow from its position (v, and v % pp).
DERIVED_FIELDS = ("virtual_stage", "stage")


@dataclasses.dataclass(frozen=True)
class PlanFile:
    """The chosen plan's degrees and the problem fields the file states (absent ones omitted);
    `path` is the file, or "file:N" for line N of a results file (what messages name)."""

    path: str
    index: int
    config: ParallelConfig
    problem: dict[str, Any]
    layout: PipelineLayout | None = None
    memory_savers: tuple[str, ...] = ()
    recompute_modules: tuple[str, ...] = ()
    offloads: tuple[str, ...] = ()
    # The answer's framework and features it was costed with, and its memory headroom label
    # (None where the file states none: a single plan object, an older file).
    framework: str | None = None
    features: FrameworkFeatures | None = None
    memory_headroom: str | None = None
    # The plan's field in the file ("plans.0"; "" where the file is the plan), for messages.
    where: str = ""


def _read_json(path: str, line: int | None = None) -> tuple[Any, str]:
    """The JSON of the file, or of its line `line` (1 = the first), and the name messages
    give it ("file" or "file:N")."""
    try:
        text = read_input_file(path).decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"--plan {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"--plan {path}: cannot read it ({exc.__class__.__name__}"
                         f"{': ' + exc.strerror if getattr(exc, 'strerror', None) else ''})"
                         ) from None
    source = path
    if line is not None:
        lines = text.splitlines()
        if not 1 <= line <= len(lines):
            raise InputError(f"--line {line}: {path} has {len(lines)} line(s)")
        text, source = lines[line - 1], f"{path}:{line}"
    try:
        return parse_json(text), source
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data" and line is None:
            raise InputError(f"--plan {path}: holds more than one JSON value (line "
                             f"{exc.lineno}); for a `sweep -o` results file, one answer per "
                             "line, choose the line with --line N") from None
        raise InputError(f"--plan {source}: not JSON ({exc.msg} at line {exc.lineno} column "
                         f"{exc.colno}); give the output of `parplan optimize --json`") from None
    except (ValueError, RecursionError) as exc:  # an integer of 4,300 digits, deep arrays
        raise InputError(f"--plan {source}: not JSON the plan reader takes "
                         f"({describe_parse_error(exc)})") from None


def load_plan_file(path: str, rank: int = 1, line: int | None = None) -> PlanFile:
    """The `rank`-th plan (1 = the first, the best) of an optimize/estimate JSON file, of
    line `line` of a sweep's results file, or the file's single plan object."""
    answer, path = _read_json(path, line)
    if not isinstance(answer, dict):
        raise InputError(f"{path}: field '(top level)': must be an object with 'plans', as "
                         "`parplan optimize --json` writes")
    if "plans" not in answer and all(name in answer for name in DEGREES):
        return _read_plan(answer, path, rank, "", {})
    plans = answer.get("plans")
    if not isinstance(plans, list):
        what = "required field is missing" if plans is None else "must be a list of plans"
        raise InputError(f"{path}: field 'plans': {what}")
    if not 1 <= rank <= len(plans):
        status = f" (status {answer['status']})" if "status" in answer else ""
        choose = f"; choose 1 to {len(plans)}" if plans else ""
        raise InputError(f"--rank {rank}: {path} holds {len(plans)} plan(s){status}{choose}")
    framework, features = _read_framework(answer, path)
    plan_file = _read_plan(plans[rank - 1], path, rank, f"plans.{rank - 1}", answer)
    return dataclasses.replace(plan_file, framework=framework, features=features)


def _read_plan(plan: Any, path: str, rank: int, where: str, answer: dict[str, Any]
               ) -> PlanFile:
    """The plan object at field `where` ("plans.i", or "" for a file that is one plan)."""
    if rank != 1 and not where:
        raise InputError(f"--rank {rank}: {path} is a single plan; choose 1")
    if not isinstance(plan, dict):
        raise InputError(f"{path}: field '{where}': must be an object with the degrees")
    prefix = f"{where}." if where else ""
    missing = [name for name in DEGREES if name not in plan]
    if missing:
        raise InputError(f"{path}: field '{prefix}{missing[0]}': required field is missing")
    try:
        config = ParallelConfig.model_validate({name: plan[name] for name in DEGREES})
    except ValidationError as exc:
        raise InputError(format_validation_error(f"{path} {where}".strip(), exc)) from None
    gpus = answer.get("gpus")
    if isinstance(gpus, int) and gpus != config.num_gpus:
        raise InputError(f"{path}: field '{where}': tp x cp x pp x dp ({config.num_gpus}) "
                         f"differs from the file's gpus ({gpus})")
    problem = {name: answer[name] for name in PROBLEM_FIELDS if name in answer}
    # The plan's own headroom label (every plan of an answer carries it), else the answer's.
    headroom = plan.get("memory_headroom", answer.get("memory_headroom"))
    if headroom is not None and not isinstance(headroom, str):
        raise InputError(f"{path}: field '{prefix}memory_headroom': must be a label like 10% "
                         f"or 4 GB, got {headroom!r}")
    layout = None
    if plan.get("layout") is not None:
        layout = _read_layout(plan["layout"], path, f"{prefix}layout", config)
    savers = _read_names(plan.get("memory_savers", []), path, f"{prefix}memory_savers",
                         MEMORY_SAVERS, "memory saver")
    modules = _read_names(plan.get("recompute_modules", []), path,
                          f"{prefix}recompute_modules", RECOMPUTE_MODULES, "recompute module")
    offloads = _read_names(plan.get("offloads", []), path, f"{prefix}offloads", OFFLOADS,
                           "offload")
    return PlanFile(path=path, index=rank, config=config, problem=problem, layout=layout,
                    memory_savers=savers, recompute_modules=modules, offloads=offloads,
                    memory_headroom=headroom, where=where)


def _read_framework(answer: dict[str, Any], path: str
                    ) -> tuple[str | None, FrameworkFeatures | None]:
    """The answer's `framework` (one of FRAMEWORKS, or the framework a sweep line's release
    profile runs) and `framework_features` (FEATURES and their values, as
    FrameworkProfile.features writes them), each None where absent."""
    framework = answer.get("framework")
    if framework is not None and framework not in FRAMEWORKS:
        if framework not in profile_names():
            raise InputError(f"{path}: field 'framework': unknown framework {framework!r} "
                             f"(known: {', '.join(FRAMEWORKS)})")
        # A sweep line's key names the release profile it was solved under
        # (megatron-bridge@26.02); its framework_features hold the release's features.
        framework = resolve_profile(framework).framework
    values = answer.get("framework_features")
    if values is None:
        return framework, None
    if not isinstance(values, dict):
        raise InputError(f"{path}: field 'framework_features': must be an object of feature "
                         "values")
    unknown = [name for name in values if name not in FEATURES]
    if unknown:
        raise InputError(f"{path}: field 'framework_features.{unknown[0]}': unknown feature "
                         f"(known: {', '.join(FEATURES)})")
    try:
        features = FrameworkFeatures.model_validate(values)
    except ValidationError as exc:
        raise InputError(format_validation_error(f"{path} framework_features", exc)) from None
    return framework, features


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
