"""Public peak-memory rows (benchmarks/data/modern_memory.jsonl, benchmarks/memory_public.py):
the data file's provenance, the view each counter is compared in, and the comparison of a few
rows pinned.

The pinned errors come from running benchmarks/memory_accuracy.py: they are a record of today's
cost model, not a target, and move (with this file) when solver/cost moves memory.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
COMMIT_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+$")
ROW_KEYS = {"id", "source", "source_url", "source_locator", "framework", "model",
            "num_hidden_layers", "gpu", "tp", "pp", "dp", "cp", "ep", "zero", "micro_batch",
            "global_batch", "seq_len", "recompute", "precision", "torch_compile", "loss_compiled",
            "fp8_all_gather", "measured", "measured_unit", "measured_kind", "needs", "note"}


def load_module(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def public():
    return load_module("memory_public")


@pytest.fixture(scope="module")
def rows(public) -> list[dict]:
    return public.load_public_rows()


@pytest.fixture(scope="module")
def summary(public) -> dict:
    return public.summarize_public()


def test_every_row_names_its_source_counter_and_configuration(public, rows) -> None:
    """Each row copies one measured number: a GitHub file at a 40-hex commit, the table and row,
    the counter it read (a view the comparison knows) and the unit printed; ids are unique; at
    least 40 rows from at least five frameworks' documents (issue 43, item 6)."""
    assert len(rows) >= 40
    assert len({row["id"] for row in rows}) == len(rows)
    assert len({row["source"] for row in rows}) >= 5
    for row in rows:
        assert set(row) == ROW_KEYS, row["id"]
        assert COMMIT_URL.match(row["source_url"]), row["id"]
        assert row["source_locator"] and row["note"], row["id"]
        assert row["measured_kind"] in public.COUNTER_VIEW, row["id"]
        assert row["measured_unit"] in public.UNIT_BYTES, row["id"]
        assert row["measured"] > 0, row["id"]
        assert set(row["needs"]) <= set(public.MISSING_FEATURES) | set(public.MAPPED_FEATURES), \
            row["id"]
        assert row["framework"] in public.FRAMEWORK_PROFILE, row["id"]


def test_rows_needing_a_missing_feature_are_listed_not_compared(public, rows, summary) -> None:
    """A row whose `needs` names a missing feature is skipped with the missing features named;
    every other row is compared, its mapped needs as profile features. torchtune's LoRA rows
    need LoRA; Hugging Face's BERT rows need fp32 training and a BERT spec; torchtitan's
    2026-08 rows its chunked LM head (ChunkedLossWrapper), which the chunked loss is not."""
    needing = {row["id"] for row in rows if set(row["needs"]) - set(public.MAPPED_FEATURES)}
    assert {r["id"] for r in summary["skipped"]} == needing
    assert {r["id"] for r in summary["rows"]} == {row["id"] for row in rows} - needing
    assert all(r["reason"].startswith("needs ") for r in summary["skipped"])
    skipped = {r["id"]: r for r in summary["skipped"]}
    assert "lora" in skipped["tune-2409-8b-lora-4090"]["reason"]
    assert "fp32_training" in skipped["hf-2302-bert-large-vanilla"]["reason"]
    assert skipped["tt-2608-8b-bf16"]["reason"] == "needs chunked_linear_loss"
    # Only the missing features are named: pure bf16 states are mapped, optimizer_in_bwd not.
    assert skipped["tune-2411-3b-opt-in-bwd"]["reason"] == "needs optimizer_in_backward"
    compared = {r["id"] for r in summary["rows"]}
    assert {"tune-2411-3b-packed", "tune-2411-3b-compile", "tune-2411-3b-chunked-ce",
            "tune-2411-3b-ac"} <= compared


