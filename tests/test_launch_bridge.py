"""`launch --format megatron-bridge` (solver.emit.bridge) and its check (solver.emit.check_bridge).

Megatron-Bridge 0.3.1 needs transformers < 5 and vLLM 0.33 needs >= 5, so Bridge lives in a
folder of its own (PARPLAN_MEGATRON_BRIDGE_03: .ci/run installs it there with pip --target),
put ahead on the path of one subprocess that feeds it the plan matrix of
tests/test_launch_frameworks.py and two broken files. Without the folder those tests skip,
unless PARPLAN_REQUIRE_FRAMEWORKS=1 (set by .ci/run): then they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_launch_frameworks import PLANS, REQUIRED, make_target

from solver.cli import cli
from solver.emit.bridge import (
    EXPLICIT,
    FLAG_KEYS,
    RECIPES,
    _layer_freq,
    build_bridge_overrides,
    pick_recipe,
    render_override,
)
from solver.emit.check_harness import installed_version
from solver.emit.formats import render_launch
from solver.emit.megatron import build_megatron_args
from solver.emit.validate import validate_emitted

# The ConfigContainer's sections (Megatron-Bridge 0.3.1 training/config.py ConfigContainer).
SECTIONS = {"model", "train", "optimizer", "ddp", "scheduler", "dataset", "logger", "tokenizer",
            "checkpoint", "dist", "rng", "comm_overlap", "mixed_precision", "profiling"}
BRIDGE_PLANS = [name for name, (formats, _) in PLANS.items() if "megatron" in formats]


def test_hydra_values_are_rendered_as_hydra_reads_them() -> None:
    """Hydra's override grammar: null / true / false, bare words, quoted text with |, *, commas
    and brackets, lists in brackets."""
    assert render_override("model.recompute_granularity", None) == \
        "model.recompute_granularity=null"
    assert render_override("model.sequence_parallel", True) == "model.sequence_parallel=true"
    assert render_override("model.num_layers", 80) == "model.num_layers=80"
    assert render_override("model.normalization", "RMSNorm") == "model.normalization=RMSNorm"
    assert render_override("model.pipeline_model_parallel_layout", "Et*7|t*9,L") == \
        'model.pipeline_model_parallel_layout="Et*7|t*9,L"'
    assert render_override("model.x", 'a"b') == 'model.x="a\\"b"'
    assert render_override("model.cuda_graph_scope", ["attn", "mlp"]) == \
        "model.cuda_graph_scope=[attn,mlp]"


def test_moe_layer_freq_expression_becomes_the_list() -> None:
    """DeepSeek-V3: 3 dense layers, then 58 MoE (megatron_model renders it run-length)."""
    assert _layer_freq("([0]*3+[1]*58)") == [0] * 3 + [1] * 58


def test_the_recipe_is_the_models_own_else_one_of_its_kind() -> None:
    """Bridge 0.3.1 has llama31_70b_pretrain_config and deepseek_v3_pretrain_config
    (recipes/llama/llama3.py, recipes/deepseek/deepseek_v3.py), none for Mixtral, whose SwiGLU
    experts go on Qwen3-30B-A3B's MoE recipe."""
    assert pick_recipe(make_target(**PLANS["llama70b-tp8-pp2"][1])) == \
        ("llama31_70b_pretrain_config", True)
    assert pick_recipe(make_target(**PLANS["deepseek-v3-ep128"][1])) == \
        ("deepseek_v3_pretrain_config", True)
    mixtral = make_target(**PLANS["mixtral-ep8"][1])
    assert pick_recipe(mixtral) == ("qwen3_30b_a3b_pretrain_config", False)
    assert any("no recipe for mixtral-8x7b" in n for n in build_bridge_overrides(mixtral)[2])
    hybrid = make_target("nemotron-h-8b", "dgx-h100", 8, tp=2)
    assert pick_recipe(hybrid) == ("nemotronh_8b_pretrain_config", True)
    overrides = build_bridge_overrides(hybrid)[0]
    assert "model.is_hybrid_model" not in overrides  # the provider class says it
    assert overrides["model.hybrid_override_pattern"].count("M") > 0
    assert all(name.endswith("_pretrain_config") for name in RECIPES.values())
    models = Path(__file__).resolve().parent.parent / "models"
    zoo = {path.stem for path in models.glob("*.toml")}
    assert set(RECIPES) <= zoo


