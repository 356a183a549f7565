"""Block patterns (solver.spec.blocks, solver.cost.layers.blocks): hybrid Mamba-2, gated DeltaNet,
sliding / chunked attention, interleaved MoE, single-block layers.

Sources of the pinned numbers are named in each test; the shapes come from the HF configs in
tests/data/hf_configs (transcribed from the model cards' config.json files, cited in
tests/test_hf_import.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.clusters import load_cluster_spec as load_cluster
from solver.catalog.hf import model_spec_from_hf_config
from solver.catalog.zoo import list_zoo_names, load_model_spec, load_zoo
from solver.cli import cli
from solver.cost.serving.block_cache import estimate_layer_cache_bytes
from solver.cost.layers.blocks import (
    estimate_kind_params,
    estimate_mixer_activation_bytes,
    estimate_mixer_core_flops,
)
from solver.cost.candidates import Candidates
from solver.cost.layers.flops import estimate_model_flops_per_token
from solver.cost.step.layout_terms import estimate_layout_coefficients
from solver.cost.memory import estimate_memory_total
from solver.cost.memory.options import MemoryOptions
from solver.cost.step.steptime import estimate_step_seconds
from solver.errors import InputError
from solver.spec import JobSpec, ModelSpec, ParallelConfig
from solver.spec.blocks import render_pattern

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "hf_configs"
PLAIN_ZOO = [m.name for m in load_zoo() if not m.is_hybrid]
HYBRID_ZOO = ["nemotron-h-8b", "nemotron-h-47b", "nemotron-h-56b", "nemotron-nano-9b-v2",
              "nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b", "gemma3-27b", "llama4-maverick",
              "glm-4.5", "llama4-scout", "kimi-k2", "nemotron-3-super-120b-a12b",
              "nemotron-3-ultra-550b-a55b", "deepseek-v3", "phi3-mini"]


def hf(name: str) -> ModelSpec:
    path = CONFIG_DIR / f"{name}.json"
    return model_spec_from_hf_config(json.loads(path.read_text()), str(path))


def with_pattern(model_spec: ModelSpec, **update: object) -> ModelSpec:
    """The same model with its block pattern written out (and `update` applied)."""
    data = {**model_spec.model_dump(), "layer_types": model_spec.layer_mixers,
            "mlp_layer_types": model_spec.layer_mlps, **update}
    return ModelSpec.model_validate(data)


def some_configs(num_gpus: int, model_spec: ModelSpec) -> list[ParallelConfig]:
    """A spread of configurations that split `model_spec` legally on `num_gpus` GPUs."""
    configs = []
    for tp, pp, cp, vpp, recompute in [(1, 1, 1, 1, "none"), (2, 2, 1, 1, "selective"),
                                       (2, 4, 1, 2, "full"), (1, 2, 2, 1, "none"),
                                       (4, 1, 1, 1, "full")]:
        if model_spec.num_attention_heads % tp or pp * vpp > model_spec.num_hidden_layers:
            continue
        dp = num_gpus // (tp * pp * cp)
        ep = 2 if model_spec.is_moe and model_spec.num_experts % 2 == 0 and dp % 2 == 0 else 1
        configs.append(ParallelConfig(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, vpp=vpp,
                                      micro_batch=1, recompute=recompute, zero=1))
    return configs


# ---- a plain pattern changes nothing -----------------------------------------------------------


@pytest.mark.parametrize("name", PLAIN_ZOO)
def test_a_pattern_of_plain_layers_gives_exactly_todays_numbers(name: str) -> None:
    """Every plain zoo model, its block pattern written out: the same parameters, FLOPs,
    worst-stage memory, step times and layout coefficients, to the last bit."""
    plain = load_model_spec(name)
    stated = with_pattern(plain)
    assert stated.is_hybrid and stated.block_kinds == plain.block_kinds
    assert (stated.total_params, stated.active_params, stated.breakdown()) == (
        plain.total_params, plain.active_params, plain.breakdown())
    assert stated.flops_per_token(8192) == plain.flops_per_token(8192)
    assert estimate_model_flops_per_token(stated, 8192) == estimate_model_flops_per_token(
        plain, 8192)
    cluster, job = load_cluster("dgx-h100"), JobSpec(seq_len=4096, global_batch=64)
    configs = some_configs(16, plain)
    candidates = Candidates.from_configs(configs)
    for left, right in zip(estimate_memory_total(stated, job, candidates),
                           estimate_memory_total(plain, job, candidates)):
        assert np.array_equal(left, right)
    assert np.array_equal(estimate_step_seconds(stated, cluster, job, candidates),
                          estimate_step_seconds(plain, cluster, job, candidates))
    stated_co = estimate_layout_coefficients(stated, cluster, job, configs[-1])
    plain_co = estimate_layout_coefficients(plain, cluster, job, configs[-1])
    for field in ("kinds", "layer_s", "layer_bytes", "base_bytes"):
        assert np.array_equal(getattr(stated_co, field), getattr(plain_co, field)), field


# ---- windows never cost more -------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["llama3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "gemma2-9b",
                              "nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b",
                              "nemotron-3-super-120b-a12b"]),
       window=st.integers(min_value=1, max_value=1 << 15),
       chunked=st.booleans(),
       layers=st.sets(st.integers(min_value=0, max_value=87), min_size=1),
       config=st.integers(min_value=0, max_value=4),
       modules=st.sampled_from([("core_attn",), ("core_attn", "moe", "layernorm"),
                                ("moe_act", "mlp", "shared_experts")]))
def test_windowed_attention_never_costs_more_memory_or_time(name: str, window: int,
                                                            chunked: bool, layers: set[int],
                                                            config: int,
                                                            modules: tuple[str, ...]) -> None:
    plain = load_model_spec(name)
    mixer = "chunked_attention" if chunked else "sliding_attention"
    # Full-attention layers windowed, and no window wider than before (Gemma 2 has its own).
    types = tuple(mixer if i in layers and own == "full_attention" else own
                  for i, own in enumerate(plain.layer_mixers))
    windowed = with_pattern(plain, layer_types=types,
                            sliding_window=min(window, plain.sliding_window or window),
                            attention_chunk_size=min(window, plain.attention_chunk_size or window))
    cluster, job = load_cluster("dgx-h100"), JobSpec(seq_len=8192, global_batch=64)
    configs = some_configs(16, plain)
    candidates = Candidates.from_configs([configs[config % len(configs)]])
    # (Megatron's recompute modules drop the same bytes from either: memory at each set)
    options = MemoryOptions(recompute_modules=modules)
    memory_plain, _ = estimate_memory_total(plain, job, candidates, options)
    memory_windowed, _ = estimate_memory_total(windowed, job, candidates, options)
    # The same items, summed over other kinds: equal up to the last bits of the sum.
    assert memory_windowed[0] <= memory_plain[0] * (1 + 1e-12)
    step_plain = estimate_step_seconds(plain, cluster, job, candidates)[0]
    step_windowed = estimate_step_seconds(windowed, cluster, job, candidates)[0]
    assert step_windowed <= step_plain * (1 + 1e-12)
    assert windowed.flops_per_token(8192) <= plain.flops_per_token(8192)


@given(window=st.integers(min_value=1, max_value=300), seq=st.integers(min_value=1, max_value=300))
def test_sliding_context_is_the_mean_of_min_i_w(window: int, seq: int) -> None:
    """Query i (1-based) of a causal sliding window attends to min(i, w) keys; the formula
    averages that exactly, capped at s/2 (parplan's causal convention for full attention)."""
    spec = with_pattern(load_model_spec("llama3.1-8b"), sliding_window=window,
                        layer_types=("sliding_attention",) * 32)
    exact = sum(min(i, window) for i in range(1, seq + 1)) / seq
    got = spec.context_tokens("sliding_attention", seq)
    if window < seq:
        assert got == pytest.approx(min(exact, seq / 2))
    else:
        assert got == seq / 2


# ---- pinned numbers ------------------------------------------------------------------------------


def test_mamba_mixer_parameters_follow_the_modeling_code() -> None:
    """transformers NemotronHMamba2Mixer on Nemotron-H-8B's config: in_proj 4096 x (2 x 8192
    + 2 x 8 x 128 + 128), conv1d (8192 + 2048) x 4 + bias, dt_bias / A_log / D 128 each, the
    gated norm 8192, out_proj 8192 x 4096."""
    spec = hf("nemotron-h-8b")
    expected = (4096 * (2 * 8192 + 2 * 8 * 128 + 128) + (8192 + 2048) * 5 + 3 * 128 + 8192
                + 8192 * 4096)
    assert spec.mamba_params_per_layer == expected == 109_635_968
    assert (render_pattern(spec.layer_mixers, spec.layer_mlps)
            == "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-")


def test_ssd_flops_follow_the_chunked_algorithm() -> None:
    """Dao & Gu 2024 (arXiv:2405.21060) §6 on Nemotron-H-8B (Q 128, N 128, G 8, P 64, H 128)."""
    spec = hf("nemotron-h-8b")
    expected = 2 * 128 * 128 * 8 + 2 * 128 * 64 * 128 + 4 * 128 * 64 * 128
    assert estimate_mixer_core_flops(spec, "mamba", 8192) == expected == 6_553_600


def test_mamba_activations_are_what_the_fused_kernel_saves() -> None:
    """mamba_ssm MambaSplitConv1dScanCombinedFn saves zxbcdt and the scan output; out_proj
    keeps its input: 2 x (2 x 8192 + 2048 + 128) + 2 x 8192 + 2 x 8192 per token (bf16)."""
    split, replicated = estimate_mixer_activation_bytes(hf("nemotron-h-8b"), "mamba", 2.0)
    assert (split, replicated) == (69_888, 16_384)


def test_mamba_state_in_vllm_is_constant_per_sequence() -> None:
    """vLLM MambaStateShapeCalculator.mamba2_state_shape: conv (kernel - 1) x (d_inner + 2GN),
    SSM H x P x N, bf16; a sliding layer keeps its window, a full layer every token."""
    spec = hf("nemotron-h-8b")
    one = np.array([1.0])
    short = estimate_layer_cache_bytes(spec, "mamba", 4096, one, 2.0)
    long = estimate_layer_cache_bytes(spec, "mamba", 131072, one, 2.0)
    assert short[0] == long[0] == (3 * 10240 + 128 * 64 * 128) * 2
    assert estimate_layer_cache_bytes(spec, "mamba", 4096, np.array([2.0]), 2.0)[0] == short[0] / 2
    gemma = hf("gemma-3-27b")
    window = estimate_layer_cache_bytes(gemma, "sliding_attention", 32768, one, 2.0)[0]
    full = estimate_layer_cache_bytes(gemma, "full_attention", 32768, one, 2.0)[0]
    assert window == 1024 * 16 * 256 * 2 and full == 32 * window


def test_tensor_parallel_splits_mamba_heads_and_groups() -> None:
    """Megatron MambaMixer splits in_proj, conv1d, A/D/dt_bias and the norm over TP: a
    Mamba-only layer's parameters per GPU fall as 1/tp (plus its 1/tp share of the norm)."""
    spec = hf("nemotron-h-8b")
    kind = spec.block_kinds.index(("mamba", "none"))
    tp = np.array([1.0, 2.0, 8.0])
    params = estimate_kind_params(spec, tp, np.ones(3), np.ones(3), kind)
    assert np.allclose(params.dense * tp, spec.kind_params(kind))
    assert not np.any(params.expert)


def test_tp_must_split_mamba_groups_and_deltanet_heads() -> None:
    """Megatron MambaMixer asserts ngroups % tp == 0 and nheads % tp == 0; the DeltaNet's key
    heads split over TP alike."""
    from solver.search.constraints import block_shape_constraints

    tp = {"tp": np.array([1, 2, 4, 8, 16])}
    (mamba,) = block_shape_constraints(load_model_spec("nemotron-h-8b"))  # 8 groups, 128 heads
    assert mamba.name == "tp_divides_mamba_groups"
    assert mamba.check(tp).tolist() == [True, True, True, True, False]
    (linear,) = block_shape_constraints(load_model_spec("qwen3-next-80b-a3b"))  # 16 key heads
    assert linear.name == "tp_divides_linear_heads"
    assert linear.check({"tp": np.array([16, 32])}).tolist() == [True, False]
    assert block_shape_constraints(load_model_spec("llama3.1-8b")) == []


# ---- pipeline balance by time, not by count -------------------------------------------------------


def test_a_hybrid_layout_costs_kinds_apart() -> None:
    """Nemotron-H: a Mamba layer, an MLP layer and an attention layer each get their own time
    and memory coefficients; attention's time grows with the sequence, Mamba's stays linear."""
    spec = load_model_spec("nemotron-h-8b")
    cluster = load_cluster("dgx-h100")
    config = ParallelConfig(tp=2, pp=2, dp=4, micro_batch=1, zero=1)
    kinds = spec.block_kinds
    short = estimate_layout_coefficients(spec, cluster, JobSpec(seq_len=4096, global_batch=64),
                                         config)
    long = estimate_layout_coefficients(spec, cluster, JobSpec(seq_len=32768, global_batch=8),
                                        config)
    mamba, mlp, attention = (kinds.index(k) for k in (("mamba", "none"), ("none", "dense"),
                                                      ("full_attention", "none")))
    assert len(set(short.layer_s[[mamba, mlp, attention]])) == 3
    growth = long.layer_s / short.layer_s
    assert growth[attention] > growth[mamba] > 1.0
    assert np.all(short.layer_bytes[:, [mamba, mlp, attention]] > 0)


# ---- the new zoo models run end to end ---------------------------------------------------------


@pytest.mark.parametrize("name", HYBRID_ZOO)
def test_models_show_prints_the_block_pattern(name: str) -> None:
    assert name in list_zoo_names()
    result = CliRunner().invoke(cli, ["models", "show", name, "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.output)
    spec = load_model_spec(name)
    assert shown["block_pattern"] == render_pattern(spec.layer_mixers, spec.layer_mlps)
    assert shown["total_params"] == spec.total_params
    assert shown["active_params"] == spec.active_params
    text = CliRunner().invoke(cli, ["models", "show", name]).output
    assert f"block pattern: {render_pattern(spec.layer_mixers, spec.layer_mlps)}" in text


@pytest.mark.parametrize("name", HYBRID_ZOO)
def test_estimate_optimize_serve_and_launch_run(name: str) -> None:
    spec = load_model_spec(name)
    gpus = "512" if spec.total_params > 500e9 else "64" if spec.total_params > 100e9 else "16"
    common = ["--model", name, "--cluster", "dgx-h100", "--gpus", gpus]
    train = [*common, "--seq-len", "4096", "--global-batch", str(max(256, int(gpus)))]
    runner = CliRunner()
    # The layout programs of a hybrid may run to their limit: bounded here (CI time).
    optimized = runner.invoke(cli, ["optimize", *train, "--top", "1", "--time-limit", "2",
                                    "--json"])
    assert optimized.exit_code == 0, optimized.output
    answer = json.loads(optimized.output)
    assert answer["status"] in ("optimal", "feasible", "infeasible")
    estimated = runner.invoke(cli, ["estimate", *train, "--json"])
    assert estimated.exit_code == 0, estimated.output
    assert json.loads(estimated.output)["plans"][0]["step_seconds"] > 0
    served = runner.invoke(cli, ["serve", *common, "--context", "32768", "--json"])
    assert served.exit_code == 0, served.output
    launched = runner.invoke(cli, ["launch", *train, "--format", "megatron"])
    assert launched.exit_code == 0, launched.output


# ---- strict input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("update, problem", [
    ({"layer_types": ("full_attention",) * 3}, "layer_types has 3 entries"),
    ({"layer_types": ("sliding_attention",) * 32}, "sliding_window is not given"),
    ({"layer_types": ("mamba",) * 32}, "mamba_num_heads, mamba_head_dim"),
    ({"mlp_layer_types": ("moe",) * 32}, "num_experts is 0"),
    ({"layer_types": ("none",) * 32, "mlp_layer_types": ("none",) * 32},
     "neither a mixer nor an MLP"),
])
def test_a_bad_pattern_is_one_line_naming_the_field(tmp_path: Path, update: dict,
                                                    problem: str) -> None:
    spec = load_model_spec("llama3.1-8b")
    # (tables such as rope_scaling are left out: json.dumps does not write TOML tables)
    data = {k: v for k, v in spec.model_dump().items()
            if v is not None and not isinstance(v, dict)}
    data.update({k: list(v) if isinstance(v, tuple) else v for k, v in update.items()})
    lines = [f"{k} = {json.dumps(v)}" for k, v in data.items()]
    path = tmp_path / "bad.toml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as caught:
        load_model_spec(str(path))
    assert problem in str(caught.value) and "\n" not in str(caught.value)
    assert str(path) in str(caught.value)
    result = CliRunner().invoke(cli, ["models", "show", str(path)])
    assert result.exit_code == 2 and problem in result.output


def test_a_bad_hybrid_override_pattern_names_the_key() -> None:
    config = json.loads((CONFIG_DIR / "nemotron-h-8b.json").read_text())
    config["hybrid_override_pattern"] = config["hybrid_override_pattern"][:-1] + "X"
    with pytest.raises(InputError, match="key 'hybrid_override_pattern': letters must be"):
        model_spec_from_hf_config(config, "n.json")
    config["hybrid_override_pattern"] = "M-"
    with pytest.raises(InputError, match="has 2 letters but num_hidden_layers is 52"):
        model_spec_from_hf_config(config, "n.json")


def test_scan_rate_is_the_median_of_the_measured_b200_scans() -> None:
    """SSD_SCAN_PEAK_FRACTION: the median achieved share of the B200 bf16 peak over the
    measured mamba_chunk_scan_combined rows of >= 8192 tokens (AIConfigurator, TensorRT-LLM
    1.3.0rc15; benchmarks/data/b200_mamba_chunk_scan.csv, benchmarks/mamba_scan.py)."""
    import csv

    from solver.catalog import load_gpu_spec
    from solver.cost.layers.blocks import SSD_SCAN_PEAK_FRACTION

    data = Path(__file__).resolve().parent.parent / "benchmarks" / "data"
    peak = load_gpu_spec("b200").peak_flop_per_s("bf16")
    shares = []
    with (data / "b200_mamba_chunk_scan.csv").open() as handle:
        for row in csv.DictReader(handle):
            if int(row["num_tokens"]) < 8192:
                continue
            spec = ModelSpec(name="scan", hidden_size=int(row["d_model"]), intermediate_size=1,
                             num_hidden_layers=1, num_attention_heads=1, vocab_size=1,
                             layer_types=("mamba",), mlp_layer_types=("none",),
                             mamba_num_heads=int(row["nheads"]),
                             mamba_head_dim=int(row["head_dim"]), n_groups=int(row["n_groups"]),
                             ssm_state_size=int(row["d_state"]),
                             chunk_size=int(row["chunk_size"]))
            flops = int(row["num_tokens"]) * estimate_mixer_core_flops(spec, "mamba", 1)
            shares.append(flops / (float(row["latency_ms"]) * 1e-3) / peak)
    assert len(shares) >= 90
    assert SSD_SCAN_PEAK_FRACTION == pytest.approx(float(np.median(shares)), abs=0.001)


def test_estimate_splits_time_and_memory_by_block_kind() -> None:
    """`estimate --json` of a hybrid: one entry per block kind, read off the same layout
    coefficients the step time is composed of; the layers add up to the model's, the work to
    the layers' share of the step, the worst stage's layers to its layout."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "nemotron-h-8b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--tp", "2", "--pp", "2",
                                      "--seq-len", "8192", "--global-batch", "64", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    kinds = {k["kind"]: k for k in answer["block_kinds"]}
    assert {name: k["layers"] for name, k in kinds.items()} == {
        "mamba": 24, "dense": 24, "full_attention": 4}
    assert sum(k["work_share"] for k in kinds.values()) == pytest.approx(1.0)
    assert sum(k["layers_on_worst_stage"] for k in kinds.values()) == 26
    assert all(k["seconds_per_layer"] > 0 and k["bytes_per_layer"] > 0 for k in kinds.values())
    plan = answer["plans"][0]
    num_micro = 64 / (plan["dp"] * plan["micro_batch"])
    worst_stage_s = max(k["seconds_per_layer"] for k in kinds.values()) * 26 * num_micro
    assert sum(k["step_seconds"] for k in kinds.values()) / 2 <= worst_stage_s
    plain = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--cluster",
                                     "dgx-h100", "--gpus", "8", "--json"])
    assert "block_kinds" not in json.loads(plain.output)


def test_olmoe_normalises_whole_q_and_k_projections() -> None:
    """transformers OlmoeAttention: q_norm = RMSNorm(hidden_size), k_norm =
    RMSNorm(head_dim x num_key_value_heads), on top of four 2048 x 2048 projections."""
    spec = hf("olmoe-1b-7b")
    assert spec.attention_params_per_layer == 4 * 2048 * 2048 + 2048 + 2048
