"""Issue 36: with --calibration, the ranking and p_fastest use the calibrated model
(solver.calibrate.scales.rank_calibrated, solver.cost.uncertainty.
estimate_calibrated_fastest_odds): a run that measured a unit slower than modelled moves the
plans that expose less of it up."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.calibrate.scales import build_prior_scales, rank_calibrated
from solver.cli import cli
from solver.cost.uncertainty import (
    UNIT_GROUP,
    build_error_model,
    estimate_calibrated_fastest_odds,
    estimate_fastest_odds,
)
from solver.spec.plan import TIME_PARTS

# uncertainty.py's docstring numbers, scale 1 (as tests/test_calibrate_training_log.py).
ERROR_MODEL = build_error_model({
    "time": {"group_sigma": {"compute": 0.089, "communication": 0.3344, "bubble": 0.0},
             "plan_sigma": 0.0706, "scale": {"": 1.0}},
    "memory": {"sigma": {"": 0.08}}, "serve": {"sigma": {"": 0.4}}})
PRIOR = build_prior_scales(ERROR_MODEL, "megatron", ("dense", "megatron", "hopper", "bf16"),
                           "llama3.1-8b")
EP = list(UNIT_GROUP).index("ep")


def parts(**seconds: list[float]) -> dict[str, np.ndarray]:
    num = len(next(iter(seconds.values())))
    return {name: np.array(seconds.get(name, [0.0] * num), dtype=float) for name in TIME_PARTS}


def with_ep_mean(log_mean: float, sd: float = 0.05):
    """The prior with EP's posterior at `log_mean` and sd `sd` (what a run measured)."""
    mean = [log_mean if i == EP else 0.0 for i in range(len(PRIOR.units))]
    cov = [list(row) for row in PRIOR.log_covariance]
    cov[EP][EP] = sd ** 2
    return PRIOR.model_copy(update={"log_mean": tuple(mean),
                                    "log_covariance": tuple(tuple(r) for r in cov)})


def fake_plan(**seconds: float) -> SimpleNamespace:
    return SimpleNamespace(time=SimpleNamespace(
        time_seconds={name: seconds.get(name, 0.0) for name in TIME_PARTS}))


def test_the_prior_draws_the_uncalibrated_odds() -> None:
    """Mean 0 and the prior's diagonal covariance: the same draws (the square root of a
    diagonal covariance is the diagonal of sigmas), so the same chances."""
    steps = parts(compute=[1.0, 1.05, 1.2], ep=[0.1, 0.0, 0.02], dp=[0.0, 0.05, 0.0])
    prior = estimate_fastest_odds(ERROR_MODEL, (), steps, 0.8)
    calibrated = estimate_calibrated_fastest_odds(PRIOR, steps, 0.8)
    assert calibrated.p_fastest == pytest.approx(prior.p_fastest, abs=1e-3)
    assert (calibrated.tied_with_best == prior.tied_with_best).all()
    assert calibrated.flip_part == prior.flip_part


def test_a_run_that_measured_ep_slower_reranks_and_moves_the_odds() -> None:
    """Plan A: 1.0 s compute + 0.1 s EP (1.1 s), plan B: 1.15 s compute. A run that measured
    EP twice as slow (posterior mean log 2, sd 0.05): A is 1.0 + 0.2 = 1.2 s > 1.15 s, so B
    ranks first and wins most draws (the gap 0.05 s against EP's sd 0.05 x 0.2 s and the
    compute draw shared by both)."""
    a, b = fake_plan(compute=1.0, ep=0.1), fake_plan(compute=1.15)
    scales = with_ep_mean(math.log(2.0))
    assert rank_calibrated([a, b], PRIOR) == (a, b)
    assert rank_calibrated([a, b], scales) == (b, a)
    before = estimate_fastest_odds(ERROR_MODEL, (), parts(compute=[1.0, 1.15], ep=[0.1, 0.0]),
                                   0.8)
    after = estimate_calibrated_fastest_odds(scales, parts(compute=[1.15, 1.0], ep=[0.0, 0.1]),
                                             0.8)
    assert before.p_fastest[0] > 0.5 and after.p_fastest[0] > 0.5
    assert after.p_fastest[0] > before.p_fastest[1]


def test_untimed_plans_stay_last() -> None:
    untimed = SimpleNamespace(time=None)
    a, b = fake_plan(compute=2.0), fake_plan(compute=1.0)
    assert rank_calibrated([untimed, a, b], PRIOR) == (b, a, untimed)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 10.0), st.floats(0.0, 3.0)), min_size=2, max_size=6),
       st.floats(-1.0, 1.0), st.floats(-0.9, 0.9))
def test_calibrated_p_fastest_sums_to_one_and_is_seeded(rows, ep_mean, correlation) -> None:
    """Any posterior (here EP and compute correlated, as one run measures them together)."""
    scales = with_ep_mean(ep_mean, 0.1)
    cov = [list(r) for r in scales.log_covariance]
    cov[0][EP] = cov[EP][0] = correlation * math.sqrt(cov[0][0] * cov[EP][EP])
    scales = scales.model_copy(update={"log_covariance": tuple(tuple(r) for r in cov)})
    steps = parts(compute=[r[0] for r in rows], ep=[r[1] for r in rows])
    odds = estimate_calibrated_fastest_odds(scales, steps, 0.8)
    assert odds.p_fastest.sum() == pytest.approx(1.0)
    assert ((odds.p_fastest >= 0) & (odds.p_fastest <= 1)).all()
    again = estimate_calibrated_fastest_odds(scales, steps, 0.8)
    assert (again.p_fastest == odds.p_fastest).all()


DATA = Path(__file__).resolve().parent / "data" / "training_logs"
# tests/test_calibrate_training_log.py's run: megatron_bigscience.log, its plan on
# dgx-a100-40gb (the mechanics, not the prediction's distance from that run).
RUN_FLAGS = ("--model", str(DATA / "gpt_64l_8192h.toml"), "--cluster", "dgx-a100-40gb",
             "--gpus", "64", "--tp", "4", "--pp", "16", "--micro-batch", "4",
             "--global-batch", "1024", "--seq-len", "1024", "--framework", "deepspeed")


def test_optimize_ranks_by_the_calibrated_step(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    made = CliRunner().invoke(cli, ["calibrate", "training-log", str(DATA /
                                    "megatron_bigscience.log"), "-o", str(path), *RUN_FLAGS])
    assert made.exit_code == 0, made.output
    flags = [*RUN_FLAGS[:6], "--global-batch", "1024", "--seq-len", "1024", "--framework",
             "deepspeed", "--top", "4"]
    result = CliRunner().invoke(cli, ["optimize", *flags, "--calibration", str(path), "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    steps = [p["step_seconds_calibrated"] for p in plans]
    assert steps == sorted(steps)
    assert sum(p["p_fastest"] for p in plans) == pytest.approx(1.0, abs=1e-3)
    again = CliRunner().invoke(cli, ["optimize", *flags, "--calibration", str(path), "--json"])
    # Seeded draws: the same answer but for the solve's wall time.
    assert (json.loads(again.output) | {"solve_seconds": 0}
            == json.loads(result.output) | {"solve_seconds": 0})
    text = CliRunner().invoke(cli, ["optimize", *flags, "--calibration", str(path)]).output
    assert "plans ranked by the calibrated step" in text
