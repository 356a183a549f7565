"""benchmarks/published.py maps the public runs (benchmarks/data/published_runs.jsonl, copied from
the shared reference data) onto parplan's specs faithfully: layouts multiply to the GPU count,
models match the published parameter counts, and three rows are pinned field by field."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from published import (  # noqa: E402
    DATA_PATH,
    PublishedRun,
    bloom_layers_fitting_pp,
    load_published_runs,
)
from time_accuracy import evaluate  # noqa: E402

from solver.catalog import load_model_spec  # noqa: E402

# Why the ok rows that are not mapped are left out (reason prefix -> rows).
SKIPPED_OK_ROWS = {
    # Megatron-LM strong-scaling end points: "TP/PP for the strong-scaling points not stated".
    "parallel layout (tp/pp/dp) not stated": 2,
}
# Runs whose model parameter count may differ from the row's total_params_b by more than 10%.
PARAM_COUNT_EXCEPTIONS: dict[str, str] = {}


@pytest.fixture(scope="module")
def loaded() -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    return load_published_runs()


@pytest.fixture(scope="module")
def rows() -> dict[str, dict]:
    lines = DATA_PATH.read_text().splitlines()
    return {row["id"]: row for row in map(json.loads, filter(str.strip, lines))}


@pytest.fixture(scope="module")
def by_id(loaded: tuple[list[PublishedRun], list[tuple[str, str]]]) -> dict[str, PublishedRun]:
    return {run.id: run for run in loaded[0]}


def test_the_data_is_the_projects_own_copy() -> None:
    assert DATA_PATH.is_relative_to(ROOT / "benchmarks" / "data")
    assert DATA_PATH.is_file()


def test_at_least_300_ok_rows_are_mapped(loaded, rows) -> None:
    runs, skipped = loaded
    ok = sum(row["status"] == "ok" for row in rows.values())
    skipped_ok = [(i, why) for i, why in skipped if rows[i]["status"] == "ok"]
    counts = {prefix: sum(why.startswith(prefix) for _, why in skipped_ok)
              for prefix in SKIPPED_OK_ROWS}
    assert counts == SKIPPED_OK_ROWS, skipped_ok
    assert len(runs) + len(skipped_ok) == ok
    assert len(runs) >= 300, (
        f"{len(runs)} of {ok} ok rows mapped; left out: {SKIPPED_OK_ROWS}")
    assert all(rows[i]["status"] != "ok" for i, why in skipped if why.startswith("status"))


def test_every_layout_multiplies_to_the_gpu_count(loaded, rows) -> None:
    for run in loaded[0]:
        c = run.parallel
        assert c.tp * c.pp * c.dp * c.cp == run.num_gpus == rows[run.id]["num_gpus"], run.id
        assert (c.tp * c.cp * c.dp) % (c.ep * c.etp) == 0, run.id


def test_models_match_the_published_parameter_counts(loaded) -> None:
    for run in loaded[0]:
        if run.params_ratio is None or run.id in PARAM_COUNT_EXCEPTIONS:
            continue
        assert 0.9 <= run.params_ratio <= 1.1, (run.id, run.params_ratio)


def test_megatron_lm_sizes_in_the_model_names_match(loaded) -> None:
    # The table gives no total_params_b; its names ("GPT 7.1B", two significant figures) are
    # the sizes. Untied embeddings with a 4h MLP match within 4% (1.75e9, 7.13e9); tied ones
    # would miss the small models by 13% (1.48e9) and 7% (6.6e9).
    table = [run for run in loaded[0] if run.source_group == "megatron-lm"]
    assert len(table) == 9
    for run in table:
        named = float(re.search(r"([\d.]+)B", run.model_spec.name).group(1))
        assert run.model_spec.total_params / 1e9 == pytest.approx(named, rel=0.04), run.id


def test_bloom_production_row(by_id, rows) -> None:
    # bigscience tr11-176B-ml README: 384 A100 80GB, TP 4, PP 12, DP 8, MBS 2, GBS 2048,
    # 19.561 samples/s at iteration 85376; 4 x 100 Gb/s Omni-Path per 8-GPU node.
    run = by_id["bloom-176b-production"]
    assert run.model_spec == load_model_spec("bloom-176b")
    assert run.params_ratio == pytest.approx(176.247271424 / 176.0)
    assert run.parallel.model_dump() == dict(tp=4, pp=12, dp=8, cp=1, ep=1, etp=1, vpp=1, zero=1,
                                            micro_batch=2, recompute="full")
    assert (run.job.seq_len, run.job.global_batch, run.job.precision) == (2048, 2048, "bf16")
    assert run.measured_from == "samples_per_sec"
    assert run.tokens_per_sec_per_gpu == pytest.approx(19.561 * 2048 / 384)
    # The row's seconds per iteration give the same throughput within rounding.
    row = rows[run.id]
    from_step = row["global_batch_size"] * row["seq_len"] / row["step_time_s"] / row["num_gpus"]
    assert run.tokens_per_sec_per_gpu == pytest.approx(from_step, rel=0.002)
    nvlink, fabric = run.cluster.tiers
    assert (nvlink.bandwidth_gb_per_s, nvlink.span_gpus) == (240.0, 8)
    assert fabric.bandwidth_gb_per_s == pytest.approx(400 / 8 / 8 * 0.80)  # 5 GB/s per GPU
    assert (run.source_group, run.gpu, run.arch_kind) == ("bloom", "A100-80GB", "dense")


def test_qwen3_235b_megatron_bridge_row(by_id) -> None:
    run = by_id["mb-archive-26.04.01-H100-Qwen3_235B_a22B-FP8-256g-78"]
    assert run.model_spec == load_model_spec("qwen3-235b-a22b")
    assert run.parallel.model_dump() == dict(tp=2, pp=8, dp=16, cp=1, ep=32, etp=1, vpp=4, zero=1,
                                            micro_batch=1, recompute="selective")
    assert (run.job.seq_len, run.job.global_batch, run.job.precision) == (4096, 8192, "fp8")
    assert (run.tokens_per_sec_per_gpu, run.measured_from) == (1712.0, "tokens_per_sec_per_gpu")
    assert run.cluster.name == "dgx-h100"
    assert (run.source_group, run.arch_kind) == ("megatron-bridge", "moe")


def test_mpt_350m_llm_foundry_row(by_id) -> None:
    # LLM Foundry, A100 40GB with 1600 Gbps RoCE: MPT-350m, seq 2048, 16 GPUs, micro-batch 18,
    # global batch 288, FSDP FULL_SHARD, no activation checkpointing, 55413 tokens/s/GPU.
    run = by_id["llmfoundry-a100_40gb-bf16-350m-s2048-g16-mb18-202"]
    spec = run.model_spec
    assert (spec.num_hidden_layers, spec.hidden_size, spec.intermediate_size) == (24, 1024, 4096)
    assert (spec.num_attention_heads, spec.kv_heads, spec.vocab_size) == (16, 16, 50368)
    assert (spec.mlp_type, spec.norm_type, spec.norm_bias) == ("plain", "layernorm", False)
    assert (spec.position_embedding_type, spec.max_position_embeddings) == ("learned", 2048)
    assert spec.tie_word_embeddings
    assert run.params_ratio == pytest.approx(spec.total_params / 0.356e9)
    assert run.parallel.model_dump() == dict(tp=1, pp=1, dp=16, cp=1, ep=1, etp=1, vpp=1, zero=3,
                                            micro_batch=18, recompute="none")
    assert (run.job.seq_len, run.job.global_batch, run.job.precision) == (2048, 288, "bf16")
    assert run.tokens_per_sec_per_gpu == 55413.0
    assert run.cluster.gpu.name == "a100-40gb"
    assert run.cluster.tiers[-1].bandwidth_gb_per_s == pytest.approx(1600 / 8 / 8 * 0.80)


def test_megatron_lm_throughput_comes_from_its_flops_formula(by_id) -> None:
    # GPT 7.1B: 465.9 TFLOP/s per GPU; Megatron's formula gives 12 x 30 x 4096^2 x
    # (1 + 1 + 4096/4096 + 4 + 131072 / (2 x 30 x 4096)) = 4.5500e10 FLOPs per token.
    run = by_id["mlm2024-h100-7.1B"]
    flops = 12 * 30 * 4096**2 * (7 + 131072 / (2 * 30 * 4096))
    assert run.tokens_per_sec_per_gpu == pytest.approx(465.9e12 / flops)
    assert run.parallel.tp == 2 and run.parallel.dp == 48


def test_evaluate_batches_like_one_call_per_run(loaded) -> None:
    runs = [run for run in loaded[0] if run.id.startswith(("bloom-0225", "llmfoundry-a100_40gb"))]
    batched = [p for _, p in evaluate(runs)]
    single = [evaluate([run])[0][1] for run in runs]
    np.testing.assert_allclose(batched, single, rtol=1e-12)
    assert all(p > 0 for p in batched)


def test_fsdp_mixed_precision_mode_is_read_and_switched(loaded) -> None:
    """LLM Foundry states Composer's FSDP mixed-precision mode in the precision field: PURE on
    its A100-40GB tables (bf16 reduce), DEFAULT elsewhere (bf16 params, fp32 reduce in the torch
    1.13-era Composer), which the benchmark turns into a 4-byte FSDP gradient reduce."""
    from time_accuracy import framework_switches

    runs, _ = loaded
    modes = {(r.gpu, r.mixed_precision_mode) for r in runs if r.source_group == "llm-foundry"}
    assert ("A100-40GB", "PURE") in modes and ("H100-80GB", "DEFAULT") in modes
    assert all(r.mixed_precision_mode is None for r in runs if r.source_group != "llm-foundry")
    default = next(r for r in runs if r.mixed_precision_mode == "DEFAULT")
    pure = next(r for r in runs if r.mixed_precision_mode == "PURE")
    triton = {"flash_attention": True, "native_attention_kernels": False,
              "triton_attention": True}
    assert framework_switches(default) == {"zero3_grad_reduce_bytes": 4.0, **triton}
    assert framework_switches(pure) == triton


def test_bloom_0220_layer_counts_are_the_multiples_of_pp_the_sizes_imply(loaded, rows) -> None:
    """BLOOM's 02-20 topology table gives each row's size (NHIDDEN 14400, 64 heads) but changes
    NLAYERS "to fit PP" without printing it. By the document's size formula the printed sizes
    imply 78.9 / 76.5 / 75.3 / 80.9 / 76.9 / 72.1 layers; the nearest multiples of pp are
    unique (the runner-up is at least 2.9 layers further), and 200B -> 80 layers matches the
    02-17 runs' stated NLAYERS=80 at NHIDDEN=14400."""
    expected = {"bloom-0220-topo-0": 80, "bloom-0220-topo-1": 80, "bloom-0220-topo-2": 78,
                "bloom-0220-topo-3": 77, "bloom-0220-topo-4": 80, "bloom-0220-topo-5": 81,
                "bloom-0220-topo-6": 80, "bloom-0220-topo-7": 77, "bloom-0220-topo-8": 72}
    by_id = {run.id: run for run in loaded[0]}
    for run_id, layers in expected.items():
        assert by_id[run_id].model_spec.num_hidden_layers == layers, run_id
        assert layers % by_id[run_id].parallel.pp == 0
    # Every 02-20 row is mapped, each micro-batch row with its topology row's depth.
    day = [run for run in loaded[0] if run.id.startswith("bloom-0220")]
    assert len(day) == 20
    depth = {run.parallel.pp: run.model_spec.num_hidden_layers
             for run in day if run.id.startswith("bloom-0220-topo")}
    for run in day:
        assert run.model_spec.num_hidden_layers == depth[run.parallel.pp], run.id
        # The pick is robust to the size's rounding (+-0.5B is 0.2 layers of 2.49B).
        row = rows[run.id]
        pp = run.parallel.pp
        for size in (row["total_params_b"] - 0.5, row["total_params_b"] + 0.5):
            assert bloom_layers_fitting_pp({**row, "total_params_b": size}, pp) == \
                run.model_spec.num_hidden_layers


