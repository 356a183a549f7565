"""Framework settings (solver/emit/{megatron,torchtitan,deepspeed,vllm,validate}.py), with the
option and field names pinned to the frameworks' sources."""

from __future__ import annotations

import json
import shlex
import sys
import types

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from solver.api import build_parallel_config, check_parallel_config, load_problem_specs
from solver.emit import DEFAULT_ORDER, FORMATS
from solver.emit.deepspeed import render_deepspeed
from solver.emit.formats import RENDERERS
from solver.emit.layout import build_rank_layout
from solver.emit.megatron import render_megatron
from solver.emit.target import LaunchTarget
from solver.emit.torchtitan import render_torchtitan
from solver.emit.validate import validate_emitted
from solver.emit.vllm import render_vllm

# Flags of NVIDIA/Megatron-LM megatron/training/arguments.py (main, commit 000c4ac2, 2025):
# _add_distributed_args, _add_training_args, _add_moe_args, _add_data_args,
# _add_mixed_precision_args, _add_checkpointing_args, _add_transformer_engine_args.
MEGATRON_LM_FLAGS = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size",
    "--context-parallel-size", "--expert-model-parallel-size", "--expert-tensor-parallel-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--pipeline-model-parallel-layout", "--sequence-parallel", "--use-distributed-optimizer",
    "--use-megatron-fsdp", "--data-parallel-sharding-strategy", "--no-gradient-accumulation-fusion",
    "--ckpt-format", "--micro-batch-size", "--global-batch-size", "--seq-length",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers", "--bf16",
    "--fp8-format", "--use-tp-pp-dp-mapping", "--overlap-grad-reduce", "--overlap-param-gather",
}
# torchtitan/config/job_config.py (TOML releases): fields of Parallelism, Training,
# ActivationCheckpoint.
TORCHTITAN_FIELDS = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage",
                    "context_parallel_degree", "expert_parallel_degree",
                    "expert_tensor_parallel_degree"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
}


def make_target(model: str = "llama3.1-8b", num_gpus: int = 8, order: str = DEFAULT_ORDER,
                cluster: str = "dgx-h100", seq_len: int = 4096, global_batch: int = 1024,
                precision: str = "bf16", **degrees: int | str) -> LaunchTarget:
    model_spec, cluster_spec, job = load_problem_specs(
        model, cluster, seq_len=seq_len, global_batch=global_batch, precision=precision)
    config = build_parallel_config(num_gpus, **degrees)
    check_parallel_config(model_spec, job, num_gpus, config)
    return LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job, config=config,
                        layout=build_rank_layout(config, model_spec.is_moe, order))


def megatron_tokens(target: LaunchTarget) -> list[str]:
    text = render_megatron(target).text
    return shlex.split(text.replace("\\\n", " "))


PLANS = [
    dict(model="llama2-70b", num_gpus=64, tp=8, zero=1),
    dict(model="llama3.1-8b", num_gpus=32, tp=2, pp=4, vpp=2, recompute="full"),
    dict(model="llama3.1-8b", num_gpus=24, pp=3, vpp=3),
    dict(model="mixtral-8x7b", num_gpus=64, tp=2, pp=2, ep=8, etp=1, zero=3),
    dict(model="llama3.1-8b", num_gpus=16, tp=2, cp=2, precision="fp8",
         order="tp-cp-ep-pp-dp"),
]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: f"{p['model']}-{p['num_gpus']}")
def test_megatron_flags_exist_in_megatron_lm(plan: dict) -> None:
    tokens = megatron_tokens(make_target(**plan))
    flags = {t for t in tokens if t.startswith("--")}
    assert flags <= MEGATRON_LM_FLAGS
    assert tokens == render_megatron(make_target(**plan)).settings


