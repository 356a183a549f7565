"""The one-page HTML of a sweep report: the summary table, then per group the configuration
chosen at each scale and its plots. Plain HTML written here, every value escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from pathlib import Path
from typing import Any

from solver.sweep.tables import (
    MARKDOWN_COLUMNS,
    Group,
    build_markdown_row,
    build_pivot,
    count_statuses,
)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; }
th { background: #f2f2f2; }
td.infeasible, td.error { color: #a33; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
"""


def _table(columns: Sequence[str], rows: Sequence[Sequence[str]],
           row_classes: Sequence[str] | None = None) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = []
    for i, row in enumerate(rows):
        css = f' class="{escape(row_classes[i])}"' if row_classes else ""
        body.append("<tr>" + "".join(f"<td{css}>{escape(v)}</td>" for v in row) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(rows: Sequence[dict[str, Any]], groups: Sequence[Group],
                figures: dict[str, list[Path]], directory: Path) -> str:
    """The page; image paths are relative to `directory`."""
    shown = ", ".join(f"{n} {status}" for status, n in count_statuses(rows).items())
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<title>parplan sweep report</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>parplan sweep report</h1>",
        f"<p>{len(rows)} problems ({escape(shown)}). Tables: "
        '<a href="summary.csv">summary.csv</a>, <a href="summary.md">summary.md</a>.</p>',
        "<h2>Summary</h2>",
        _table(MARKDOWN_COLUMNS, [build_markdown_row(r) for r in rows],
               [str(r["status"]) for r in rows]),
        "<h2>Configuration chosen at each scale</h2>",
    ]
    for group in groups:
        parts.append(f'<h3 id="{escape(group.slug)}">{escape(group.title)}</h3>')
        parts.append(_table(*build_pivot(group)))
        for path in figures.get(group.slug, []):
            src = path.relative_to(directory).as_posix()
            parts.append(f'<img src="{escape(src)}" alt="{escape(path.stem)}">')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def write_html(rows: Sequence[dict[str, Any]], groups: Sequence[Group],
               figures: dict[str, list[Path]], directory: Path) -> Path:
    path = directory / "index.html"
    path.write_text(render_html(rows, groups, figures, directory), encoding="utf-8")
    return path