def test_bloom_switches_follow_the_optimizer_change_of_02_28(by_id) -> None:
    """chronicles-prequel "Rebalancing layers" (02-28): "from now on the testing is happening
    with BF16 optimizer that was just written to accumulate gradients in fp32 ... compared to
    fp16 which grad accumulates in fp16"; production uses it too (tr11-176B-ml.slurm, "bf16
    must use z0! it implements its own zero stage 1 equivalent"). All of them run DeepSpeed's
    pipeline engine (DP collectives exposed) without sequence parallel or FlashAttention, with
    Megatron's default attention dropout (tr11-176B-ml README: "The default Megatron-LM
    dropout settings are inherited") and CUDA_LAUNCH_BLOCKING=1 (chronicles-prequel "dealing
    with JZ hanging"; tr11-176B-ml.slurm)."""
    from time_accuracy import framework_switches

    common = {"sequence_parallel": False, "flash_attention": False, "dp_overlap": "never",
              "cuda_launch_blocking": True, "attention_dropout": True}
    fp16 = {**common, "grad_accumulation_bytes_per_param": 6.0, "grad_reduce_bytes": 2.0}
    bf16 = {**common, "grad_accumulation_bytes_per_param": 18.0, "grad_reduce_bytes": 4.0,
            "zero1_grad_all_reduce": True}
    for run_id in ("bloom-0220-topo-0", "bloom-0221-181B-dp4-pp12-mbs1", "bloom-0225-181B-1"):
        assert framework_switches(by_id[run_id]) == fp16, run_id
    for run_id in ("bloom-0228-195B-0", "bloom-176b-production"):
        assert framework_switches(by_id[run_id]) == bf16, run_id


