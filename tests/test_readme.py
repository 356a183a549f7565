"""Docs that cannot drift: the README's two commands match CI, and the examples of the README
and of the docs/ pages its internals moved to run (docs/walkthrough.md is checked, output and
all, by tests/test_walkthrough.py)."""

from __future__ import annotations

import re
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


DOCS = [ROOT / "README.md"] + sorted(path for path in (ROOT / "docs").glob("*.md")
                                     if path.name != "walkthrough.md")
EXAMPLES = [line.strip()[2:] for path in DOCS
            for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip().startswith("$ parplan ")]


def test_the_docs_hold_the_examples_the_readme_had() -> None:
    """The README's internals moved to docs/ (issue 39) with their examples: 30 of them then."""
    assert len(EXAMPLES) >= 30


def test_every_docs_page_the_readme_links_exists() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)]+)\)", text)
    assert len(set(links)) >= 10
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_readme_stays_short() -> None:
    """Issue 39: the README teaches; the internals live in docs/."""
    assert len(README) < 250


@pytest.mark.parametrize("command", EXAMPLES)
def test_readme_examples_run(command: str) -> None:
    result = CliRunner().invoke(cli, shlex.split(command)[1:])
    assert result.exit_code == 0, result.output
