"""The 2025-26 architectures of the zoo (issue 42 item 3): DeepSeek Sparse Attention
(DeepSeek-V3.2, GLM-5), zero-computation experts (LongCat-Flash), MiniMax-M2.5, Qwen3.5
(dense and MoE gated-DeltaNet hybrids), ERNIE 4.5 MoE.

Sources pinned here:
- DSA's indexer shapes: Megatron-Core megatron/core/transformer/experimental_attention_variant/
  dsa.py DSAIndexer @d98e8a6 (linear_wq_b q_lora_rank -> H_I d_I, linear_wk h -> d_I,
  LayerNorm k_norm, linear_weights_proj h -> H_I, all parallel_mode="duplicated");
  DeepSeek-V3.2 config.json (index_n_heads 64, index_head_dim 128, index_topk 2048; as
  ai-dynamo/aiconfigurator aic-core/src/aiconfigurator_core/model_configs copies it @095f58a).
- The indexer key cache: vLLM model_executor/models/deepseek_v2.py DeepseekV32IndexerCache
  (head_dim fp8 bytes + head_dim // 128 fp32 scales).
- Megatron-Core 0.16's DSA flags: TransformerConfig experimental_attention_variant "dsa",
  dsa_indexer_n_heads / _head_dim / _topk (core_v0.16.0 transformer_config.py).
- Zero-computation experts: transformers models/longcat_flash (LongcatFlashTopkRouter
  classifier over n_routed_experts + zero_expert_num, identity experts without weights);
  the LongCat-Flash card: 560B total, 18.6B-31.3B activated, 27B on average.
- The parameter totals: tests/test_zoo.py and tests/test_hf_import.py (model cards).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import example, given, settings
from hypothesis import strategies as st

from solver.catalog.zoo import load_model_spec
from solver.cli import cli
from solver.spec import JobSpec
from solver.cost.layers.flops import estimate_attention_core_flops, estimate_moe_layer_flops
from solver.cost.candidates import RECOMPUTE_NONE, RECOMPUTE_SELECTIVE
from solver.cost.layers.sparse_attention import (
    estimate_indexer_cache_bytes_per_token,
    estimate_indexer_saved_bytes_per_token,
    estimate_indexer_replica_params,
    estimate_prefill_sparse_flops_per_token,
    estimate_sparse_core_flops,
    indexer_params_per_layer,
)
from solver.cost.memory.activations import _attention_bytes
from solver.cost.memory.options import MemoryOptions
from solver.cost.serving.memory import estimate_kv_bytes_per_token
from solver.cost.serving.step import attention_params_per_gpu

NEW_MODELS = ("deepseek-v3.2", "glm-5", "minimax-m2.5", "qwen3.5-397b-a17b", "qwen3.5-27b",
              "longcat-flash", "ernie-4.5-21b-a3b")
DSA_MODELS = ("deepseek-v3.2", "glm-5")


def dense_twin(name: str):
    """The same model with dense MLA (no indexer)."""
    return load_model_spec(name).model_copy(
        update={"index_n_heads": None, "index_head_dim": None, "index_topk": None})


# ---- DSA shapes and costs, pinned to their sources -----------------------------------------


def test_indexer_parameters_follow_megatron_dsa_indexer() -> None:
    """q_lora_rank x H_I d_I + h d_I + 2 d_I (LayerNorm weight and bias) + h H_I."""
    v32 = load_model_spec("deepseek-v3.2")
    assert indexer_params_per_layer(v32) == (1536 * 64 * 128 + 7168 * 128 + 2 * 128
                                             + 7168 * 64) == 13_959_424
    glm5 = load_model_spec("glm-5")
    assert indexer_params_per_layer(glm5) == 2048 * 32 * 128 + 6144 * 128 + 256 + 6144 * 32
    for name in DSA_MODELS:
        spec, dense = load_model_spec(name), dense_twin(name)
        layers = spec.num_hidden_layers
        assert spec.total_params - dense.total_params == layers * indexer_params_per_layer(spec)
        assert spec.breakdown()["indexer"] == layers * indexer_params_per_layer(spec)
        assert indexer_params_per_layer(dense) == 0


def test_indexer_is_duplicated_on_every_tp_rank() -> None:
    """vLLM builds the indexer's projections as ReplicatedLinear, Megatron-Core as
    parallel_mode="duplicated": a TP rank holds all of it, not 1/tp."""
    spec, dense = load_model_spec("deepseek-v3.2"), dense_twin("deepseek-v3.2")
    for tp in (1, 2, 8):
        extra = attention_params_per_gpu(spec, np.array([tp]))[0] - attention_params_per_gpu(
            dense, np.array([tp]))[0]
        assert extra == pytest.approx(13_959_424)
    assert estimate_indexer_replica_params(spec, 8) == pytest.approx(13_959_424 * 7 / 8)
    assert estimate_indexer_replica_params(spec, 1) == 0


def test_sparse_attention_core_flops_worked_number() -> None:
    """DeepSeek-V3.2 at s = 8192: mean keys k - k(k-1)/(2s) = 1792.125 of the top 2048;
    2 x 1792.125 x 128 heads x (192 + 128) + indexer 2 x 64 x 128 x 4096."""
    spec = load_model_spec("deepseek-v3.2")
    assert spec.sparse_context_tokens(8192) == pytest.approx(2048 - 2048 * 2047 / 16384)
    assert spec.indexer_core_flops_per_token(8192) == 67_108_864
    assert estimate_sparse_core_flops(spec, 8192) == pytest.approx(
        2 * 1792.125 * 128 * 320 + 67_108_864)
    assert estimate_attention_core_flops(spec, 8192) == estimate_sparse_core_flops(spec, 8192)
    # Dense MLA would attend to 4096 keys on average.
    assert estimate_attention_core_flops(dense_twin("deepseek-v3.2"), 8192) == 2 * 4096 * 128 * 320


@settings(max_examples=50, deadline=None)
@given(seq_len=st.integers(1, 1 << 20), topk=st.integers(1, 1 << 16))
@example(seq_len=3, topk=2)  # CI's draw: the prefill form passed causal attention's s/2
def test_sparse_context_never_exceeds_causal_attention(seq_len: int, topk: int) -> None:
    """min(i, k) keys for query i: never more than causal attention's s/2 mean, never more
    than k, and exactly s/2 once k covers the sequence; the vectorised prefill form agrees."""
    spec = load_model_spec("deepseek-v3.2").model_copy(update={"index_topk": topk})
    ctx = spec.sparse_context_tokens(seq_len)
    assert ctx <= seq_len / 2 + 1e-9 and ctx <= topk
    if topk >= seq_len:
        assert ctx == seq_len / 2
    prefill = estimate_prefill_sparse_flops_per_token(spec, np.array([seq_len]), 1)[0]
    assert prefill == pytest.approx(estimate_sparse_core_flops(spec, seq_len), rel=1e-9)


def test_indexer_key_cache_is_served_next_to_mla() -> None:
    """vLLM DeepseekV32IndexerCache: 128 fp8 keys + one fp32 scale = 132 B per token and
    layer, next to MLA's (512 + 64) x 2 B; 61 layers: 78,324 B per token."""
    spec = load_model_spec("deepseek-v3.2")
    assert estimate_indexer_cache_bytes_per_token(spec) == 132
    kv = estimate_kv_bytes_per_token(spec, 8192, 2.0, np.array([8]), np.array([1]))
    assert kv[0] == 61 * (1152 + 132) == 78_324
    assert estimate_indexer_cache_bytes_per_token(dense_twin("deepseek-v3.2")) == 0


