"""Docs that cannot drift: the README's two commands match CI, and its examples run."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.cli import cli

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()


def test_readme_starts_with_exactly_two_commands() -> None:
    install_and_run, install_and_test = (line.strip() for line in README[:2])
    assert README[2].strip() == ""
    assert "pip install" in install_and_run and "parplan " in install_and_run
    assert "pip install" in install_and_test and "pytest" in install_and_test
    assert "'.[test]'" in install_and_test


def test_ci_runs_the_readme_test_command() -> None:
    test_command = README[1].split("&&")[-1].strip().removeprefix(".venv/bin/")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert test_command in ci
    assert "pip install --quiet -e '.[test]'" in ci


def test_readme_main_command_runs() -> None:
    command = README[0].split("&&")[-1].strip()
    args = shlex.split(command)[1:]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output


EXAMPLES = [line.strip()[2:] for line in README if line.strip().startswith("$ parplan ")]


@pytest.mark.parametrize("command", EXAMPLES)
def test_readme_examples_run(command: str) -> None:
    result = CliRunner().invoke(cli, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
