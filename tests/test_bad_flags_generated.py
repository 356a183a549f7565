"""Generated bad numbers on every numeric flag (issue 19), found by walking the CLI so that a
new flag is covered: each is answered with exit status 2 and one line naming the flag; outputs
that cannot be written and `calibrate run` outside torchrun are one line too (helpers:
tests/bad_input.py)."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bad_input import (
    BAD_FLAG_VALUES,
    BAD_INTEGER_FLAG_VALUES,
    BASE_ARGS,
    GENERATED,
    assert_one_line_error,
    invoke,
)
from solver.cli import cli
from solver.cli.params import BoundedInt, FiniteFloat


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("bad-flags")


# ---- flags ------------------------------------------------------------------------------------

def numeric_options() -> list[tuple[str, str, click.Parameter]]:
    """(command path, flag, option) of every option of every command whose type is a number."""
    found = []

    def walk(command: click.Command, path: str) -> None:
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):  # the lazy group loads each command
                walk(command.get_command(ctx, name), f"{path} {name}".strip())
            return
        for param in command.params:
            kind = param.type
            numeric = isinstance(kind, (click.types.IntParamType, click.types.FloatParamType))
            if numeric or kind.__class__.__name__ in ("PinSpec", "TokenCount", "ContextLength",
                                                      "ByteSize"):
                found.append((path, max(param.opts, key=len), param))

    walk(cli, "")
    return found


NUMERIC_OPTIONS = numeric_options()


def test_every_numeric_flag_takes_the_shared_bounded_types() -> None:
    """No flag parses numbers with click's own INT / FLOAT / IntRange / FloatRange, which take
    nan, inf and integers of any size (solver.cli.params)."""
    loose = [f"{path} {flag}" for path, flag, param in NUMERIC_OPTIONS
             if isinstance(param.type, (click.types.IntParamType, click.types.FloatParamType))
             and not isinstance(param.type, (BoundedInt, FiniteFloat))]
    assert not loose, f"use solver.cli.params.BoundedInt / FiniteFloat for {loose}"
    assert {path for path, _, _ in NUMERIC_OPTIONS} <= set(BASE_ARGS), "add BASE_ARGS"


@settings(GENERATED, max_examples=250)
@given(option=st.sampled_from(NUMERIC_OPTIONS), data=st.data())
def test_a_bad_number_on_any_flag_is_one_line_naming_the_flag(
        work: Path, option: tuple[str, str, click.Parameter], data: st.DataObject) -> None:
    path, flag, param = option
    integer = not isinstance(param.type, click.types.FloatParamType)
    value = data.draw(st.sampled_from(BAD_INTEGER_FLAG_VALUES if integer else BAD_FLAG_VALUES))
    args = [*path.split(), *BASE_ARGS[path]]
    if flag in args:
        del args[args.index(flag):args.index(flag) + 2]
    if path == "optimize" and flag == "--gpus-for-days":
        args += ["--token-budget", "1T"]
    if path in ("sweep", "calibrate nccl-tests", "calibrate run", "calibrate training-log",
                "report"):
        args += ["-o", str(work / "out")]
    assert_one_line_error(invoke(*args, f"{flag}={value}"), flag)


def test_outputs_that_cannot_be_written_are_one_line(work: Path) -> None:
    unwritable = [work] + ([Path("/dev/full")] if Path("/dev/full").exists() else [])
    for output in unwritable:
        for args in (["sweep", *BASE_ARGS["sweep"]],
                     ["launch", *BASE_ARGS["launch"], "--format", "torch"],
                     ["calibrate", "nccl-tests", *BASE_ARGS["calibrate nccl-tests"]]):
            assert_one_line_error(invoke(*args, "-o", output), str(output))


def test_calibrate_run_outside_torchrun_is_one_line(work: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    result = invoke("calibrate", "run", "--cluster", "dgx-h100", "-o", work / "p.json")
    assert_one_line_error(result)
    assert "torchrun" in result.stderr or "needs torch" in result.stderr