def test_what_the_mixed_precision_preset_decides_is_said() -> None:
    """Bridge's presets write fp8_param_gather and grad_reduce_in_fp32 after the overrides
    (mixed_precision.py: on in the delayed-scaling fp8 preset, off in the blockwise one; every
    bf16 preset reduces in fp32): a plan asking otherwise gets a warning, not a key."""
    def said(precision: str, **features: bool) -> str:
        target = make_target("llama3.1-8b", "dgx-h100", 16, precision=precision, tp=2, zero=1,
                             features=features)
        overrides, warnings, notes = build_bridge_overrides(target)
        assert "model.fp8_param_gather" not in overrides
        assert "ddp.grad_reduce_in_fp32" not in overrides
        return " ".join(warnings + notes)

    assert "keeps bf16 parameters" in said("fp8-blockwise", fp8_param_gather=True)
    assert "keeps the parameters in fp8" in said("fp8", fp8_param_gather=False)
    assert "preset" not in said("fp8", fp8_param_gather=True)
    assert "reduce gradients in fp32" in said("bf16", grad_reduce_in_bf16=True)


@pytest.mark.parametrize("plan", BRIDGE_PLANS)
def test_every_megatron_flag_has_a_bridge_key(plan: str) -> None:
    """The overrides carry the Megatron flags of the same plan: each value flag's value lands on
    a key of a ConfigContainer section, and the plan's degrees are the model's."""
    target = make_target(**PLANS[plan][1])
    overrides, _, _ = build_bridge_overrides(target)
    assert {key.split(".")[0] for key in overrides} <= SECTIONS
    c = target.config
    assert overrides["model.tensor_model_parallel_size"] == c.tp
    assert overrides["model.pipeline_model_parallel_size"] == c.pp
    assert overrides["model.context_parallel_size"] == c.cp
    assert overrides["train.global_batch_size"] == target.job.global_batch
    assert overrides["model.seq_length"] == overrides["dataset.sequence_length"] == \
        target.job.seq_len
    assert overrides["ddp.use_distributed_optimizer"] == (c.zero >= 1)
    for key in EXPLICIT:  # written out, never left to the recipe
        assert key in overrides
    flags, _, _ = build_megatron_args(target)
    for flag, *values in flags:
        if flag in FLAG_KEYS and values:
            for key in FLAG_KEYS[flag][0]:
                assert str(overrides[key]) == values[0]


def test_bridge_is_an_alias_and_the_header_names_the_version() -> None:
    runner = CliRunner()
    args = ["launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--tp", "2"]
    alias = runner.invoke(cli, [*args, "--format", "bridge"])
    full = runner.invoke(cli, [*args, "--target", "megatron-bridge@0.3"])
    assert alias.exit_code == full.exit_code == 0, alias.output + full.output
    assert alias.output == full.output
    assert "# Megatron-Bridge 0.3: a recipe and Hydra overrides" in alias.output
    assert "scripts/training/run_recipe.py --recipe llama31_8b_pretrain_config" in alias.output
    unknown = runner.invoke(cli, [*args, "--target", "megatron-bridge@0.9"])
    assert unknown.exit_code == 2
    assert "megatron-bridge version '0.9' is not written" in unknown.output


def test_without_bridge_the_file_is_not_checked_and_says_why() -> None:
    if installed_version("megatron-bridge") is not None:
        pytest.skip("Megatron-Bridge is importable here")
    target = make_target(**PLANS["llama70b-tp8-pp2"][1])
    line = validate_emitted("megatron-bridge", target, render_launch("megatron-bridge", target))
    assert line.startswith("megatron-bridge@0.3: not checked: the recipe overrides "
                           "(megatron-bridge is not installed: it needs transformers < 5"), line
    assert "accepted" not in line


# Run in the subprocess with Bridge's folder ahead on the path: one line of JSON per case.
CHECK_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from test_launch_frameworks import PLANS, make_target
from dataclasses import replace
from solver.emit.formats import render_launch
from solver.emit.validate import validate_emitted
for name in json.loads(sys.argv[2]):
    target = make_target(**PLANS[name][1], version="0.3")
    emitted = render_launch("megatron-bridge", target)
    print(json.dumps([name, validate_emitted("megatron-bridge", target, emitted)]), flush=True)