def test_megatron_seed_70b_example() -> None:
    """Seed 000's 70B row: 64 GPUs, TP 8, DP 8, ZeRO 1 (distributed optimizer)."""
    assert megatron_tokens(make_target("llama2-70b", 64, tp=8, zero=1)) == [
        "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "1",
        "--context-parallel-size", "1", "--sequence-parallel", "--use-distributed-optimizer",
        "--overlap-grad-reduce", "--overlap-param-gather", "--micro-batch-size", "1",
        "--global-batch-size", "1024", "--seq-length", "4096",
        "--recompute-granularity", "selective", "--bf16"]


def test_megatron_asks_for_the_dp_overlap_the_model_assumes() -> None:
    """Megatron hides DP traffic only with --overlap-grad-reduce (and --overlap-param-gather,
    which needs the distributed optimizer); without data parallelism there is none to hide."""
    zero0 = megatron_tokens(make_target(num_gpus=8, zero=0))
    assert "--overlap-grad-reduce" in zero0 and "--overlap-param-gather" not in zero0
    alone = megatron_tokens(make_target(num_gpus=8, tp=8, zero=1))
    assert "--overlap-grad-reduce" not in alone and "--overlap-param-gather" not in alone


def test_megatron_virtual_stages_even_and_uneven() -> None:
    even = megatron_tokens(make_target(num_gpus=32, tp=2, pp=4, vpp=2))
    assert even[even.index("--num-layers-per-virtual-pipeline-stage") + 1] == "4"
    uneven = make_target(num_gpus=24, pp=3, vpp=3)
    tokens = megatron_tokens(uneven)
    layout = tokens[tokens.index("--pipeline-model-parallel-layout") + 1]
    # 32 layers over 9 virtual stages: the first 5 take 4, the rest 3; E first, L last.
    assert layout == "Et*4|t*4|t*4|t*4|t*4|t*3|t*3|t*3|t*3,L"
    assert "--num-layers-per-virtual-pipeline-stage" not in tokens
    assert "'Et*4|" in render_megatron(uneven).text  # shell-quoted: | and * are special


def test_megatron_fsdp_moe_and_orders() -> None:
    moe = make_target("mixtral-8x7b", 64, tp=2, pp=2, ep=8, etp=1, zero=3)
    tokens = megatron_tokens(moe)
    assert tokens[tokens.index("--expert-model-parallel-size") + 1] == "8"
    assert tokens[tokens.index("--expert-tensor-parallel-size") + 1] == "1"
    assert tokens[tokens.index("--data-parallel-sharding-strategy") + 1] == "optim_grads_params"
    assert "--use-megatron-fsdp" in tokens
    assert any("pipeline parallelism" in w for w in render_megatron(moe).warnings)
    seed_order = make_target(num_gpus=16, tp=2, pp=2, order="tp-pp-dp")
    assert "--use-tp-pp-dp-mapping" in megatron_tokens(seed_order)
    other = render_megatron(make_target(num_gpus=16, tp=2, pp=2, order="dp-tp-cp-ep-pp"))
    assert "--use-tp-pp-dp-mapping" not in other.settings
    assert any("not dp-tp-cp-ep-pp" in w for w in other.warnings)
    fp8 = megatron_tokens(make_target(num_gpus=8, precision="fp8"))
    assert fp8[fp8.index("--fp8-format") + 1] == "hybrid"