def test_blocking_launches_cost_what_blooms_own_ab_test_allows(rows) -> None:
    """chronicles-prequel "dealing with JZ hanging" timed CUDA_LAUNCH_BLOCKING=1 against
    asynchronous launches on the 200B prototype (TP 8, PP 10, 80 layers of h 14400 with 96
    heads, global batch 512, iteration 2): 91.04 against 97.20 TFLOPs on 80 GPUs (6.8% slower),
    84.59 against 84.44 on 160 (none). The model's blocking cost for that layer, its host ops
    added to every pass (TimeConstants.cuda_launch_blocking), is 2.1% at both sizes: inside
    the measured range, as the README's "makes a tiny impact or no impact at all" says."""
    from published import _map_row
    from time_accuracy import SOURCE_FRAMEWORKS, framework_switches

    from solver.cost.candidates import Candidates
    from solver.cost.step.steptime import estimate_step_time
    from solver.cost.step.frameworks import framework_time_constants

    for dp in (1, 2):
        run = _map_row({**rows["bloom-0220-topo-6"], "id": "bloom-0217-blocking-ab",
                        "layers": 80, "heads": 96, "kv_heads": 96, "dp": dp,
                        "num_gpus": 80 * dp, "global_batch_size": 512})
        switches = framework_switches(run)
        assert switches["cuda_launch_blocking"]
        blocking = framework_time_constants(SOURCE_FRAMEWORKS["bloom"]).model_copy(
            update=switches)
        asynchronous = blocking.model_copy(update={"cuda_launch_blocking": False})
        steps = [estimate_step_time(run.model_spec, run.cluster, run.job,
                                    Candidates.from_configs([run.parallel]), c).step_s[0]
                 for c in (blocking, asynchronous)]
        slowdown = steps[0] / steps[1] - 1.0
        assert 0.0 < slowdown < 97.20 / 91.04 - 1.0
        assert slowdown == pytest.approx(0.021, abs=0.005)


