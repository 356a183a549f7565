"""`serve --objective cost|energy` (issue 42 item 4): plans ranked by $ (or kWh at board
power) per output token, solver.cost.serving.price."""

from __future__ import annotations

import json

from click.testing import CliRunner

from solver.cli import cli

JOB = ["serve", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--json"]


def serve(*flags: str) -> dict:
    result = CliRunner().invoke(cli, [*JOB, *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_cost_ranks_by_dollars_per_million_output_tokens() -> None:
    answer = serve("--objective", "cost", "--price-per-gpu-hour", "2.5")
    assert answer["objective"] == "cost"
    # $ per million output tokens = $/h / 3,600 / output tokens/s x 1e6, recomputed here.
    dollars = [p["cost"]["dollars_per_hour"] / 3600 / p["tokens_per_second"] * 1e6
               for p in answer["plans"]]
    assert dollars == sorted(dollars) and len(dollars) > 1
    # Energy ranks the same on one cluster (board power and price are both per GPU-hour).
    energy = serve("--objective", "energy")
    assert [(p["tp"], p["pp"], p["dp"], p["replicas"]) for p in energy["plans"]] == [
        (p["tp"], p["pp"], p["dp"], p["replicas"]) for p in answer["plans"]]


def test_cost_without_a_price_is_refused() -> None:
    result = CliRunner().invoke(cli, [*JOB, "--objective", "cost"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "--price-per-gpu-hour" in result.stderr