def test_indexer_keeps_its_tensors_whole_on_every_tp_rank() -> None:
    """Megatron-Core core_v0.19.0 ops/indexer.py saves index_q, index_k, weights (bf16) and the
    int32 top-k indices: 2 (64 x 128 + 128 + 64) + 4 x 2048 = 24,960 B per token and layer,
    on every TP rank (the split part is divided by tp, so it enters x tp); a recomputed core
    (core_attn) recomputes the indexer too."""
    spec, dense = load_model_spec("deepseek-v3.2"), dense_twin("deepseek-v3.2")
    assert estimate_indexer_saved_bytes_per_token(spec) == 24_960
    job, options = JobSpec(seq_len=4096, global_batch=64), MemoryOptions()
    tp = np.array([1, 2, 8])
    for recompute, kept in ((RECOMPUTE_NONE, 24_960), (RECOMPUTE_SELECTIVE, 0)):
        mode = np.full(3, recompute)
        with_indexer, _ = _attention_bytes(spec, job, mode, options, tp)
        without, _ = _attention_bytes(dense, job, mode, options, tp)
        np.testing.assert_allclose((with_indexer - without) / tp, kept)


def test_dsa_sizes_come_together_and_need_mla() -> None:
    spec = load_model_spec("deepseek-v3.2")
    with pytest.raises(ValueError, match="needs all of index_n_heads"):
        spec.model_validate({**spec.model_dump(), "index_topk": None})
    with pytest.raises(ValueError, match="needs multi-head latent attention"):
        load_model_spec("minimax-m2.5").model_validate(
            {**load_model_spec("minimax-m2.5").model_dump(), "index_n_heads": 64,
             "index_head_dim": 128, "index_topk": 2048})


