"""Calibration from one real run (solver.calibrate.scales, `parplan calibrate training-log`):
the Bayesian update pinned to its worked numbers (Bishop, Pattern Recognition and Machine
Learning, 2006, eqs. 2.113-2.117), its invariants (hypothesis), and the command end to end on
BigScience's Megatron-DeepSpeed log (tests/data/training_logs/megatron_bigscience.log): the
profile it writes, `estimate --calibration` using it, and bad logs refused in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.calibrate.profile import load_profile, replace_profile_scales
from solver.calibrate.scales import (
    build_prior_scales,
    estimate_noise_sigma,
    fit_scales,
)
from solver.cli import cli
from solver.cost.uncertainty import TIME_GROUPS, build_error_model, estimate_calibrated_step
from solver.spec.calibration import CalibrationProfile, CollectiveCurve, CurveKnot
from solver.spec.plan import TIME_PARTS

DATA = Path(__file__).resolve().parent / "data" / "training_logs"
BIGSCIENCE = str(DATA / "megatron_bigscience.log")
# The run of megatron_bigscience.log as its arguments state it (lines 4-11 of the file): a
# 64-layer GPT on 64 GPUs, tp 4, pp 16, micro-batch 4, global batch 1024, sequence 1024,
# Megatron-DeepSpeed. The catalog has no V100 cluster (Jean Zay's): dgx-a100-40gb stands in,
# so these tests check the mechanics, not how far the prediction is from that run.
RUN_FLAGS = ("--model", str(DATA / "gpt_64l_8192h.toml"), "--cluster", "dgx-a100-40gb",
             "--gpus", "64", "--tp", "4", "--pp", "16", "--micro-batch", "4",
             "--global-batch", "1024", "--seq-len", "1024", "--framework", "deepspeed")
# The error model of uncertainty.py's docstring numbers (scale 1 everywhere).
ERROR_MODEL = build_error_model({
    "time": {"group_sigma": {"compute": 0.089, "communication": 0.3344, "bubble": 0.0},
             "plan_sigma": 0.0706, "scale": {"": 1.0}},
    "memory": {"sigma": {"": 0.08}}, "serve": {"sigma": {"": 0.4}}})
LEVELS = ("dense", "megatron", "hopper", "bf16")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


def compute_only(seconds: float = 1.0) -> dict[str, float]:
    return {name: seconds if name == "compute" else 0.0 for name in TIME_PARTS}


def as_arrays(parts: dict[str, float]) -> dict[str, np.ndarray]:
    return {name: np.array([value]) for name, value in parts.items()}


def test_update_worked_number() -> None:
    """scales.py docstring: a step all compute measured 10% slower. S = 0.089^2 + 0.0706^2 =
    0.012905, K = 0.007921 / S = 0.6138, mean 0.6138 log 1.1 = 0.0585, sd sqrt(0.007921 (1 -
    0.6138)) = 0.0553; another compute-bound plan's sigma sqrt(0.0553^2 + 0.0706^2) = 0.0897
    (0.1136 before); its step x exp(0.0585) = 1.060."""
    prior = build_prior_scales(ERROR_MODEL, "megatron", LEVELS, "m")
    posterior = fit_scales(prior, compute_only(), 1.1, noise_sigma=0.0)
    k = posterior.units.index("compute")
    assert posterior.log_mean[k] == pytest.approx(0.0585, abs=5e-5)
    assert math.sqrt(posterior.log_covariance[k][k]) == pytest.approx(0.0553, abs=5e-5)
    step0, sigma0 = estimate_calibrated_step(prior, as_arrays(compute_only(2.0)))
    step, sigma = estimate_calibrated_step(posterior, as_arrays(compute_only(2.0)))
    assert (float(step0[0]), float(sigma0[0])) == pytest.approx((2.0, 0.1136), abs=5e-5)
    assert float(sigma[0]) == pytest.approx(0.0897, abs=5e-5)
    assert float(step[0]) == pytest.approx(2.0 * 1.0602, abs=5e-4)


def test_memory_update_worked_number() -> None:
    """Memory sigma 0.08 split half shared, half own (variance 0.0032 each): measured 10% over
    the prediction, gain 0.0032 / 0.0064 = 0.5, mean 0.5 log 1.1 = 0.04766, shared sigma
    sqrt(0.0032 * 0.5) = 0.04, so another plan's sigma sqrt(0.0016 + 0.0032) = 0.0693."""
    prior = build_prior_scales(ERROR_MODEL, "megatron", LEVELS, "m", memory_shared_share=0.5)
    posterior = fit_scales(prior, compute_only(), 1.0, 0.0, measured_memory_bytes=1.1e9,
                           predicted_memory_bytes=1.0e9)
    assert posterior.memory_log_mean == pytest.approx(0.04766, abs=1e-5)
    assert posterior.memory_log_sigma == pytest.approx(0.04, abs=1e-6)
    assert math.hypot(posterior.memory_log_sigma, posterior.memory_plan_sigma) == \
        pytest.approx(0.0693, abs=5e-5)