def test_mapped_needs_are_one_rule(public) -> None:
    """Each mapped need is one profile feature for every row (module docstring): torchtune's
    dtype bf16 is pure_bf16, with AdamW8bit pure_bf16_adam8bit (solver.cost.step.training_states),
    CEWithChunkedOutputLoss the chunked loss, the eager attention the unfused kernel; torchtune
    runs under the generic profile (plain PyTorch)."""
    build = public.build_mapped_features
    assert build([]) == {}
    assert build(["bf16_training_states"]) == {"training_states": "pure_bf16"}
    assert build(["8bit_adam"]) == {"training_states": "adam8bit"}
    assert build(["8bit_adam", "bf16_training_states", "lora"]) == {
        "training_states": "pure_bf16_adam8bit"}
    assert build(["bf16_training_states", "loss_implementation=chunked"]) == {
        "training_states": "pure_bf16", "loss_implementation": "chunked"}
    assert build(["unfused_attention_memory"]) == {"attention_kernel": "unfused"}
    assert public.FRAMEWORK_PROFILE["torchtune"] == "generic"


def test_torchtune_rows_take_pure_bf16_states_and_their_loss(public, rows) -> None:
    """torchtune README @1814feb, optimization flags table (Llama 3.2 3B, batch 2 x 4,096
    packed tokens, bf16: "all activations, gradients and optimizer states are in bfloat16",
    recipes/full_finetune_single_device.py): the states are 8 B per parameter, 2 each for the
    weights, gradients and AdamW's two moments. The loss as torchtune runs it
    (memory_public.build_torchtune_loss_options; solver.cost.memory.loss): '+ Packed Dataset'
    F.cross_entropy on the decoder's fp32 logits (`self.output(h).float()`,
    modules/transformer.py @1814feb), torchtitan's 12 B per logit; '+ Compile' the compiled
    loss on them, 4 + 4 = 8 B; '+ Chunked Cross Entropy' bf16 chunks with each chunk's
    cross-entropy compiled (training/_compile.py compile_loss), 2 + 2/8 = 2.25 B.
    Logits: 8,192 x 128,256."""
    from solver.cost.candidates import Candidates
    from solver.cost.step.frameworks import build_framework_profile
    from solver.cost.memory import estimate_memory
    from solver.spec import JobSpec, ParallelConfig

    by_id = {row["id"]: row for row in rows}
    logits = 2 * 4096 * 128256
    for name, per_logit in (("tune-2411-3b-packed", 12.0), ("tune-2411-3b-compile", 8.0),
                            ("tune-2411-3b-chunked-ce", 2.25)):
        row = by_id[name]
        features = {"fused_elementwise": row["torch_compile"],
                    "loss_implementation": "compiled" if row["loss_compiled"] else "eager",
                    **public.build_mapped_features(row["needs"])}
        config = ParallelConfig(tp=1, pp=1, dp=1, cp=1, ep=1, zero=0, micro_batch=2,
                                recompute=row["recompute"])
        job = JobSpec(seq_len=4096, global_batch=2, precision="bf16")
        spec = public.build_row_model_spec(row)
        options = build_framework_profile("generic", features).memory_options().model_copy(
            update=public.build_torchtune_loss_options(features["loss_implementation"],
                                                       row["loss_compiled"]))
        breakdown = estimate_memory(spec, job, Candidates.from_configs([config]), options)
        items = breakdown.items
        params = items["weights"][0] / 2.0
        assert items["grads"][0] == pytest.approx(2.0 * params), name
        assert items["optimizer"][0] == pytest.approx(4.0 * params), name
        assert items["logits"][0] == pytest.approx(logits * per_logit), name
        # The benchmark predicts the row with these features, in the allocated view.
        assert public.predict_view_bytes(row) == pytest.approx(
            float(breakdown.views["allocated"][0]))


def test_counters_map_to_their_views(public) -> None:
    """max_memory_allocated and torchtune's peak active memory see the allocated tensors,
    max_memory_reserved adds the allocator's fragmentation, nvidia-smi (pynvml used memory)
    every item including the CUDA context and NCCL."""
    assert public.COUNTER_VIEW == {"max_allocated": "allocated", "max_active": "allocated",
                                   "max_reserved": "reserved", "device": "device"}