@pytest.mark.parametrize("ab", __import__("ab_checks").BLOOM_HEAD_DIM_ABS,
                         ids=lambda ab: ab.name)
def test_bloom_head_dim_ab_tests(ab) -> None:
    """BLOOM's own A/B tests of a misaligned head dimension (benchmarks/ab_checks.py: same
    layout, unfused attention, fp16-period switches). No constant is fitted to them; the model
    reproduces the direction and more than half of each slowdown (measured 1.27x / 1.42x /
    1.44x / 1.33x, predicted 1.20x / 1.26x / 1.27x / 1.24x): the fallback kernels are slower
    than the FP32 peak x matmul fraction assumed, or the softmax around them costs more.
    With an aligned head (or FlashAttention) both runs would go at the same rate."""
    from ab_checks import predict_head_dim_ab

    predicted = predict_head_dim_ab(ab)
    assert 1.15 < predicted < ab.measured
    assert predicted > 1 + 0.5 * (ab.measured - 1)
    assert predict_head_dim_ab(ab, flash_attention=True) == pytest.approx(1.0, abs=0.03)


def test_bridge_moe_rows_get_their_releases_recipe(by_id) -> None:
    """Megatron-Bridge's H100 MoE recipes per release (solver.spec.profiles, the
    megatron-bridge@<release> profiles, with their recipes under the row's precision):
    25.09 (e4bb622 scripts/performance/run_script.py) ran DeepSeek-V3 with DeepEP
    (`enable_deepep = gpu in ["h100"]`), A2A overlap and recompute_modules ["mla_up_proj",
    "mlp"], and Qwen3 with tp_comm_overlap only; from 25.11 (v0.2.0 workload_base_configs.py)
    Qwen3 sets moe_a2a_overlap=True (Qwen3-30B in 26.02, v0.3.0, with the flex dispatcher's
    DeepEP backend, which apply_flex_dispatcher_backend keeps on compute capability 9), until
    Qwen3-30B moved to ep 16 with HybridEP and moe_a2a_overlap=False (v0.4.0, v0.5.0); GPT-OSS
    120B on H100 never sets moe_a2a_overlap. Every release's performance scripts reduce
    gradients in bf16 (cfg.ddp.grad_reduce_in_fp32 = False: 25.09 configs/*/*.yaml, v0.2.0-
    v0.5.0 configs/<family>/*_llm_pretrain.py). Qwen3 and DeepSeek-V3 run the fused router
    (moe_router_fusion: 25.09 yamls, v0.2.0-v0.5.0 set_qwen3_common_configs) and FP8 with
    current scaling (the 25.09 h100 perf_matrix's fp8_cs, v0.2.0-v0.5.0's only
    *_H100_FP8_CS_* presets); Qwen3-235B on H100 turns TP overlap off from 25.11
    (CommOverlapConfig(tp_comm_overlap=False) in qwen3_llm_pretrain.py). Every MoE model's
    provider fuses the token permutation (moe_permute_fusion: 25.09-v0.3.0 qwen_provider.py,
    gpt_oss_provider.py, deepseek_provider.py; v0.4.0-v0.5.0 qwen3_moe_bridge.py,
    gpt_oss_bridge.py)."""
    from time_accuracy import bridge_release, framework_switches

    base = {"tp_comm_overlap": True, "ep_comm_overlap": True, "grad_reduce_in_bf16": True,
            "moe_permute_fusion": True, "loss_implementation": "fused"}
    fp8_cs = {**base, "moe_router_fusion": True, "fp8_current_scaling": True}
    # GPT_OSS_120B_..._H100_BF16: recompute_modules ["layernorm", "moe_act"] (v0.2.0
    # workload_base_configs.py, v0.4.0 gpt_oss_workload_base_configs.py)
    gpt_oss = {**base, "ep_comm_overlap": False, "recompute_modules": ("layernorm", "moe_act")}
    expected = {
        "mb-archive-25.09-H100-DeepSeekV3-FP8-1024g-262":
            {**fp8_cs, "moe_dispatcher": "deepep", "recompute_modules": ("mla_up_proj", "mlp")},
        "mb-archive-25.09-H100-Qwen3_235B_a22B-FP8-256g-265":
            {**fp8_cs, "ep_comm_overlap": False},
        "mb-archive-26.04-H100-Qwen3_235B_a22B-FP8-256g-123": {**fp8_cs, "tp_comm_overlap": False},
        "mb-archive-26.02.01-H100-Qwen3_30B_a3B-FP8-16g-163":
            {**fp8_cs, "moe_dispatcher": "deepep"},
        "mb-archive-25.11-H100-Qwen3_30B_a3B-FP8-CS-16g-236": fp8_cs,
        "mb-archive-26.06-H100-Qwen3_30B_a3B-FP8-16g-32":
            {**fp8_cs, "ep_comm_overlap": False, "moe_dispatcher": "hybridep"},
        "mb-archive-26.04.01-H100-GPT_OSS_120B-BF16-64g-68": gpt_oss,
        "mb-archive-25.11-H100-GPT_OSS_120B-BF16-64g-235": gpt_oss,
    }
    for run_id, switches in expected.items():
        assert framework_switches(by_id[run_id]) == switches, run_id
    assert bridge_release(by_id["mb-archive-26.02.01-H100-Qwen3_30B_a3B-FP8-16g-163"]) == "26.02"
    # The 26.06 Qwen3-30B layout is the recipe's: ep 16 on 16 GPUs, no pipeline.
    layout = by_id["mb-archive-26.06-H100-Qwen3_30B_a3B-FP8-16g-32"].parallel
    assert (layout.ep, layout.pp) == (16, 1)


def test_nemotron_3_nano_rows_are_the_zoo_hybrid(loaded, rows) -> None:
    """Megatron-Bridge's Nemotron 3 Nano rows (arch_type hybrid_mamba_moe; the source gives no
    architecture numbers) map onto the zoo's nemotron-3-nano-30b-a3b and are reported as
    hybrids, apart from the plain MoE transformers."""
    hybrids = [run for run in loaded[0] if rows[run.id]["arch_type"] == "hybrid_mamba_moe"]
    assert len(hybrids) == 4
    assert {run.arch_kind for run in hybrids} == {"hybrid"}
    assert {run.model_spec.name for run in hybrids} == {"nemotron-3-nano-30b-a3b"}
    assert all((run.parallel.tp, run.parallel.ep, run.num_gpus) == (1, 8, 16) for run in hybrids)
