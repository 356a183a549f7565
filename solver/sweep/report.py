"""`parplan report`: a sweep's results as tables (CSV, Markdown), plots and one HTML page.

Rows are sorted by the problem key, so the report of a file does not depend on the order in
which the sweep finished its problems. A **group** is one model under one job (seq_len,
global_batch, precision, framework, objective): its pivot table gives the configuration
chosen on each cluster at each GPU count, its plots the scaling and the memory of the winners.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solver.errors import InputError
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


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(SUMMARY_COLUMNS)
        for row in rows:
            writer.writerow([row[name] for name in SUMMARY_COLUMNS])


def _markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cells(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    return [cells(columns), "|" + "|".join(" --- " for _ in columns) + "|",
            *(cells(r) for r in rows)]


def write_markdown(rows: Sequence[dict[str, Any]], groups: Sequence[Group], path: Path) -> None:
    lines = ["# Sweep summary", "", *_markdown_table(
        MARKDOWN_COLUMNS, [build_markdown_row(r) for r in rows]), ""]
    lines += ["## Configuration chosen at each scale", ""]
    for group in groups:
        lines += [f"### {group.title}", "", *_markdown_table(*build_pivot(group)), ""]
    path.write_text("\n".join(lines), encoding="utf-8")


@dataclass(frozen=True)
class Report:
    """What `write_report` wrote: the directory, the files, the status counts, and why plots
    were skipped (None when they were drawn)."""

    directory: Path
    files: tuple[Path, ...]
    status_counts: dict[str, int]
    plots_skipped: str | None


def write_report(lines: Sequence[dict[str, Any]], directory: str | Path,
                 plots: bool = True) -> Report:
    """summary.csv, summary.md, plots/*.png (with matplotlib) and index.html in `directory`."""
    from solver.sweep.report_html import write_html

    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"-o {directory}: cannot create the report folder "
                         f"({exc.strerror})") from None
    rows = build_summary_rows(lines)
    groups = build_groups(rows)
    files = [directory / "summary.csv", directory / "summary.md"]
    write_csv(rows, files[0])
    write_markdown(rows, groups, files[1])
    figures: dict[str, list[Path]] = {}
    skipped: str | None = "not asked for (--no-plots)"
    if plots:
        from solver.sweep.plots import draw_group_plots, matplotlib_missing

        skipped = matplotlib_missing()
        if skipped is None:
            figures = {g.slug: draw_group_plots(g, directory / "plots") for g in groups}
            files += [p for paths in figures.values() for p in paths]
    files.append(write_html(rows, groups, figures, directory))
    return Report(directory, tuple(files), count_statuses(rows), skipped)


