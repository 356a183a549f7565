"""The interactive page of a sweep report: one self-contained HTML file that works offline.

The page holds its data (solver.sweep.report_data) as JSON in a `<script type=
"application/json">` element, its script (report_page.js) and style (report_page.css), and,
with the `report` extra, Plotly's JavaScript bundle inline as text that the script runs once
the table is painted (solver.sweep.plots): no request leaves the page. Without Plotly the page keeps its tables and says how to get the charts.
"""

from __future__ import annotations

import json
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from solver.output_file import write_output_file

TITLE = "parplan sweep report"


def _asset(name: str) -> str:
    return resources.files("solver.sweep").joinpath(name).read_text(encoding="utf-8")


def _json_for_script(data: dict[str, Any]) -> str:
    """JSON safe inside a <script> element: `<` escaped, so no `</script>` or `<!--` in a
    name can end it."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _filter(key: str, label: str) -> str:
    return (f'<label>{escape(label)} <select id="filter-{key}"><option value="">all</option>'
            "</select></label>")


def render_page(data: dict[str, Any], chart_library: str | None) -> str:
    """The page: header, filters, the problem table (filled by the script), the details."""
    counts = ", ".join(f"{n} {status}" for status, n in data["counts"].items())
    total = sum(data["counts"].values())
    shared = ", ".join(f"{name.replace('_', ' ')} {value}"
                       for name, value in data["constant"].items())
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{escape(TITLE)}</title>", f"<style>{_asset('report_page.css')}</style>",
        "</head><body>",
        f"<h1>{escape(TITLE)}</h1>",
        f'<p class="note">{total} problems ({escape(counts or "none")})'
        + (f"; every problem: {escape(shared)}" if shared else "")
        + '. Tables: <a href="summary.csv">summary.csv</a>, <a href="summary.md">summary.md</a>.'
        " Click a row for its ranked plans, memory, step time, launch lines and Pareto fronts;"
        " click a column to sort.</p>",
        '<div id="filters"><label>search <input id="filter-text" type="search" '
        'placeholder="model, cluster, plan..."></label>',
        _filter("model", "model"), _filter("cluster", "cluster"), _filter("gpus", "GPUs"),
        _filter("status", "status"), '<span id="row-count"></span></div>',
        '<div class="table-box"><table id="problems"><thead><tr></tr></thead><tbody></tbody>'
        "</table></div>",
        '<section id="details" hidden></section>', '<section id="fronts" hidden></section>',
        f'<script type="application/json" id="report-data">{_json_for_script(data)}</script>',
    ]
    if chart_library is not None:
        # Kept as text and run by the page's script once the table is painted (a bundle
        # of megabytes would otherwise hold the first paint for seconds).
        if "</script" in chart_library.lower():
            raise ValueError("the chart library cannot be embedded: it contains </script")
        parts.append(f'<script type="text/plain" id="chart-library">{chart_library}</script>')
    parts += [f"<script>{_asset('report_page.js')}</script>", "</body></html>"]
    return "\n".join(parts) + "\n"


def write_html(data: dict[str, Any], chart_library: str | None, directory: Path) -> Path:
    path = directory / "index.html"
    write_output_file(path, render_page(data, chart_library))
    return path
