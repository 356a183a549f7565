"""parplan report: the summary table (CSV and Markdown) has one sorted row per problem; the
page is one self-contained file (its data as JSON, Plotly inline with the `report` extra, no
request leaving it) whose problems, ranked plans, launch lines and Pareto fronts are those of
the results file; the report does not depend on the order of the lines; without Plotly the
tables and the page are still written. The page's behaviour in a browser is tested in
test_report_browser.py."""

from __future__ import annotations

import csv
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import SweepProblem

PROBLEMS = [
    SweepProblem("llama3.2-1b", "dgx-h100", 8, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "dgx-h100", 16, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "mi300x", 8, 4096, 1024, "bf16"),
    SweepProblem("llama3.1-405b", "dgx-h100", 8, 4096, 1024, "bf16"),  # infeasible
    SweepProblem("llama3.2-1b", "dgx-a100-80gb", 8, 4096, 1024, "fp8"),  # error: no fp8
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "results.jsonl"
    lines = [solve_sweep_problem(p, SolveSettings(top=3)) for p in PROBLEMS]
    path.write_text("".join(json.dumps(line) + "\n" for line in reversed(lines)))
    return path


def run_report(results: Path, output: Path, *extra: str) -> str:
    result = CliRunner().invoke(cli, ["report", str(results), "-o", str(output), *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_tables_have_one_sorted_row_per_problem(results: Path, tmp_path: Path) -> None:
    output = run_report(results, tmp_path / "report", "--no-plots")
    assert "5 problems (1 error, 1 infeasible, 3 optimal)" in output
    with (tmp_path / "report" / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["model"], r["cluster"], r["gpus"]) for r in rows] == [
        ("llama3.1-405b", "dgx-h100", "8"), ("llama3.2-1b", "dgx-a100-80gb", "8"),
        ("llama3.2-1b", "dgx-h100", "8"), ("llama3.2-1b", "dgx-h100", "16"),
        ("llama3.2-1b", "mi300x", "8")]
    infeasible, error, best = rows[0], rows[1], rows[2]
    assert infeasible["status"] == "infeasible" and "memory_fits_hbm" in infeasible["note"]
    assert error["status"] == "error" and "no fp8 support" in error["note"]
    assert best["status"] == "optimal" and int(best["tp"]) >= 1 and 0 < float(best["mfu"]) < 1
    markdown = (tmp_path / "report" / "summary.md").read_text()
    assert "| llama3.2-1b | dgx-h100 | 16 | 4096 | 1024 | bf16 | optimal | tp " in markdown
    assert "## Configuration chosen at each scale" in markdown
    assert "| GPUs | dgx-h100 | mi300x |" in markdown
    data = page_data(tmp_path / "report" / "index.html")
    assert [(p["model"], p["cluster"], p["gpus"], p["status"]) for p in data["problems"]] == [
        (r["model"], r["cluster"], int(r["gpus"]), r["status"]) for r in rows]


def test_an_unproven_answer_notes_how_far_from_the_optimum_it_may_be() -> None:
    from solver.sweep.tables import build_summary_rows

    line = solve_sweep_problem(PROBLEMS[0], SolveSettings(top=3))
    stopped = {**line, "status": "feasible", "optimality_gap": 0.0123}
    assert build_summary_rows([line])[0]["note"] == ""
    assert build_summary_rows([stopped])[0]["note"] == (
        "not proven: the best within 1.2% of the optimum")
    proven_best = {**stopped, "optimality_gap": 0.0}  # the top 1 proven, not the rest
    assert build_summary_rows([proven_best])[0]["note"] == "not proven but the best plan"


def page_data(path: Path) -> dict[str, Any]:
    """The JSON the page's script reads."""
    return page_data_text(path.read_text(encoding="utf-8"))


def test_the_report_does_not_depend_on_line_order(results: Path, tmp_path: Path) -> None:
    lines = results.read_text().splitlines()
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(lines[2:] + lines[:2]) + "\n")
    run_report(results, tmp_path / "a", "--no-plots")
    run_report(shuffled, tmp_path / "b", "--no-plots")
    for name in ("summary.csv", "summary.md", "index.html"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_without_plotly_the_page_has_tables_and_says_why(results: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly raises
    monkeypatch.setitem(sys.modules, "plotly.offline", None)
    output = run_report(results, tmp_path / "report")
    assert output.splitlines()[-1] == ("no charts: charts need plotly (pip install "
                                       "'parplan[report]'); the tables are complete")
    html = (tmp_path / "report" / "index.html").read_text()
    assert "plotly.js v" not in html and len(html) < 500_000
    assert page_data(tmp_path / "report" / "index.html")["charts_missing"].startswith(
        "charts need plotly")


def test_the_page_is_self_contained(results: Path, tmp_path: Path) -> None:
    """Plotly's bundle inline, and nothing the page would fetch: no src or href to another
    host, no stylesheet link, no import."""
    offline = pytest.importorskip("plotly.offline")
    run_report(results, tmp_path / "report")
    html = (tmp_path / "report" / "index.html").read_text()
    bundle = offline.get_plotlyjs()
    assert f'<script type="text/plain" id="chart-library">{bundle}</script>' in html
    html = html.replace(bundle, "")  # its own links (plotly.com in the mode bar) stay
    assert not re.search(r"<script[^>]* src=|<link |@import|<iframe", html)
    assert re.findall(r'href="([^"]*)"', html) == ["summary.csv", "summary.md"]


def test_each_plan_carries_its_launch_line_and_it_runs(results: Path, tmp_path: Path) -> None:
    """The copyable line of every ranked plan is a `parplan launch` command with the plan's
    degrees and layout; run as it is, it writes the framework's settings."""
    run_report(results, tmp_path / "report", "--no-charts")
    data = page_data(tmp_path / "report" / "index.html")
    solved = [p for p in data["problems"] if p["status"] == "optimal"]
    assert solved and all(1 <= len(p["plans"]) <= 3 for p in solved)
    for problem in solved:
        for plan in problem["plans"]:
            words = shlex.split(plan["launch"])
            assert words[:2] == ["parplan", "launch"]
            assert words[words.index("--tp") + 1] == str(plan["tp"])
            assert words[words.index("--gpus") + 1] == str(problem["gpus"])
            result = CliRunner().invoke(cli, words[1:])
            assert result.exit_code == 0, (plan["launch"], result.output)
            assert "--tensor-model-parallel-size" in result.output


def test_days_and_gpu_hours_are_those_of_the_token_budget(results: Path, tmp_path: Path
                                                          ) -> None:
    run_report(results, tmp_path / "report", "--no-charts", "--token-budget", "2T")
    data = page_data(tmp_path / "report" / "index.html")
    assert data["token_budget"] == 2e12 and data["token_budget_label"] == "2T"
    for problem in data["problems"]:
        for plan in problem["plans"]:
            assert plan["days"] * 86400 * plan["rate"] == pytest.approx(2e12, rel=1e-9)
            assert plan["gpu_hours"] == pytest.approx(plan["days"] * 24 * problem["gpus"])


def test_constant_job_fields_are_named_once(results: Path, tmp_path: Path) -> None:
    """Every fixture problem has seq 4096, batch 1024, megatron, objective time; precision
    varies (bf16, fp8), so it stays a column."""
    run_report(results, tmp_path / "report", "--no-charts")
    data = page_data(tmp_path / "report" / "index.html")
    assert data["constant"] == {"seq_len": 4096, "global_batch": 1024, "framework": "megatron",
                                "objective": "time"}
    assert "every problem: seq len 4096, global batch 1024, framework megatron, objective time" \
        in (tmp_path / "report" / "index.html").read_text()


def test_each_group_with_a_solved_problem_has_its_two_fronts(results: Path, tmp_path: Path
                                                            ) -> None:
    run_report(results, tmp_path / "report", "--no-charts")
    data = page_data(tmp_path / "report" / "index.html")
    fronts = data["fronts"]
    # Only llama3.2-1b in bf16 has solved problems (3: dgx-h100 8 and 16, mi300x 8). The
    # lines carry the GPUs' board power (H100 SXM 700 W, MI300X 750 W datasheets), so kWh
    # too (issue 42); no price was given, so no $ front.
    group = "llama3.2-1b-4096-1024-bf16-megatron-time"
    assert [(f["group"], f["x_label"], f["y_label"]) for f in fronts] == [
        (group, "GPUs", "tokens/s (whole job)"), (group, "days for 1T tokens", "GPU-hours"),
        (group, "days for 1T tokens", "kWh at board power")]
    hours, kwh = fronts[1]["points"], fronts[2]["points"]
    watts = {"dgx-h100": 700.0, "mi300x": 750.0}
    for (series, _, gpu_hours, _, _), (_, _, energy, _, _) in zip(hours, kwh):
        power = next(w for name, w in watts.items() if name in series)
        assert energy == pytest.approx(gpu_hours * power / 1000)
    problems = data["problems"]
    for front in fronts:
        assert len(front["points"]) == 3
        for series, x, y, label, index in front["points"]:
            assert problems[index]["cluster"] == series and label.startswith(series)
    rate = fronts[0]
    assert sorted(p[1] for p in rate["points"]) == [8, 8, 16]


def test_a_name_cannot_end_the_data_script() -> None:
    from solver.sweep.report_html import render_page

    data = {"counts": {}, "constant": {}, "problems": [{"model": "</script><script>x()"}]}
    html = render_page(data, None)
    assert "</script><script>x()" not in html
    assert page_data_text(html)["problems"][0]["model"] == "</script><script>x()"


def page_data_text(html: str) -> dict[str, Any]:
    match = re.search(r'id="report-data">(.*?)</script>', html, re.S)
    assert match is not None
    return json.loads(match[1])


def test_a_torn_last_line_is_skipped_and_said(results: Path, tmp_path: Path) -> None:
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(results.read_bytes() + b'{"status": "opt')
    result = CliRunner().invoke(cli, ["report", str(torn), "-o", str(tmp_path / "r"),
                                      "--no-plots"])
    assert result.exit_code == 0
    assert "skipped an incomplete last line" in result.output
    assert "5 problems" in result.output


def test_a_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "none.jsonl"), "-o",
                                      str(tmp_path / "r")])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and "cannot read the results file" in result.output


