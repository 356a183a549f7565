"""`parplan sweep --executor ray` on a local Ray instance gives the lines of the local pool.
Ray is an optional extra (parplan[ray]), not a test dependency: without it, this is skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.sweep.problems import key_of_line
from solver.sweep.results import read_results

pytest.importorskip("ray")

SWEEP = ["--models", "llama3.2-1b,llama3.1-405b", "--clusters", "dgx-h100,dgx-a100-80gb",
         "--gpus", "8", "--precision", "bf16,fp8", "--top", "2"]


def test_ray_and_the_local_pool_give_the_same_lines(tmp_path: Path) -> None:
    lines = {}
    for executor in ("ray", "process"):
        path = tmp_path / f"{executor}.jsonl"
        result = CliRunner().invoke(cli, ["sweep", *SWEEP, "--executor", executor, "--jobs",
                                          "2", "-o", str(path)])
        assert result.exit_code == 0, result.output
        found, torn = read_results(path)
        assert not torn
        lines[executor] = {key_of_line(line): {k: v for k, v in line.items()
                                               if k != "solve_seconds"} for line in found}
    assert len(lines["ray"]) == 8
    assert lines["ray"] == lines["process"]