TRAIN = ["--cluster", "dgx-h100", "--gpus", "256", "--seq-len", "4096", "--global-batch",
         "1024"]


def invoke_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ---- zero-computation experts ----------------------------------------------------------------


def test_zero_experts_give_the_cards_activated_range() -> None:
    """LongCat-Flash card: 18.6B to 31.3B activated (no FFN expert to all 12 FFN experts),
    27B on average; balanced over 768 experts a token visits 12 x 512 / 768 = 8 FFN experts.
    LongCat counts without the input embedding and truncates, as the card's figures show."""
    spec = load_model_spec("longcat-flash")
    assert spec.experts_per_token == 8.0
    per_expert_layers = spec.num_moe_layers * spec.expert_params
    mean = spec.active_params - spec.embedding_params
    assert int(mean / 1e9) == 27
    assert int((mean - 8 * per_expert_layers) / 1e8) == 186
    assert int((mean + 4 * per_expert_layers) / 1e8) == 313


def test_zero_experts_have_no_weights_and_no_flops() -> None:
    """The router scores 512 + 256 experts (with its correction bias); the identity experts
    hold nothing and compute nothing: a MoE layer costs what 8 FFN experts of 512 cost, plus
    the router's 256 extra rows."""
    spec = load_model_spec("longcat-flash")
    assert spec.router_params_per_layer == 768 * (6144 + 1)
    assert spec.breakdown()["routed_experts"] == 28 * 512 * 3 * 6144 * 2048
    plain = spec.model_copy(update={"num_zero_experts": 0, "num_experts_per_tok": 8})
    difference = (estimate_moe_layer_flops(spec, 4096).total
                  - estimate_moe_layer_flops(plain, 4096).total)
    assert difference == 2 * 256 * (6144 + 1)


@settings(max_examples=50, deadline=None)
@given(top_k=st.integers(1, 64), experts=st.integers(64, 1024), zero=st.integers(0, 1024))
def test_zero_experts_only_lower_the_experts_a_token_visits(top_k: int, experts: int,
                                                            zero: int) -> None:
    spec = load_model_spec("longcat-flash")
    visited = spec.model_copy(update={"num_zero_experts": zero}).experts_per_token_of(
        experts, top_k)
    assert 0 < visited <= top_k
    assert (visited == top_k) == (zero == 0)
    more = spec.model_copy(update={"num_zero_experts": zero + 1}).experts_per_token_of(
        experts, top_k)
    assert more < visited


@pytest.mark.parametrize(("framework", "rule"), [
    ("megatron", "megatron_core_has_no_zero_experts"),
    ("megatron-bridge", "megatron_core_has_no_zero_experts"),
    ("torchtitan", "torchtitan_has_no_zero_experts"),
    ("deepspeed", "deepspeed_has_no_zero_experts"),
])
def test_training_frameworks_without_zero_experts_refuse_them(framework: str,
                                                              rule: str) -> None:
    answer = invoke_json("optimize", "--model", "longcat-flash", *TRAIN, "--framework",
                         framework)
    assert answer["status"] == "infeasible" and rule in answer["conflicts"]


# ---- framework rules -----------------------------------------------------------------------

@pytest.mark.parametrize("framework", ["megatron", "megatron-bridge"])
def test_megatron_core_up_to_0_18_trains_dsa_unfused(framework: str) -> None:
    """core_v0.16.0-0.18.2 dsa.py: DSAttention.forward calls unfused_dsa_fn (fp32 torch.bmm
    over every key, an s x s mask); parplan costs fused sparse attention and refuses it."""
    answer = invoke_json("optimize", "--model", "deepseek-v3.2", *TRAIN, "--framework",
                         framework)
    assert answer["status"] == "infeasible"
    assert answer["conflicts"] == ["megatron_sparse_attention_is_unfused"]


@pytest.mark.parametrize("framework", ["torchtitan", "deepspeed"])
def test_frameworks_without_dsa_refuse_it(framework: str) -> None:
    answer = invoke_json("optimize", "--model", "glm-5", *TRAIN, "--framework", framework)
    assert answer["status"] == "infeasible"
    assert f"{framework}_has_no_sparse_attention" in answer["conflicts"]