def test_the_features_a_plan_turns_on_are_in_every_label(tmp_path: Path) -> None:
    """Issue 39 item 2: Llama-3.1-8B on 8 H100s fits with memory savers and an offload
    (Plan.memory_savers, Plan.offloads) the framework does not turn on by default; the summary
    CSV's `features` column, the Markdown's configuration, the pivot and the report's plan
    label all name them, as launch flags without the dashes."""
    line = solve_sweep_problem(SweepProblem("llama3.1-8b", "dgx-h100", 8, 4096, 1024, "bf16"),
                               SolveSettings(top=1))
    best = line["plans"][0]
    names = [*(best.get("memory_savers") or []), *(best.get("offloads") or [])]
    assert "activation_offload" in names, best
    flags = [name.replace("_", "-") for name in names]
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(line) + "\n")
    run_report(path, tmp_path / "report", "--no-plots")
    with (tmp_path / "report" / "summary.csv").open() as handle:
        row = next(csv.DictReader(handle))
    assert row["features"] == " ".join(flags)
    label = " ".join(f"+{flag}" for flag in flags)
    markdown = (tmp_path / "report" / "summary.md").read_text()
    assert markdown.count(f" {best['recompute']} {label} |") == 2  # the row and the pivot
    data = page_data(tmp_path / "report" / "index.html")
    assert data["problems"][0]["plans"][0]["config"].endswith(label)


