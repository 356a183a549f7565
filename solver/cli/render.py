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


def echo_infeasible(result: Any, what_to_change: str) -> None:
    """The clashing constraints with their rules, then the fixes (or what to change)."""
    click.echo(f"infeasible ({result.solve_seconds:.2f} s): these constraints cannot hold "
               "together:")
    for name in result.conflicts:
        click.echo(f"  {name}: {result.rules.get(name, '')}")
    if result.fixes:
        click.echo("fixes: " + "; ".join(result.fixes))
    else:
        click.echo(f"no single fix found: change {what_to_change}")


def echo_ranked(result: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                note: str | None = None) -> None:
    """The ranked plans as a table titled with how they were found, a note on the table, then
    the why."""
    if result.num_feasible is not None:
        counted = f"of {result.num_feasible:,} feasible plans"
    elif result.num_memory_checked is not None:  # memory checked as far as the top needed
        counted = (f"of {result.num_candidates:,} plans meeting every rule but memory, "
                   f"memory checked on the {result.num_memory_checked:,} fastest")
    else:  # the layout search: bounds decided which candidates needed a layout program
        counted = f"of {result.num_candidates:,} plans meeting every rule but memory"
    echo_table(f"top {len(rows)} {counted} ({result.status}, {result.engine}, "
               f"{result.solve_seconds:.2f} s)", columns, rows)
    if note:
        click.echo(note)
    click.echo("why:")
    for line in result.why:
        click.echo(f"  {line}")
