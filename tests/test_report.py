"""parplan report: the summary table (CSV and Markdown) has one sorted row per problem, the
HTML page shows the tables (and the plots when matplotlib is installed), the report does not
depend on the order of the lines, and without matplotlib the tables are still written."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import SweepProblem

PROBLEMS = [
    SweepProblem("llama3.2-1b", "dgx-h100", 8, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "dgx-h100", 16, 4096, 1024, "bf16"),
    SweepProblem("llama3.2-1b", "mi300x", 8, 4096, 1024, "bf16"),
    SweepProblem("llama3.1-70b", "dgx-h100", 8, 4096, 1024, "bf16"),  # infeasible
    SweepProblem("llama3.2-1b", "dgx-a100-80gb", 8, 4096, 1024, "fp8"),  # error: no fp8
]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("report") / "results.jsonl"
    lines = [solve_sweep_problem(p, SolveSettings(top=1)) for p in PROBLEMS]
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
        ("llama3.1-70b", "dgx-h100", "8"), ("llama3.2-1b", "dgx-a100-80gb", "8"),
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
    html = (tmp_path / "report" / "index.html").read_text()
    assert html.count("<tr>") == 1 + 5 + (1 + 1) + (1 + 2) + (1 + 1)  # summary, 3 pivots
    assert "<img" not in html


def test_the_report_does_not_depend_on_line_order(results: Path, tmp_path: Path) -> None:
    lines = results.read_text().splitlines()
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("\n".join(lines[2:] + lines[:2]) + "\n")
    run_report(results, tmp_path / "a", "--no-plots")
    run_report(shuffled, tmp_path / "b", "--no-plots")
    for name in ("summary.csv", "summary.md", "index.html"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()


def test_without_matplotlib_the_tables_are_written(results: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises
    output = run_report(results, tmp_path / "report")
    assert output.splitlines()[-1] == ("plots skipped: matplotlib is not installed "
                                       "(pip install 'parplan[report]')")
    assert (tmp_path / "report" / "summary.csv").exists()
    assert not (tmp_path / "report" / "plots").exists()


def test_plots_are_drawn_and_shown(results: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    output = run_report(results, tmp_path / "report")
    assert "plots skipped" not in output
    plots = sorted(p.name for p in (tmp_path / "report" / "plots").iterdir())
    # Only groups with a solved problem have plots (70B on 8 GPUs and fp8 on A100 have none).
    assert plots == ["memory-llama3.2-1b-4096-1024-bf16-megatron-time.png",
                     "scaling-llama3.2-1b-4096-1024-bf16-megatron-time.png"]
    assert all((tmp_path / "report" / "plots" / p).read_bytes()[:4] == b"\x89PNG" for p in plots)
    html = (tmp_path / "report" / "index.html").read_text()
    assert html.count("<img") == 2 and 'src="plots/scaling-llama3.2-1b' in html


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
