"""`parplan launch` through click's CliRunner: the groups JSON of DESIGN.md ("Interfaces"),
plans read back from `optimize --json`, -o FILE, warnings, and bad input (one stderr line,
exit 2, no traceback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from bad_input import assert_one_line_error
from solver.cli import cli
from solver.cost.uncertainty import build_error_headroom, load_error_model

BASE = ["launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100"]


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, [*BASE, *args])


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    result = CliRunner().invoke(cli, ["optimize", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "16", "--top", "3", "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path_factory.mktemp("plans") / "plans.json"
    path.write_text(result.stdout, encoding="utf-8")
    return path


def test_groups_json_has_the_design_shape() -> None:
    """Seed 000's TP=2/DP=4 example on one 8-GPU node."""
    result = run("--gpus", "8", "--tp", "2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["world_size"] == 8 and document["order"] == "tp-cp-ep-dp-pp"
    assert {"tp", "pp", "dp", "cp", "ep"} <= set(document["groups"])
    assert document["groups"]["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert document["groups"]["dp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert document["tiers"]["tp"] == ["nvlink"] * 4 and document["warnings"] == []
    assert [r["rank"] for r in document["ranks"]] == list(range(8))
    assert document["ranks"][3] == {"rank": 3, "node": 0, "local_rank": 3, "tp": 1, "cp": 0,
                                    "dp": 1, "pp": 0, "ep": 0}


def test_groups_tables_and_a_tp_group_leaving_nvlink() -> None:
    result = CliRunner().invoke(cli, ["launch", "--model", "gpt3-175b", "--cluster", "dgx-h100",
                                      "--gpus", "32", "--tp", "16", "--pp", "2"])
    assert result.exit_code == 0, result.output
    assert "rank order tp-cp-ep-dp-pp" in result.stdout and "fabric x2" in result.stdout
    assert ("warning: tp: 2 of 2 groups of 16 ranks leave the NVLink domain (8 GPUs) and run "
            "over 'fabric'") in result.stderr


def test_plan_file_gives_the_same_groups_as_its_degree_flags(optimized: Path) -> None:
    plans = json.loads(optimized.read_text())["plans"]
    second = plans[1]
    from_file = run("--gpus", "16", "--plan", str(optimized), "--rank", "2", "--json")
    assert from_file.exit_code == 0, from_file.output
    flags = [f"--{name.replace('_', '-')}" for name in ("tp", "pp", "cp", "ep", "etp", "vpp",
                                                        "zero", "micro_batch", "recompute")]
    values = [str(second[name]) for name in ("tp", "pp", "cp", "ep", "etp", "vpp", "zero",
                                             "micro_batch", "recompute")]
    by_flags = run("--gpus", "16", *[x for pair in zip(flags, values) for x in pair], "--json")
    assert by_flags.exit_code == 0, by_flags.output
    document, flagged = json.loads(from_file.stdout), json.loads(by_flags.stdout)
    # The degrees alone leave out the savers and offloads the plan turned on to fit
    # (grad_reduce_in_bf16, activation_offload): as flags, it warns that it does not fit.
    assert second["offloads"] and document.pop("warnings") == []
    needed, _ = _estimate_gb("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16",
                             *[x for pair in zip(flags, values) for x in pair])
    assert [line.partition(" GB")[0] for line in flagged.pop("warnings")] == [
        f"memory: as written this plan needs {needed:.1f}"]
    assert document == flagged
    megatron = run("--gpus", "16", "--plan", str(optimized), "--format", "megatron")
    assert f"--micro-batch-size {plans[0]['micro_batch']}" in megatron.stdout


def test_output_file_and_json_envelope(tmp_path: Path) -> None:
    target = tmp_path / "args.sh"
    written = run("--gpus", "16", "--tp", "2", "--pp", "2", "--format", "megatron",
                  "-o", str(target))
    assert written.exit_code == 0, written.output
    assert written.stdout == f"wrote {target} (megatron, 16 ranks)\n"
    printed = run("--gpus", "16", "--tp", "2", "--pp", "2", "--format", "megatron")
    assert target.read_text() == printed.stdout
    assert "note: export CUDA_DEVICE_MAX_CONNECTIONS=1" in printed.stderr
    envelope = json.loads(run("--gpus", "16", "--tp", "2", "--pp", "2", "--format", "megatron",
                              "--json", "--validate").stdout)
    assert envelope["format"] == "megatron" and envelope["text"] == printed.stdout
    assert envelope["plan"]["tp"] == 2 and envelope["settings"][:2] == [
        "--tensor-model-parallel-size", "2"]
    assert envelope["validation"].startswith("megatron@core_v0.16: ")
    groups_file = tmp_path / "groups.json"
    assert run("--gpus", "8", "-o", str(groups_file)).exit_code == 0
    assert json.loads(groups_file.read_text())["world_size"] == 8


def test_validate_says_what_it_did() -> None:
    result = run("--gpus", "8", "--format", "torch", "--validate")
    assert result.exit_code == 0, result.output
    assert "validation: torch: accepted by Python's compile (the module compiles)" in \
        result.stderr


def test_bad_input_is_one_line_and_exit_2(optimized: Path, tmp_path: Path) -> None:
    assert_one_line_error(run("--gpus", "8", "--format", "slurm"), "--format", "slurm")
    assert_one_line_error(run("--gpus", "16", "--plan", str(optimized), "--rank", "9"),
                     "--rank 9", str(optimized), "holds 3 plan(s)")
    assert_one_line_error(run("--gpus", "8", "--rank", "2"), "--rank 2", "--plan")
    assert_one_line_error(run("--gpus", "16", "--plan", str(optimized), "--tp", "2"),
                     "--tp", "not both")
    assert_one_line_error(run("--gpus", "8", "--plan", str(optimized)), "field 'gpus'", "16")
    assert_one_line_error(run("--gpus", "8", "--order", "tp-dp-xx"), "unknown axis 'xx'")
    assert_one_line_error(run("--gpus", "8", "--plan", str(tmp_path / "none.json")), "no such file")
    broken = tmp_path / "broken.json"
    broken.write_text('{"plans": [', encoding="utf-8")
    assert_one_line_error(run("--gpus", "8", "--plan", str(broken)), str(broken), "not JSON")
    plans = json.loads(optimized.read_text())
    del plans["plans"][0]["tp"]
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(plans), encoding="utf-8")
    assert_one_line_error(run("--gpus", "16", "--plan", str(missing)),
                     str(missing), "field 'plans.0.tp'", "missing")
    plans["plans"][0]["tp"] = 0
    zero = tmp_path / "zero.json"
    zero.write_text(json.dumps(plans), encoding="utf-8")
    assert_one_line_error(run("--gpus", "16", "--plan", str(zero)), str(zero), "'tp'")
    other = CliRunner().invoke(cli, ["launch", "--model", "llama2-7b", "--cluster", "dgx-h100",
                                     "--gpus", "16", "--plan", str(optimized)])
    assert_one_line_error(other, "field 'model'", "llama3.1-8b")


def test_layout_option_reaches_the_framework_settings() -> None:
    """--layout in Megatron's --pipeline-model-parallel-layout syntax (solver.spec.layout_syntax)
    replaces the even split."""
    result = run("--gpus", "8", "--pp", "4", "--layout", "Et*7|t*9|t*8|t*8,L",
                 "--format", "megatron")
    assert result.exit_code == 0, result.output
    assert "--pipeline-model-parallel-layout 'Et*7|t*9|t*8|t*8,L'" in result.stdout
    # Megatron's own --decoder-first-pipeline-num-layers where it builds the same split
    first = run("--gpus", "8", "--pp", "4", "--layout", "Et*5|(t*9|)*2,t*9,L",
                "--format", "megatron")
    assert "--decoder-first-pipeline-num-layers 5" in first.stdout
    # the text has no recompute counts: --recompute full recomputes every layer
    full = run("--gpus", "8", "--pp", "4", "--layout", "Et*7|t*9|t*8|t*8,L", "--recompute",
               "full", "--format", "megatron")
    assert "--recompute-method uniform" in full.stdout
    titan = run("--gpus", "8", "--pp", "4", "--layout", "Et*7|t*9|t*8|t*8,L",
                "--format", "torchtitan")
    assert "--parallelism.pipeline_parallel_first_stage_less_layers 2 " in titan.stdout
    envelope = json.loads(run("--gpus", "8", "--pp", "4", "--layout", "Et*7|t*9|t*8|t*8,L",
                              "--format", "deepspeed", "--json").stdout)
    assert envelope["layout"]["syntax"] == "Et*7|t*9|t*8|t*8,L"
    assert [s["layers"] for s in envelope["layout"]["stages"]] == [7, 9, 8, 8]


def test_plan_file_layout_reaches_the_framework_settings(optimized: Path,
                                                         tmp_path: Path) -> None:
    from solver.spec import PipelineLayout
    from solver.spec.layout_syntax import parse_pipeline_layout
    from solver.spec.plan_json import render_layout_json

    answer = json.loads(optimized.read_text())
    plan = answer["plans"][0]
    plan.update(tp=1, pp=4, dp=4, cp=1, ep=1, etp=1, vpp=1, recompute="none")
    layout = parse_pipeline_layout("Et*7|t*9|t*8|t*8,L", 4, 1, 32, 0)
    layout = PipelineLayout(pp=4, vpp=1, stages=tuple(
        stage.model_copy(update={"recompute_layers": 2}) for stage in layout.stages))
    plan["layout"] = render_layout_json(layout)
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(answer), encoding="utf-8")
    result = run("--gpus", "16", "--plan", str(path), "--format", "megatron")
    assert result.exit_code == 0, result.output
    assert "--pipeline-model-parallel-layout 'Et*7|t*9|t*8|t*8,L'" in result.stdout
    assert "--recompute-method block" in result.stdout
    assert "--recompute-num-layers 2" in result.stdout
    # --layout replaces the plan's layout
    mine = run("--gpus", "16", "--plan", str(path), "--layout", "Et*8|t*8|t*8|t*8,L",
               "--format", "megatron")
    assert "--pipeline-model-parallel-layout" not in mine.stdout
    del plan["layout"]["syntax"]  # optional; read, it must agree with the stages
    plan["layout"]["stages"][1]["layers"] = 8
    short = tmp_path / "short.json"
    short.write_text(json.dumps(answer), encoding="utf-8")
    assert_one_line_error(run("--gpus", "16", "--plan", str(short)), str(short),
                     "field 'plans.0.layout'", "31 decoder layers", "llama3.1-8b has 32")
    plan["layout"]["stages"][1]["layers"] = -1
    negative = tmp_path / "negative.json"
    negative.write_text(json.dumps(answer), encoding="utf-8")
    assert_one_line_error(run("--gpus", "16", "--plan", str(negative)), str(negative),
                     "'stages.1.layers'")


