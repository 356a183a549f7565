"""`parplan rl` (issue 41): plans for a 7-8B and a 70B dense model and a mixture of experts,
colocated and split, 8 to 256 GPUs; the properties the issue names; the rollout's pieces."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cli import cli
from solver.rl.job import RlJob, RlPins
from solver.rl.rollout import estimate_rollouts, estimate_survival, mean_running_age
from solver.rl.search import build_placements, plan_rl
from solver.serve.workload import LengthDistribution, parse_length_distribution

PHASES = {"generation", "log_probs", "training", "weight_sync", "host_swap"}


def rl_job(response: str = "256-2048", prompts: int = 64, samples: int = 8,
           algorithm: str = "grpo", async_steps: int = 0, max_response: int | None = None
           ) -> RlJob:
    lengths = parse_length_distribution(response, "--response-len")
    return RlJob(algorithm=algorithm, prompts_per_step=prompts, samples_per_prompt=samples,
                 prompt_lengths=LengthDistribution.fixed(256), response_lengths=lengths,
                 max_response_len=max_response or lengths.maximum, async_steps=async_steps)


def assert_every_phase_fits(result) -> None:
    usable_gb = result.cluster.usable_memory_bytes / 1e9
    for plan in result.plans:
        assert set(plan.phases) == PHASES
        assert set(plan.memory_gb) == {"generation", "log_probs", "training", "weight_sync"}
        for phase, gb in plan.memory_gb.items():
            assert 0 < gb <= usable_gb + 1e-9, (phase, gb, usable_gb)
        assert plan.step_seconds >= max(plan.phases.values())
        assert 0 < plan.utilization < 1


@pytest.mark.parametrize("model, gpus", [
    ("llama3.1-8b", 8), ("llama3.1-8b", 256), ("llama3.1-70b", 64), ("llama3.1-70b", 256),
    ("qwen3-30b-a3b", 32)])
def test_grpo_plans_colocated_and_split(model: str, gpus: int) -> None:
    """Issue 41's done-when: GRPO for a 7-8B and a 70B dense model and a MoE (Qwen3-30B-A3B),
    colocated and split, 8 to 256 GPUs; every phase of every plan fits (how long each takes:
    benchmarks/rl_speed.py)."""
    result = plan_rl(model, "dgx-h100", gpus, rl_job(), top=100)
    assert result.status == "feasible", result.unplaced
    assert {p.placement for p in result.plans} == {"colocated", "split"}
    assert_every_phase_fits(result)
    assert result.plans == tuple(sorted(result.plans, key=lambda p: p.step_seconds))
    assert all(p.training.config.zero in (0, 1) for p in result.plans)  # verl's megatron
    assert result.why[0].startswith("Best: ")
    for plan in result.plans:
        gpus_used = plan.training_gpus + (plan.rollout_gpus if plan.placement == "split" else 0)
        assert gpus_used == gpus
        rollout = plan.rollout
        assert rollout["tp"] * rollout["dp"] * rollout["replicas"] == plan.rollout_gpus


def test_off_policy_plans_are_never_slower() -> None:
    """Property on real plans: the best plan off by one step is never slower than on-policy,
    and its split plans overlap generation with training."""
    on = plan_rl("llama3.1-8b", "dgx-h100", 16, rl_job(), top=100)
    off = plan_rl("llama3.1-8b", "dgx-h100", 16, rl_job(async_steps=1), top=100)
    assert off.plans[0].step_seconds <= on.plans[0].step_seconds
    split_on = min(p.step_seconds for p in on.plans if p.placement == "split")
    split_off = min(p.step_seconds for p in off.plans if p.placement == "split")
    assert split_off < split_on


def test_placements_split_whole_nodes() -> None:
    assert build_placements(64, 8) == (("colocated", 64, 64), ("split", 8, 56),
                                       ("split", 16, 48), ("split", 24, 40), ("split", 32, 32),
                                       ("split", 40, 24), ("split", 48, 16), ("split", 56, 8))
    assert build_placements(8, 8) == (("colocated", 8, 8), ("split", 1, 7), ("split", 2, 6),
                                      ("split", 4, 4), ("split", 6, 2))


def test_survival_and_running_age() -> None:
    """P(L > t): uniform 1..1000 at 250 is 0.75; the mean running age E[L^2] / (2 E[L]):
    fixed 1000, 500; uniform 1..1000, 333,833.5 / 1001 = 333.5; an empirical file's share."""
    uniform = LengthDistribution(kind="uniform", low=1, high=1000)
    assert float(estimate_survival(uniform, np.array(250.0))) == 0.75
    assert mean_running_age(LengthDistribution.fixed(1000)) == 500.0
    assert mean_running_age(uniform) == pytest.approx(333.5)
    empirical = LengthDistribution(kind="empirical", low=10, high=40, values=(10, 20, 30, 40))
    assert estimate_survival(empirical, np.array([5.0, 20.0, 40.0])).tolist() == [1.0, 0.5, 0.0]


@pytest.fixture(scope="module")
def h100():
    return load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")


@settings(max_examples=15, deadline=None, derandomize=True)
@given(gpus=st.sampled_from([1, 2, 4, 8, 16]), more=st.sampled_from([2, 4]),
       prompts=st.integers(1, 128), samples=st.integers(1, 16))
