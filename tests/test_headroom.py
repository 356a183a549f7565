"""--memory-headroom (solver.spec.headroom; issue 21): one parser for a share or decimal GB,
the usable capacity (the GPU's memory less the headroom) is what every plan of estimate,
optimize, serve and sweep must fit, and the output says so."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cli import cli
from solver.errors import InputError
from solver.optimize import build_problem, solve
from solver.spec.features import FrameworkFeatures
from solver.spec.headroom import MemoryHeadroom, parse_memory_headroom

H100_BYTES = 80 * 2**30  # 85.9 GB
BASE = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8"]


@pytest.mark.parametrize("text, expected", [
    ("10%", MemoryHeadroom(fraction=0.1)), ("0.1", MemoryHeadroom(fraction=0.1)),
    ("4GB", MemoryHeadroom(bytes=4e9)), (" 4 gb ", MemoryHeadroom(bytes=4e9)),
    ("0", MemoryHeadroom()), ("12.5%", MemoryHeadroom(fraction=0.125)),
])
def test_parse_takes_a_share_or_gb(text: str, expected: MemoryHeadroom) -> None:
    assert parse_memory_headroom(text) == expected


@pytest.mark.parametrize("text", ["100%", "150%", "1.5", "abc", "-1", "nan", "inf", "1e999",
                                  "4GiB", "", "10%%", "2e7GB"])
def test_parse_refuses_anything_else_naming_the_flag(text: str) -> None:
    with pytest.raises(InputError, match="--memory-headroom"):
        parse_memory_headroom(text)


def test_usable_bytes_worked_numbers() -> None:
    """The docstring's numbers: 80 GiB = 85.9 GB; less 10% is 77.3 GB, less 4 GB 81.9 GB."""
    assert MemoryHeadroom(fraction=0.1).usable_bytes(H100_BYTES) / 1e9 == pytest.approx(77.31,
                                                                                         abs=0.01)
    assert MemoryHeadroom(bytes=4e9).usable_bytes(H100_BYTES) / 1e9 == pytest.approx(81.9,
                                                                                     abs=0.01)
    assert MemoryHeadroom(fraction=0.1).describe(H100_BYTES) == (
        "85.9 GB - 10% headroom = 77.3 GB")


@settings(max_examples=12, deadline=None)
@given(model=st.sampled_from(["llama3.2-1b", "llama3.1-8b", "mixtral-8x7b"]),
       gpus=st.sampled_from([8, 16]), share=st.sampled_from([0.05, 0.1, 0.2, 0.4]),
       engine=st.sampled_from(["layout", "even"]))
def test_every_plan_fits_the_usable_capacity_and_headroom_never_speeds_up(
        model: str, gpus: int, share: float, engine: str) -> None:
    plain = solve(build_problem(model, "dgx-h100", gpus), top=3, engine=engine)
    capacity = plain.problem.cluster.gpu_memory_bytes
    kept = solve(build_problem(model, "dgx-h100", gpus,
                               memory_headroom=MemoryHeadroom(fraction=share)),
                 top=3, engine=engine)
    for plan in kept.plans:
        assert plan.worst_stage.total_bytes <= (1 - share) * capacity * (1 + 1e-12)
        assert plan.fits and plan.usable_memory_bytes == pytest.approx((1 - share) * capacity)
    if kept.plans:
        assert plain.plans
        # A plan is timed with the memory savers it turns on (issue 35 drift 3), and those
        # savers are faster (bf16 gradient reduction, bf16 moments) but only turned on where a
        # plan needs them to fit: headroom never speeds up against the problem with the top
        # plan's savers on.
        savers = kept.plans[0].memory_savers
        if savers:
            plain = solve(build_problem(model, "dgx-h100", gpus, features=FrameworkFeatures(
                **{name: True for name in savers})), top=3, engine=engine)
        assert kept.plans[0].time.step_seconds >= plain.plans[0].time.step_seconds * (1 - 1e-9)
    else:
        assert kept.status == "infeasible"


def test_no_headroom_is_the_answer_without_the_flag() -> None:
    plain = solve(build_problem("llama3.1-8b", "dgx-h100", 8), top=3)
    zero = solve(build_problem("llama3.1-8b", "dgx-h100", 8, memory_headroom=MemoryHeadroom()),
                 top=3)
    assert [p.config for p in plain.plans] == [p.config for p in zero.plans]


def test_the_output_shows_the_headroom() -> None:
    """dgx-h100's H100 SXM has 79.65 GiB usable by CUDA = 85.5 GB; less 10% is 77.0 GB."""
    runner = CliRunner()
    table = runner.invoke(cli, ["optimize", *BASE, "--top", "2", "--memory-headroom", "10%"])
    assert table.exit_code == 0, table.output
    assert "plans fit 85.5 GB - 10% headroom = 77.0 GB" in table.output
    answer = json.loads(runner.invoke(cli, ["optimize", *BASE, "--top", "2", "--json",
                                            "--memory-headroom", "4GB"]).output)
    plan = answer["plans"][0]
    assert (plan["memory_headroom"], plan["usable_memory_gb"]) == ("4 GB", round(
        plan["gpu_memory_gb"] - 4, 3))
    estimate = runner.invoke(cli, ["estimate", *BASE, "--memory-headroom", "10%"])
    assert "usable (10% headroom)" in estimate.output
    serve = runner.invoke(cli, ["serve", *BASE, "--context", "8k", "--memory-headroom", "10%"])
    assert "0.9 x (85.5 GB - 10% headroom = 77.0 GB)" in serve.output
    assert "--gpu-memory-utilization 0.81" in serve.output


def test_sweep_lines_carry_the_headroom(tmp_path) -> None:
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(cli, ["sweep", "--models", "llama3.2-1b", "--clusters",
                                      "dgx-h100", "--gpus", "8", "--jobs", "1", "-q",
                                      "--memory-headroom", "20GB", "-o", str(out)])
    assert result.exit_code == 0, result.output
    line = json.loads(out.read_text().splitlines()[0])
    assert line["memory_headroom"] == "20 GB"
    assert line["plans"][0]["memory_gb"]["total"] <= line["plans"][0]["usable_memory_gb"]


def test_a_headroom_that_leaves_nothing_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["optimize", *BASE, "--memory-headroom", "100GB"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0 and "leaves nothing" in result.output
