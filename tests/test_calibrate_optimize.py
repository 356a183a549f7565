"""Issue 6: the plan changes for the right reason when the fabric of a calibration profile is
cut. Llama 3.1 70B on 64 H100s (8 DGX nodes), dgx-h100 calibrated with the DGX H100 NVLink
log and the AWS p5 2-node EFA log."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.optimize import build_problem, solve

DATA = Path(__file__).resolve().parent / "data" / "nccl"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("profiles")
    measured = folder / "measured.json"
    result = CliRunner().invoke(cli, [
        "calibrate", "nccl-tests", str(DATA / "nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt"),
        str(DATA / "aws_p5_h100_2node_efa_all_reduce_tagged.txt"), "--cluster", "dgx-h100",
        "--ranks", "16", "--nodes", "2", "-o", str(measured)])
    assert result.exit_code == 0, result.output
    data = json.loads(measured.read_text())
    for curve in data["tiers"]["fabric"].values():  # every fabric segment 10x slower
        floor = curve["knots"][0]["time_us"]
        for knot in curve["knots"]:
            knot["time_us"] = floor + 10 * (knot["time_us"] - floor)
    slow = folder / "slow-fabric.json"
    slow.write_text(json.dumps(data))
    return measured, slow


def best(calibration: Path):
    # The generic rule set reduces FSDP gradients in bf16 (2 B): with Megatron's fp32
    # reduction the measured fabric's winner already keeps DP inside a node.
    problem = build_problem("llama3.1-70b", "dgx-h100", 64, seq_len=8192, global_batch=128,
                            calibration=str(calibration), framework="generic")
    result = solve(problem, top=1)
    assert result.status == "optimal"
    return result.plans[0]


def test_a_slower_fabric_moves_data_parallelism_off_it(profiles) -> None:
    """On the measured fabric the winner (generic rules) spreads data parallelism (dp x cp)
    across the nodes and pays for it in exposed DP/ZeRO time. With the fabric 10x slower that
    sync would cost more than the whole pipeline bubble, so the winner stops data-parallel
    sync across nodes
    (dp = 1; cp shards the optimizer inside a node) and pipelines across them instead: only
    activations cross the slow links."""
    measured, slow = profiles
    fast_plan, slow_plan = best(measured), best(slow)
    f = fast_plan.config
    assert f.tp * f.cp * f.dp > 8  # DP groups span nodes (stride tp*cp in rank order)
    assert fast_plan.time.time_seconds["dp"] > 0
    assert slow_plan.config.dp == 1
    c = slow_plan.config
    assert c.tp * c.cp * c.dp <= 8  # what is left of DP/ZeRO sync stays inside a node
    assert slow_plan.config.pp > fast_plan.config.pp
    # What DP sync remains runs on NVLink: a fraction of what crossed the fabric.
    assert slow_plan.time.time_seconds["dp"] < 0.5 * fast_plan.time.time_seconds["dp"]
    assert slow_plan.time.step_seconds > fast_plan.time.step_seconds


def test_optimize_says_which_bandwidths_were_measured(profiles) -> None:
    measured, _ = profiles
    result = CliRunner().invoke(cli, ["optimize", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "16", "--calibration",
                                      str(measured), "--json"])
    assert result.exit_code == 0, result.output
    sources = json.loads(result.stdout)["calibration"]
    assert sources["file"] == str(measured)
    assert sources["bandwidths"]
