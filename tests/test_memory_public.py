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
        assert set(row["needs"]) <= set(public.MISSING_FEATURES), row["id"]


def test_rows_needing_a_missing_feature_are_listed_not_compared(rows, summary) -> None:
    """A row whose `needs` is not empty is skipped with the features it needs named; every
    other row is compared. torchtune's README rows all need pure bf16 states, LoRA or a chunked
    loss; Hugging Face's BERT rows need fp32 training and a BERT spec."""
    needing = {row["id"] for row in rows if row["needs"]}
    assert {r["id"] for r in summary["skipped"]} == needing
    assert {r["id"] for r in summary["rows"]} == {row["id"] for row in rows} - needing
    assert all(r["reason"].startswith("needs ") for r in summary["skipped"])
    skipped = {r["id"]: r for r in summary["skipped"]}
    assert "lora" in skipped["tune-2409-8b-lora-4090"]["reason"]
    assert "fp32_training" in skipped["hf-2302-bert-large-vanilla"]["reason"]


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
    # id: (measured GB, predicted / measured - 1) from benchmarks/memory_accuracy.py today.
    "dgxc-llama3.1-8b-bf16-mbs4": (194.41, 0.0411),      # Megatron-Bridge, max allocated
    "trainy-2506-8b-8nodes": (50.434, -0.0065),          # torchtitan on H200, max reserved
    "ao-2503-h100-8b-bf16": (51.164, -0.0463),           # torchao/torchtitan, eager loss
    "ao-2508-mi300x-8b-bf16": (41.973, 0.0048),          # compiled loss
    "ao-2508-b200-8b-bf16": (36.196, 0.1652),            # same configuration, 5.4 GiB less
    "ao-2510-b200-llama4-2l-bf16": (156.283, -0.0985),   # 2-layer Llama 4 Scout, EP 4
    "titan-2412-t4-70b-2d": (77.202, -0.2488),           # the worst row
}


def test_pinned_rows_are_stable(summary) -> None:
    """A handful of rows as the script compares them today (module docstring)."""
    compared = {r["id"]: r for r in summary["rows"]}
    for name, (measured_gb, error) in PINNED.items():
        assert compared[name]["measured_gb"] == pytest.approx(measured_gb, abs=1e-3), name
        assert compared[name]["relative_error"] == pytest.approx(error, abs=0.002), name


def test_summary_per_framework_and_source(summary) -> None:
    """Medians overall, per framework profile and per source document; the bounds are a ratchet
    on today's numbers (overall median 6.9%, p90 16.5%; torchtitan 7.1% over 32 rows), not the
    issue's target of 7% per framework, which torchtitan misses."""
    assert sum(s["count"] for s in summary["by_framework"].values()) == summary["count"]
    assert sum(s["count"] for s in summary["by_source"].values()) == summary["count"]
    assert set(summary["by_source"]) == {"nvidia-dgxc", "torchao", "torchtitan", "trainy"}
    assert summary["median_abs_error"] <= 0.07
    assert summary["p90_abs_error"] <= 0.17
    assert summary["by_framework"]["torchtitan"]["median_abs_error"] <= 0.075
    assert summary["worst"][0] == "titan-2412-t4-70b-2d"


@settings(max_examples=12, deadline=None)
@given(st.data())
def test_views_are_ordered_on_every_compared_row(public, rows, data) -> None:
    """Property: for any compared row, what max_memory_allocated would see is at most what
    max_memory_reserved would, which is at most what nvidia-smi would."""
    row = data.draw(st.sampled_from([r for r in rows if not r["needs"]]))
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
