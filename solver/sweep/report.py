"""`parplan report`: a sweep's results as tables (CSV, Markdown), plots and one HTML page.

Rows are sorted by the problem key, so the report of a file does not depend on the order in
which the sweep finished its problems. A **group** is one model under one job (seq_len,
global_batch, precision, framework, objective): its pivot table gives the configuration
chosen on each cluster at each GPU count, its plots the scaling and the memory of the winners.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solver.errors import InputError
from solver.spec.plan_json import DEGREES
from solver.sweep.problems import KEY_FIELDS, key_of_line

METRICS = ("memory_gb", "step_seconds", "tokens_per_second", "tokens_per_second_per_gpu",
           "mfu")
SUMMARY_COLUMNS = KEY_FIELDS + ("status",) + DEGREES + METRICS + ("note",)
JOB_FIELDS = ("seq_len", "global_batch", "precision", "framework", "objective")


@dataclass(frozen=True)
class Group:
    """One model under one job: its rows (best plan per cluster and GPU count)."""

    model: str
    job: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        j = self.job
        return (f"{self.model}: seq {j['seq_len']}, global batch {j['global_batch']}, "
                f"{j['precision']}, {j['framework']}, objective {j['objective']}")

    @property
    def slug(self) -> str:
        text = "-".join([self.model] + [str(self.job[name]) for name in JOB_FIELDS])
        return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")


def render_config(row: dict[str, Any]) -> str:
    """`tp 8 pp 2 dp 4 zero 1 mb 1 selective`, with cp, ep, etp and vpp only when > 1."""
    if row["status"] not in ("optimal", "feasible"):
        return row["status"]
    parts = [f"tp {row['tp']}", f"pp {row['pp']}", f"dp {row['dp']}"]
    parts += [f"{name} {row[name]}" for name in ("cp", "ep", "etp", "vpp") if row[name] > 1]
    parts += [f"zero {row['zero']}", f"mb {row['micro_batch']}", str(row["recompute"])]
    return " ".join(parts)


def build_summary_rows(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per problem (the first line of a key), sorted by the key: the best plan's
    degrees and metrics, or the conflicts and fixes (infeasible) or the message (error)."""
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for line in lines:
        first.setdefault(key_of_line(line), line)
    rows = []
    for key in sorted(first):
        line = first[key]
        row: dict[str, Any] = dict(zip(KEY_FIELDS, key))
        row["status"] = line.get("status", "")
        plans = line.get("plans") or []
        best = plans[0] if plans else {}
        row.update({name: best.get(name, "") for name in DEGREES})
        row["memory_gb"] = best.get("memory_gb", {}).get("total", "") if best else ""
        row.update({name: best.get(name, "") for name in METRICS[1:]})
        row["note"] = _note(line)
        row["memory_breakdown_gb"] = best.get("memory_gb", {}) if best else {}
        row["gpu_memory_gb"] = best.get("gpu_memory_gb", "") if best else ""
        rows.append(row)
    return rows


def _note(line: dict[str, Any]) -> str:
    if line.get("status") == "infeasible":
        fixes = "; fixes: " + ", ".join(line["fixes"]) if line.get("fixes") else ""
        return "conflicts: " + ", ".join(line.get("conflicts", [])) + fixes
    if line.get("status") == "error":
        return str(line.get("error", ""))
    return ""


def build_groups(rows: Sequence[dict[str, Any]]) -> list[Group]:
    """Rows grouped by model and job, in row order."""
    groups: dict[tuple[Any, ...], Group] = {}
    for row in rows:
        job = {name: row[name] for name in JOB_FIELDS}
        key = (row["model"], *job.values())
        groups.setdefault(key, Group(model=row["model"], job=job)).rows.append(row)
    return list(groups.values())


def build_pivot(group: Group) -> tuple[list[str], list[list[str]]]:
    """The configuration chosen at each scale: one row per GPU count, one column per cluster."""
    clusters = list(dict.fromkeys(row["cluster"] for row in group.rows))
    cells = {(row["gpus"], row["cluster"]): render_config(row) for row in group.rows}
    table = [[str(gpus)] + [cells.get((gpus, c), "") for c in clusters]
             for gpus in sorted({row["gpus"] for row in group.rows})]
    return ["GPUs"] + clusters, table


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def write_csv(rows: Sequence[dict[str, Any]], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(SUMMARY_COLUMNS)
        for row in rows:
            writer.writerow([row[name] for name in SUMMARY_COLUMNS])


MARKDOWN_COLUMNS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision",
                    "status", "configuration", "GB/GPU", "step s", "tokens/s", "MFU %", "note")


def build_markdown_row(row: dict[str, Any]) -> list[str]:
    solved = row["status"] in ("optimal", "feasible")
    metrics = [format_value(row["memory_gb"]), format_value(row["step_seconds"]),
               f"{row['tokens_per_second']:,.0f}", f"{100 * row['mfu']:.1f}"] if solved else \
        ["", "", "", ""]
    return ([str(row[name]) for name in MARKDOWN_COLUMNS[:7]] + [render_config(row)] + metrics
            + [row["note"]])


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


def count_statuses(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many rows have each status, by status name."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return dict(sorted(counts.items()))
