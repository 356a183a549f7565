"""No user-facing text refers to the project's internal design documents: not the README, not
a string the program can print (every string constant in solver/ that is not a docstring),
not the help of any command (click shows command docstrings). Internal notes ("the seed",
"seed 002", "DESIGN.md") mean nothing to a user."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import click
from click.testing import CliRunner

from solver.cli import cli

ROOT = Path(__file__).resolve().parent.parent
INTERNAL = re.compile(r"\bseeds?\b|DESIGN\.md", re.IGNORECASE)


def _docstring_ids(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def test_no_printable_string_refers_to_internal_documents() -> None:
    found = []
    for path in sorted((ROOT / "solver").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = _docstring_ids(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and INTERNAL.search(node.value)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value[:80]!r}")
    assert found == []


def test_the_readme_does_not_refer_to_internal_documents() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert [line for line in lines if INTERNAL.search(line)] == []


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the lazy group loads each command here
        command = group.get_command(ctx, name)
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths += _command_paths(command, (*prefix, name))
    return paths


def test_no_help_text_refers_to_internal_documents() -> None:
    paths = [()] + _command_paths(cli)
    assert len(paths) > 10
    for path in paths:
        result = CliRunner().invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, path
        assert not INTERNAL.search(result.output), (path, INTERNAL.search(result.output))


def test_the_pattern_finds_what_it_must() -> None:
    """The check itself: it flags the phrasings that reached users before."""
    for text in ("seed 002's tree", "the seed's example", "see DESIGN.md", "the seeds' table"):
        assert INTERNAL.search(text), text
    for text in ("seeded", "seedless", "DESIGN"):
        assert INTERNAL.search(text) is None, text
