"""`parplan estimate` through click's CliRunner: the memory table, the JSON of DESIGN.md
("Interfaces"), --per-stage, and bad input (one stderr line, exit 2, no traceback).

The cluster is a file written here (80 GiB GPUs, an NVLink node and a fabric), so the tests
do not depend on the presets; models come from the zoo or from TOML files written here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.cli import cli

DEGREES = {"tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute"}
MEMORY_FIELDS = {"weights", "grads", "optimizer", "activations", "other", "total"}

CLUSTER = """
name = "test-h100"
gpus_per_node = 8

[gpu]
name = "h100-test"
memory_gib = 80.0
peak_tflops_bf16 = 989.0
peak_tflops_fp16 = 989.0
peak_tflops_fp8 = 1979.0
hbm_gb_per_s = 3350.0

[[tiers]]
name = "nvlink"
kind = "nvlink"
span_gpus = 8
bandwidth_gb_per_s = 360.0
latency_us = 15.0

[[tiers]]
name = "fabric"
kind = "network"
bandwidth_gb_per_s = 40.0
latency_us = 30.0
"""

MOE_MODEL = """
name = "tiny-moe"
hidden_size = 2048
intermediate_size = 6144
num_hidden_layers = 16
num_attention_heads = 16
num_key_value_heads = 8
vocab_size = 32000
num_experts = 16
num_experts_per_tok = 2
moe_intermediate_size = 1408
"""


@pytest.fixture()
def cluster_file(tmp_path: Path) -> str:
    path = tmp_path / "test-h100.toml"
    path.write_text(CLUSTER, encoding="utf-8")
    return str(path)


def run(*args: str):
    return CliRunner().invoke(cli, ["estimate", *args])


def llama8b(cluster: str, *args: str):
    return run("--model", "llama3.1-8b", "--cluster", cluster, *args)


def test_table_shows_the_memory_verification_of_the_worst_stage(cluster_file: str) -> None:
    result = llama8b(cluster_file, "--gpus", "8", "--zero", "3", "--micro-batch", "4",
                     "--recompute", "full", "--seq-len", "4096", "--global-batch", "256")
    assert result.exit_code == 0, result.output
    for label in ("weights", "gradients", "optimizer state", "activations",
                  "logits + cross-entropy", "ZeRO-3 gathered layers", "CUDA context",
                  "NCCL buffers", "allocator fragmentation", "total", "GPU capacity", "fits"):
        assert label in result.stdout, label
    # 43.62 GB: seed 003 example 1 under our model (tests/test_memory.py), to 3 figures.
    assert re.search(r"│ total \(device\) +│ +43\.6 │", result.stdout)
    assert "step time" in result.stdout and "MFU" in result.stdout
    assert "yes" in result.stdout


def test_json_has_the_design_fields(cluster_file: str) -> None:
    result = llama8b(cluster_file, "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "1",
                     "--recompute", "full", "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "feasible"
    assert answer["solve_seconds"] == 0
    (plan,) = answer["plans"]
    assert DEGREES <= plan.keys()
    assert (plan["tp"], plan["pp"], plan["dp"], plan["recompute"]) == (2, 2, 4, "full")
    assert plan["fits"] is True
    assert set(plan["memory_gb"]) == MEMORY_FIELDS
    assert len(plan["stages"]) == 2
    worst = max(plan["stages"], key=lambda s: s["memory_gb"]["total"])
    assert plan["memory_gb"] == worst["memory_gb"] and plan["worst_stage"] == worst["stage"]
    for stage in plan["stages"]:
        memory = stage["memory_gb"]
        parts = sum(memory[k] for k in ("weights", "grads", "optimizer", "activations", "other"))
        assert parts == pytest.approx(memory["total"], abs=0.003)
        assert sum(stage["other_gb"].values()) == pytest.approx(memory["other"], abs=0.006)
    assert plan["stages"][1]["other_gb"]["logits"] > 0 == plan["stages"][0]["other_gb"]["logits"]
    assert plan["gpu_memory_gb"] == pytest.approx(80 * 2**30 / 1e9, abs=0.001)
    for field in ("step_seconds", "tokens_per_second", "tokens_per_second_per_gpu",
                  "tflops_per_gpu", "mfu"):
        assert plan[field] > 0
    assert set(plan["time_seconds"]) == {"compute", "recompute", "tp", "cp", "ep", "offload",
                                         "dp", "pp", "bubble", "optimizer"}
    assert sum(plan["time_seconds"].values()) == pytest.approx(plan["step_seconds"], rel=1e-4)


def test_json_of_a_plan_that_does_not_fit_is_an_answer_with_fixes(cluster_file: str) -> None:
    result = llama8b(cluster_file, "--gpus", "8", "--zero", "0", "--recompute", "none",
                     "--json")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "infeasible"
    assert answer["conflicts"] == ["memory_fits_hbm"]
    assert answer["plans"][0]["fits"] is False
    assert any(fix.startswith("--zero 3") for fix in answer["fixes"])


def test_per_stage_lists_every_stage(cluster_file: str) -> None:
    result = llama8b(cluster_file, "--gpus", "32", "--tp", "2", "--pp", "4", "--vpp", "2",
                     "--per-stage")
    assert result.exit_code == 0, result.output
    stage_table = result.stdout.split("step time")[0]
    # Off a terminal the wide stage table is compact: space-separated, no rules.
    rows = [line.split() for line in stage_table.splitlines() if re.match(r" +\d+ ", line)]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]


def test_moe_model_file_with_expert_parallelism(cluster_file: str, tmp_path: Path) -> None:
    model = tmp_path / "tiny-moe.toml"
    model.write_text(MOE_MODEL, encoding="utf-8")
    result = run("--model", str(model), "--cluster", cluster_file, "--gpus", "16", "--tp", "2",
                 "--ep", "8", "--etp", "2", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plans"][0]
    assert (plan["dp"], plan["ep"], plan["etp"]) == (8, 8, 2)


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus", "12", "--tp", "8"], "--gpus (12) must be a multiple of tp x pp x cp"),
    (["--gpus", "6", "--tp", "3"], "--tp 3: tp must divide num_attention_heads (32)"),
    (["--gpus", "64", "--pp", "64"], "--pp 64: pp must not exceed num_hidden_layers (32)"),
    (["--gpus", "16", "--pp", "8", "--vpp", "5"],
     "--pp 8, --vpp 5: pp x vpp must not exceed num_hidden_layers + 2 (34)"),
    (["--gpus", "8", "--vpp", "2"], "--pp 1, --vpp 2: virtual pipeline stages (vpp > 1) need"),
    (["--gpus", "8", "--ep", "2"], "--ep 2, --etp 1: llama3.1-8b has no experts"),
    (["--gpus", "8", "--cp", "2", "--seq-len", "1001"], "seq_len (1001) must be a multiple"),
    (["--gpus", "8", "--global-batch", "12", "--micro-batch", "2"],
     "global_batch (12) must be a multiple of dp x micro_batch"),
    (["--gpus", "8", "--calibration", "fit.json"], "--calibration (fit.json)"),
    (["--gpus", "8", "--zero", "4"], "--zero"),
    (["--gpus", "0"], "--gpus"),
    (["--gpus", "8", "--framework", "colossal"], "--framework"),
])
def test_bad_degrees_are_one_line_exit_2(cluster_file: str, args: list[str],
                                         message: str) -> None:
    result = llama8b(cluster_file, *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.output and result.stdout == ""


def test_unknown_model_and_cluster_are_one_line_exit_2(cluster_file: str) -> None:
    for args, message in (
        (["--model", "no-such-model", "--cluster", cluster_file], "unknown model 'no-such-model'"),
        (["--model", "llama3.1-8b", "--cluster", "no-such-cluster"], "unknown cluster"),
    ):
        result = run(*args, "--gpus", "8")
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
        assert "Traceback" not in result.output


def test_missing_required_option_is_a_usage_error(cluster_file: str) -> None:
    result = run("--model", "llama3.1-8b", "--cluster", cluster_file)
    assert result.exit_code == 2
    assert "--gpus" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_fp8_on_a_gpu_without_fp8_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "a100.toml"
    path.write_text(CLUSTER.replace("peak_tflops_fp8 = 1979.0\n", ""), encoding="utf-8")
    result = llama8b(str(path), "--gpus", "8", "--precision", "fp8")
    assert result.exit_code == 2, result.output
    assert "--precision fp8" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_fp8_adds_weight_copies(cluster_file: str) -> None:
    """Precision fp8 keeps fp8 copies of the GEMM weights (MemoryOptions): more weight memory
    than bf16 for the same configuration."""
    weights = {}
    for precision in ("bf16", "fp8"):
        result = llama8b(cluster_file, "--gpus", "8", "--precision", precision, "--json")
        assert result.exit_code == 0, result.output
        weights[precision] = json.loads(result.stdout)["plans"][0]["memory_gb"]["weights"]
    assert weights["fp8"] > weights["bf16"]


def test_token_budget_gives_days_and_gpu_hours() -> None:
    """days = tokens / (tokens/s) / 86400 and GPU-hours = days x 24 x GPUs (issue 4 outputs)."""
    result = run("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--token-budget", "2T", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plans"][0]
    days = 2e12 / plan["tokens_per_second"] / 86400
    assert plan["train_days"] == pytest.approx(days, rel=1e-3)
    assert plan["gpu_hours"] == pytest.approx(days * 24 * 8, rel=1e-3)


@pytest.mark.parametrize("budget", ["lots", "0", "-5T", "1e30"])
def test_bad_token_budget_is_one_line(budget: str) -> None:
    result = run("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--token-budget", budget)
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "--token-budget" in result.stderr


def test_framework_brings_its_timing(cluster_file: str) -> None:
    """--framework deepspeed: its pipeline engine reduces gradients after the last backward,
    so a pipelined plan's DP time is all exposed; Megatron hides it (as `optimize` assumes)."""
    def dp_seconds(framework: str) -> float:
        result = llama8b(cluster_file, "--gpus", "32", "--tp", "2", "--pp", "2", "--zero", "1",
                         "--framework", framework, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.output)["plans"][0]["time_seconds"]["dp"]

    assert dp_seconds("deepspeed") > dp_seconds("megatron") > 0