def test_memory_is_not_moved_by_default() -> None:
    """MEMORY_SHARED_SHARE 0 (scales.py docstring): the run's memory moves nothing."""
    prior = build_prior_scales(ERROR_MODEL, "megatron", LEVELS, "m")
    posterior = fit_scales(prior, compute_only(), 1.0, 0.0, measured_memory_bytes=1.1e9,
                           predicted_memory_bytes=1.0e9)
    assert (posterior.memory_log_mean, posterior.memory_log_sigma) == (0.0, 0.0)
    assert posterior.memory_plan_sigma == pytest.approx(0.08)


def test_noise_of_the_median() -> None:
    """sqrt(pi/2) sd / sqrt(n): steps 1.0, 1.1, 0.9 s, sd of their logs 0.1004 -> 0.0726."""
    assert estimate_noise_sigma([1.0, 1.1, 0.9]) == pytest.approx(0.0726, abs=5e-5)
    assert estimate_noise_sigma([2.0]) == 0.0


part_seconds = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(part_seconds, min_size=len(TIME_PARTS), max_size=len(TIME_PARTS)),
       st.floats(min_value=-1.0, max_value=1.0), st.floats(min_value=0.0, max_value=0.5))
def test_update_properties(values: list[float], log_ratio: float, noise: float) -> None:
    """Every unit's variance shrinks or stays; the plan's calibrated sigma lies between its
    plan sigma and the prior covariance's at the same weights (a large shift moves the weights:
    a part found slower carries more of the step and of its error); the linearised shift
    g' mean has the measurement's sign and is no larger than it."""
    parts = dict(zip(TIME_PARTS, values))
    predicted = sum(parts.values())
    if predicted <= 1e-6:
        return
    prior = build_prior_scales(ERROR_MODEL, "megatron", LEVELS, "m")
    posterior = fit_scales(prior, parts, predicted * math.exp(log_ratio), noise)
    before, after = np.diag(prior.log_covariance), np.diag(posterior.log_covariance)
    assert np.all(after <= before + 1e-12)
    # The same step weights (the posterior mean's) under the prior's covariance: wider.
    moved = prior.model_copy(update={"log_mean": posterior.log_mean})
    _, sigma0 = estimate_calibrated_step(moved, as_arrays(parts))
    _, sigma = estimate_calibrated_step(posterior, as_arrays(parts))
    assert prior.plan_sigma - 1e-9 <= float(sigma[0]) <= float(sigma0[0]) + 1e-9
    units = {"compute": sum(parts[p] for p in TIME_GROUPS["compute"]),
             **{p: parts[p] for p in (*TIME_GROUPS["communication"], "bubble")}}
    g = np.array([units[u] for u in posterior.units]) / predicted
    shift = float(g @ np.array(posterior.log_mean))
    assert shift * log_ratio >= -1e-12
    assert abs(shift) <= abs(log_ratio) + 1e-12


