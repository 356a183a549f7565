"""Names are shown as text wherever they are shown (issue 37, item 5): markup and formula
injection, where no code runs but a name changes what the reader sees or clicks.

- rich: a tier named `[/x]` crashed `launch`'s groups table and `calibrate`'s fit table
  (rich.errors.MarkupError: closing tag with nothing to close), and `[link=URL]` printed a
  terminal hyperlink (OSC 8) around the cell;
- Plotly: the report page's front charts handed names to Plotly, which reads `<a href>` in a
  legend as a live link;
- summary.csv: a cell `=HYPERLINK(...)` was written raw, a formula to a spreadsheet (OWASP
  "CSV Injection": prefix = + - @ tab CR with a single quote);
- summary.md: raw HTML in a cell, and a newline inside a `conflicts` item ended its table row.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from bad_input import NCCL_LOG, ROOT, assert_ok, invoke
from solver.sweep.report_fronts import FrontPoint, build_front

TIER_CLOSING = "[/x]"
TIER_LINK = "[link=https://evil.example]fabric"
CLUSTER_BOLD = "[bold]dgx[/bold]"
OSC8 = "\x1b]8;"  # the terminal escape that opens a hyperlink


@pytest.fixture(scope="module")
def markup_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dgx-h100 with rich markup for its name and tier names."""
    text = (ROOT / "clusters" / "presets" / "dgx-h100.toml").read_text(encoding="utf-8")
    text = text.replace('name = "dgx-h100"', f'name = "{CLUSTER_BOLD}"')
    text = text.replace('name = "nvlink"', f'name = "{TIER_CLOSING}"')
    text = text.replace('name = "fabric"', f'name = "{TIER_LINK}"')
    path = tmp_path_factory.mktemp("markup") / "markup.toml"
    path.write_text(text, encoding="utf-8")
    return path


# ---- rich ------------------------------------------------------------------------------------

def test_launch_shows_markup_tier_names_as_written(markup_cluster: Path) -> None:
    result = invoke("launch", "--model", "llama3.2-1b", "--cluster", markup_cluster, "--gpus",
                    "16", "--tp", "2", "--format", "groups")
    assert_ok(result)
    assert f"{TIER_CLOSING} x" in result.stdout  # the tp groups' tier
    assert TIER_LINK in result.stdout  # the dp groups cross the fabric
    assert CLUSTER_BOLD in result.stdout


def test_calibrate_shows_markup_tier_names_as_written(markup_cluster: Path,
                                                      tmp_path: Path) -> None:
    result = invoke("calibrate", "nccl-tests", NCCL_LOG, "--cluster", markup_cluster, "-o",
                    tmp_path / "profile.json")
    assert_ok(result)
    assert f"fit of {TIER_CLOSING} all_reduce" in result.stdout


def test_a_link_in_a_table_cell_prints_no_terminal_hyperlink() -> None:
    """On a terminal rich turns `[link=URL]` markup into an OSC 8 hyperlink; a cell is text."""
    from rich.console import Console

    from solver.cli.render import _build_table

    table = _build_table(f"{TIER_LINK} title", ["tier", TIER_CLOSING],
                         [[TIER_LINK, CLUSTER_BOLD], [TIER_CLOSING, 1]])
    out = io.StringIO()
    Console(file=out, force_terminal=True, color_system="truecolor", width=200).print(table)
    text = out.getvalue()
    assert OSC8 not in text
    for name in (TIER_LINK, TIER_CLOSING, CLUSTER_BOLD, f"{TIER_LINK} title"):
        assert name in text


# ---- Plotly, through the page's own script under node ------------------------------------------

PAGE_JS = ROOT / "solver" / "sweep" / "report_page.js"
HOSTILE_CLUSTER = '<a href="https://evil.example">dgx</a>'


def page_function(source: str, name: str) -> str:
    """The text of a function of report_page.js (indented two spaces inside its closure)."""
    match = re.search(rf"\n  function {name}\(.*?\n  }}\n", source, re.DOTALL)
    return match.group(0) if match else ""


