"""`--plan FILE` of `launch` and `estimate`: one reader (solver.emit.plan_file) for a plan of
`optimize --json` / `estimate --json` (`--rank N`), a single plan object, or line N of a
`sweep -o` results file (`--line N`); the file fills the options left at their defaults, and
a degree flag beside it is refused (the file or the flags describe the plan, not both)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from solver.cli.params import MAX_TOP, BoundedInt
from solver.spec.job import ParallelConfig
from solver.spec.strict import MAX_COUNT

F = TypeVar("F", bound=Callable[..., object])
# The degree flags of `degree_options` (dp is the rest of the GPUs).
DEGREE_NAMES = tuple(name for name in ParallelConfig.model_fields if name != "dp")
# Job options a plan file fills in when they are left at their defaults.
JOB_OPTIONS = ("seq_len", "global_batch", "precision")


def plan_file_options(help_text: str) -> Callable[[F], F]:
    """--plan FILE, --rank N and --line N (parameters plan_path, plan_rank, plan_line)."""
    def decorate(command: F) -> F:
        for option in reversed([
            click.option("--plan", "plan_path", metavar="FILE", default=None, help=help_text),
            click.option("--rank", "plan_rank", type=BoundedInt(1, MAX_TOP), default=1,
                         show_default=True,
                         help="Which plan of --plan (1 = the first, the best)."),
            click.option("--line", "plan_line", type=BoundedInt(1, MAX_COUNT), default=None,
                         help="With --plan of a `sweep -o` results file: its line N (1 = the "
                              "first), one problem's answer."),
        ]):
            command = option(command)
        return command
    return decorate


def given(ctx: click.Context, name: str) -> bool:
    """Whether option `name` was given (not left at its default)."""
    return ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT


def read_plan_option(ctx: click.Context, plan_path: str | None, plan_rank: int,
                     plan_line: int | None, job_values: dict[str, Any]) -> Any:
    """The plan file's chosen plan (a PlanFile), with its job values filling the options left
    at defaults; None when degree flags describe the plan."""
    from solver.emit.plan_file import load_plan_file
    from solver.errors import InputError

    if plan_path is None:
        for name, flag in (("plan_rank", f"--rank {plan_rank}"),
                           ("plan_line", f"--line {plan_line}")):
            if given(ctx, name):
                raise InputError(f"{flag} picks a plan of --plan FILE; give --plan")
        return None
    flags = [name for name in DEGREE_NAMES if given(ctx, name)]
    if flags:
        raise InputError(f"--{flags[0].replace('_', '-')} with --plan {plan_path}: give the plan "
                         "file or degree flags, not both")
    plan_file = load_plan_file(plan_path, plan_rank, plan_line)
    for name in JOB_OPTIONS:
        if name in plan_file.problem and not given(ctx, name):
            job_values[name] = plan_file.problem[name]
    # What the plan trains (solver.spec.finetune), unless --finetune says (launch has no flag).
    stated = plan_file.problem.get("finetune")
    flagged = "finetune" in ctx.params and given(ctx, "finetune")
    if stated is not None and not flagged:
        job_values["finetune"] = parse_plan_finetune(plan_file.path, stated)
    return plan_file


def parse_plan_finetune(path: str, stated: Any) -> Any:
    """A plan file's "finetune" object (FinetuneSpec.describe) as a FinetuneSpec; a malformed one
    is one line naming the file and the field."""
    from pydantic import ValidationError

    from solver.errors import InputError, format_validation_error
    from solver.spec.finetune import FinetuneSpec

    if not isinstance(stated, dict):
        raise InputError(f"{path}: field 'finetune': an object (mode, lora_rank, ...) expected")
    fields = {name: stated[name] for name in ("mode", "lora_rank", "lora_alpha",
                                               "lora_targets", "packed_sequences")
              if name in stated}
    if isinstance(fields.get("lora_targets"), list):
        fields["lora_targets"] = tuple(fields["lora_targets"])
    try:
        return FinetuneSpec(**fields)
    except ValidationError as exc:
        raise InputError(format_validation_error(f"{path}: field 'finetune'", exc)) from None


def check_plan_problem(plan_file: Any, model_name: str, cluster_name: str,
                       num_gpus: int) -> None:
    """An InputError where a flag names another model, cluster or GPU count than the file."""
    from solver.errors import InputError

    stated = plan_file.problem
    for field, ours in (("model", model_name), ("cluster", cluster_name), ("gpus", num_gpus)):
        if field in stated and stated[field] != ours:
            raise InputError(f"{plan_file.path}: field '{field}': the plan is for "
                             f"{stated[field]}, not {ours} (--{field})")


def plan_problem_names(plan_file: Any, model: str | None, cluster: str | None,
                       num_gpus: int | None) -> tuple[str, str, int]:
    """--model, --cluster and --gpus, each from the plan file where the flag is not given."""
    from solver.errors import InputError

    stated = plan_file.problem if plan_file is not None else {}
    values = {"model": model, "cluster": cluster, "gpus": num_gpus}
    for field in values:
        if values[field] is None:
            if field not in stated:
                where = (f"{plan_file.path} names no '{field}'" if plan_file is not None
                         else "or a --plan FILE that names it")
                raise InputError(f"--{field}: required ({where})")
            values[field] = stated[field]
    if not isinstance(values["gpus"], int) or isinstance(values["gpus"], bool):
        raise InputError(f"{plan_file.path}: field 'gpus': must be a whole number, got "
                         f"{values['gpus']!r}")
    for field in ("model", "cluster"):
        if not isinstance(values[field], str):
            raise InputError(f"{plan_file.path}: field '{field}': must be a name, got "
                             f"{values[field]!r}")
    return values["model"], values["cluster"], values["gpus"]


def plan_framework_features(plan_file: Any, framework: str, flags: dict[str, Any]
                            ) -> dict[str, Any]:
    """The feature overrides under which `framework`'s profile is the one the plan was costed
    with: the file's `framework_features` that differ from the bare profile's (and any a flag
    of those moved: they must come out as the file states them), the memory
    savers and offloads the plan turned on, the module set its selective recompute chose, and
    last the feature flags given (`flags`: FrameworkFeatures.given())."""
    from solver.cost.step.frameworks import build_framework_profile
    from solver.errors import InputError

    features: dict[str, Any] = {}
    if plan_file.features is not None:
        stated = {name: list(value) if isinstance(value, tuple) else value
                  for name, value in plan_file.features.given().items()}
        # Only what differs from the profile is overridden; a feature whose flag moves another
        # (torchtitan's --fused-elementwise sets the loss) is then pinned as well.
        for _ in range(3):
            try:
                built = build_framework_profile(framework, features).features()
            except InputError as exc:
                raise InputError(f"{plan_file.path}: field 'framework_features': {exc}"
                                 ) from None
            differ = [name for name, value in stated.items() if built.get(name) != value]
            features.update({name: getattr(plan_file.features, name) for name in differ})
        # Every feature given is set as given: pinning the moved ones cannot move others.
        assert not differ, differ
    features.update({name: True for name in plan_file.memory_savers + plan_file.offloads})
    if plan_file.recompute_modules:
        features["recompute_modules"] = plan_file.recompute_modules
    return {**features, **flags}
