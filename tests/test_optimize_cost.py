"""`optimize --objective cost|energy` and `--price-per-gpu-hour` (issue 42 item 4,
solver.optimize_counts): the count whose best plan is cheapest per million tokens, what it
gives up against the fastest count, and the arithmetic of solver.cost.serving.price."""

from __future__ import annotations

import json
from functools import cache

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from solver.cli import cli
from solver.cost.serving.price import (
    estimate_dollars_per_million_tokens,
    estimate_kwh_per_million_tokens,
)

# Llama 3.2 1B, batch 64 on 8 or 16 H100s: 16 GPUs halve the step but each does its share of
# the batch less efficiently (more DP traffic per token), so the cheapest is not the fastest.
JOB = ("--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8,16",
       "--global-batch", "64", "--engine", "even", "--top", "1", "--json")
PRICE = 2.5  # $ per GPU-hour: the worked number of solver/cost/serving/price.py
H100_W = 700.0  # NVIDIA H100 datasheet: SXM max TDP 700 W (the catalog's power_limit_w)


@cache
def answer(*flags: str) -> dict:
    result = CliRunner().invoke(cli, ["optimize", *JOB, *flags])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_kwh_worked_number() -> None:
    """Docstring of estimate_kwh_per_million_tokens: 8 x 700 W (H100 SXM datasheet TDP) at
    40,000 tokens/s: 1e6 / (40,000 / 5,600) J = 140,000 J = 0.03889 kWh per million tokens."""
    assert float(estimate_kwh_per_million_tokens(40_000, 8 * H100_W)) == pytest.approx(
        0.038889, abs=5e-7)


@given(st.integers(1, 4096), st.floats(1.0, 1e7), st.floats(0.01, 100.0),
       st.floats(100.0, 2000.0))
def test_dollars_and_kwh_per_token_are_one_gpu_hour_apart(gpus: int, tokens_per_s: float,
                                                           price: float, watts: float) -> None:
    """At one cluster $ and kWh per million tokens differ by price / (board power in kW):
    both are GPU-hours per million tokens, times $ per GPU-hour or kWh per GPU-hour."""
    dollars = float(estimate_dollars_per_million_tokens(price * gpus, tokens_per_s))
    kwh = float(estimate_kwh_per_million_tokens(tokens_per_s, watts * gpus))
    assert dollars / kwh == pytest.approx(price / (watts / 1000.0), rel=1e-9)


def test_cost_picks_fewer_gpus_than_time_and_says_what_it_gives_up() -> None:
    fastest = answer("--objective", "time", "--price-per-gpu-hour", str(PRICE))
    cheapest = answer("--objective", "cost", "--price-per-gpu-hour", str(PRICE))
    assert fastest["gpus"] == 16 and cheapest["gpus"] == 8
    fast, cheap = fastest["plans"][0], cheapest["plans"][0]
    # $ per million tokens recomputed here: price x GPUs / 3,600 / tokens/s x 1e6.
    fast_dollars = PRICE * 16 / 3600 / fast["tokens_per_second"] * 1e6
    cheap_dollars = PRICE * 8 / 3600 / cheap["tokens_per_second"] * 1e6
    assert cheap_dollars < fast_dollars
    assert cheapest["pricing"]["plans"][0]["dollars_per_million_tokens"] == pytest.approx(
        cheap_dollars)
    assert cheap["step_seconds"] > fast["step_seconds"]
    why = cheapest["why"][0]
    assert why.startswith("cost: 8 GPUs") and "against 16 GPUs" in why
    slower = cheap["step_seconds"] / fast["step_seconds"] - 1
    assert f"gives up {slower:.0%} more step time" in why
    assert f"{fast['tokens_per_second'] - cheap['tokens_per_second']:,.0f} tokens/s" in why
    assert f"{1 - cheap_dollars / fast_dollars:.0%} less $ per million tokens" in why
    assert fastest["why"][0].startswith("time: 16 GPUs")


def test_energy_picks_the_cost_count_on_one_cluster() -> None:
    """One GPU kind: kWh and $ per token are both GPU-hours per token (property above)."""
    energy = answer("--objective", "energy")
    assert energy["gpus"] == 8
    kwh = H100_W * 8 / energy["plans"][0]["tokens_per_second"] * 1e6 / 3.6e6
    assert energy["pricing"]["plans"][0]["kwh_per_million_tokens"] == pytest.approx(kwh)
    assert energy["pricing"]["plans"][0]["dollars_per_million_tokens"] is None


def test_one_count_cost_ranks_as_time() -> None:
    """At a fixed GPU count $ per step = price x GPUs x step time: the same plans."""
    args = ["optimize", *JOB[:5], "8", *JOB[6:]]
    runs = [json.loads(CliRunner().invoke(cli, args + extra).stdout) for extra in
            (["--objective", "time"], ["--objective", "cost", "--price-per-gpu-hour", "3"])]
    assert runs[0]["plans"][0]["step_seconds"] == runs[1]["plans"][0]["step_seconds"]
    assert "ranks the plans as step time does" in runs[1]["why"][0]
    assert runs[0]["pricing"]["price_per_gpu_hour"] is None
    assert runs[0]["pricing"]["board_power_w"] == H100_W


@pytest.mark.parametrize(("flags", "needle"), [
    (("--objective", "cost"), "--price-per-gpu-hour"),
    (("--gpus", "1-17"), "at most 16"),
    (("--price-per-gpu-hour", "-1"), "--price-per-gpu-hour"),
])
def test_refusals_are_one_line(flags: tuple[str, ...], needle: str) -> None:
    result = CliRunner().invoke(cli, ["optimize", *JOB, *flags])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert needle in result.stderr


def test_gpus_for_days_by_cost_tries_the_fewest_and_twice_and_four_times_as_many() -> None:
    """--gpus-for-days finds the fewest GPUs (8 train 10B tokens in 0.3 days here); cost
    compares them with 16 and 32 and keeps the cheapest per token, here the fewest."""
    args = ["optimize", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--global-batch",
            "64", "--engine", "even", "--top", "1", "--json", "--token-budget", "10B",
            "--gpus-for-days", "3", "--objective", "cost", "--price-per-gpu-hour", str(PRICE)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    line = json.loads(result.stdout)
    assert line["gpus"] == 8
    assert "the best of 8, 16, 32 GPUs; against 32 GPUs" in line["why"][0]
    plan = line["plans"][0]
    # $ for the budget: price x GPU-hours (10B tokens / tokens/s / 3,600 x 8 GPUs).
    hours = 10e9 / plan["tokens_per_second"] / 3600 * 8
    assert line["pricing"]["plans"][0]["dollars_for_token_budget"] == pytest.approx(
        PRICE * hours, rel=1e-6)
