"""Predicted peak memory per GPU against measured points: BLOOM-176B (A100 80 GB), then public
measurements from the frameworks' own documents in a second table.

    .venv/bin/python benchmarks/memory_accuracy.py [--json]

Second table (benchmarks/memory_public.py, which says how each source maps):
benchmarks/data/modern_memory.jsonl, every row copied from its source (URL at a commit, table and
row): torchtitan's own benchmark tables and NVFP4 page, Trainy's torchtitan runs, torchao's
float8 / MX / MoE training tables (torchtitan runs on H100, MI300X and B200), torchtune's README
tables, Hugging Face transformers' single-GPU training guide and NVIDIA dgxc-benchmarking's
Megatron-Bridge log. Each is compared in the view its counter measured (max allocated or active:
the allocated items; max reserved: plus the allocator's cache, grown into the room the row's GPU
leaves; nvidia-smi: everything, CUDA context and NCCL included), per framework profile and per
source; rows that need a feature the memory model
lacks are listed with the feature, not compared. Nothing is fitted to these rows.

Data: benchmarks/data/published_memory.jsonl (copied from the shared reference data): 74
points from the BigScience chronicles-prequel (Megatron-DeepSpeed, ZeRO-1, full activation
checkpointing, seq 2048, 250k vocabulary), 6 of them out-of-memory. The measured value is the
nvidia-smi maximum of the first node (stage 0 of the pipeline), which includes the CUDA
context and the allocator's cached blocks, so it is compared with the predicted total of the
worst stage (reserve and fragmentation included).

Each row becomes specs by fixed rules, the same for every row of a period (no per-row
constant is fitted):
  model       BLOOM layer (LayerNorm, biases, plain GeLU MLP 4h, ALiBi, tied embedding,
              embedding LayerNorm) with the row's hidden size, heads and layers; the vocabulary
              padded to 250880 as the production run did (--pad-vocab-size-to 250880).
  layers      rows of 02-20 do not give them ("layer count varied per row to fit PP"); the
              source sized each model with l*(12h^2 + 13h) + v*h + s*h + 2h, so we take the
              multiple of pp whose size is closest to the row's stated size (80, 80, 78, 77,
              80, 81, 80, 77, 72 for pp 4-12; the formula with or without the embedding picks
              the same layers).
  framework   Megatron-DeepSpeed of early 2022: no sequence parallelism, no FlashAttention
              (the fused softmax keeps the softmax output), dropout at Megatron's default 0.1
              (the launch scripts set none), full recompute.
  optimizer   before 02-28, DeepSpeed ZeRO-1 in fp16/bf16: 2-byte gradients, 16 bytes of
              sharded optimizer state (fp32 master, fp32 gradient partition, Adam m and v);
              from 02-28, DeepSpeed's BF16_Optimizer: bf16 gradients plus an unsharded fp32
              accumulation buffer (6 bytes, "additional memory usage is 4bytes x params and
              it's not sharded"), 12 sharded bytes; and the pipeline partition
              'type:transformer|embedding' that gives each embedding a layer slot.
  pipeline    DeepSpeed's engine keeps each in-flight micro-batch's stage output for backward.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.spec import JobSpec, ModelSpec, ParallelConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_public import render_public, summarize_public  # noqa: E402
from published import layers_fitting_pp  # noqa: E402

DATA_PATH = Path(__file__).resolve().parent / "data" / "published_memory.jsonl"
GIB = 2**30
BLOOM_PADDED_VOCAB = 250880
SIZE_PATTERN = re.compile(r"(\d+)B ")


@dataclass(frozen=True)
class MemoryCase:
    """One measured point in parplan's vocabulary."""

    row_id: str
    model_spec: ModelSpec
    job: JobSpec
    config: ParallelConfig
    options: MemoryOptions
    capacity_bytes: float
    measured_bytes: float | None
    oom: bool
    layers_inferred: bool


def infer_layers(row: dict[str, Any]) -> int:
    """The multiple of pp whose size by the source's formula is closest to the stated size
    (published.layers_fitting_pp, the rule the time benchmark uses too)."""
    stated = float(SIZE_PATTERN.search(row["model"]).group(1)) * 1e9
    return layers_fitting_pp(stated, row["hidden"], row["vocab"], row["seq_len"], row["pp"])


def row_case(row: dict[str, Any]) -> MemoryCase:
    """The specs of one row, by the rules in the module docstring."""
    layers, inferred = row["layers"], row["layers"] is None
    if inferred:
        layers = infer_layers(row)
    model_spec = ModelSpec(
        name=row["id"], model_type="bloom", hidden_size=row["hidden"],
        intermediate_size=4 * row["hidden"], num_hidden_layers=layers,
        num_attention_heads=row["heads"], vocab_size=BLOOM_PADDED_VOCAB,
        tie_word_embeddings=True, mlp_type="plain", norm_type="layernorm", embedding_norm=True,
        position_embedding_type="alibi", qkv_bias=True, o_bias=True, mlp_bias=True,
    )
    options = bloom_memory_options("BF16_Optimizer" in (row["precision"] or ""))
    config = ParallelConfig(tp=row["tp"], pp=row["pp"], dp=row["dp"], zero=1,
                            micro_batch=row["micro_batch_size"], recompute="full")
    job = JobSpec(seq_len=row["seq_len"], global_batch=row["global_batch_size"])
    measured = row["measured_mem_value"]
    return MemoryCase(
        row_id=row["id"], model_spec=model_spec, job=job, config=config, options=options,
        capacity_bytes=row["gpu_memory_gb"] * GIB,
        measured_bytes=None if measured is None else measured * 1e9,
        oom=bool(row["oom"]), layers_inferred=inferred,
    )