def test_megatron_launch_writes_the_dsa_flags() -> None:
    result = CliRunner().invoke(cli, ["launch", "--model", "deepseek-v3.2", *TRAIN, "--tp", "2",
                                      "--pp", "8", "--ep", "8", "--format", "megatron"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    for flag in ("--multi-latent-attention", "--experimental-attention-variant dsa",
                 "--dsa-indexer-n-heads 64", "--dsa-indexer-head-dim 128",
                 "--dsa-indexer-topk 2048"):
        assert flag in text


# ---- every new model through estimate, optimize, serve and launch ------------------------

# (training GPUs, pins) and serving GPUs per model: enough H100s to hold it.
RUNS = {
    # DSA: fused sparse attention, which no Megatron-Core release here runs (generic).
    "deepseek-v3.2": (["--gpus", "256", "--pp", "8", "--framework", "generic"], "32"),
    "glm-5": (["--gpus", "256", "--pp", "8", "--framework", "generic"], "32"),
    "minimax-m2.5": (["--gpus", "64", "--pp", "4"], "8"),
    "qwen3.5-397b-a17b": (["--gpus", "128", "--pp", "4"], "16"),
    "qwen3.5-27b": (["--gpus", "16"], "2"),
    "ernie-4.5-21b-a3b": (["--gpus", "16"], "1"),
    # No training framework has zero experts: the generic one (its rules lifted).
    "longcat-flash": (["--gpus", "256", "--pp", "8", "--framework", "generic"], "16"),
}


@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_model_plans_end_to_end(name: str, tmp_path: Path) -> None:
    """optimize's best plan, estimated again from its file (same step time), written as
    Megatron arguments; a vLLM serving plan and its launch line."""
    train, serve_gpus = RUNS[name]
    best = invoke_json("optimize", "--model", name, "--cluster", "dgx-h100", "--seq-len",
                       "4096", "--global-batch", "1024", *train, "--top", "1")
    assert best["status"] in ("optimal", "feasible") and best["plans"][0]["fits"]
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(best), encoding="utf-8")
    estimate = invoke_json("estimate", "--plan", str(path))
    assert estimate["plans"][0]["step_seconds"] == pytest.approx(
        best["plans"][0]["step_seconds"], rel=1e-6)
    if "generic" in train:
        launch = CliRunner().invoke(cli, ["launch", "--plan", str(path), "--format", "groups",
                                          "--json"])
        assert launch.exit_code == 0, launch.output
        assert json.loads(launch.stdout)["world_size"] == int(train[1])
    else:
        launch = CliRunner().invoke(cli, ["launch", "--plan", str(path), "--format",
                                          "megatron"])
        assert launch.exit_code == 0, launch.output
        assert f"--num-layers {load_model_spec(name).num_hidden_layers}" in launch.stdout
    served = invoke_json("serve", "--model", name, "--cluster", "dgx-h100", "--gpus",
                         serve_gpus, "--context", "32768", "--precision", "fp8")
    assert served["status"] in ("optimal", "feasible") and served["plans"][0]["fits"]
    engine = served["plans"][0]
    vllm = CliRunner().invoke(cli, ["launch", "--model", name, "--cluster", "dgx-h100",
                                    "--gpus", serve_gpus, "--tp", str(engine["tp"]), "--pp",
                                    str(engine["pp"]), "--format", "vllm"])
    assert vllm.exit_code == 0, vllm.output
    assert f"--tensor-parallel-size {engine['tp']}" in vllm.stdout


@pytest.mark.parametrize(("name", "letters"), [
    ("deepseek-v3.2", "*-*-*-*E*E"), ("glm-5", "*-*-*-*E"), ("minimax-m2.5", "*E*E*E"),
    ("qwen3.5-397b-a17b", "LELELE*ELE"), ("qwen3.5-27b", "L-L-L-*-L-"),
    ("longcat-flash", "*E*-*E*-"), ("ernie-4.5-21b-a3b", "*-*E*E*E"),
])
def test_models_show_prints_the_block_pattern(name: str, letters: str) -> None:
    result = CliRunner().invoke(cli, ["models", "show", name])
    assert result.exit_code == 0, result.output
    pattern = result.stdout.split("block pattern: ", 1)[1].split("\n", 1)[0]
    assert pattern.startswith(letters)
    assert len(pattern.replace("E", "").replace("-", "")) == load_model_spec(
        name).num_hidden_layers
    if name in DSA_MODELS:
        assert "DeepSeek Sparse Attention" in result.stdout
    if name == "longcat-flash":
        assert "256 zero-computation experts: 8 FFN experts a token" in result.stdout