def test_units_as_printed(summary) -> None:
    """Hugging Face's 'GPU memory occupied: 14949 MB.' is pynvml's used // 1024**2: MiB
    (15.675 GB); torchao's 'Peak Memory (GB)' 47.65 is torchtitan's GiB (51.164 GB)."""
    skipped = {r["id"]: r for r in summary["skipped"]}
    assert skipped["hf-2302-bert-large-vanilla"]["measured_gb"] == pytest.approx(
        14949 * 2**20 / 1e9)
    compared = {r["id"]: r for r in summary["rows"]}
    assert compared["ao-2503-h100-8b-bf16"]["measured_gb"] == pytest.approx(47.65 * 2**30 / 1e9)


def test_two_layer_llama4_keeps_the_first_layers(public, rows) -> None:
    """torchao's Llama 4 MoE runs use the 17Bx16E config with 2 of its 48 layers: the spec
    keeps the first two entries of each per-layer list (two chunked-attention MoE layers)."""
    row = next(r for r in rows if r["id"] == "ao-2510-b200-llama4-2l-bf16")
    spec = public.build_row_model_spec(row)
    assert spec.num_hidden_layers == 2
    assert list(spec.layer_types) == ["chunked_attention", "chunked_attention"]
    assert list(spec.mlp_layer_types) == ["moe", "moe"]


PINNED = {
    # id: (measured GB, predicted / measured - 1) from benchmarks/memory_accuracy.py today. The
    # reserved rows see the allocator's cache grown into the GPU's room (solver.cost.memory.
    # views.estimate_memory_views_with_room, 11.56% of allocated where the GPU has it, 5%
    # before): trainy -9.4% -> -3.7%, H100 -4.6% -> +1.3%, MI300x -4.8% -> +1.2%, B200
    # +10.4% -> +17.3%, 2-layer Llama 4 -27.6% -> -23.1%, 70B 2D -24.9% -> -20.2%. Earlier the
    # compiled loss's 4 B per logit (was 6 B) lowered every compiled-loss row by 2 B per logit.
    "dgxc-llama3.1-8b-bf16-mbs4": (194.41, 0.0411),      # Megatron-Bridge, max allocated
    "trainy-2506-8b-8nodes": (50.434, -0.0374),          # torchtitan on H200, max reserved
    "ao-2503-h100-8b-bf16": (51.164, 0.0133),            # torchao/torchtitan, eager loss
    "ao-2508-mi300x-8b-bf16": (41.973, 0.0118),          # compiled loss
    "ao-2508-b200-8b-bf16": (36.196, 0.1732),            # same configuration, 5.4 GiB less
    "ao-2510-b200-llama4-2l-bf16": (156.283, -0.2312),   # 2-layer Llama 4 Scout, EP 4
    "titan-2412-t4-70b-2d": (77.202, -0.2018),           # 70B, FSDP 32 x TP 8
    "titan-2412-t1-8b-fsdp": (88.477, -0.0532),          # eager model, op-level SAC
    # torchtune under the generic profile, pure bf16 (max active = the allocated view), its
    # loss as torchtune runs it (build_torchtune_loss_options; before: 6, 4 and 5 B per logit,
    # -8.6%, -13.7%, +4.9%, +24.7%).
    "tune-2411-3b-packed": (64.425, 0.0114),             # eager on fp32 logits: 12 B
    "tune-2411-3b-compile": (54.761, -0.0602),           # compiled on fp32 logits: 8 B
    "tune-2411-3b-chunked-ce": (46.064, -0.0140),        # compiled bf16 chunks: 2.25 B
    "tune-2411-3b-ac": (26.736, 0.1389),                 # full AC: the gradients counted whole
}


def test_pinned_rows_are_stable(summary) -> None:
    """A handful of rows as the script compares them today (module docstring)."""
    compared = {r["id"]: r for r in summary["rows"]}
    for name, (measured_gb, error) in PINNED.items():
        assert compared[name]["measured_gb"] == pytest.approx(measured_gb, abs=1e-3), name
        assert compared[name]["relative_error"] == pytest.approx(error, abs=0.002), name