def test_a_noisy_run_teaches_nothing() -> None:
    """With a measurement noise far above the prior, the posterior is the prior."""
    prior = build_prior_scales(ERROR_MODEL, "megatron", LEVELS, "m")
    posterior = fit_scales(prior, compute_only(), 1.5, noise_sigma=1e6)
    assert np.allclose(posterior.log_mean, prior.log_mean, atol=1e-12)
    assert np.allclose(posterior.log_covariance, prior.log_covariance, atol=1e-12)


def test_scales_sit_beside_the_curves() -> None:
    """A profile's curves are kept when scales are added; old files (no scales) still load."""
    curve = CollectiveCurve(num_ranks=8, num_nodes=1, num_domains=1,
                            knots=(CurveKnot(size_bytes=1024, time_us=10.0),
                                   CurveKnot(size_bytes=2**30, time_us=5000.0)))
    old = CalibrationProfile(cluster="dgx-h100", tiers={"nvlink": {"all_reduce": curve}})
    assert old.scales == ()
    scales = build_prior_scales(ERROR_MODEL, "megatron", LEVELS, "llama3.1-8b")
    both = replace_profile_scales(old, "dgx-h100", scales)
    assert both.tiers == old.tiers and both.scales == (scales,)
    again = replace_profile_scales(both, "dgx-h100", scales.model_copy(
        update={"log_mean": tuple(0.1 for _ in scales.units)}))
    assert len(again.scales) == 1 and again.scales[0].log_mean[0] == 0.1
    assert again.find_scales("megatron", "/".join(LEVELS), "llama3.1-8b") is not None
    assert again.find_scales("megatron", "/".join(LEVELS), "llama3.1-70b") is None


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    path = tmp_path_factory.mktemp("tlog") / "profile.json"
    result = invoke("calibrate", "training-log", BIGSCIENCE, "-o", str(path), *RUN_FLAGS,
                    "--json")
    assert result.exit_code == 0, result.output
    return path, json.loads(result.output)


def test_command_writes_the_run_and_its_scales(calibrated: tuple[Path, dict]) -> None:
    """Iterations 11-20 kept (warm-up 10): median (125352.3 + 125984.1) / 2 ms; the memory
    is the largest 'max allocated' (15492.85 MiB = 16.245 GB, allocated view)."""
    path, answer = calibrated
    run = answer["scales"]["run"]
    assert run["num_iterations"] == 10
    assert run["measured_step_s"] == pytest.approx(125.6682)
    assert run["measured_memory_gb"] == pytest.approx(15492.84619140625 * 2**20 / 1e9)
    assert run["memory_view"] == "allocated"
    profile = load_profile(path)
    (scales,) = profile.scales
    assert (profile.cluster, scales.framework, scales.model) == (
        "dgx-a100-40gb", "deepspeed", "gpt-64l-8192h")
    assert scales.category == "dense/deepspeed/ampere/bf16"
    # The run is slower than predicted: the compute scale grows, its sigma shrinks.
    k = scales.units.index("compute")
    assert scales.log_mean[k] > 0
    assert answer["scales"]["units"]["compute"]["log_sigma_after"] < \
        answer["scales"]["units"]["compute"]["log_sigma_before"]
    assert answer["scales"]["step_log_sigma_after"] < answer["scales"]["step_log_sigma_before"]


