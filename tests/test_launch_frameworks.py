"""The emitted files fed to the frameworks themselves (`launch --validate`,
solver.emit.validate), at the versions of solver.emit.TARGETS, for a matrix of zoo plans:
dense, MoE, MLA, uneven pipeline layouts, every ZeRO stage, fp8. And one deliberately broken file
per framework, which must come back "rejected", never "accepted".

The frameworks come from the `frameworks` extra (pyproject.toml; vLLM with --no-deps). Where one
is not installed its tests skip, unless PARPLAN_REQUIRE_FRAMEWORKS=1 (set by .ci/run, which
installs them): then a missing framework fails the test. Megatron-LM's own parse_args /
validate_args run when a checkout is importable; otherwise megatron-core's TransformerConfig
is what accepts the Megatron flags, and the line says which.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from solver.api import build_parallel_config, check_parallel_config, load_problem_specs
from solver.cost.step.frameworks import build_framework_profile
from solver.emit import TARGETS
from solver.emit.check_harness import installed_version
from solver.emit.formats import render_launch
from solver.emit.layout import build_rank_layout
from solver.emit.target import Emitted, LaunchTarget, parse_launch_pipeline
from solver.emit.validate import validate_emitted

REQUIRED = os.environ.get("PARPLAN_REQUIRE_FRAMEWORKS") == "1"
DISTRIBUTIONS = {"megatron": "megatron-core", "torchtitan": "torchtitan",
                 "torchtitan-python": "torchtitan", "deepspeed": "deepspeed", "vllm": "vllm"}


def need(launch_format: str, version: str) -> None:
    """Skip (fail under PARPLAN_REQUIRE_FRAMEWORKS=1) unless the framework is installed at
    the version the file is written for."""
    distribution = DISTRIBUTIONS[launch_format]
    found = installed_version(distribution)
    prefix = version.removeprefix("core_v")
    if found is not None and (found == prefix or found.startswith(prefix + ".")):
        return
    message = (f"{distribution} {prefix} is not installed (found {found}): "
               "pip install -e '.[frameworks]' (see .ci/run)")
    if REQUIRED:
        pytest.fail(message)
    pytest.skip(message)


def make_target(model: str, cluster: str, num_gpus: int, version: str = "",
                layout: str | None = None, precision: str = "bf16", global_batch: int = 1024,
                features: dict | None = None, **degrees: int | str) -> LaunchTarget:
    """A plan to launch; `features`: Megatron profile features the flags ask for
    (solver.cost.step.frameworks, as `launch --cuda-graphs` ... give them)."""
    model_spec, cluster_spec, job = load_problem_specs(model, cluster, precision=precision,
                                                       global_batch=global_batch)
    config = build_parallel_config(num_gpus, **degrees)
    check_parallel_config(model_spec, job, num_gpus, config)
    pipeline = parse_launch_pipeline(layout, model_spec, config) if layout else None
    constants = (build_framework_profile("megatron", features).time_constants
                 if features else None)
    return LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job, config=config,
                        layout=build_rank_layout(config, model_spec.is_moe), pipeline=pipeline,
                        version=version, time_constants=constants)


# The three plans (Llama-3.1-70B / 64 H100, DeepSeek-V3 / 256 H800, Mixtral-8x7B /
# 16 H100) and the matrix around them; each with the formats whose framework takes the plan
# (DeepSpeed: no pipeline with ZeRO 2/3, no vpp, no cp, AutoEP without etp or tp x pp;
# Megatron: no ZeRO 2, FSDP without pp).
ALL = ("megatron", "torchtitan", "deepspeed", "vllm")
PLANS = {
    "llama70b-tp8-pp2": (ALL, dict(model="llama3.1-70b", cluster="dgx-h100", num_gpus=64,
                                   tp=8, pp=2, zero=1)),
    "deepseek-v3-ep128": (("megatron", "torchtitan", "vllm"), dict(
        model="deepseek-v3", cluster="hgx-h800", num_gpus=256, tp=8, pp=2, ep=128)),
    "deepseek-v3-ep64-deepspeed": (("deepspeed",), dict(
        model="deepseek-v3", cluster="hgx-h800", num_gpus=256, pp=4, ep=64)),
    "mixtral-ep8": (ALL, dict(model="mixtral-8x7b", cluster="dgx-h100", num_gpus=16, tp=2,
                              ep=8)),
    "qwen3-moe-zero3": (("megatron", "torchtitan", "deepspeed"), dict(
        model="qwen3-30b-a3b", cluster="dgx-h100", num_gpus=16, ep=8, zero=3)),
    "deepseek-v2-lite-mla": (ALL, dict(model="deepseek-v2-lite", cluster="dgx-h100",
                                       num_gpus=8, ep=8, zero=1)),
    "llama8b-zero0": (ALL, dict(model="llama3.1-8b", cluster="dgx-h100", num_gpus=16, tp=2,
                                zero=0)),
    "llama8b-zero2": (("torchtitan", "deepspeed", "vllm"), dict(
        model="llama3.1-8b", cluster="dgx-h100", num_gpus=16, tp=2, zero=2)),
    "llama8b-zero3": (("megatron", "torchtitan", "deepspeed"), dict(
        model="llama3.1-8b", cluster="dgx-h100", num_gpus=8, zero=3)),
    "llama8b-uneven-pp4": (ALL, dict(model="llama3.1-8b", cluster="dgx-h100", num_gpus=8,
                                     pp=4, layout="Et*7|t*9|t*8|t*8,L")),
    "llama8b-uneven-vpp": (("megatron", "torchtitan"), dict(
        model="llama3.1-8b", cluster="dgx-h100", num_gpus=24, pp=3, vpp=3,
        recompute="full")),
    # Megatron-Core's feature flags: CUDA graphs of attention (its core recomputed: dropout 0)
    # and router, without mlp in an all-MoE model; DeepEP; EP overlap; bf16 optimizer states
    "qwen3-moe-features": (("megatron",), dict(
        model="qwen3-30b-a3b", cluster="dgx-h100", num_gpus=16, ep=16, features=dict(
            cuda_graphs=True, moe_dispatcher="deepep", ep_comm_overlap=True))),
    "deepseek-v3-cuda-graphs": (("megatron",), dict(
        model="deepseek-v3", cluster="hgx-h800", num_gpus=256, tp=8, pp=2, ep=128,
        features=dict(cuda_graphs=True, tp_comm_overlap=True))),
    "llama8b-fp8-cp2": (("megatron", "torchtitan", "vllm"), dict(
        model="llama3.1-8b", cluster="dgx-h100", num_gpus=16, tp=2, cp=2,
        precision="fp8")),
}
# torchtitan 0.3's Python config module takes every plan its command line takes.
CASES = [pytest.param(launch_format, version, plan, id=f"{launch_format}@{version}-{name}")
         for name, (formats, plan) in PLANS.items()
         for launch_format in formats + (("torchtitan-python",) if "torchtitan" in formats
                                         else ())
         for version in TARGETS[launch_format] if not (launch_format, version) == (
             "torchtitan", "0.2")]


@pytest.mark.parametrize(("launch_format", "version", "plan"), CASES)
def test_the_framework_accepts_the_file(launch_format: str, version: str, plan: dict) -> None:
    need(launch_format, version)
    target = make_target(**plan, version=version)
    line = validate_emitted(launch_format, target, render_launch(launch_format, target))
    assert line.startswith(f"{launch_format}@{version}: accepted by "), line


def test_torchtitan_02_toml_is_checked_by_02_only() -> None:
    """torchtitan 0.2 and 0.3 cannot be installed side by side: the TOML of 0.2 is "not
    checked" where 0.3 is installed, and says so."""
    target = make_target("llama3.1-8b", "dgx-h100", 8, version="0.2", tp=2)
    line = validate_emitted("torchtitan", target, render_launch("torchtitan", target))
    found = installed_version("torchtitan")
    if found is not None and found.startswith("0.2"):
        assert line.startswith("torchtitan@0.2: accepted by "), line
    else:
        assert line.startswith("torchtitan@0.2: not checked: the TOML file ("), line


