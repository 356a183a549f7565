"""`parplan estimate --plan FILE` (issue 35, item 5): a plan that `optimize --json` wrote (the
file `launch --plan` reads), a single plan object, or a line of a `sweep -o` results file is
estimated again under everything it was costed with (model, cluster, job, framework and its
features, degrees, recompute and its module set, memory savers, offloads, layout, headroom),
and gives the same memory and step time.

The oracle is the optimizer itself: `optimize` costs its plans with the same cost model
(solver.ranked_plans.build_ranked_plans: estimate_plans on each plan's layout), so a plan read
back must give its numbers to the rounding of the JSON (relative 1e-9), memory and step
time alike: since issue 35's drift 3 was fixed, `optimize` times each plan with the memory
savers it turns on (solver.ranked_plans.cost_ranked_plans), as `estimate` does.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_input import assert_one_line_error
from solver.cli import cli
from solver.spec.headroom import MemoryHeadroom
from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import SweepProblem

# What an estimated plan does not carry (the search's own fields): the settings of the same
# step time, and the names of what the search turned on (the estimate's profile has them on).
# (p_fastest and tied_with_best compare a plan with the others listed: estimate has one.)
SEARCH_FIELDS = {"equivalent", "memory_savers", "recompute_modules", "offloads", "p_fastest",
                 "tied_with_best"}
# Small zoo models of each kind: dense, hybrid (Mamba + attention), MLA MoE, GQA MoE.
MODELS = ("llama3.2-1b", "nemotron-h-8b", "deepseek-v2-lite", "qwen3-30b-a3b")
CLUSTERS = ("dgx-h100", "dgx-a100-80gb")
SCALES = (8, 32)


def assert_close(want: Any, got: Any, where: str = "plan") -> None:
    """Equal JSON, numbers within a relative 1e-9."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(want) == set(got), (where, want, got)
        for key in want:
            assert_close(want[key], got[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(want) == len(got), (where, want, got)
        for index, (a, b) in enumerate(zip(want, got)):
            assert_close(a, b, f"{where}.{index}")
    elif isinstance(want, float) or isinstance(got, float):
        assert math.isclose(want, got, rel_tol=1e-9, abs_tol=0.0), (where, want, got)
    else:
        assert want == got, (where, want, got)


def optimize_json(path: Path, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["optimize", *args, "--top", "3", "--time-limit", "5",
                                      "--json"])
    assert result.exit_code == 0, result.output
    path.write_text(result.stdout, encoding="utf-8")
    return json.loads(result.stdout)


def estimate_plan_json(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["estimate", "--plan", *args, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert len(answer["plans"]) == 1
    return answer


def assert_reproduces(plan: dict[str, Any], estimated: dict[str, Any]) -> None:
    """The estimate gives the plan's memory items, stages and views, and its step time."""
    skip = SEARCH_FIELDS
    assert_close({k: v for k, v in plan.items() if k not in skip},
                 {k: v for k, v in estimated.items() if k not in skip})


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(model=st.sampled_from(MODELS), cluster=st.sampled_from(CLUSTERS),
       gpus=st.sampled_from(SCALES))
def test_estimate_plan_reproduces_every_top_plan(tmp_path: Path, model: str, cluster: str,
                                                 gpus: int) -> None:
    path = tmp_path / f"{model}-{cluster}-{gpus}.json"
    answer = optimize_json(path, "--model", model, "--cluster", cluster, "--gpus", str(gpus))
    assert answer["plans"], answer.get("conflicts")
    for rank, plan in enumerate(answer["plans"], 1):
        estimated = estimate_plan_json(str(path), "--rank", str(rank))
        assert estimated["framework_features"] == {
            **answer["framework_features"],
            **{name: True for name in plan.get("memory_savers", []) + plan.get("offloads", [])},
            **({"recompute_modules": plan["recompute_modules"]}
               if plan.get("recompute_modules") else {})}
        for field in ("model", "cluster", "gpus", "seq_len", "global_batch", "precision",
                      "framework"):
            assert estimated[field] == answer[field], field
        assert_reproduces(plan, estimated["plans"][0])


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Llama 3.2 1B on 8 H100s: plan 2 needs --grad-reduce-in-bf16 to fit (its saver)."""
    path = tmp_path_factory.mktemp("plans") / "plans.json"
    return path, optimize_json(path, "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                               "--gpus", "8")


def test_plan_with_a_memory_saver_keeps_its_memory(optimized: tuple[Path, dict]) -> None:
    path, answer = optimized
    rank = next(i for i, plan in enumerate(answer["plans"], 1) if plan.get("memory_savers"))
    plan = answer["plans"][rank - 1]
    estimated = estimate_plan_json(str(path), "--rank", str(rank))
    assert estimated["framework_features"]["grad_reduce_in_bf16"] is True
    assert_close(plan["memory_gb"], estimated["plans"][0]["memory_gb"])
    # Without the saver the same degrees need more memory (the saver is what was read).
    plain = CliRunner().invoke(cli, ["estimate", "--plan", str(path), "--rank", str(rank),
                                     "--no-grad-reduce-in-bf16", "--json"])
    assert json.loads(plain.stdout)["plans"][0]["memory_gb"]["grads"] > \
        plan["memory_gb"]["grads"]


def test_memory_saver_plan_keeps_its_step_time(optimized: tuple[Path, dict]) -> None:
    path, answer = optimized
    rank = next(i for i, plan in enumerate(answer["plans"], 1) if plan.get("memory_savers"))
    estimated = estimate_plan_json(str(path), "--rank", str(rank))
    assert_close(answer["plans"][rank - 1]["step_seconds"],
                 estimated["plans"][0]["step_seconds"])


def test_sweep_results_line(tmp_path: Path) -> None:
    """Line 2 of a `sweep -o` results file (solver.sweep.outcome writes each line), with a
    memory headroom the plans were checked against."""
    settings_ = SolveSettings(top=2, time_limit_s=5.0,
                              memory_headroom=MemoryHeadroom(fraction=0.1))
    lines = [solve_sweep_problem(SweepProblem("llama3.2-1b", "dgx-h100", gpus, 4096, 256,
                                              "bf16"), settings_) for gpus in (8, 16)]
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    for rank, plan in enumerate(lines[1]["plans"], 1):
        estimated = estimate_plan_json(str(path), "--line", "2", "--rank", str(rank))
        assert estimated["gpus"] == 16 and estimated["global_batch"] == 256
        assert estimated["plans"][0]["memory_headroom"] == "10%"
        assert_reproduces(plan, estimated["plans"][0])
    assert_one_line_error(CliRunner().invoke(cli, ["estimate", "--plan", str(path)]),
                     str(path), "more than one JSON value", "--line N")
    assert_one_line_error(CliRunner().invoke(cli, ["estimate", "--plan", str(path), "--line", "3"]),
                     "--line 3", "has 2 line(s)")
    # The same reader behind `launch --plan`: line 2's plan 1 is launched on 16 GPUs.
    launched = CliRunner().invoke(cli, ["launch", "--plan", str(path), "--line", "2",
                                        "--json"])
    assert launched.exit_code == 0, launched.output
    groups = json.loads(launched.stdout)
    best = lines[1]["plans"][0]
    assert groups["world_size"] == 16 and len(groups["groups"]["tp"][0]) == best["tp"]


def test_single_plan_object_takes_the_problem_from_flags(optimized: tuple[Path, dict],
                                                         tmp_path: Path) -> None:
    """`jq '.plans[0]'`: a plan object alone, with no problem fields; the flags name them."""
    _, answer = optimized
    plan = answer["plans"][0]
    assert not plan.get("memory_savers")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")
    assert_one_line_error(CliRunner().invoke(cli, ["estimate", "--plan", str(path)]),
                     "--model: required", f"{path} names no 'model'")
    estimated = estimate_plan_json(str(path), "--model", "llama3.2-1b", "--cluster",
                                   "dgx-h100", "--gpus", "8")
    assert_reproduces(plan, estimated["plans"][0])
    assert_one_line_error(CliRunner().invoke(cli, ["estimate", "--plan", str(path), "--model",
                                              "llama3.2-1b", "--cluster", "dgx-h100",
                                              "--gpus", "16"]),
                     "--gpus 16", "= 8 GPUs")


def test_flags_override_the_file(optimized: tuple[Path, dict]) -> None:
    """A job flag given replaces the file's value (what-if), as in `launch --plan`."""
    path, answer = optimized
    longer = estimate_plan_json(str(path), "--seq-len", "8192")
    assert longer["seq_len"] == 8192 and answer["seq_len"] == 4096
    assert longer["plans"][0]["step_seconds"] > answer["plans"][0]["step_seconds"]


def test_bad_plan_files_are_one_line_naming_the_file_and_field(
        optimized: tuple[Path, dict], tmp_path: Path) -> None:
    path, answer = optimized

    def write(name: str, data: Any) -> str:
        target = tmp_path / name
        target.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
        return str(target)

    def estimate(*args: str) -> Result:
        return CliRunner().invoke(cli, ["estimate", "--plan", *args])

    assert_one_line_error(estimate(str(tmp_path / "absent.json")), "no such file")
    assert_one_line_error(estimate(write("text.json", "plans: 1")), "text.json", "not JSON")
    assert_one_line_error(estimate(str(path), "--rank", "9"), "--rank 9", "holds 3 plan(s)")
    bad_framework = write("framework.json", {**answer, "framework": "jax"})
    assert_one_line_error(estimate(bad_framework), "framework.json", "field 'framework'", "'jax'")
    unknown = write("unknown.json", {**answer, "framework_features": {
        **answer["framework_features"], "warp_drive": True}})
    assert_one_line_error(estimate(unknown), "unknown.json",
                     "field 'framework_features.warp_drive'", "unknown feature")
    wrong = write("value.json", {**answer, "framework_features": {
        **answer["framework_features"], "moe_dispatcher": "carrier_pigeon"}})
    assert_one_line_error(estimate(wrong), "value.json", "moe_dispatcher")
    headroom = write("headroom.json", {**answer, "plans": [
        {**answer["plans"][0], "memory_headroom": "lots"}]})
    assert_one_line_error(estimate(headroom), "headroom.json", "field 'plans.0.memory_headroom'")
    degrees = write("degrees.json", {**answer, "plans": [{**answer["plans"][0], "tp": 0}]})
    assert_one_line_error(estimate(degrees), "degrees.json", "plans.0", "tp")
    assert_one_line_error(estimate(str(path), "--tp", "2"), "--tp with --plan",
                     "not both")
    assert_one_line_error(estimate(str(path), "--framework", "torchtitan"),
                     "--framework torchtitan", "costed under megatron")
    assert_one_line_error(estimate(str(path), "--model", "llama3.1-8b"), "field 'model'",
                     "llama3.2-1b")
    assert_one_line_error(CliRunner().invoke(cli, ["estimate", "--rank", "2", "--model",
                                              "llama3.2-1b", "--cluster", "dgx-h100",
                                              "--gpus", "8"]), "--rank 2", "give --plan")
    assert_one_line_error(CliRunner().invoke(cli, ["estimate", "--cluster", "dgx-h100", "--gpus",
                                              "8"]), "--model: required")


def test_torchtitan_features_that_move_each_other(tmp_path: Path) -> None:
    """torchtitan's --fused-elementwise also compiles the loss unless --loss-implementation
    says otherwise (solver.cost.step.frameworks.build_framework_profile): a plan costed with fused
    element-wise ops and an eager loss is read back with both, not with the compiled loss."""
    path = tmp_path / "titan.json"
    answer = optimize_json(path, "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus",
                           "8", "--framework", "torchtitan", "--fused-elementwise",
                           "--loss-implementation", "eager")
    assert answer["framework_features"]["fused_elementwise"] is True
    assert answer["framework_features"]["loss_implementation"] == "eager"
    for rank, plan in enumerate(answer["plans"], 1):
        estimated = estimate_plan_json(str(path), "--rank", str(rank))
        assert estimated["framework"] == "torchtitan"
        assert estimated["framework_features"] == answer["framework_features"]
        assert_reproduces(plan, estimated["plans"][0])


def test_tables_name_the_plan_they_estimate(optimized: tuple[Path, dict]) -> None:
    path, answer = optimized
    result = CliRunner().invoke(cli, ["estimate", "--plan", str(path), "--rank", "3"])
    assert result.exit_code == 0, result.output
    heading, degrees = result.stdout.splitlines()[:2]
    assert heading.endswith(f"; plan 3 of {path}")
    plan = answer["plans"][2]
    assert degrees.startswith(f"tp {plan['tp']} pp {plan['pp']} dp {plan['dp']}")