def test_estimate_uses_the_scales(calibrated: tuple[Path, dict]) -> None:
    path, answer = calibrated
    plain = json.loads(invoke("estimate", *RUN_FLAGS, "--json").output)["plans"][0]
    result = invoke("estimate", *RUN_FLAGS, "--calibration", str(path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    plan = data["plans"][0]
    assert plan["step_seconds"] == plain["step_seconds"]  # the cost model's own number
    assert plan["step_seconds_calibrated"] == pytest.approx(
        answer["scales"]["step_seconds_calibrated"], rel=1e-5)
    low, high = plan["step_seconds_interval"]
    assert low < plan["step_seconds_calibrated"] < high
    plain_low, plain_high = plain["step_seconds_interval"]
    assert high / low < plain_high / plain_low  # narrower
    assert data["uncertainty"]["calibrated"]["num_runs"] == 1
    assert "memory_gb_calibrated" in plan
    text = invoke("estimate", *RUN_FLAGS, "--calibration", str(path)).output
    assert "calibrated by 1 run" in text


def test_a_second_run_updates_the_first(calibrated: tuple[Path, dict],
                                        tmp_path: Path) -> None:
    path, answer = calibrated
    second = tmp_path / "second.json"
    result = invoke("calibrate", "training-log", BIGSCIENCE, "-o", str(second), *RUN_FLAGS,
                    "--calibration", str(path), "--json")
    assert result.exit_code == 0, result.output
    update = json.loads(result.output)["scales"]
    assert update["step_log_sigma_before"] == pytest.approx(
        answer["scales"]["step_log_sigma_after"], abs=1e-4)
    assert update["step_log_sigma_after"] < update["step_log_sigma_before"]
    assert len(load_profile(second).scales[0].runs) == 2


def test_another_model_is_not_calibrated(calibrated: tuple[Path, dict]) -> None:
    path, _ = calibrated
    flags = list(RUN_FLAGS)
    flags[1] = "gpt3-175b"
    flags[flags.index("--pp") + 1] = "16"
    result = invoke("estimate", *flags, "--calibration", str(path), "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)["plans"][0]
    assert "step_seconds_calibrated" not in plan


def test_a_plan_the_log_contradicts_is_refused(tmp_path: Path) -> None:
    """The log states tensor_model_parallel_size 4 (its line 10); the flags say tp 2."""
    flags = list(RUN_FLAGS)
    flags[flags.index("--tp") + 1] = "2"
    result = invoke("calibrate", "training-log", BIGSCIENCE, "-o", str(tmp_path / "p.json"),
                    *flags)
    assert_one_line_error(result, "megatron_bigscience.log: line 10:",
                          "tensor_model_parallel_size is 4", "tp is 2")
    assert not (tmp_path / "p.json").exists()


def test_a_log_of_another_framework_is_refused(tmp_path: Path) -> None:
    flags = list(RUN_FLAGS)
    flags[flags.index("--framework") + 1] = "megatron"
    result = invoke("calibrate", "training-log", str(DATA / "torchtitan_graph_trainer.log"),
                    "-o", str(tmp_path / "p.json"), *flags)
    assert_one_line_error(result, "torchtitan_graph_trainer.log: line 4:",
                          "a torchtitan log", "framework 'megatron'")


def test_a_log_without_iterations_is_refused(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("> building GPT model ...\nNumber of parameters in billions: 8.03\n")
    result = invoke("calibrate", "training-log", str(log), "-o", str(tmp_path / "p.json"),
                    *RUN_FLAGS)
    assert_one_line_error(result, "train.log: no iteration line")


def test_a_warm_up_only_log_is_refused(tmp_path: Path) -> None:
    result = invoke("calibrate", "training-log", str(DATA / "megatron_bridge_dgxc.log"),
                    "-o", str(tmp_path / "p.json"), *RUN_FLAGS)
    assert_one_line_error(result, "megatron_bridge_dgxc.log: line 3:", "warm-up")


def test_optimize_uses_the_scales(calibrated: tuple[Path, dict]) -> None:
    path, _ = calibrated
    flags = [f for f in RUN_FLAGS[:6]] + ["--global-batch", "1024", "--seq-len", "1024",
                                          "--framework", "deepspeed", "--top", "2"]
    result = invoke("optimize", *flags, "--calibration", str(path), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["uncertainty"]["calibrated"]["num_runs"] == 1
    for plan in data["plans"]:
        low, high = plan["step_seconds_interval"]
        assert low < plan["step_seconds_calibrated"] < high
    text = invoke("optimize", *flags, "--calibration", str(path)).output
    assert "calibrated by 1 run of this model" in text