import importlib.util, pathlib, re
from solver.emit.bridge import FALLBACK_RECIPES, RECIPES
folder = pathlib.Path(importlib.util.find_spec("megatron.bridge").submodule_search_locations[0])
defined = {name for path in (folder / "recipes").rglob("*.py")
           for name in re.findall(r"^def (\\w+)\\(", path.read_text(), re.M)}
wanted = set(RECIPES.values()) | set(FALLBACK_RECIPES.values())
print(json.dumps(["recipes-missing", json.dumps(sorted(wanted - defined))]), flush=True)
target = make_target(**PLANS["llama70b-tp8-pp2"][1], version="0.3")
emitted = render_launch("megatron-bridge", target)
tokens = emitted.settings["overrides"]
for name, changed in (
        ("heads-60", [t if not t.startswith("model.num_attention_heads=") else
                      "model.num_attention_heads=60" for t in tokens]),
        ("unknown-key", [*tokens, "model.num_experts=8"]),
        ("bf16-reduction", [*tokens, "ddp.grad_reduce_in_fp32=false"])):
    settings = dict(emitted.settings, overrides=changed)
    line = validate_emitted("megatron-bridge", target, replace(emitted, settings=settings))
    print(json.dumps([name, line]), flush=True)
"""


@pytest.fixture(scope="module")
def bridge_lines() -> dict[str, str]:
    """What Bridge 0.3.1 says of each plan's file and of the broken ones."""
    folder = os.environ.get("PARPLAN_MEGATRON_BRIDGE_03")
    if not folder:
        message = ("PARPLAN_MEGATRON_BRIDGE_03 names no folder holding Megatron-Bridge 0.3.1 "
                   "(see .ci/run)")
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    tests = Path(__file__).resolve().parent
    result = subprocess.run(
        [sys.executable, "-c", CHECK_SCRIPT, str(tests), json.dumps(BRIDGE_PLANS)],
        capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([folder, str(tests.parent)])})
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(json.loads(line) for line in result.stdout.splitlines() if line.startswith("["))


@pytest.mark.parametrize("plan", BRIDGE_PLANS)
def test_megatron_bridge_accepts_the_overrides(bridge_lines: dict[str, str], plan: str) -> None:
    line = bridge_lines[plan]
    assert line.startswith("megatron-bridge@0.3: accepted by Megatron-Bridge 0.3.1's "
                           "process_config_with_overrides and runtime_config_update (the "
                           "mixed-precision preset's setup, then ConfigContainer.validate(); "), line
    assert "no setting of the file changed" in line
    assert "not checked: the values of recipe" in line
    # Bridge's own data-parallel size (world / (tp x pp x cp)) is the plan's
    target = make_target(**PLANS[plan][1])
    assert f"data-parallel size {target.config.dp};" in line, line
    assert "Bridge's LoRA modules (they import Transformer Engine" in line


def test_the_recipes_named_are_bridges(bridge_lines: dict[str, str]) -> None:
    """Every recipe the file may name is a function of the installed Bridge's recipes."""
    assert json.loads(bridge_lines["recipes-missing"]) == []


def test_broken_overrides_are_rejected(bridge_lines: dict[str, str]) -> None:
    """60 heads on tp 8 (TransformerConfig.__post_init__ through the provider's finalize); a
    key the model provider lacks (Hydra, struct mode: Megatron's --num-experts is Bridge's
    num_moe_experts); a setting the bf16_mixed preset writes over in its setup
    (mixed_precision.py: grad_reduce_in_fp32=True)."""
    heads = bridge_lines["heads-60"]
    assert heads.startswith("megatron-bridge@0.3: rejected by Megatron-Bridge's "
                            "runtime_config_update: num_attention_heads (60) must be a "
                            "multiple of tensor_model_parallel_size (8)"), heads
    rewritten = bridge_lines["bf16-reduction"]
    assert rewritten.startswith("megatron-bridge@0.3: rejected by Megatron-Bridge's "
                                "runtime_config_update: its setup changes "
                                "ddp.grad_reduce_in_fp32 to True (the file: False)"), rewritten
    unknown = bridge_lines["unknown-key"]
    assert unknown.startswith("megatron-bridge@0.3: rejected by Megatron-Bridge's "
                              "process_config_with_overrides: "), unknown
    assert "model.num_experts" in unknown