def test_torchtitan_toml() -> None:
    target = make_target("mixtral-8x7b", 64, tp=2, pp=4, vpp=2, ep=4, etp=1, zero=1,
                         recompute="selective")
    emitted = render_torchtitan(target)
    parsed = tomllib.loads(emitted.text)
    assert parsed == emitted.settings
    for section, fields in parsed.items():
        assert set(fields) <= TORCHTITAN_FIELDS[section], section
    p, t = parsed["parallelism"], parsed["training"]
    assert (p["data_parallel_replicate_degree"], p["data_parallel_shard_degree"]) == (1, 8)
    assert p["fsdp_reshard_after_forward"] == "never"  # ZeRO 1 becomes ZeRO 2 ...
    assert any("ZeRO 1" in w for w in emitted.warnings)  # ... and says so
    assert p["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert p["pipeline_parallel_layers_per_stage"] == 4
    assert (p["expert_parallel_degree"], p["expert_tensor_parallel_degree"]) == (4, 1)
    # with a pipeline, a data-parallel rank's batch is cut into micro-batches
    assert (t["local_batch_size"], t["global_batch_size"]) == (128, 1024)
    assert parsed["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    ddp = tomllib.loads(render_torchtitan(make_target(num_gpus=8, tp=2, zero=0)).text)
    assert (ddp["parallelism"]["data_parallel_replicate_degree"],
            ddp["parallelism"]["data_parallel_shard_degree"]) == (4, 1)
    assert ddp["training"]["local_batch_size"] == 1  # gradient accumulation over 256 steps


def test_deepspeed_config() -> None:
    target = make_target(num_gpus=16, tp=2, pp=2, zero=2, micro_batch=2, global_batch=512)
    emitted = render_deepspeed(target)
    config = json.loads(emitted.text)
    assert config == emitted.settings
    dp = target.config.dp
    assert config["train_batch_size"] == (config["train_micro_batch_size_per_gpu"]
                                          * config["gradient_accumulation_steps"] * dp) == 512
    # overlap_comm is off by default below ZeRO-3; the step-time model assumes it on.
    assert config["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert json.loads(render_deepspeed(make_target(num_gpus=8, zero=0)).text)[
        "zero_optimization"] == {"stage": 0}
    assert config["tensor_parallel"] == {"autotp_size": 2}
    assert config["bf16"] == {"enabled": True}
    assert any("ZeRO 0 or 1" in w for w in emitted.warnings)


def test_vllm_command_is_quoted_and_names_the_hf_repository() -> None:
    emitted = render_vllm(make_target("mixtral-8x7b", 16, tp=4, ep=4, etp=1))
    assert shlex.split(emitted.text) == [
        "vllm", "serve", "mistralai/Mixtral-8x7B-v0.1", "--tensor-parallel-size", "4",
        "--pipeline-parallel-size", "1", "--data-parallel-size", "4", "--enable-expert-parallel"]
    assert any("tp x dp = 16" in w for w in emitted.warnings)
    target = make_target(num_gpus=8, tp=8)
    odd = LaunchTarget(model_spec=target.model_spec.model_copy(update={
        "name": "my model; rm -rf /", "source": ""}), cluster=target.cluster, job=target.job,
        config=target.config, layout=target.layout)
    text = render_vllm(odd).text
    assert "'my model; rm -rf /'" in text and shlex.split(text)[2] == "my model; rm -rf /"


def test_every_format_has_a_renderer() -> None:
    assert tuple(RENDERERS) == FORMATS


def test_validation_skips_missing_frameworks_and_reports_rejections(
        monkeypatch: pytest.MonkeyPatch) -> None:
    target = make_target(num_gpus=16, tp=2, pp=2)
    for launch_format in ("torchtitan", "deepspeed", "vllm"):
        monkeypatch.setitem(sys.modules, launch_format, None)  # import fails
        line = validate_emitted(launch_format, target, RENDERERS[launch_format](target))
        assert line.startswith(f"{launch_format}: skipped (")
    torch_line = validate_emitted("torch", target, RENDERERS["torch"](target))
    assert torch_line == "torch: accepted: the module compiles"
    # A Megatron-LM whose parser knows fewer flags than we emit: the unknown ones are named.
    arguments = types.ModuleType("megatron.training.arguments")
    arguments.add_megatron_arguments = lambda parser: parser.add_argument(
        "--tensor-model-parallel-size")
    for name, module in (("megatron", types.ModuleType("megatron")),
                         ("megatron.training", types.ModuleType("megatron.training")),
                         ("megatron.training.arguments", arguments)):
        monkeypatch.setitem(sys.modules, name, module)
    line = validate_emitted("megatron", target, render_megatron(target))
    assert line.startswith("megatron: rejected: Megatron-LM's parser does not know "
                           "--pipeline-model-parallel-size, --context-parallel-size, ")