def bloom_memory_options(bf16_optimizer: bool) -> MemoryOptions:
    """Megatron-DeepSpeed of early 2022 (module docstring, "framework" and "optimizer"): also
    the known-to-run table's options for BLOOM (benchmarks/known_to_run.py)."""
    return MemoryOptions(
        sequence_parallel=False, flash_attention=False, dropout=True,
        grad_bytes=6.0 if bf16_optimizer else 2.0,
        optimizer_bytes=12.0 if bf16_optimizer else 16.0,
        account_for_embedding_in_pipeline_split=bf16_optimizer,
        keep_stage_outputs=True,
        fragmentation=0.12,  # 2022 PyTorch allocator, no expandable segments (options.py)
    )


def load_memory_cases(path: Path = DATA_PATH) -> list[MemoryCase]:
    with path.open(encoding="utf-8") as lines:
        return [row_case(json.loads(line)) for line in lines if line.strip()]


def predict_peak_bytes(case: MemoryCase) -> float:
    """Total of the worst stage (reserve and fragmentation included)."""
    candidates = Candidates.from_configs([case.config])
    return float(estimate_memory(case.model_spec, case.job, candidates, case.options).total[0])


def summarize(cases: list[MemoryCase]) -> dict[str, Any]:
    """Per-row predictions, relative errors of the measured rows, and the OOM verdicts."""
    rows = []
    for case in cases:
        predicted = predict_peak_bytes(case)
        error = None if case.measured_bytes is None else (
            predicted / case.measured_bytes - 1.0)
        rows.append({
            "id": case.row_id, "tp": case.config.tp, "pp": case.config.pp, "dp": case.config.dp,
            "micro_batch": case.config.micro_batch,
            "layers": case.model_spec.num_hidden_layers, "layers_inferred": case.layers_inferred,
            "predicted_gb": predicted / 1e9,
            "measured_gb": None if case.measured_bytes is None else case.measured_bytes / 1e9,
            "relative_error": error, "oom": case.oom,
            "predicted_fits": predicted <= case.capacity_bytes,
        })
    errors = np.array([abs(r["relative_error"]) for r in rows if r["relative_error"] is not None])
    return {
        "rows": rows,
        "median_abs_error": float(np.median(errors)),
        "p90_abs_error": float(np.percentile(errors, 90)),
        "mean_signed_error": float(np.mean(
            [r["relative_error"] for r in rows if r["relative_error"] is not None])),
        "oom_predicted_fit": [r["id"] for r in rows if r["oom"] and r["predicted_fits"]],
        "success_predicted_oom": [
            r["id"] for r in rows if not r["oom"] and not r["predicted_fits"]],
    }


def main(argv: list[str]) -> None:
    summary = summarize(load_memory_cases())
    modern = summarize_public()
    if "--json" in argv:
        print(json.dumps({**summary, "modern": modern}, indent=2))
        return
    print(f"{'row':34} {'tp':>2} {'pp':>2} {'dp':>2} {'mb':>2} {'L':>4} "
          f"{'pred GB':>8} {'meas GB':>8} {'error':>7}  verdict")
    for r in summary["rows"]:
        measured = "OOM" if r["oom"] else f"{r['measured_gb']:.0f}"
        error = "" if r["relative_error"] is None else f"{100 * r['relative_error']:+.1f}%"
        verdict = "fits" if r["predicted_fits"] else "OOM"
        layers = f"{r['layers']}{'*' if r['layers_inferred'] else ''}"
        print(f"{r['id'][4:]:34} {r['tp']:>2} {r['pp']:>2} {r['dp']:>2} {r['micro_batch']:>2} "
              f"{layers:>4} {r['predicted_gb']:>8.1f} {measured:>8} {error:>7}  {verdict}")
    measured = [r for r in summary["rows"] if r["relative_error"] is not None]
    worst = sorted(measured, key=lambda r: -abs(r["relative_error"]))[:5]
    print(f"\n{len(measured)} measured rows ({sum(r['layers_inferred'] for r in measured)} with "
          f"inferred layers, marked *), {sum(r['oom'] for r in summary['rows'])} OOM rows")
    print(f"median |error| {100 * summary['median_abs_error']:.1f}%   "
          f"p90 |error| {100 * summary['p90_abs_error']:.1f}%   "
          f"mean signed error {100 * summary['mean_signed_error']:+.1f}%")
    print("worst rows: " + ", ".join(
        f"{r['id'][4:]} {100 * r['relative_error']:+.1f}%" for r in worst))
    print(f"measured OOM predicted to fit: {summary['oom_predicted_fit'] or 'none'}")
    print(f"measured success predicted OOM: {summary['success_predicted_oom'] or 'none'}")
    render_public(modern)


if __name__ == "__main__":
    main(sys.argv[1:])