def _offload_line() -> dict[str, Any]:
    """Llama-3.1-8B on 8 H100s: its best plan offloads activations to the host (issue 39
    item 2); a step's `offload` part is the series the chart drew as "trace 4"."""
    line = solve_sweep_problem(SweepProblem("llama3.1-8b", "dgx-h100", 8, 4096, 1024, "bf16"),
                               SolveSettings(top=2))
    assert "activation_offload" in line["plans"][0]["offloads"], line["plans"][0]
    assert "offload" in line["plans"][0]["time_seconds"]
    return line


def test_every_series_of_the_charts_is_named(tmp_path: Path) -> None:
    """Issue 39 item 8: every part of the step (the chart's series, the details' words) has a
    name in the page's data, the offload one included; the page's script has no list of its
    own (a part missing from it was Plotly's unnamed "trace 4")."""
    from solver.sweep.report_data import TIME_PARTS

    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(_offload_line()) + "\n")
    run_report(path, tmp_path / "report", "--no-plots")
    data = page_data(tmp_path / "report" / "index.html")
    assert list(data["time_words"]) == list(data["time_parts"]) == list(TIME_PARTS)
    assert data["time_words"]["offload"] == "host offload"
    assert all(word.strip() for word in data["time_words"].values())
    script = (Path(__file__).resolve().parent.parent / "solver" / "sweep"
              / "report_page.js").read_text()
    assert "var TIME_WORDS = data.time_words;" in script
    assert "compute: \"compute\"" not in script


