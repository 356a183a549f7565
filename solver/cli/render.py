"""Rendering helpers shared by the commands: deterministic JSON and rich tables."""

from __future__ import annotations

import errno
import os
import json
import sys
from collections.abc import Sequence
from typing import Any

import click

from solver.search.limits import STOPPED_BY_WORDS


def echo_json(obj: Any) -> None:
    """Deterministic JSON on stdout (same input, same bytes)."""
    click.echo(json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False))


# Off a terminal (a file, a pipe, CI logs) a table is printed at its natural width, nothing
# cut or wrapped, so the output is stable; a table wider than this that has short labels
# (the per-stage memory) prints them instead, compact.
PLAIN_WIDTH = 100
# A table cell or a line that says a plan cannot run: red on a terminal, plain elsewhere.
ALERT_STYLE = "bold red"


def make_console(err: bool = False, width: int = PLAIN_WIDTH) -> Any:
    """A rich Console on stdout (stderr): the terminal's width and colours on a terminal;
    off one, `width` columns and no colour (NO_COLOR is honoured by rich as well)."""
    from rich.console import Console

    stream = sys.stderr if err else sys.stdout
    console = Console(file=stream, width=None if stream.isatty() else width, highlight=False)
    console.on_broken_pipe = _raise_broken_pipe  # rich's own exits 1 without a word
    return console


def _raise_broken_pipe() -> None:
    """A closed pipe is an output error like any other (solver.cli answers it in one line)."""
    raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _natural_width(table: Any) -> int:
    from rich.console import Console

    console = Console(width=10_000)
    return int(console.measure(table).maximum)


def _build_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                 compact: bool = False) -> Any:
    """The rich table; `compact`: no vertical rules and one space between columns. Title,
    headers and cells are plain Text, never console markup: a name from a file (a tier named
    `[/x]` raised MarkupError; `[link=URL]` printed a terminal hyperlink) shows as written."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    if compact:
        table = Table(title=Text(title), title_justify="left", box=box.SIMPLE_HEAD,
                      padding=(0, 0))
    else:
        table = Table(title=Text(title), title_justify="left", show_lines=False)
    for i, name in enumerate(columns):
        numeric = rows and all(isinstance(r[i], (int, float)) for r in rows)
        # A cell without a space cannot wrap: the column keeps its width, the others wrap.
        whole = i == 0 or all(" " not in format_number(r[i]) for r in rows)
        table.add_column(Text(name), justify="right" if numeric else "left", no_wrap=whole,
                         overflow="fold")
    for row in rows:
        table.add_row(*(Text("no", style=ALERT_STYLE) if v is False else Text(format_number(v))
                        for v in row))
    return table


def echo_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
               short_columns: Sequence[str] | None = None,
               narrow: tuple[Sequence[str], Sequence[Sequence[Any]], str] | None = None
               ) -> None:
    """A rich table; numbers right-aligned to the precision they carry, `False` cells (does
    not fit) as a red "no". `short_columns`: labels for when the table is wider than the
    console (a file: PLAIN_WIDTH), in a compact table followed by a line spelling out the
    shortened ones. `narrow`: (columns, rows, legend) of another layout of the same table
    (merged cells) for a terminal narrower than the table, printed compact with its legend,
    so that nothing is cut. A title wider than the table is a line of its own (a table wraps
    its title)."""
    natural = _natural_width(_build_table(title, columns, rows))
    console = make_console(width=natural)
    limit = console.width if console.is_terminal else PLAIN_WIDTH
    if narrow is not None and console.is_terminal and natural > limit:
        narrow_columns, narrow_rows, legend = narrow
        _print_titled(console, title, _build_table("", narrow_columns, narrow_rows,
                                                   compact=True))
        console.print(legend, markup=False)
        return
    if short_columns is not None and natural > limit:
        table = _build_table(title, short_columns, rows, compact=True)
        console = make_console(width=max(PLAIN_WIDTH, _natural_width(table)))
        console.print(table)
        console.print("; ".join(f"{short}: {full}" for short, full in zip(short_columns, columns)
                                if short != full), markup=False)
        return
    _print_titled(console, title, _build_table("", columns, rows))


def _print_titled(console: Any, title: str, table: Any) -> None:
    """`table` (untitled) under `title`, the title a line of its own where it is wider than
    the table, which would wrap it."""
    from rich.text import Text

    if len(title) > min(_natural_width(table), console.width):
        console.print(Text(title), soft_wrap=True)
    else:
        table.title = Text(title)
    console.print(table)


def echo_alert(text: str, err: bool = False) -> None:
    """A line that says something cannot run (does not fit, infeasible): red on a terminal."""
    from rich.text import Text

    make_console(err).print(Text(text, style=ALERT_STYLE), soft_wrap=True)


def format_number(value: Any) -> str:
    """yes/no, integers with thousands separators, floats to three significant figures
    (solver.spec.figures: 80.0, not 80.00)."""
    from solver.spec.figures import format_significant

    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format_significant(value)
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
    echo_alert(f"infeasible ({result.solve_seconds:.2f} s): these constraints cannot hold "
               "together:")
    for name in result.conflicts:
        click.echo(f"  {name}: {result.rules.get(name, '')}")
    if result.fixes:
        click.echo("fixes: " + "; ".join(result.fixes))
    else:
        click.echo(f"no single fix found: change {what_to_change}")


def echo_ranked(result: Any, columns: Sequence[str], rows: Sequence[Sequence[Any]],
                note: str | None = None,
                narrow: tuple[Sequence[str], Sequence[Sequence[Any]], str] | None = None
                ) -> None:
    """The ranked plans as a table titled with how they were found (`narrow`: its layout
    for a narrow terminal, echo_table), a note on the table, then the why."""
    if result.num_feasible is not None:
        counted = f"of {result.num_feasible:,} feasible plans"
    elif result.num_memory_checked is not None:  # memory checked as far as the top needed
        counted = (f"of {result.num_candidates:,} plans meeting every rule but memory, "
                   f"memory checked on the {result.num_memory_checked:,} fastest")
    else:  # the layout search: bounds decided which candidates needed a layout program
        counted = f"of {result.num_candidates:,} plans meeting every rule but memory"
    status = result.status
    gap = getattr(result, "optimality_gap", None)
    stopped = STOPPED_BY_WORDS.get(getattr(result, "stopped_by", None) or "")
    if stopped:
        status += f", stopped by {stopped}"
    if status.startswith("feasible") and gap is not None:
        status += (", the best proven optimal, the rest not" if gap == 0
                   else f", the best within {100 * gap:.1f}% of the optimum")
    echo_table(f"top {len(rows)} {counted} ({status}, {result.engine}, "
               f"{result.solve_seconds:.2f} s)", columns, rows, narrow=narrow)
    if note:
        click.echo(note)
    click.echo("why:")
    for line in result.why:
        click.echo(f"  {line}")
