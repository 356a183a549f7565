"""benchmarks/known_to_run.py: every published run estimated under its framework's profile and
its stated configuration (issue 17's "known to run" table). The counts are a ratchet: a memory
feature may raise the share of runs that ran predicted to fit, never lower it, and the rows the
BLOOM chronicles-prequel reports out of memory stay predicted not to fit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from known_to_run import (  # noqa: E402
    evaluate_known_run,
    load_known_runs,
    run_memory_options,
    summarize,
)

# The six BLOOM rows the chronicles-prequel marks OOM (02-25 and 02-28 tables).
NUM_OOM_ROWS = 6
# Runs that ran and that the table predicts to fit; raised as features land.
MIN_RAN_FIT = 324


@pytest.fixture(scope="module")
def summary() -> dict:
    runs, _ = load_known_runs()
    return summarize([evaluate_known_run(run, ran) for run, ran in runs])


def test_every_out_of_memory_row_is_mapped(summary: dict) -> None:
    assert summary["num_oom"] == NUM_OOM_ROWS
    assert summary["num_ran"] == 329  # with the four Nemotron 3 Nano hybrid rows


def test_known_to_run_share_never_falls(summary: dict) -> None:
    assert summary["num_ran_fit"] >= MIN_RAN_FIT
    # bloom-0228-206B-19 is predicted at 66.6 GB (memory_accuracy: the one OOM row it misses)
    assert summary["num_oom_predicted_oom"] >= NUM_OOM_ROWS - 1


def test_misses_name_their_largest_item(summary: dict) -> None:
    for miss in summary["misses"]:
        assert miss["largest_item_gb"] > 0 and miss["largest_item"]


def _first_run(group: str):
    runs, _ = load_known_runs()
    return next(run for run, ran in runs if run.source_group == group and ran)


def test_llm_foundry_runs_keep_fused_cross_entropy_logits() -> None:
    """LLM Foundry's MPT defaults to loss_fn 'fused_crossentropy' (llmfoundry/models/mpt/
    modeling_mpt.py @4952183, lines 1000-1006), flash-attn's CrossEntropyLoss with
    inplace_backward=False: it saves the bf16 logits and allocates their bf16 gradient, 4 B per
    logit; Composer's FSDP keeps the fp32 shard as the master (16 B / d at ZeRO-3)."""
    options = run_memory_options(_first_run("llm-foundry"))
    assert options.logits_bytes == 4.0
    assert options.fp32_sharded_params


def test_megatron_bridge_runs_reduce_gradients_in_bf16() -> None:
    """Megatron-Bridge's performance recipes set cfg.ddp.grad_reduce_in_fp32 = False
    (src/megatron/bridge/perf_recipes/_common.py _benchmark_common @067f987; every perf config
    since #403, 2025-08-28): a bf16 gradient buffer, 2 B per parameter. The Llama-3.1-405B FP8
    rows (tp 8, pp 8, cp 2, vpp 8 on H100) fit with it: 26.6 GB of fp32 gradients become
    13.3 GB."""
    run = _first_run("megatron-bridge")
    assert run_memory_options(run).grad_bytes == 2.0
    # Transformer Engine's fused cross-entropy writes the gradient into the bf16 logits
    # (triton/cross_entropy.py cross_entropy_backward_kernel, "in-place"); the MoE tables
    # "force-balance the token distribution among experts"
    assert run_memory_options(run).loss_implementation == "fused"  # 2 B per logit
    assert run_memory_options(run).moe_capacity_factor == 1.0
    megatron_lm = run_memory_options(_first_run("megatron-lm"))
    assert megatron_lm.grad_bytes == 4.0  # the Megatron-LM README runs state nothing else


def test_deepseek_v3_runs_recompute_the_recipe_modules(summary: dict) -> None:
    """Megatron-Bridge @ad151f3 (2025-09-30) scripts/performance/run_script.py lines 89-90
    (solver.spec.profiles, megatron-bridge@25.09): on H100, DeepSeek-V3 recomputes ["mla_up_proj", "mlp"]
    under selective granularity
    (configs/deepseek/deepseek_v3_llm_pretrain.yaml); the 25.09 table's two H100 rows (tp 2,
    pp 8, vpp 4, ep 64) fit with it (91.7 GB with core_attn alone)."""
    runs, _ = load_known_runs()
    deepseek = [run for run, ran in runs if "-25.09-H100-DeepSeekV3-" in run.id]
    assert len(deepseek) == 2
    for run in deepseek:
        assert run_memory_options(run).recompute_modules == ("mla_up_proj", "mlp")
    fits = {row["id"]: row["fits"] for row in summary["rows"]}
    assert all(fits[run.id] for run in deepseek)
    other = next(run for run, ran in runs if "-26.06-H100-LLAMA3.1_405B" in run.id)
    assert run_memory_options(other).recompute_modules == ("core_attn",)


def test_misses_say_why(summary: dict) -> None:
    """Every miss carries a reason; the GPT-OSS row's is its own inconsistency."""
    whys = {miss["id"]: miss["why"] for miss in summary["misses"]}
    assert all(whys.values())
    assert "contradicts" in whys.get("mb-archive-25.11-H100-GPT_OSS_120B-BF16-64g-235", "")