def test_bad_layout_option_is_one_line_and_exit_2() -> None:
    assert_one_line_error(run("--gpus", "8", "--pp", "4", "--layout", "E|t*32|L"),
                     "--layout 'E|t*32|L'", "3 virtual stages", "pp 4 x vpp 1 needs 4")
    assert_one_line_error(run("--gpus", "8", "--pp", "2", "--layout", "Et*16|t*15,L"),
                     "--layout 'Et*16|t*15,L'", "31 decoder layers", "the model has 32")
    assert_one_line_error(run("--gpus", "8", "--pp", "2", "--layout", "t*16|t*16,L"),
                     "E (embedding) appears 0 times")
    assert_one_line_error(run("--gpus", "8", "--pp", "2", "--layout", "Et*16|t*16,x"),
                     "unknown character 'x'")
    assert_one_line_error(run("--gpus", "8", "--pp", "2", "--layout", "E|t*16|t*16,L",
                         "--vpp", "2"), "needs 4")


def test_405b_layout_with_embedding_and_loss_stages() -> None:
    """Llama-3.1-405B, 126 layers on pp 16 x vpp 8: the embedding and the loss each take a
    virtual stage, which is Megatron's --account-for-embedding/loss-in-pipeline-split."""
    result = CliRunner().invoke(cli, ["launch", "--model", "llama3.1-405b", "--cluster",
                                      "dgx-h100", "--gpus", "128", "--tp", "8", "--pp", "16",
                                      "--vpp", "8", "--layout", "E|(t|)*126,L",
                                      "--format", "megatron"])
    assert result.exit_code == 0, result.output
    assert "--account-for-embedding-in-pipeline-split" in result.stdout
    assert "--account-for-loss-in-pipeline-split" in result.stdout
    assert "--num-layers-per-virtual-pipeline-stage 1" in result.stdout
    assert "--pipeline-model-parallel-layout" not in result.stdout


