"""`--help` lists options in groups (issue 39 item 6: `optimize --help` was 148 lines of flat
options): problem, degrees and pins, search, framework features, memory features, output; each
option in exactly one, placed by the declarations it sets (solver.cli.help_groups)."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.cli.help_groups import (
    FRAMEWORK,
    MEMORY,
    OTHER,
    PINS,
    GroupedCommand,
    option_group,
)
from solver.search.space import VARIABLES
from solver.spec.features import FEATURES, MEMORY_SAVERS, OFFLOADS

COMMANDS = ("optimize", "estimate", "serve", "sweep")


def _command(name: str) -> click.Command:
    return getattr(importlib.import_module(f"solver.cli.{name}_command"), name)


def _sections(text: str) -> dict[str, list[str]]:
    """--help's sections (a line ending in ':' at the margin) and their option flags."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
            sections[current] = []
        elif current and line.startswith("  -"):
            sections[current].append(line.split()[0].rstrip(","))
    return sections


def test_optimize_help_lists_the_issues_groups() -> None:
    output = CliRunner().invoke(cli, ["optimize", "--help"]).output
    sections = _sections(output)
    assert "Options" not in sections  # no flat list
    assert list(sections) == ["Problem: model, cluster, job", "Degrees and pins", "Search",
                              "Framework features", "Memory features", "Output"]
    assert "--tp" in sections["Degrees and pins"] and "--zero" in sections["Degrees and pins"]
    assert "--grad-reduce-in-bf16" in sections["Memory features"]
    assert "--optimizer-offload" in sections["Memory features"]
    assert "--memory-headroom" in sections["Memory features"]
    assert "--attention-kernel" in sections["Framework features"]
    assert "--json" in sections["Output"] and "--model" in sections["Problem: model, cluster, job"]


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_is_in_a_named_group(name) -> None:
    command = _command(name)
    assert isinstance(command, GroupedCommand)
    ctx = click.Context(command)
    params = [p for p in command.get_params(ctx) if p.get_help_record(ctx) is not None]
    assert [p.name for p in params
            if (command.groups.get(p.name) or option_group(p.name)) == OTHER] == []
    output = CliRunner().invoke(cli, [name, "--help"]).output
    listed = sum(len(flags) for flags in _sections(output).values())
    assert listed == len(params)  # each option once


def test_groups_follow_the_declarations() -> None:
    assert all(option_group(name) == PINS for name in VARIABLES)
    assert all(option_group(name) == MEMORY for name in MEMORY_SAVERS + OFFLOADS)
    assert option_group("attention_kernel") == FRAMEWORK
    assert all(option_group(name) in (FRAMEWORK, MEMORY) for name in FEATURES)