def test_summary_per_framework_and_source(summary) -> None:
    """Medians overall, per framework and per source document; the bounds are a ratchet on
    today's numbers, not the issue's target of 7% per framework, which torchtitan and torchtune
    misses: none now. 37 rows, overall median 2.6%, p90 17.3%; torchtitan 2.0% over 32 rows
    (2.6% before torch.distributed.pipelining's buffers were counted, 8.3% before the
    allocator's cache was grown into the GPU's room; 7.1% before the compiled loss went from 6
    to 4 B per logit), torchtune 3.7% over 4 (11.2% before its loss was
    counted as torchtune runs it), Megatron 4.1% over 1. Overall before: 8.6% and 22.6%. The
    worst row is a 2-layer Llama 4 run (-26.3%), whose logits are half of its prediction; the
    B200 8B rows are +17% (the same configuration measures 5.8 GiB less than on MI300x).
    """
    assert sum(s["count"] for s in summary["by_framework"].values()) == summary["count"]
    assert sum(s["count"] for s in summary["by_source"].values()) == summary["count"]
    assert set(summary["by_source"]) == {"nvidia-dgxc", "torchao", "torchtitan", "torchtune",
                                         "trainy"}
    assert summary["count"] == 37
    assert summary["median_abs_error"] <= 0.03
    assert summary["p90_abs_error"] <= 0.18
    for framework, medians in summary["by_framework"].items():
        assert medians["median_abs_error"] <= 0.07, framework  # the target
    assert summary["by_framework"]["torchtitan"]["median_abs_error"] <= 0.021
    assert summary["worst"][0] == "ao-2510-b200-llama4-2l-mxfp8-all"


def test_rows_see_the_allocators_cache_on_their_own_gpu(public, rows) -> None:
    """Each row's GPU is a catalog GPU (clusters/gpus/), whose memory bounds the allocator's
    cache (views.estimate_memory_views_with_room): torchtitan's 2024-12 8B FSDP row ran on
    96 GB H100s (95.58 GiB), where the 11.56% cache fits (reserved = allocated x 1.1156), the
    allocated view is unchanged, and a GPU the catalog lacks keeps the tight views."""
    from solver.catalog import list_gpu_names, load_gpu_spec
    from solver.cost.memory.views import ROOMY_CACHE_FRACTION

    assert set(public.CATALOG_GPU.values()) <= set(list_gpu_names())
    assert load_gpu_spec(public.CATALOG_GPU["H100-96GB"]).memory_gib == 95.58
    row = next(r for r in rows if r["id"] == "titan-2412-t1-8b-fsdp")
    allocated = public.predict_view_bytes({**row, "measured_kind": "max_allocated"})
    assert public.predict_view_bytes(row) == pytest.approx(allocated * (1 + ROOMY_CACHE_FRACTION))
    tight = public.predict_view_bytes({**row, "gpu": "V100-SXM2-16GB"})
    assert tight == pytest.approx(allocated * 1.05, rel=1e-9)  # MemoryOptions.fragmentation
    assert public.predict_view_bytes({**row, "measured_kind": "max_allocated",
                                      "gpu": "V100-SXM2-16GB"}) == allocated


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_views_are_ordered_on_every_compared_row(public, rows, summary, data) -> None:
    """Property: for any compared row, what max_memory_allocated would see is at most what
    max_memory_reserved would, which is at most what nvidia-smi would."""
    compared = {r["id"] for r in summary["rows"]}
    row = data.draw(st.sampled_from([r for r in rows if r["id"] in compared]))
    predicted = {kind: public.predict_view_bytes({**row, "measured_kind": kind})
                 for kind in ("max_allocated", "max_reserved", "device")}
    assert predicted["max_allocated"] <= predicted["max_reserved"] <= predicted["device"]


def test_json_output_carries_the_public_summary() -> None:
    """`memory_accuracy.py --json` prints the BLOOM summary with the public one under "modern":
    compared rows, skipped rows with reasons, per-framework and per-source summaries."""
    bench = load_module("memory_accuracy")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main(["--json"])
    printed = json.loads(out.getvalue())
    modern = printed["modern"]
    assert {"rows", "skipped", "by_framework", "by_source", "worst",
            "median_abs_error", "p90_abs_error"} <= set(modern)
    assert len(modern["rows"]) + len(modern["skipped"]) >= 40
