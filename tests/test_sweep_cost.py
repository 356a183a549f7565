"""`sweep --price-per-gpu-hour` and `--objective cost|energy`, and the report's $ and kWh
fronts (issue 42 item 4)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import SweepProblem
from solver.sweep.report_data import build_group_fronts

# $ per GPU-hour, given by the user (the catalog carries none): the H100 at the worked number
# of solver/cost/serving/price.py, the MI300X cheaper.
PRICES = (("dgx-h100", 2.5), ("mi300x", 1.5))


def test_lines_price_their_plans(tmp_path: Path) -> None:
    settings = SolveSettings(top=1, prices=PRICES)
    line = solve_sweep_problem(SweepProblem("llama3.2-1b", "mi300x", 8, 4096, 1024, "bf16",
                                            objective="cost"), settings)
    assert line["status"] in ("optimal", "feasible") and line["objective"] == "cost"
    plan, priced = line["plans"][0], line["pricing"]
    assert priced["price_per_gpu_hour"] == 1.5
    assert priced["board_power_w"] == 750.0  # AMD MI300X data sheet: 750 W peak board power
    # 1.5 $/h x 8 GPUs / 3,600 s / tokens/s x 1e6; 8 x 750 W / tokens/s x 1e6 / 3.6e6 J/kWh.
    assert priced["plans"][0]["dollars_per_million_tokens"] == pytest.approx(
        1.5 * 8 / 3600 / plan["tokens_per_second"] * 1e6)
    assert priced["plans"][0]["kwh_per_million_tokens"] == pytest.approx(
        8 * 750 / plan["tokens_per_second"] * 1e6 / 3.6e6)


def test_report_fronts_gain_dollars_and_kwh() -> None:
    """Each cluster's point: $ = its price x GPU-hours, kWh = GPU-hours x board power."""
    problems = [{"group": "g", "status": "optimal", "cluster": cluster, "gpus": 8,
                 "price_per_gpu_hour": price, "board_power_w": watts,
                 "plans": [{"config": "tp 1", "rate": rate, "days": days,
                            "gpu_hours": days * 24 * 8}]}
                for cluster, price, watts, rate, days in (
                    ("dgx-h100", 2.5, 700.0, 4e5, 10.0), ("mi300x", 1.5, 750.0, 3e5, 12.0))]
    fronts = build_group_fronts(SimpleNamespace(slug="g"), problems, "1T")  # type: ignore[arg-type]
    assert [f.y_label for f in fronts] == ["tokens/s (whole job)", "GPU-hours", "$",
                                           "kWh at board power"]
    dollars, kwh = fronts[2], fronts[3]
    assert [p.y for p in dollars.points] == pytest.approx([2.5 * 1920, 1.5 * 2304])
    assert [p.y for p in kwh.points] == pytest.approx([1920 * 0.7, 2304 * 0.75])
    # GPU-hours alone: the H100 wins on both axes; priced, the MI300X is cheaper ($3,456
    # against $4,800) though slower, so both are on the $ front.
    assert fronts[1].on_front == (0,)
    assert sorted(dollars.on_front) == [0, 1]


def test_cost_without_every_price_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [
        "sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100,mi300x", "--gpus", "8",
        "--objective", "cost", "--price-per-gpu-hour", "dgx-h100=2.5",
        "-o", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "none for mi300x" in result.stderr


def test_sweep_writes_priced_lines(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(cli, [
        "sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8",
        "--global-batch", "64", "--engine", "even", "--jobs", "1", "--quiet",
        "--objective", "energy", "--price-per-gpu-hour", "2.5", "-o", str(out)])
    assert result.exit_code == 0, result.output
    line = json.loads(out.read_text().splitlines()[0])
    assert line["objective"] == "energy" and line["pricing"]["price_per_gpu_hour"] == 2.5