def test_plan_file_names_the_model_cluster_and_gpus(optimized: Path, tmp_path: Path) -> None:
    """`launch --plan FILE` alone: the plan file's model, cluster and gpus fill the flags."""
    alone = CliRunner().invoke(cli, ["launch", "--plan", str(optimized), "--format", "megatron"])
    assert alone.exit_code == 0, alone.output
    flagged = run("--gpus", "16", "--plan", str(optimized), "--format", "megatron")
    assert alone.stdout == flagged.stdout
    answer = json.loads(optimized.read_text())
    del answer["cluster"]
    nameless = tmp_path / "nameless.json"
    nameless.write_text(json.dumps(answer), encoding="utf-8")
    assert_one_line_error(CliRunner().invoke(cli, ["launch", "--plan", str(nameless)]),
                     "--cluster: required", "names no 'cluster'")
    assert_one_line_error(CliRunner().invoke(cli, ["launch", "--model", "llama3.1-8b"]),
                     "--cluster: required", "--plan FILE")


def test_an_imported_model_is_served_by_its_folder(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A model imported from ./hf/config.json is `vllm serve ./hf` (the checkpoint's folder),
    not `vllm serve hf`, which vLLM would look up on the Hugging Face Hub."""
    folder = tmp_path / "hf"
    folder.mkdir()
    source = Path(__file__).parent / "data" / "hf_configs" / "llama3.1-8b.json"
    (folder / "config.json").write_text(source.read_text(), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["launch", "--model", "./hf/config.json", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--tp", "8", "--format", "vllm"])
    assert result.exit_code == 0, result.output
    assert " serve ./hf " in result.stdout
    bare = CliRunner().invoke(cli, ["launch", "--model", "hf/config.json", "--cluster",
                                    "dgx-h100", "--gpus", "8", "--tp", "8", "--format", "vllm"])
    assert " serve ./hf " in bare.stdout
    served = CliRunner().invoke(cli, ["serve", "--model", "hf/config.json", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--context", "8192", "--json"])
    assert served.exit_code == 0, served.output
    assert json.loads(served.stdout)["plans"][0]["vllm_command"].startswith("vllm serve ./hf ")
    absolute = CliRunner().invoke(cli, ["launch", "--model", str(folder / "config.json"),
                                        "--cluster", "dgx-h100", "--gpus", "8", "--tp", "8",
                                        "--format", "vllm"])
    assert f" serve {folder} " in absolute.stdout


def test_target_picks_the_framework_version() -> None:
    titan = run("--gpus", "8", "--tp", "2", "--target", "torchtitan@0.2")
    assert titan.exit_code == 0, titan.output
    assert "[parallelism]" in titan.stdout
    assert_one_line_error(run("--gpus", "8", "--target", "torchtitan@9.9"), "--target torchtitan@9.9",
                     "versions: 0.3, 0.2")
    assert_one_line_error(run("--gpus", "8", "--target", "slurm@1"), "unknown framework 'slurm'")
    assert_one_line_error(run("--gpus", "8", "--target", "vllm@0.33", "--format", "megatron"),
                     "give one framework")


def test_a_plan_of_another_framework_is_refused_with_the_command_that_replans_it(
        optimized: Path) -> None:
    """A Megatron-costed plan written for torchtitan (issue 39 item 7): launch writes a plan,
    it does not search, so it refuses in one line giving the `parplan optimize` command that
    plans the same problem for torchtitan, and that command runs."""
    result = run("--plan", str(optimized), "--format", "torchtitan")
    command = ("parplan optimize --model llama3.1-8b --cluster dgx-h100 --gpus 16 --seq-len "
               "4096 --global-batch 1024 --precision bf16 --framework torchtitan")
    assert_one_line_error(result, f"--format torchtitan with --plan {optimized}",
                          "costed under megatron, not torchtitan", command)
    replanned = CliRunner().invoke(cli, [*command.split()[1:], "--json"])
    assert replanned.exit_code == 0, replanned.output
    assert json.loads(replanned.stdout)["framework"] == "torchtitan"
    # its own framework's format, and the formats of no framework, are written as before
    assert run("--plan", str(optimized), "--format", "megatron").exit_code == 0
    assert run("--plan", str(optimized), "--format", "torch").exit_code == 0
    bridge = run("--plan", str(optimized), "--format", "deepspeed", "--framework", "deepspeed")
    assert_one_line_error(bridge, "--framework deepspeed")


def _estimate_gb(*args: str) -> tuple[float, float]:
    """(needed, usable) GB of `parplan estimate --json`: the worst stage's device bytes."""
    result = CliRunner().invoke(cli, ["estimate", *args, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plans"][0]
    return plan["device_gb"], plan["usable_memory_gb"]


# Megatron's default memory headroom (issue 39 item 1), as the output labels it: "9.0%".
DEFAULT_HEADROOM = build_error_headroom(load_error_model(), "megatron").label()


def test_an_override_that_no_longer_fits_is_written_with_a_warning(tmp_path: Path) -> None:
    """Issue 39 item 7: Llama 3.1 70B on 8 H100s, the optimized plan (optimizer offload on)
    written with --no-optimizer-offload needs more than the GPU holds; launch re-estimates the
    plan as written with estimate's cost model and warns with the needed and usable GB, in the
    text and in the JSON envelope; the plan as optimized fits and has no such warning."""
    problem = ["--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8"]
    optimized = CliRunner().invoke(cli, ["optimize", *problem, "--json"])
    assert optimized.exit_code == 0, optimized.output
    path = tmp_path / "plans.json"
    path.write_text(optimized.stdout, encoding="utf-8")
    assert "optimizer_offload" in json.loads(optimized.stdout)["plans"][0]["offloads"]
    as_planned = CliRunner().invoke(cli, ["launch", "--plan", str(path), "--format", "megatron"])
    assert as_planned.exit_code == 0 and "memory:" not in as_planned.stderr
    override = ["--plan", str(path), "--no-optimizer-offload"]
    needed, usable = _estimate_gb(*override)
    assert needed > usable
    written = CliRunner().invoke(cli, ["launch", *override, "--format", "megatron"])
    assert written.exit_code == 0, written.output
    assert (f"warning: memory: as written this plan needs {needed:.1f} GB per GPU"
            in written.stderr), written.stderr
    # ... and the headroom that leaves those usable (issue 39 item 1: the default one).
    assert (f"{usable:.1f} GB are usable (the GPU's 85.5 GB less the {DEFAULT_HEADROOM} "
            "headroom): it does not fit") in written.stderr
    envelope = json.loads(CliRunner().invoke(
        cli, ["launch", *override, "--format", "megatron", "--json"]).stdout)
    assert any(f"needs {needed:.1f} GB" in line for line in envelope["warnings"])
    # degree flags are an override too; the groups document carries the warning
    tp8 = ["--tp", "8", *problem]
    needed, usable = _estimate_gb(*tp8)
    groups = json.loads(CliRunner().invoke(cli, ["launch", *tp8, "--json"]).stdout)
    # a server holds no optimizer or activations of a training step: no such check
    served = CliRunner().invoke(cli, ["launch", *tp8, "--format", "vllm"])
    assert served.exit_code == 0 and "memory:" not in served.stderr
    assert [line for line in groups["warnings"] if line.startswith("memory:")] == [
        f"memory: as written this plan needs {needed:.1f} GB per GPU, {usable:.1f} GB are "
        f"usable (the GPU's 85.5 GB less the {DEFAULT_HEADROOM} headroom): it does not fit "
        "(the cost model of `parplan estimate`)"]