@pytest.mark.skipif(shutil.which("node") is None, reason="no node")
def test_front_charts_hand_plotly_escaped_names() -> None:
    """drawFront with a stub Plotly: every string it passes (legend names, hover text, titles)
    holds no tag; the entity-escaped text Plotly shows is the name as written."""
    source = PAGE_JS.read_text(encoding="utf-8")
    functions = "".join(page_function(source, name) for name in ("plotText", "axis", "drawFront"))
    front = build_front(f"fronts of {HOSTILE_CLUSTER}", "<b>GPUs</b>", "tokens/s", "lower",
                        "higher", [FrontPoint(HOSTILE_CLUSTER, 8, 100.0,
                                              f"{HOSTILE_CLUSTER}, 8 GPUs", 0)]).as_json()
    script = (
        "var PLOT_CONFIG = {}; var calls = [];\n"
        "var window = { Plotly: { newPlot: function (div, traces, layout) {"
        " calls.push({ traces: traces, layout: layout }); } } };\n"
        "function select() {}\n" + functions +
        f"drawFront({{ on: function () {{}} }}, {json.dumps(front)}, 0);\n"
        "process.stdout.write(JSON.stringify(calls));\n")
    done = subprocess.run(["node", "-e", script], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    call = json.loads(done.stdout)[0]
    shown = [call["traces"][0]["name"], *call["traces"][0]["text"], call["layout"]["title"]["text"],
             call["layout"]["xaxis"]["title"]["text"]]
    assert all("<" not in text for text in shown), shown
    assert call["traces"][0]["name"] == HOSTILE_CLUSTER.replace("<", "&lt;").replace(">", "&gt;")


# ---- summary.csv and summary.md ----------------------------------------------------------------

FORMULAS = ['=HYPERLINK("https://evil.example","click")', "+cmd|' /C calc'!A0", "-2+3",
            "@SUM(1+1)"]


@pytest.fixture(scope="module")
def optimized() -> dict:
    result = invoke("optimize", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus",
                    "8", "--json")
    assert_ok(result)
    return json.loads(result.stdout)


def write_results(folder: Path, lines: list[dict]) -> Path:
    path = folder / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    return path


def test_summary_csv_neutralises_formulas(tmp_path: Path, optimized: dict) -> None:
    lines = [{**optimized, "cluster": formula, "gpus": 8 * (i + 1)}
             for i, formula in enumerate(FORMULAS)]
    lines.append({**optimized, "gpus": 128, "status": "error", "plans": [],
                  "error": '=HYPERLINK("https://evil.example")'})
    lines.append({**optimized, "model": "@model"})
    result = invoke("report", write_results(tmp_path, lines), "-o", tmp_path / "report",
                    "--no-plots")
    assert_ok(result)
    with (tmp_path / "report" / "summary.csv").open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    cells = [cell for row in rows for cell in row.values()]
    assert not [c for c in cells if c[:1] in ("=", "+", "-", "@", "\t", "\r")], cells
    assert sorted(row["cluster"] for row in rows if row["model"] == "llama3.2-1b"
                  and row["status"] != "error") == sorted("'" + f for f in FORMULAS)
    assert any(row["note"] == "'" + '=HYPERLINK("https://evil.example")' for row in rows)
    assert any(row["model"] == "'@model" for row in rows)
    assert any(row["tp"] == "1" for row in rows)  # numbers stay numbers


def test_a_cell_starting_with_a_tab_or_return_is_neutralised_too() -> None:
    """Results lines refuse unprintable names, so these reach the writer only past them."""
    from solver.sweep.report import render_csv_cell

    assert render_csv_cell("\tindent") == "'\tindent"
    assert render_csv_cell("\r=1") == "'\r=1"
    assert render_csv_cell("dgx-h100") == "dgx-h100"
    assert render_csv_cell(-1.5) == -1.5


def test_summary_md_escapes_html_and_keeps_each_row_on_one_line(tmp_path: Path,
                                                                 optimized: dict) -> None:
    infeasible = {**optimized, "gpus": 1024, "status": "infeasible", "plans": [],
                  "conflicts": ["first\nsecond | third", "<img src=x onerror=alert(1)>"],
                  "fixes": ["[click](https://evil.example)"]}
    solved = {**optimized, "cluster": "<script>alert(1)</script>"}
    result = invoke("report", write_results(tmp_path, [optimized, infeasible, solved]), "-o",
                    tmp_path / "report", "--no-plots")
    assert_ok(result)
    text = (tmp_path / "report" / "summary.md").read_text(encoding="utf-8")
    assert "<img" not in text and "<script" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "first<br>second \\| third" in text
    assert "\\[click\\](https://evil.example)" in text
    summary = text.split("## ")[0]
    rows = [line for line in summary.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 3  # header, rule, one row per problem
    assert all(row.endswith("|") for row in rows)
    columns = rows[0].count(" | ")
    assert all(re.sub(r"\\\|", "", row).count(" | ") == columns for row in rows[2:])
