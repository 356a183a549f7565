"""`parplan report`: a sweep's results as tables (CSV, Markdown) and one interactive HTML page.

Rows are sorted by the problem key, so the report of a file does not depend on the order in
which the sweep finished its problems. A **group** is one model under one job (seq_len,
global_batch, precision, framework, objective): its pivot table gives the configuration
chosen on each cluster at each GPU count, its Pareto fronts the trade-offs between clusters
and scales (solver.sweep.report_data, report_fronts). The page (solver.sweep.report_html) is
one self-contained file: tables, filters, ranked plans, launch lines, charts.
"""

from __future__ import annotations

import csv
import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solver.errors import InputError
from solver.sweep.report_fronts import Front
from solver.sweep.tables import (
    MARKDOWN_COLUMNS,
    SUMMARY_COLUMNS,
    Group,
    build_groups,
    build_markdown_row,
    build_pivot,
    build_summary_rows,
    count_statuses,
)


# A spreadsheet reads a cell that starts with one of these as a formula (=HYPERLINK(...),
# +cmd|..., @SUM(...)) or, after a tab or carriage return, may: OWASP "CSV Injection".
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def render_csv_cell(value: Any) -> Any:
    """A summary.csv cell: text that starts like a formula gets a leading single quote, as
    OWASP's CSV Injection page advises (the spreadsheet then shows it as text); numbers and
    other text as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(SUMMARY_COLUMNS)
        for row in rows:
            writer.writerow([render_csv_cell(row[name]) for name in SUMMARY_COLUMNS])


def render_markdown_text(text: str) -> str:
    """Text for a summary.md table cell or heading, shown as written: backslashes, HTML (`<`,
    `>`, `&`: a renderer would run <img onerror=...> or show a live <a>), the cell separator `|`
    and link brackets escaped; a line break (it would end the table row) as `<br>`, GitHub
    Markdown's break inside a table cell."""
    text = html.escape(text.replace("\\", "\\\\"), quote=False)
    for char in "|[]":
        text = text.replace(char, "\\" + char)
    return "<br>".join(text.splitlines()) if text else text


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cells(values: Sequence[str]) -> str:
        return "| " + " | ".join(render_markdown_text(v) for v in values) + " |"

    return [cells(columns), "|" + "|".join(" --- " for _ in columns) + "|",
            *(cells(r) for r in rows)]


def write_markdown(rows: Sequence[dict[str, Any]], groups: Sequence[Group], path: Path) -> None:
    lines = ["# Sweep summary", "", *_markdown_table(
        MARKDOWN_COLUMNS, [build_markdown_row(r) for r in rows]), ""]
    lines += ["## Configuration chosen at each scale", ""]
    for group in groups:
        lines += [f"### {render_markdown_text(group.title)}", "",
                  *_markdown_table(*build_pivot(group)), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


DEFAULT_TOKEN_BUDGET = 1e12


@dataclass(frozen=True)
class Report:
    """What `write_report` wrote: the directory, the files, the status counts, and why the
    page has no charts (None when it has them)."""

    directory: Path
    files: tuple[Path, ...]
    status_counts: dict[str, int]
    charts_skipped: str | None


def write_report(lines: Sequence[dict[str, Any]], directory: str | Path, charts: bool = True,
                 token_budget: float = DEFAULT_TOKEN_BUDGET,
                 fronts: Sequence[Front] = ()) -> Report:
    """summary.csv, summary.md and index.html (the interactive page, with Plotly's charts when
    the `report` extra is installed and `charts`) in `directory`. `fronts`: Pareto fronts
    to draw besides each group's two (solver.sweep.report_fronts)."""
    from solver.sweep.plots import load_chart_library
    from solver.sweep.report_data import build_page_data
    from solver.sweep.report_html import write_html

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"-o {directory}: cannot create the report folder "
                         f"({exc.strerror})") from None
    # Everything is built before anything is written: a line the tables cannot show stops the
    # report with no file half written.
    rows = build_summary_rows(lines)
    groups = build_groups(rows)
    data = build_page_data(lines, groups, token_budget, fronts)
    files = [directory / "summary.csv", directory / "summary.md"]
    library, skipped = (None, "not asked for (--no-charts)")
    if charts:
        library, skipped = load_chart_library()
    data["charts_missing"] = skipped or ""
    try:  # a full disk is one line naming the folder (the page itself: whole or not at all)
        write_csv(rows, files[0])
        write_markdown(rows, groups, files[1])
        files.append(write_html(data, library, directory))
    except OSError as exc:
        raise InputError(f"-o {directory}: cannot write the report ({exc.strerror or exc})") \
            from None
    return Report(directory, tuple(files), count_statuses(rows), skipped)
