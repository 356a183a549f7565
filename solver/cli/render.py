"""Rendering helpers shared by the commands: deterministic JSON and rich tables."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import click


def echo_json(obj: Any) -> None:
    """Deterministic JSON on stdout (same input, same bytes)."""
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False))


def echo_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table; numbers right-aligned, width fixed when not a terminal (stable output)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=False)
    for i, name in enumerate(columns):
        numeric = rows and all(isinstance(r[i], (int, float)) for r in rows)
        table.add_column(name, justify="right" if numeric else "left", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(format_number(v) for v in row))
    stream = sys.stdout
    console = Console(file=stream, width=None if stream.isatty() else 200, highlight=False)
    console.print(table)


def format_number(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_params(count: int) -> str:
    """8030261248 -> '8.03B'."""
    if count >= 1e12:
        return f"{count / 1e12:.2f}T"
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    return f"{count / 1e6:.1f}M"
