"""`parplan serve --pareto --report DIR`: the front on the report page (solver.sweep.report),
the disaggregated plans among its points with --disaggregated, and bad flags as one line."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from solver.cli import cli

ARGS = ("serve", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--context",
        "8k", "--request-rate", "20", "--input-len", "4096", "--output-len", "256",
        "--max-ttft-ms", "1000", "--max-tpot-ms", "30", "--pareto")


def test_report_draws_the_front_with_its_disaggregated_points(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [*ARGS, "--disaggregated", "--json", "--report",
                                      str(tmp_path)])
    assert result.exit_code == 0, result.output
    front = json.loads(result.stdout)["pareto"]
    kinds = {p["kind"] for p in front}
    assert kinds == {"aggregated", "disaggregated"}
    assert all(("prefill" in p) == (p["kind"] == "disaggregated") for p in front)
    page = (tmp_path / "index.html").read_text()
    assert "Serving llama3.1-8b on 8 h100-sxm" in page and "output tokens/s per GPU" in page
    assert page.count("prefill tp") >= sum(p["kind"] == "disaggregated" for p in front)


def test_report_needs_pareto_and_a_writable_folder(tmp_path: Path) -> None:
    without = CliRunner().invoke(cli, [*ARGS[:-1], "--report", str(tmp_path)])
    assert without.exit_code == 2 and "--report" in without.output
    assert "Traceback" not in without.output and len(without.output.strip().splitlines()) == 1
    blocked = tmp_path / "file"
    blocked.write_text("")
    bad = CliRunner().invoke(cli, [*ARGS, "--report", str(blocked / "sub")])
    assert bad.exit_code == 2 and f"--report {blocked / 'sub'}" in bad.output