@pytest.mark.parametrize(("edit", "field"), [
    ("peak_tflops_fp32 = -1.0", "gpu.peak_tflops_fp32"),
    ("legacy_mma_fraction = 1.5", "gpu.legacy_mma_fraction"),
])
def test_bad_gpu_compute_fields_are_one_line(tmp_path: Path, edit: str, field: str) -> None:
    """The FP32 CUDA-core peak must be positive and the legacy MMA share a fraction."""
    path = tmp_path / "bad-gpu.toml"
    path.write_text(CLUSTER.replace("hbm_gb_per_s = 3350.0",
                                    f"hbm_gb_per_s = 3350.0\n{edit}"), encoding="utf-8")
    result = llama8b(str(path), "--gpus", "8")
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"field '{field}'" in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_estimate_and_optimize_accept_the_same_virtual_stages() -> None:
    """Issue 15: `estimate --pp 4 --vpp 3` on a 32-layer model was accepted while `optimize`
    with the same pins answered infeasible. One rule set (pp x vpp <= layers + 2) serves both:
    12 virtual stages over 32 layers (Megatron places them with a layout)."""
    base = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16",
            "--global-batch", "256", "--json"]
    estimated = CliRunner().invoke(cli, ["estimate", *base, "--pp", "4", "--vpp", "3"])
    assert estimated.exit_code == 0, estimated.output
    plan = json.loads(estimated.stdout)["plans"][0]
    assert [s["layers"] for s in plan["layout"]["stages"]] == [3] * 8 + [2] * 4
    optimized = CliRunner().invoke(cli, ["optimize", *base, "--pp", "4", "--vpp", "3",
                                         "--top", "1"])
    assert optimized.exit_code == 0, optimized.output
    answer = json.loads(optimized.stdout)
    assert answer["status"] == "optimal"
    assert (answer["plans"][0]["pp"], answer["plans"][0]["vpp"]) == (4, 3)