def test_more_rollout_gpus_never_slow_generation(h100, gpus, more, prompts, samples) -> None:
    """Property (issue 41): with more rollout GPUs, every engine layout of the smaller pool is
    there again with more engines, and generates no slower; so does the best layout."""
    model_spec, cluster = h100
    job = rl_job(prompts=prompts, samples=samples)
    budget = 0.9 * cluster.usable_memory_bytes
    small = estimate_rollouts(model_spec, cluster, job, gpus, budget)
    large = estimate_rollouts(model_spec, cluster, job, gpus * more, budget)
    for i in np.flatnonzero(small.fits):
        tp = small.candidates.tp[i]
        j = np.flatnonzero((large.candidates.tp == tp) & large.fits)[0]
        assert large.generation.total_s[j] <= small.generation.total_s[i] * (1 + 1e-12)
    best = lambda r: np.min(np.where(r.fits, r.generation.total_s, np.inf))  # noqa: E731
    assert best(large) <= best(small) * (1 + 1e-12)


@settings(max_examples=15, deadline=None, derandomize=True)
@given(low=st.integers(1, 2000), width=st.integers(0, 2000), longer=st.integers(1, 4000),
       samples=st.integers(1, 2048))
def test_a_longer_tail_never_shortens_generation(h100, low, width, longer, samples) -> None:
    """Property (issue 41): responses whose upper end is longer (same maximum response length)
    never generate faster."""
    model_spec, cluster = h100
    high = low + width
    ceiling = high + longer
    short = RlJob(prompts_per_step=1, samples_per_prompt=samples,
                  prompt_lengths=LengthDistribution.fixed(128),
                  response_lengths=parse_length_distribution(f"{low}-{high}", "x"),
                  max_response_len=ceiling)
    long = short.model_copy(update={
        "response_lengths": parse_length_distribution(f"{low}-{ceiling}", "x")})
    budget = 0.9 * cluster.usable_memory_bytes
    a = estimate_rollouts(model_spec, cluster, short, 8, budget)
    b = estimate_rollouts(model_spec, cluster, long, 8, budget)
    both = a.fits & b.fits
    assert both.any()
    assert np.all(b.generation.total_s[both] >= a.generation.total_s[both] * (1 - 1e-12))


def test_a_longer_tail_never_shortens_the_step() -> None:
    """Property on the whole step: the best plan's step with a longer response tail."""
    short = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job("256-2048", max_response=4096))
    long = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job("256-4096", max_response=4096))
    assert long.plans[0].step_seconds >= short.plans[0].step_seconds


def test_dapo_runs_no_reference_and_ppo_trains_a_critic() -> None:
    """DAPO drops the KL term (Yu et al. 2025 §2.3): fewer forward passes than GRPO; PPO's
    critic adds its forward and training."""
    grpo = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job(), top=100)
    dapo = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job(algorithm="dapo"), top=100)
    ppo = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job(algorithm="ppo", samples=8), top=100)

    def colocated(result):
        return next(p for p in result.plans if p.placement == "colocated")

    assert colocated(dapo).phases["log_probs"] < colocated(grpo).phases["log_probs"]
    assert colocated(ppo).phases["training"] > colocated(grpo).phases["training"]


def test_cli_json_has_the_design_fields() -> None:
    result = CliRunner().invoke(cli, ["rl", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                      "--gpus", "8", "--algorithm", "grpo",
                                      "--prompts-per-step", "32", "--samples-per-prompt", "4",
                                      "--prompt-len", "128", "--response-len", "64-512",
                                      "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["status"] == "feasible"
    plan = payload["plans"][0]
    assert plan["placement"] in ("colocated", "split")
    assert set(plan["phases"]) == PHASES
    assert plan["step_seconds"] > 0 and set(plan["memory_gb"]) >= {"generation", "training"}


def test_cli_table_and_verl_command() -> None:
    result = CliRunner().invoke(cli, ["rl", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                      "--gpus", "8", "--prompts-per-step", "32",
                                      "--response-len", "64-512", "--verl"])
    assert result.exit_code == 0, result.output
    assert "- Best: " in result.output
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size=" in result.output


@pytest.mark.parametrize("args, needle", [
    (["--response-len", "100-9000", "--max-response-len", "4096"], "max_response_len"),
    (["--prompts-per-step", "10", "--optimizer-steps-per-rollout", "3"],
     "optimizer_steps_per_rollout"),
    (["--algorithm", "grpo", "--critic-model", "llama3.2-1b"], "--critic-model"),
    (["--response-len", "abc"], "--response-len"),
])
def test_bad_rl_input_is_one_line(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(cli, ["rl", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                      "--gpus", "8", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert needle in result.output


def test_pins_cost_the_given_configuration() -> None:
    """RlPins (--placement, --training-gpus, --rollout-tp, --offload and the training search's
    own pins) leave only plans that have them."""
    pins = RlPins(placement="split", training_gpus=4, rollout_tp=2, offload="none",
                  training={"tp": (2,), "micro_batch": (1,)})
    result = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job(), top=100, pins=pins)
    assert result.plans
    for plan in result.plans:
        assert (plan.placement, plan.training_gpus, plan.rollout["tp"], plan.offload) == (
            "split", 4, 2, "none")
        assert plan.training.config.tp == 2 and plan.training.config.micro_batch == 1
    colocated = plan_rl("llama3.1-8b", "dgx-h100", 8, rl_job(), top=100,
                        pins=RlPins(placement="colocated", rollout_gpu_memory_utilization=0.5))
    assert {p.placement for p in colocated.plans} == {"colocated"}
    assert all(p.rollout_gpu_memory_utilization == pytest.approx(0.5) for p in colocated.plans)


def test_cli_pins_a_split() -> None:
    result = CliRunner().invoke(cli, ["rl", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                      "--gpus", "8", "--prompts-per-step", "32",
                                      "--response-len", "64-512", "--placement", "split",
                                      "--training-gpus", "2", "--json"])
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)["plans"]
    assert plans and all(p["training_gpus"] == 2 and p["placement"] == "split" for p in plans)
