"""--fail-on-infeasible (issue 21): optimize, serve and sweep exit with status 3 when no plan
is feasible (sweep: any of its problems), after printing the answer and its explanation; the
default stays status 0 (an infeasible problem is an answer, not an error)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from solver.cli import cli
from solver.cli.shared_flags import INFEASIBLE_EXIT

TOO_BIG = ["--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8"]
FITS = ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8"]


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_optimize_exits_3_only_when_asked_and_infeasible() -> None:
    assert INFEASIBLE_EXIT == 3
    asked = run("optimize", *TOO_BIG, "--json", "--fail-on-infeasible")
    assert asked.exit_code == 3
    assert json.loads(asked.output)["status"] == "infeasible"  # the answer comes first
    table = run("optimize", *TOO_BIG, "--fail-on-infeasible")
    assert table.exit_code == 3 and "memory_fits_hbm" in table.output
    assert run("optimize", *TOO_BIG, "--json").exit_code == 0
    assert run("optimize", *FITS, "--top", "1", "--fail-on-infeasible").exit_code == 0


def test_serve_exits_3_when_asked_and_infeasible() -> None:
    args = ["serve", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "1",
            "--context", "8k"]
    assert run(*args, "--fail-on-infeasible").exit_code == 3
    assert run(*args).exit_code == 0
    assert run("serve", *FITS, "--context", "8k", "--fail-on-infeasible").exit_code == 0


def test_sweep_exits_3_when_any_problem_is_infeasible(tmp_path: Path) -> None:
    out = str(tmp_path / "r.jsonl")
    base = ["sweep", "--clusters", "dgx-h100", "--gpus", "8", "--jobs", "1", "-q", "-o", out]
    both = [*base, "--models", "llama3.1-405b,llama3.2-1b"]
    assert run(*both, "--fail-on-infeasible").exit_code == 3
    # Resumed: the infeasible answer of the earlier run still counts.
    assert run(*both, "--fail-on-infeasible").exit_code == 3
    assert run(*both).exit_code == 0
    # A sweep of the feasible problem alone, in the same file, passes.
    assert run(*base, "--models", "llama3.2-1b", "--fail-on-infeasible").exit_code == 0