@pytest.mark.parametrize("plan", ["llama70b-tp8-pp2", "mixtral-ep8", "deepseek-v3-ep128"])
def test_torchtitan_02_accepts_the_toml(plan: str) -> None:
    """torchtitan 0.2.2 from a folder of its own (PARPLAN_TORCHTITAN_02: .ci/run installs it
    there with pip --target), ahead of 0.3 on the path of a `parplan launch --validate`."""
    folder = os.environ.get("PARPLAN_TORCHTITAN_02")
    if not folder:
        message = "PARPLAN_TORCHTITAN_02 names no folder holding torchtitan 0.2.2 (see .ci/run)"
        if REQUIRED:
            pytest.fail(message)
        pytest.skip(message)
    p = PLANS[plan][1]
    degrees = [x for name in ("tp", "pp", "ep", "zero") if name in p
               for x in (f"--{name}", str(p[name]))]
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "solver", "launch", "--model", p["model"], "--cluster",
         p["cluster"], "--gpus", str(p["num_gpus"]), *degrees, "--target", "torchtitan@0.2",
         "--validate"], capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([folder, str(root)])})
    assert result.returncode == 0, result.stderr
    assert "validation: torchtitan@0.2: accepted by ConfigManager.parse_args (the TOML file); " \
           "ParallelDims.build_mesh" in result.stderr, result.stderr