def test_axes_start_at_zero_or_say_they_are_log(results: Path, tmp_path: Path) -> None:
    """Issue 39 item 8: the GPU-hours axis was zoomed to its points' 0.01% spread; a linear
    axis now starts at zero (Plotly's rangemode "tozero") and a log axis says so in its
    title."""
    run_report(results, tmp_path / "report", "--no-charts")
    fronts = page_data(tmp_path / "report" / "index.html")["fronts"]
    assert [(f["x_axis"], f["y_axis"]) for f in fronts] == [
        ({"title": "GPUs (log scale)", "type": "log"},
         {"title": "tokens/s (whole job) (log scale)", "type": "log"}),
        ({"title": "days for 1T tokens (log scale)", "type": "log"},
         {"title": "GPU-hours", "type": "linear", "rangemode": "tozero"}),
        # issue 42: energy at the GPUs' board power (the lines carry no price: no $ front)
        ({"title": "days for 1T tokens (log scale)", "type": "log"},
         {"title": "kWh at board power", "type": "linear", "rangemode": "tozero"})]


def test_launch_lines_wrap_at_spaces_only() -> None:
    """Issue 39 item 8: the launch line broke mid-word (word-break: break-all); it wraps at
    spaces, in the page's normal size, and a copy button copies it whole
    (test_report_browser checks where the lines break)."""
    css = (Path(__file__).resolve().parent.parent / "solver" / "sweep"
           / "report_page.css").read_text()
    rule = re.search(r"td\.launch code \{([^}]*)\}", css)
    assert rule is not None
    assert "break-all" not in rule[1] and "anywhere" not in rule[1]
    assert "white-space: pre-wrap" in rule[1] and "font-size: 1em" in rule[1]
    script = (Path(__file__).resolve().parent.parent / "solver" / "sweep"
              / "report_page.js").read_text()
    assert "copyText(plan.launch, copy)" in script


def test_memory_is_shown_as_a_share_of_the_gpu_and_other_item_by_item(tmp_path: Path) -> None:
    """Issue 39 item 8: the page's plans and the summary tables carry the worst stage's memory
    as % of the GPU's memory, and "other" item by item (the plan's `other_gb`: logits,
    buffers, the CUDA context...), which add up to it."""
    line = _offload_line()
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(line) + "\n")
    run_report(path, tmp_path / "report", "--no-plots")
    data = page_data(tmp_path / "report" / "index.html")
    for raw, plan in zip(line["plans"], data["problems"][0]["plans"]):
        total, gpu = raw["memory_gb"]["total"], raw["gpu_memory_gb"]
        assert plan["memory_percent"] == round(100 * total / gpu, 1)
        assert 50 < plan["memory_percent"] <= 100
        assert set(plan["memory_other"]) == set(raw["other_gb"]) and len(plan["memory_other"]) > 1
        assert sum(plan["memory_other"].values()) == pytest.approx(plan["memory"]["other"],
                                                                   abs=0.01)
        values = list(plan["memory_other"].values())
        assert values == sorted(values, reverse=True)
    with (tmp_path / "report" / "summary.csv").open() as handle:
        row = next(csv.DictReader(handle))
    best = line["plans"][0]
    assert float(row["memory_percent_of_gpu"]) == round(
        100 * best["memory_gb"]["total"] / best["gpu_memory_gb"], 1)
    markdown = (tmp_path / "report" / "summary.md").read_text()
    assert "| device GB | % of GPU | step s |" in markdown
    assert f"| {row['memory_percent_of_gpu']} |" in markdown


def test_a_line_without_other_items_shows_other_as_one() -> None:
    """Lines written before `other_gb` keep their one "other" item."""
    from solver.sweep.report_data import _other_items

    assert _other_items({"memory_gb": {"other": 2.5, "total": 80.0}}) == {"other": 2.5}
