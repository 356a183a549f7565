"""Issue 36: intervals, fit probability and p_fastest from the error model
(solver.cost.uncertainty, fitted by benchmarks/error_model.py into solver/catalog/
error_model.json)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cli import cli
from solver.errors import InputError
from solver.cost.uncertainty import (
    ERROR_MODEL_PATH,
    TIME_GROUPS,
    ErrorModel,
    build_error_headroom,
    describe_flip,
    estimate_fastest_odds,
    estimate_fit_probability,
    estimate_interval,
    estimate_step_sigma,
    interval_z,
    load_error_model,
    lookup_scale,
    usable_share_for_fit_probability,
)
from solver.spec.plan import TIME_PARTS
from solver.sweep.result_line import parse_result_line

ROOT = Path(__file__).resolve().parent.parent
# A model with round numbers, so that the expected values below can be worked by hand.
MODEL = ErrorModel(group_sigma={"compute": 0.1, "communication": 0.2, "bubble": 0.0},
                   plan_sigma=0.05, time_scale={"": 1.0, "dense": 2.0, "dense/*": 3.0},
                   memory_sigma={"": 0.08}, serve_sigma={"": 0.4})
PROBLEM = ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "2048",
           "--global-batch", "64"]


def parts(**seconds: list[float]) -> dict[str, np.ndarray]:
    num = len(next(iter(seconds.values())))
    return {name: np.array(seconds.get(name, [0.0] * num), dtype=float) for name in TIME_PARTS}


def test_interval_of_the_docstring() -> None:
    # Standard normal table: the 90th percentile is 1.2816 (two-sided 80%).
    assert interval_z(0.8) == pytest.approx(1.28155, abs=1e-5)
    low, high = estimate_interval(np.array([2.0]), np.array([0.1]), 0.8)
    assert (low[0], high[0]) == pytest.approx((1.7594, 2.2735), abs=1e-4)


def test_fit_probability_of_the_docstring() -> None:
    # Phi(log(1 / 0.9) / 0.08) = Phi(1.317) = 0.906 (standard normal table).
    fit = estimate_fit_probability(np.array([90.0]), np.array([100.0]), 0.08)
    assert fit[0] == pytest.approx(0.906, abs=1e-3)
    # Today's rule is a fit probability of one half: a plan exactly at its usable memory.
    assert estimate_fit_probability(np.array([5.0]), np.array([5.0]), 0.08)[0] == 0.5


def test_usable_share_and_headroom() -> None:
    # exp(-0.08 * 1.2816) = 0.9026; 0.5 leaves the usable memory as it is (today's rule).
    assert usable_share_for_fit_probability(0.9, 0.08) == pytest.approx(0.9026, abs=1e-4)
    assert usable_share_for_fit_probability(0.5, 0.08) == 1.0
    # The default headroom (issue 39) keeps 1 - 0.9026 of the GPU's memory free at sigma 0.08.
    headroom = build_error_headroom(MODEL, "megatron")
    assert headroom.usable_bytes(100e9) == pytest.approx(90.26e9, rel=1e-4)


def test_step_sigma_formula() -> None:
    # All compute, scale 1: sqrt(0.1^2 + 0.05^2) = 0.1118; half compute, half EP at the
    # "dense" scale 2: 2 * sqrt(0.5^2 0.1^2 + 0.5^2 0.2^2 + 0.05^2) = 0.2449.
    sigma = estimate_step_sigma(MODEL, (), parts(compute=[1.0]))
    assert sigma[0] == pytest.approx(math.sqrt(0.01 + 0.0025))
    sigma = estimate_step_sigma(MODEL, ("dense",), parts(compute=[1.0], ep=[1.0]))
    assert sigma[0] == pytest.approx(2 * math.sqrt(0.0025 + 0.01 + 0.0025), abs=1e-4)


def test_unseen_category_takes_its_siblings_spread() -> None:
    assert lookup_scale(MODEL.time_scale, ("dense", "megatron")) == 3.0
    assert lookup_scale(MODEL.time_scale, ("moe",)) == 1.0


def test_winner_change_is_named() -> None:
    # Plan 1: 1.0 s compute + 0.1 s EP; plan 2: 1.15 s compute. Plan 2 wins if EP grows by
    # 0.05 / 0.1 = 50% (|log 1.5| / 0.2 = 2.0 sigmas) or compute shrinks by 0.05 / 0.15 = 33%
    # (|log 0.667| / 0.1 = 4.1 sigmas): the EP change is the likelier.
    odds = estimate_fastest_odds(MODEL, (), parts(compute=[1.0, 1.15], ep=[0.1, 0.0]), 0.8)
    assert describe_flip(odds) == "if EP all-to-all is 50% slower than modelled, plan 2 wins"


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.0, 3.0), st.floats(0.0, 2.0)),
                min_size=2, max_size=8))
def test_p_fastest_sums_to_at_most_one(rows: list[tuple[float, float, float]]) -> None:
    steps = parts(compute=[r[0] for r in rows], ep=[r[1] for r in rows],
                  bubble=[r[2] for r in rows])
    odds = estimate_fastest_odds(MODEL, (), steps, 0.8)
    assert odds.p_fastest.sum() <= 1.0 + 1e-12
    assert ((odds.p_fastest >= 0) & (odds.p_fastest <= 1)).all()
    again = estimate_fastest_odds(MODEL, (), steps, 0.8)
    assert (again.p_fastest == odds.p_fastest).all()  # seeded: the same every time


@settings(max_examples=40, deadline=None)
@given(st.floats(0.1, 10.0), st.floats(0.0, 1.0),
       st.lists(st.floats(3.0, 20.0), min_size=1, max_size=6))
def test_p_fastest_is_one_for_a_plan_that_wins_every_draw(
        compute: float, ep: float, slower: list[float]) -> None:
    # Every other plan is at least 3x slower in every part: with plan sigma 0.05 at scale 1 no
    # draw (|z| < 6 in 2,000 draws) closes a factor exp(log 3 / 0.05 / 2) apart.
    steps = parts(compute=[compute] + [compute * f for f in slower],
                  ep=[ep] + [ep * f for f in slower])
    odds = estimate_fastest_odds(MODEL, (), steps, 0.8)
    assert odds.p_fastest[0] == 1.0
    assert not odds.tied_with_best[1:].any()


def test_error_model_inputs_are_the_repository_data() -> None:
    # The fit's provenance names the data it was fitted on: when a data file changes, the
    # model must be refitted (benchmarks/error_model.py --write).
    stored = json.loads(ERROR_MODEL_PATH.read_text(encoding="utf-8"))
    for path, digest in stored["provenance"]["inputs"].items():
        assert hashlib.sha256((ROOT / path).read_bytes()).hexdigest() == digest, path
    model = load_error_model()
    assert model.group_sigma["compute"] > 0 and model.plan_sigma > 0


def run_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_optimize_fields_and_byte_identical_output() -> None:
    args = ["optimize", *PROBLEM, "--top", "5", "--json"]
    first = CliRunner().invoke(cli, args).output
    second = CliRunner().invoke(cli, args).output
    # solve_seconds is the wall clock; everything else must repeat byte for byte.
    strip = [line for line in first.splitlines() if '"solve_seconds"' not in line]
    assert strip == [line for line in second.splitlines() if '"solve_seconds"' not in line]
    answer = json.loads(first)
    plans = answer["plans"]
    assert sum(p["p_fastest"] for p in plans) <= 1.0 + 1e-9
    for plan in plans:
        low, high = plan["step_seconds_interval"]
        assert low < plan["step_seconds"] < high
        low, high = plan["tokens_per_second_per_gpu_interval"]
        assert low < plan["tokens_per_second_per_gpu"] < high
        low, high = plan["memory_gb_interval"]
        assert low < plan["memory_gb"]["total"] < high
        # The default headroom (issue 39): every listed plan fits with at least 90%.
        assert plan["fits"] and plan["fit_probability"] >= 0.9 - 1e-4
    assert plans[0]["tied_with_best"]
    assert answer["uncertainty"]["min_fit_probability"] == 0.9


def test_without_headroom_fits_is_a_fit_probability_of_one_half() -> None:
    answer = run_json("optimize", *PROBLEM, "--top", "5", "--json",
                      "--memory-headroom", "0", "--interval-level", "0.9")
    for plan in answer["plans"]:
        assert plan["fits"] == (plan["fit_probability"] >= 0.5)
    assert answer["uncertainty"]["min_fit_probability"] == 0.5
    assert answer["uncertainty"]["interval_level"] == 0.9


def test_interval_level_out_of_range_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["optimize", *PROBLEM, "--interval-level", "1.5"])
    assert result.exit_code == 2 and "--interval-level" in result.output


def test_estimate_carries_intervals() -> None:
    answer = run_json("estimate", *PROBLEM, "--tp", "2", "--json")
    plan = answer["plans"][0]
    assert plan["step_seconds_interval"][0] < plan["step_seconds"]
    assert "p_fastest" not in plan  # one plan: no race
    table = CliRunner().invoke(cli, ["estimate", *PROBLEM, "--tp", "2"]).output
    assert "80% interval" in table and "chance it fits" in table


def test_serve_carries_intervals() -> None:
    answer = run_json("serve", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "1",
                      "--context", "4096", "--top", "1", "--json")
    plan = answer["plans"][0]
    for name in ("ttft_ms", "tpot_ms", "tokens_per_second"):
        low, high = plan[f"{name}_interval"]
        assert low < plan[name] < high


def test_sweep_line_with_and_without_the_fields_loads() -> None:
    answer = run_json("optimize", *PROBLEM, "--top", "2", "--json")
    line = dict(answer)
    parsed = parse_result_line(json.dumps(line).encode(), "results.jsonl:1")
    assert parsed["plans"][0]["p_fastest"] == answer["plans"][0]["p_fastest"]
    for plan in line["plans"]:
        for name in ("step_seconds_interval", "memory_gb_interval", "fit_probability",
                     "p_fastest", "tied_with_best", "tokens_per_second_per_gpu_interval"):
            plan.pop(name)
    parse_result_line(json.dumps(line).encode(), "results.jsonl:1")
    line["plans"][0]["fit_probability"] = 1.5
    with pytest.raises(InputError, match="fit_probability"):
        parse_result_line(json.dumps(line).encode(), "results.jsonl:1")


def load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def flatten(tree: dict, prefix: str = "") -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        elif isinstance(value, float):
            out[f"{prefix}{key}"] = value
    return out


def test_error_model_fit_is_deterministic_and_the_stored_one_current(capsys) -> None:
    """benchmarks/error_model.py: the same rows give the same fit byte for byte, and the stored
    file is the fit of today's cost model to within 10% per number (a cost-model change that
    moves the errors more than that needs `benchmarks/error_model.py --write`; `--check` asks
    for the exact file)."""
    benchmarks = str(ROOT / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        module = load_benchmark("error_model")
        rows = (module.load_time_rows(), module.load_memory_rows(), module.load_serve_rows())
        first = json.dumps(module.rounded(module.fit_all(*rows)), sort_keys=True)
        assert json.dumps(module.rounded(module.fit_all(*rows)), sort_keys=True) == first
        module.render_coverage("Step time", module.leave_one_out(
            rows[0], module.fit_time, module.time_sigma))
    finally:
        sys.path.remove(benchmarks)
    assert "leave-one-source-out coverage of the 80% intervals" in capsys.readouterr().out
    stored = json.loads(ERROR_MODEL_PATH.read_text(encoding="utf-8"))
    assert stored["provenance"]["rows"] == {"time": len(rows[0]), "memory": len(rows[1]),
                                            "serve": len(rows[2])}
    refit, kept = flatten(json.loads(first)), flatten(stored)
    assert set(refit) == {k for k in kept if not k.startswith("provenance.")}
    for key, value in refit.items():
        assert kept[key] == pytest.approx(value, rel=0.1, abs=1e-3), (
            f"{key}: stored {kept[key]}, refit {value}: run benchmarks/error_model.py --write")


def test_sweep_lines_take_the_interval_level(tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    result = CliRunner().invoke(cli, [
        "sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8",
        "--seq-len", "2048", "--global-batch", "64", "--top", "2", "--jobs", "1",
        "--interval-level", "0.9", "-o", str(output), "-q"])
    assert result.exit_code == 0, result.output
    line = json.loads(output.read_text(encoding="utf-8").splitlines()[0])
    assert line["uncertainty"]["interval_level"] == 0.9
    wide = line["plans"][0]["step_seconds_interval"]
    narrow = run_json("optimize", *PROBLEM, "--top", "2", "--json")["plans"][0]
    assert wide[0] < narrow["step_seconds_interval"][0] <= narrow["step_seconds_interval"][1] \
        < wide[1]


def test_serve_table_shows_the_intervals() -> None:
    output = CliRunner().invoke(cli, ["serve", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                      "--gpus", "1", "--context", "4096", "--top", "1",
                                      "--interval-level", "0.9"]).output
    assert "90% intervals of plan 1" in output and "TTFT" in output


def test_every_time_part_has_an_error_group() -> None:
    # A part outside TIME_GROUPS would be left out of the intervals and the draws.
    grouped = [p for names in TIME_GROUPS.values() for p in names]
    assert sorted(grouped) == sorted(TIME_PARTS)