def test_megatron_405b_pp16_vpp8_with_embedding_and_loss_stages() -> None:
    """The issue's Megatron recipe: Llama-3.1-405B (126 layers) on pp 16 x vpp 8 = 128 virtual
    stages, the embedding and the loss each in one (--account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split); `estimate` accepts it, by default and as a layout,
    and the two agree."""
    base = ["--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "1024", "--tp", "8",
            "--pp", "16", "--vpp", "8", "--recompute", "full", "--seq-len", "8192",
            "--global-batch", "2048", "--json"]
    even = CliRunner().invoke(cli, ["estimate", *base])
    given = CliRunner().invoke(cli, ["estimate", *base, "--layout", "E|(t|)*126,L"])
    assert even.exit_code == 0 and given.exit_code == 0, even.output + given.output
    first, second = (json.loads(r.stdout)["plans"][0] for r in (even, given))
    assert first["layout"]["syntax"] == "E|(t|)*126,L"
    assert first["step_seconds"] == second["step_seconds"]
    assert first["memory_gb"] == second["memory_gb"]
    stages = first["layout"]["stages"]
    assert len(stages) == 128 and stages[0]["layers"] == 0 and stages[-1]["layers"] == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--layout", "Et*3|t*3,L"], "--layout"),
    (["--layout", "Et*16|t*16,L", "--recompute-num-layers", "2"], "--recompute-num-layers 2"),
    (["--layout", "Et*20|t*20,L"], "--layout"),
])
def test_bad_layouts_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "16", "--pp", "2", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