def test_deepspeed_refuses_the_deepseek_plan_and_so_does_the_search() -> None:
    """DeepSeek-V3 tp 8 x pp 2 x ep 128: AutoEP folds AutoTP only without pipeline parallelism
    (auto_ep_folding.py); the search's deepspeed_autoep_tp_without_pp constraint names it."""
    need("deepspeed", "0.19")
    target = make_target(**PLANS["deepseek-v3-ep128"][1])
    line = validate_emitted("deepspeed", target, render_launch("deepspeed", target))
    assert line.startswith("deepspeed@0.19: rejected by AutoEP's validate_autoep_config: "
                           "AutoEP+AutoTP folding currently supports pp_size=1 only"), line


def broken(emitted: Emitted, settings: object = None, text: str | None = None) -> Emitted:
    return replace(emitted, settings=emitted.settings if settings is None else settings,
                   text=emitted.text if text is None else text)


def test_a_broken_megatron_file_is_rejected() -> None:
    """64 attention heads on tp 8, then told there are 60: Megatron-Core's TransformerConfig
    ("num_attention_heads must be a multiple of tensor_model_parallel_size")."""
    need("megatron", "core_v0.16")
    target = make_target(**PLANS["llama70b-tp8-pp2"][1])
    emitted = render_launch("megatron", target)
    tokens = list(emitted.settings)
    tokens[tokens.index("--num-attention-heads") + 1] = "60"
    line = validate_emitted("megatron", target, broken(emitted, settings=tokens))
    assert line.startswith("megatron@core_v0.16: rejected by "), line
    assert "accepted" not in line


def test_a_broken_torchtitan_command_line_is_rejected() -> None:
    """torchtitan 0.3 dropped expert_tensor_parallel_degree (tyro: unrecognised option), and
    without --training.disable_cuda_graphs it refuses pipeline parallelism."""
    need("torchtitan", "0.3")
    target = make_target(**PLANS["llama70b-tp8-pp2"][1])
    emitted = render_launch("torchtitan", target)
    tokens = list(emitted.settings)
    removed = validate_emitted("torchtitan", target, broken(emitted, settings=[
        *tokens[:-1], "--parallelism.expert_tensor_parallel_degree", "1", tokens[-1]]))
    assert removed.startswith("torchtitan@0.3: rejected by torchtitan's ConfigManager"), removed
    assert "expert_tensor_parallel_degree" in removed.replace("-", "_")
    graphs = validate_emitted("torchtitan", target, broken(emitted, settings=[
        t for t in tokens if t != "--training.disable_cuda_graphs"]))
    assert "CUDA graphs do not support pipeline parallelism" in graphs, graphs
    assert graphs.startswith("torchtitan@0.3: rejected by ")


def test_a_broken_torchtitan_config_module_is_rejected() -> None:
    """The Python config sets what it is given: a field 0.3 dropped fails on the slotted
    ParallelismConfig, and a pipeline micro-batch that does not divide the local batch fails
    Trainer.Config.__post_init__ when ConfigManager rebuilds the config."""
    need("torchtitan-python", "0.3")
    target = make_target(**PLANS["llama70b-tp8-pp2"][1])
    emitted = render_launch("torchtitan-python", target)
    dropped = emitted.text.replace(
        "    return config", "    config.parallelism.expert_tensor_parallel_degree = 1\n"
        "    return config")
    line = validate_emitted("torchtitan-python", target, broken(emitted, text=dropped))
    assert line.startswith("torchtitan-python@0.3: rejected by torchtitan's ConfigManager"), line
    assert "expert_tensor_parallel_degree" in line
    micro = emitted.text.replace("pipeline_parallel_microbatch_size = 1",
                                 "pipeline_parallel_microbatch_size = 3")
    line = validate_emitted("torchtitan-python", target, broken(emitted, text=micro))
    assert line.startswith("torchtitan-python@0.3: rejected by "), line
    assert "must be divisible by" in line or "local_batch_size" in line, line


def test_a_broken_ds_config_is_rejected() -> None:
    """train_batch_size must be micro-batch x accumulation x data-parallel ranks
    (DeepSpeedConfig._configure_train_batch_size)."""
    need("deepspeed", "0.19")
    target = make_target(**PLANS["mixtral-ep8"][1])
    emitted = render_launch("deepspeed", target)
    config = dict(emitted.settings, train_batch_size=emitted.settings["train_batch_size"] + 8)
    line = validate_emitted("deepspeed", target, broken(emitted, settings=config))
    assert line.startswith("deepspeed@0.19: rejected by DeepSpeedConfig: "), line
    assert "train_batch_size is not equal to" in line


def test_a_broken_vllm_line_is_rejected() -> None:
    need("vllm", "0.33")
    target = make_target(**PLANS["mixtral-ep8"][1])
    emitted = render_launch("vllm", target)
    text = re.sub(r"--tensor-parallel-size \d+", "--tensor-parallel-size two", emitted.text,
                  count=1)
    line = validate_emitted("vllm", target, broken(emitted, text=text))
    assert line.startswith("vllm@0.33: rejected by vLLM's serve parser: "), line
    assert "tensor-parallel-size" in line
