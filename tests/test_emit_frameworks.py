"""Framework settings (solver/emit/{megatron,torchtitan,deepspeed,vllm,validate}.py), with the
option and field names pinned to the frameworks' sources."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from solver.api import build_parallel_config, check_parallel_config, load_problem_specs
from solver.emit import DEFAULT_ORDER, FORMATS
from solver.emit.deepspeed import render_deepspeed
from solver.emit.formats import RENDERERS, render_torchtitan
from solver.emit.layout import build_rank_layout
from solver.emit.megatron import render_megatron
from solver.emit.megatron_pipeline import megatron_split
from solver.emit.target import LaunchTarget, check_pipeline_layout
from solver.emit.torchtitan import torchtitan_split
from solver.emit.validate import validate_emitted
from solver.emit.vllm import render_vllm
from solver.errors import InputError
from solver.spec import PipelineLayout, VirtualStage
from solver.spec.layout_syntax import parse_layout_stages, parse_pipeline_layout

# Flags of NVIDIA/Megatron-LM megatron/training/arguments.py (core_v0.16.1; first listed from
# main, commit 000c4ac2, 2025, and checked against the core_v0.16.1 parser):
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
    # _add_training_args: --recompute-modules nargs='*' (default ["core_attn"]), the
    # TransformerConfig field recompute_modules; launch writes it for selective plans whose
    # set is not the default (solver.emit.megatron).
    "--recompute-modules",
    "--fp8-format", "--use-tp-pp-dp-mapping", "--overlap-grad-reduce", "--overlap-param-gather",
    "--fp8-recipe", "--fp4-format", "--fp4-recipe",
    # _add_distributed_args (commit d98e8a64, 2026) and the TransformerConfig fields
    # account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split, which
    # ArgumentGroupFactory(TransformerConfig) turns into flags.
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split",
    # TransformerConfig / ModelParallelConfig fields (core_v0.16.1): the framework profile's
    # features (solver.emit.megatron._feature_flags).
    "--moe-token-dispatcher-type", "--moe-flex-dispatcher-backend", "--moe-grouped-gemm",
    "--cuda-graph-impl", "--cuda-graph-scope", "--tp-comm-overlap",
    "--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute",
    # the architecture (core_v0.16.1 add_megatron_arguments: _add_network_size_args and the
    # TransformerConfig / MLATransformerConfig fields ArgumentGroupFactory adds)
    "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
    "--group-query-attention", "--num-query-groups", "--kv-channels",
    "--max-position-embeddings", "--vocab-size", "--normalization", "--position-embedding-type",
    "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
    "--add-qkv-bias", "--qk-layernorm", "--num-experts", "--moe-router-topk",
    "--moe-ffn-hidden-size", "--moe-shared-expert-intermediate-size", "--moe-layer-freq",
    "--moe-router-score-function", "--moe-router-enable-expert-bias",
    "--multi-latent-attention", "--q-lora-rank", "--kv-lora-rank", "--qk-head-dim",
    "--qk-pos-emb-head-dim", "--v-head-dim", "--mtp-num-layers",
    # core_v0.16.1 _add_network_size_args (--rotary-base type=int, --use-rope-scaling,
    # --rope-scaling-factor) and TransformerConfig attention_dropout / hidden_dropout
    "--rotary-base", "--use-rope-scaling", "--rope-scaling-factor", "--attention-dropout",
    "--hidden-dropout",
}
# torchtitan/config/job_config.py (TOML releases): fields of Parallelism, Training,
# ActivationCheckpoint.
TORCHTITAN_FIELDS = {
    "parallelism": {"data_parallel_replicate_degree", "data_parallel_shard_degree",
                    "fsdp_reshard_after_forward", "tensor_parallel_degree",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule",
                    "pipeline_parallel_microbatch_size", "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers", "module_fqns_per_model_part",
                    "context_parallel_degree", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "expert_parallel_comm_backend"},
    "training": {"local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"},
    "activation_checkpoint": {"mode", "selective_ac_option"},
    "compile": {"enable", "components"},
}


def make_target(model: str = "llama3.1-8b", num_gpus: int = 8, order: str = DEFAULT_ORDER,
                cluster: str = "dgx-h100", seq_len: int = 4096, global_batch: int = 1024,
                precision: str = "bf16", version: str = "", **degrees: int | str
                ) -> LaunchTarget:
    model_spec, cluster_spec, job = load_problem_specs(
        model, cluster, seq_len=seq_len, global_batch=global_batch, precision=precision)
    config = build_parallel_config(num_gpus, **degrees)
    check_parallel_config(model_spec, job, num_gpus, config)
    return LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job, config=config,
                        layout=build_rank_layout(config, model_spec.is_moe, order),
                        version=version)


def megatron_tokens(target: LaunchTarget) -> list[str]:
    text = render_megatron(target).text
    return shlex.split(text.replace("\\\n", " "), comments=True)


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
        "--global-batch-size", "1024",
        # models/llama2-70b.toml (meta-llama/Llama-2-70b-hf config.json)
        "--num-layers", "80", "--hidden-size", "8192", "--ffn-hidden-size", "28672",
        "--num-attention-heads", "64", "--group-query-attention", "--num-query-groups", "8",
        "--seq-length", "4096", "--max-position-embeddings", "4096", "--vocab-size", "32000",
        "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--rotary-base", "10000", "--attention-dropout", "0", "--hidden-dropout", "0",
        "--swiglu", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
        "--recompute-granularity", "selective", "--bf16"]


def test_megatron_architecture_of_moe_and_mla_models() -> None:
    """DeepSeek-V3 (models/deepseek-v3.toml): MLA widths, 256 experts top-8 of width 2048, one
    shared expert, the first 3 layers dense (Megatron's --moe-layer-freq list expression, as in
    its DeepSeek-V3 recipe "([0]*3+[1]*58)"), sigmoid routing with expert bias, one MTP layer."""
    tokens = megatron_tokens(make_target("deepseek-v3", 256, tp=8, pp=2, ep=128))
    for flag, value in (("--num-layers", "61"), ("--hidden-size", "7168"),
                        ("--q-lora-rank", "1536"), ("--kv-lora-rank", "512"),
                        ("--qk-head-dim", "128"), ("--qk-pos-emb-head-dim", "64"),
                        ("--v-head-dim", "128"), ("--num-experts", "256"),
                        ("--moe-router-topk", "8"), ("--moe-ffn-hidden-size", "2048"),
                        ("--moe-shared-expert-intermediate-size", "2048"),
                        ("--moe-layer-freq", "([0]*3+[1]*58)"),
                        ("--moe-router-score-function", "sigmoid"), ("--mtp-num-layers", "1")):
        assert value_of(tokens, flag) == value, flag
    assert "--multi-latent-attention" in tokens and "--num-query-groups" not in tokens
    mixtral = megatron_tokens(make_target("mixtral-8x7b", 16, tp=2, ep=8))
    assert value_of(mixtral, "--num-experts") == "8"
    assert value_of(mixtral, "--moe-router-topk") == "2"
    assert "--moe-layer-freq" not in mixtral and "--moe-router-enable-expert-bias" not in mixtral


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
    assert layout == "Et*4|(t*4|)*4,(t*3|)*3,t*3,L"
    assert parse_layout_stages(layout, 100) == ["Etttt"] + ["tttt"] * 4 + ["ttt"] * 3 + ["tttL"]
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
    mxfp8 = megatron_tokens(make_target(num_gpus=8, cluster="dgx-b200", precision="mxfp8"))
    assert mxfp8[mxfp8.index("--fp8-recipe") + 1] == "mxfp8"
    nvfp4 = megatron_tokens(make_target(num_gpus=8, cluster="dgx-b200", precision="nvfp4"))
    assert nvfp4[nvfp4.index("--fp4-recipe") + 1] == "nvfp4" and "--fp8-format" not in nvfp4


def test_torchtitan_toml() -> None:
    target = make_target("mixtral-8x7b", 64, tp=2, pp=4, vpp=2, ep=4, etp=1, zero=1,
                         recompute="selective", version="0.2")
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
    ddp = tomllib.loads(render_torchtitan(make_target(num_gpus=8, tp=2, zero=0,
                                                     version="0.2")).text)
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
    emitted = render_vllm(make_target("mixtral-8x7b", 8, tp=4, ep=4, etp=1))
    assert emitted.text.startswith("# parplan launch: mixtral-8x7b on 8 GPUs")
    assert "# vLLM 0.33: " in emitted.text
    assert shlex.split(emitted.text, comments=True) == emitted.settings == [
        "vllm", "serve", "mistralai/Mixtral-8x7B-v0.1", "--tensor-parallel-size", "4",
        "--pipeline-parallel-size", "1", "--data-parallel-size", "2", "--enable-expert-parallel"]
    assert any("tp x dp = 8" in w for w in emitted.warnings)
    target = make_target(num_gpus=8, tp=8)
    odd = LaunchTarget(model_spec=target.model_spec.model_copy(update={
        "name": "my model; rm -rf /", "source": ""}), cluster=target.cluster, job=target.job,
        config=target.config, layout=target.layout)
    text = render_vllm(odd).text
    assert "'my model; rm -rf /'" in text
    assert shlex.split(text, comments=True)[2] == "my model; rm -rf /"


def test_torchtitan_python_config_sets_what_the_command_line_sets() -> None:
    """The config module (torchtitan 0.3 --module / --config) and the tyro overrides carry the
    same fields; the module compiles and names the registry function it starts from."""
    from solver.emit.torchtitan_cli import build_torchtitan_args
    from solver.emit.torchtitan_python import render_torchtitan_python

    target = make_target("llama3.1-70b", 64, version="0.3", tp=8, pp=2)
    emitted = render_torchtitan_python(target)
    compile(emitted.text, "parplan_plan.py", "exec")
    assert emitted.settings["function"] == "parplan_llama3_1_70b_tp8_pp2_dp4"
    assert "from torchtitan.models.llama3.config_registry import llama3_70b" in emitted.text
    assert "--module parplan_plan --config parplan_llama3_1_70b_tp8_pp2_dp4" in emitted.text
    tokens = build_torchtitan_args(target)[0]
    for index, token in enumerate(tokens):
        if token.startswith("--") and token not in ("--module", "--config"):
            section, name = token[2:].split(".")
            if name.startswith("no_"):
                assert f"config.{section}.{name[3:]} = False" in emitted.text
            elif index + 1 == len(tokens) or tokens[index + 1].startswith(("--", "activ")):
                assert f"config.{section}.{name} = True" in emitted.text
            else:
                assert f"config.{section}.{name} = " in emitted.text
    assert tokens[-1] == "activation-checkpoint:selective"
    assert "config.activation_checkpoint = SelectiveAC.Config()" in emitted.text


def test_megatron_cuda_graph_scope_follows_megatron_cores_rules() -> None:
    """megatron-core 0.16.1 transformer_config.py __post_init__: no mlp graph in a model whose
    every layer is MoE ("mlp cuda graph is only supported for dense layers"); graphed attention
    whose core is recomputed needs attention dropout 0 (Megatron's default is 0.1)."""
    from solver.cost.step.frameworks import build_framework_profile
    from solver.emit.megatron import build_megatron_args

    graphs = build_framework_profile("megatron", {"cuda_graphs": True}).time_constants

    def flags_of(model: str, num_gpus: int, **degrees: int | str) -> dict[str, list[str]]:
        target = replace(make_target(model, num_gpus, **degrees), time_constants=graphs)
        return {flag: values for flag, *values in build_megatron_args(target)[0]}

    all_moe = flags_of("qwen3-30b-a3b", 16, ep=16, recompute="none")
    assert all_moe["--cuda-graph-scope"] == ["attn", "moe_router", "moe_preprocess"]
    assert all_moe["--attention-dropout"] == ["0"]  # the model's own (ModelSpec default 0)
    first_dense = flags_of("deepseek-v2-lite", 8, ep=8, recompute="selective")
    assert first_dense["--cuda-graph-scope"] == ["attn", "mlp", "moe_router", "moe_preprocess"]
    assert first_dense["--attention-dropout"] == ["0"]
    dense = flags_of("llama3.1-8b", 8, tp=2, recompute="full")
    assert dense["--cuda-graph-scope"] == ["attn", "mlp"]
    # a model that trains with attention dropout 0.1: graphed recomputed attention forces 0
    # (one flag, replacing the model's), without graphs the model's 0.1 goes out
    target = make_target("deepseek-v2-lite", 8, ep=8, recompute="selective")
    wet = replace(target, model_spec=target.model_spec.model_copy(
        update={"attention_dropout": 0.1}))
    forced = [f for f in build_megatron_args(replace(wet, time_constants=graphs))[0]
              if f[0] == "--attention-dropout"]
    assert forced == [("--attention-dropout", "0")]
    plain = [f for f in build_megatron_args(wet)[0] if f[0] == "--attention-dropout"]
    assert plain == [("--attention-dropout", "0.1")]


def test_every_format_has_a_renderer() -> None:
    assert tuple(RENDERERS) == FORMATS


def test_validation_never_accepts_what_it_did_not_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework that is not installed, or installed at another version, is "not checked"
    with the reason; a parser's usage error is the framework's rejection."""
    import argparse

    from solver.emit import check_harness

    target = make_target(num_gpus=16, tp=2, pp=2)
    monkeypatch.setattr(check_harness, "installed_version", lambda distribution: None)
    for launch_format in ("megatron", "megatron-bridge", "torchtitan", "torchtitan-python",
                          "deepspeed", "vllm"):
        line = validate_emitted(launch_format, target, RENDERERS[launch_format](target))
        assert line.startswith(f"{launch_format}@") and ": not checked: " in line, line
        assert "accepted" not in line and "is not installed" in line
    monkeypatch.setattr(check_harness, "installed_version", lambda distribution: "0.18.0")
    line = validate_emitted("deepspeed", target, render_deepspeed(target))
    assert line == ("deepspeed@0.19: not checked: the ds_config (deepspeed 0.18.0 is installed; "
                    "the file is for 0.19)")
    assert validate_emitted("torch", target, RENDERERS["torch"](target)) == \
        "torch: accepted by Python's compile (the module compiles)"

    def parse() -> None:
        parser = argparse.ArgumentParser(prog="x")
        parser.add_argument("--tensor-model-parallel-size", type=int)
        parser.parse_args(["--tensor-model-parallel-size", "two"])

    with pytest.raises(check_harness.Rejected) as refused:
        check_harness.run_parser("the parser", parse)
    assert refused.value.message == ("x: error: argument --tensor-model-parallel-size: "
                                     "invalid int value: 'two'")
    checked = check_harness.Validation("deepspeed@0.19", accepted=["DeepSpeedConfig"],
                                  unchecked=["the model code (needs the model)"])
    assert checked.render() == ("deepspeed@0.19: accepted by DeepSpeedConfig. not checked: the "
                                "model code (needs the model)")
    checked.rejected = refused.value
    assert checked.render().startswith("deepspeed@0.19: rejected by the parser: x: error:")


# --- pipeline layouts (LaunchTarget.pipeline) ---------------------------------------------


def with_pipeline(target: LaunchTarget, text: str, recompute: list[int] | None = None
                  ) -> LaunchTarget:
    """`target` with the layout `text` (Megatron syntax) and per-virtual-stage recompute."""
    c, model_spec = target.config, target.model_spec
    pipeline = parse_pipeline_layout(text, c.pp, c.vpp, model_spec.num_hidden_layers,
                                     model_spec.num_nextn_predict_layers)
    if recompute is not None:
        pipeline = PipelineLayout(pp=c.pp, vpp=c.vpp, stages=tuple(
            stage.model_copy(update={"recompute_layers": r})
            for stage, r in zip(pipeline.stages, recompute)))
    return LaunchTarget(model_spec=model_spec, cluster=target.cluster, job=target.job,
                        config=c, layout=target.layout, pipeline=pipeline,
                        version=target.version)


def llama_405b_target() -> LaunchTarget:
    """Llama-3.1-405B (126 layers), tp 8 x pp 16 x vpp 8 on 128 GPUs, the embedding and the
    loss each in a virtual stage of their own."""
    target = make_target("llama3.1-405b", 128, seq_len=8192, global_batch=2048, tp=8, pp=16,
                         vpp=8, recompute="none")
    pipeline = PipelineLayout(pp=16, vpp=8, stages=(
        VirtualStage(layers=0, embedding=True), *[VirtualStage(layers=1)] * 126,
        VirtualStage(layers=0, loss=True)))
    return LaunchTarget(model_spec=target.model_spec, cluster=target.cluster, job=target.job,
                        config=target.config, layout=target.layout, pipeline=pipeline)


def value_of(tokens: list[str], flag: str) -> str:
    return tokens[tokens.index(flag) + 1]


def test_megatron_split_follows_megatron_core() -> None:
    """megatron/core/transformer/transformer_block.py get_num_layers_to_build and the checks of
    megatron/training/arguments.py validate_args / transformer_config.py __post_init__."""
    # its comment: "With 8 layers, 2 stages, and 4 model chunks ... Stage 0: [0] [2] [4] [6]"
    assert megatron_split(8, 2, 4) == [1] * 8
    assert megatron_split(8, 2, 2) == [2] * 4  # "Stage 0: [0, 1] [4, 5]"
    assert megatron_split(30, 4, 1) is None  # "Number of layers should be divisible by pp"
    assert megatron_split(24, 4, 4) is None  # "... must be divisible by vp_size"
    # tests/functional_tests/test_cases/gpt/gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_
    # loss_in_pipeline_split: 6 layers, pp 4, 2 virtual stages a rank, both slots
    assert megatron_split(6, 4, 2, embedding_slot=True, loss_slot=True) == [0] + [1] * 6 + [0]
    assert megatron_split(126, 16, 8, embedding_slot=True) is None  # 127 % 16
    # gpt3_mcore_te_tp1_pp4_vp1_uneven_pipeline: 12 layers, pp 4, first 2, last 2
    assert megatron_split(12, 4, 1, first=2, last=2) == [2, 4, 4, 2]
    assert megatron_split(12, 4, 1, first=0) is None  # "must be larger than 0"
    # with vpp, each end rank's layers are cut into vpp equal chunks
    assert megatron_split(16, 4, 2, first=2, last=2) == [1, 3, 3, 1, 1, 3, 3, 1]
    assert megatron_split(12, 4, 2, first=3) is None  # "must be divisible by virtual ..."
    assert megatron_split(13, 4, 1, first=2) is None  # "... divisible by the middle ... size"
    # "num_layers_in_first_pipeline_stage ... cannot be set at the same time with
    # account_for_embedding_in_pipeline_split"
    assert megatron_split(12, 4, 1, embedding_slot=True, first=2) is None


def test_megatron_prefers_its_own_flags_to_the_layout_text() -> None:
    # The 405B layout is Megatron's --account-for-embedding/loss-in-pipeline-split.
    tokens = megatron_tokens(llama_405b_target())
    assert "--account-for-embedding-in-pipeline-split" in tokens
    assert "--account-for-loss-in-pipeline-split" in tokens
    assert value_of(tokens, "--num-layers-per-virtual-pipeline-stage") == "1"
    assert "--pipeline-model-parallel-layout" not in tokens
    # 32 layers on pp 3, the loss in a slot: (32 + 1) / 3 = 11 a rank, 10 on the last
    loss_only = megatron_tokens(with_pipeline(make_target(num_gpus=3, pp=3), "Et*11|t*11|t*10,L"))
    assert "--account-for-loss-in-pipeline-split" in loss_only
    assert "--account-for-embedding-in-pipeline-split" not in loss_only
    # first and last rank lighter: --decoder-first/last-pipeline-num-layers, and with vpp
    # --num-virtual-stages-per-pipeline-rank (validate_args refuses
    # --num-layers-per-virtual-pipeline-stage with an uneven split)
    ends = megatron_tokens(with_pipeline(make_target(num_gpus=8, pp=4, vpp=2),
                                         "Ett|t*6|t*6|tt|tt|t*6|t*6|ttL"))
    assert (value_of(ends, "--decoder-first-pipeline-num-layers"),
            value_of(ends, "--decoder-last-pipeline-num-layers"),
            value_of(ends, "--num-virtual-stages-per-pipeline-rank")) == ("4", "4", "2")
    assert "--num-layers-per-virtual-pipeline-stage" not in ends
    first = megatron_tokens(with_pipeline(make_target(num_gpus=4, pp=4), "Et*5|t*9|t*9|t*9,L"))
    assert value_of(first, "--decoder-first-pipeline-num-layers") == "5"
    assert "--decoder-last-pipeline-num-layers" not in first
    # anything else: the layout text, alone (validate_args: one of the three vpp flags)
    free = with_pipeline(make_target(num_gpus=8, pp=4, vpp=2), "Et*3|(t*4|)*6,t*5,L")
    tokens = megatron_tokens(free)
    assert value_of(tokens, "--pipeline-model-parallel-layout") == "Et*3|(t*4|)*6,t*5,L"
    assert not {"--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-"
                "rank", "--account-for-loss-in-pipeline-split"} & set(tokens)
    for target in (llama_405b_target(), free):
        flags = {t for t in megatron_tokens(target) if t.startswith("--")}
        assert flags <= MEGATRON_LM_FLAGS
    # the even split Megatron makes itself needs no layout flag
    even = megatron_tokens(with_pipeline(make_target(num_gpus=4, pp=4), "Et*8|t*8|t*8|t*8,L"))
    assert not [t for t in even if "layout" in t or "account" in t or "decoder-" in t]


def test_megatron_recompute_of_a_layout() -> None:
    """megatron/core/recompute.py: the block method checkpoints layer i of a model chunk when
    i < --recompute-num-layers, so a chunk with fewer layers recomputes them all; the count is
    one for every chunk."""
    base = make_target(num_gpus=4, pp=4, recompute="none")
    text = "Ett|t*10|t*10|t*10,L"
    block = render_megatron(with_pipeline(base, text, [2, 3, 3, 3]))
    tokens = block.settings
    assert tokens[tokens.index("--recompute-granularity"):][:6] == [
        "--recompute-granularity", "full", "--recompute-method", "block",
        "--recompute-num-layers", "3"]
    assert not block.warnings
    every = megatron_tokens(with_pipeline(base, text, [2, 10, 10, 10]))
    assert value_of(every, "--recompute-method") == "uniform"
    assert value_of(every, "--recompute-num-layers") == "1"
    mixed = render_megatron(with_pipeline(base, text, [2, 4, 1, 0]))
    assert value_of(mixed.settings, "--recompute-num-layers") == "4"
    # the largest count everywhere: 2 + 4 + 4 + 4 = 14 layers instead of the planned 7
    assert any("with 4 everywhere 7 more layer(s)" in w for w in mixed.warnings)
    selective = render_megatron(with_pipeline(make_target(num_gpus=4, pp=4), text,
                                              [0, 2, 2, 2]))
    assert any("one recompute granularity" in w for w in selective.warnings)
    assert value_of(megatron_tokens(with_pipeline(make_target(num_gpus=4, pp=4), text)),
                    "--recompute-granularity") == "selective"


def test_torchtitan_split_follows_torchtitan() -> None:
    """torchtitan/distributed/pipeline_parallel.py generate_llm_fqn_per_model_part (v0.2.2)."""
    # its docstring: (2, 3, input_weight=2, output_weight=2) -> embeddings count as 2 layers,
    # norm + output as 2: stage 0 tok_embeddings, layers.0, layers.1; stage 1 layers.2
    assert torchtitan_split(2, 3, 2, 2) == [2, 1]
    # the defaults (pipeline_parallel_first/last_stage_less_layers = 1): 32 layers over 4
    assert torchtitan_split(4, 32, 1, 1) == [8, 9, 8, 7]
    assert torchtitan_split(4, 32, 0, 0) == [8, 8, 8, 8]
    assert torchtitan_split(8, 3, 1, 1) is None  # more stages than layers + weights
    assert torchtitan_split(4, 5, 3, 0) is None  # a weight above the layers per stage


def test_torchtitan_pipeline_fields() -> None:
    # the even split: both weights 0 (their default is 1), layers_per_stage as before
    even = tomllib.loads(render_torchtitan(make_target(num_gpus=8, pp=4, vpp=2,
                                                       version="0.2")).text)
    p = even["parallelism"]
    assert (p["pipeline_parallel_layers_per_stage"], p["pipeline_parallel_first_stage_less_layers"],
            p["pipeline_parallel_last_stage_less_layers"]) == (4, 0, 0)
    # 405B: one layer a virtual stage, the embedding and the loss one slot each
    big = render_torchtitan(replace(llama_405b_target(), version="0.2")).settings["parallelism"]
    assert (big["pipeline_parallel_layers_per_stage"], big["pipeline_parallel_first_stage_less_"
            "layers"], big["pipeline_parallel_last_stage_less_layers"]) == (1, 1, 1)
    # a split torchtitan does not make itself: module names per virtual stage
    free = render_torchtitan(with_pipeline(make_target(num_gpus=4, pp=4, version="0.2"),
                                           "Et*9|t*7|t*9|t*7,L"))
    parsed = tomllib.loads(free.text)
    assert parsed == free.settings
    parts = parsed["parallelism"]["module_fqns_per_model_part"]
    assert "pipeline_parallel_layers_per_stage" not in parsed["parallelism"]
    assert parts[0] == ["tok_embeddings"] + [f"layers.{i}" for i in range(9)]
    assert parts[3] == [f"layers.{i}" for i in range(25, 32)] + ["norm", "output"]
    partial = render_torchtitan(with_pipeline(make_target(num_gpus=4, pp=4, recompute="none",
                                                          version="0.2"),
                                              "Et*8|t*8|t*8|t*8,L", [8, 4, 0, 0]))
    assert partial.settings["activation_checkpoint"] == {"mode": "full"}
    assert any("12 of 32 layers" in w for w in partial.warnings)


def test_torchtitan_has_no_mtp_module() -> None:
    target = make_target("deepseek-v3", 256, pp=4, ep=64, tp=1)
    assert any("MTP" in w for w in render_torchtitan(target).warnings)


def test_deepspeed_partition_of_a_layout() -> None:
    """deepspeed/runtime/pipe/module.py _partition_layers: "type:REGEX" balances the layers
    whose class names match (partition_balanced minimises the spread); no explicit parts."""
    even = render_deepspeed(make_target(num_gpus=4, pp=4))
    assert any('partition_method="type:DecoderLayer")' in n for n in even.notes)
    assert not even.warnings
    # 32 layers on pp 3, the first stages one more: the LM head as a slot balances them
    loss_slot = render_deepspeed(make_target(num_gpus=3, pp=3))
    assert any('"type:DecoderLayer|LMHead"' in n for n in loss_slot.notes)
    assert not loss_slot.warnings
    near = render_deepspeed(with_pipeline(make_target(num_gpus=4, pp=4), "Et*7|t*9|t*8|t*8,L"))
    assert any("picks itself" in w for w in near.warnings)
    far = render_deepspeed(with_pipeline(make_target(num_gpus=4, pp=4), "Et*5|t*11|t*8|t*8,L"))
    assert any("takes no explicit partition" in w for w in far.warnings)
    partial = render_deepspeed(with_pipeline(make_target(num_gpus=4, pp=4, recompute="none"),
                                             "Et*8|t*8|t*8|t*8,L", [2, 2, 2, 2]))
    assert any("full recomputation of 8 of 32 layers" in n for n in partial.notes)


def test_a_plan_layout_is_checked_against_the_model() -> None:
    """A plan's layout must hold the model's layers; its MTP layers, when it places none, go
    with the loss (Megatron's default place, and the only one a PipelineLayout has)."""
    target = make_target("deepseek-v3", 256, pp=4, ep=64)
    even = target.pipeline_layout()
    assert even.stages[-1].mtp_layers == 1 and even.num_layers == 61
    bare = PipelineLayout(pp=4, vpp=1, stages=(*even.stages[:-1], even.stages[-1].model_copy(
        update={"mtp_layers": 0})))
    assert check_pipeline_layout(bare, target.model_spec, target.config, "plan") == even
    with pytest.raises(InputError, match="^plan: its last virtual stage holds 2 MTP layers"):
        check_pipeline_layout(even.model_copy(update={"stages": (*even.stages[:-1], even.stages[
            -1].model_copy(update={"mtp_layers": 2}))}), target.model_spec, target.config, "plan")
    with pytest.raises(InputError, match="a layout of pp 4 x vpp 1, but the plan has pp 2"):
        check_pipeline_layout(even, target.model_spec, target.config.model_copy(
            update={"pp": 2, "dp": target.config.dp * 2}), "plan")


def test_deepspeed_expert_parallelism_is_autoep() -> None:
    """DeepSpeed 0.19's AutoEP (deepspeed/module_inject/auto_ep_config.py parse_autoep_config:
    expert_parallel.enabled / autoep_size / preset_model; presets in auto_ep_presets/*.py)."""
    emitted = render_deepspeed(make_target("mixtral-8x7b", 16, tp=2, ep=8, etp=1))
    assert emitted.settings["expert_parallel"] == {"enabled": True, "autoep_size": 8,
                                                   "preset_model": "mixtral"}
    assert not emitted.warnings
    folded = render_deepspeed(make_target("mixtral-8x7b", 16, tp=2, pp=2, ep=4, etp=2))
    assert any("no expert tensor parallelism" in w for w in folded.warnings)
    assert any("only without pipeline parallelism" in w for w in folded.warnings)
    dense = render_deepspeed(make_target(num_gpus=8))
    assert "expert_parallel" not in dense.settings


def test_deepspeed_autoep_rules_are_named_search_constraints() -> None:
    """auto_ep_folding.py validate_folding_global (DeepSpeed 0.19.8): "expert_tensor_parallel_
    size={n} is reserved ... not supported yet" and "AutoEP+AutoTP folding currently supports
    pp_size=1 only"; dense models and other frameworks do not get them."""
    import numpy as np

    from solver.optimize import build_problem
    from solver.search.constraints import build_constraints

    def rules(model: str, framework: str) -> dict:
        problem = build_problem(model, "dgx-h100", 64, framework=framework)
        return {c.name: c for c in build_constraints(problem)}

    moe = rules("mixtral-8x7b", "deepspeed")
    values = {"ep": np.array([8, 8, 8, 1]), "etp": np.array([1, 2, 1, 2]),
              "tp": np.array([2, 1, 2, 2]), "pp": np.array([1, 1, 2, 2])}
    assert list(moe["deepspeed_autoep_no_etp"].check(values)) == [True, False, True, True]
    assert list(moe["deepspeed_autoep_tp_without_pp"].check(values)) == [True, True, False, True]
    assert "deepspeed_autoep_no_etp" not in rules("llama3.1-8b", "deepspeed")
    assert "deepspeed_autoep_no_etp" not in rules("mixtral-8x7b", "megatron")


def test_per_node_launch_lines() -> None:
    """torchrun's c10d rendezvous: one line for every node; DeepSpeed's launcher on the first
    node with a "HOST slots=G" hostfile; vLLM's multi-node data parallelism: the first node
    with --data-parallel-size-local and the address, node k --headless from rank k x local
    (vLLM docs, "Data Parallel Deployment")."""
    target = make_target("mixtral-8x7b", 32, tp=4, ep=8)
    titan = render_torchtitan(target).text.splitlines()[2]
    assert titan.startswith("torchrun --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d "
                            "--rdzv-endpoint HOST:29500 -m torchtitan.train")
    deepspeed = render_deepspeed(target).notes[0]
    assert "deepspeed --hostfile hostfile --num_nodes 4 --num_gpus 8" in deepspeed
    assert '"node-0 slots=8; node-1 slots=8; node-2 slots=8; node-3 slots=8"' in deepspeed
    commands = [shlex.split(line) for line in render_vllm(target).text.splitlines()
                if line.startswith("vllm ")]
    assert len(commands) == 4  # dp 8 engines of tp 4, two a node
    assert all(value_of(c, "--data-parallel-size-local") == "2" for c in commands)
    assert "--headless" not in commands[0]
    assert [value_of(c, "--data-parallel-start-rank") for c in commands[1:]] == ["2", "4", "6"]
    one_node = render_vllm(make_target("mixtral-8x7b", 8, tp=4, ep=8))
    assert "--data-parallel-size-local" not in one_node.text
    wide = render_vllm(make_target("llama3.1-70b", 32, tp=8, pp=2))
    assert any("Ray cluster" in note for note in wide.notes)


def test_torchtitan_expert_rule_is_a_search_constraint() -> None:
    """torchtitan 0.3 ParallelismConfig.expert_parallel_degree: "EP borrows ranks from FSDP and
    TP: efsdp = dp_shard * cp * tp / ep"; no expert TP. Under ZeRO 0 (DDP) dp_shard is 1."""
    import numpy as np

    from solver.optimize import build_problem
    from solver.search.constraints import build_constraints

    problem = build_problem("mixtral-8x7b", "dgx-h100", 64, framework="torchtitan")
    rule = {c.name: c for c in build_constraints(problem)}["torchtitan_ep_borrows_fsdp_tp"]
    values = {"ep": np.array([8, 8, 8, 8, 1]), "etp": np.array([1, 1, 2, 1, 4]),
              "dp": np.array([8, 8, 8, 4, 8]), "cp": np.array([1, 1, 1, 1, 1]),
              "tp": np.array([1, 1, 1, 1, 4]), "zero": np.array([3, 0, 3, 0, 0])}
    assert list(rule.check(values)) == [True, False, False, False, True]
    dense = build_problem("llama3.1-8b", "dgx-h100", 8, framework="torchtitan")
    assert "torchtitan_ep_borrows_fsdp_tp" not in {c.name for c in build_constraints(dense)}
