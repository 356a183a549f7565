"""Public peak-memory measurements from the frameworks' own documents, each compared with the
prediction in the view its counter measured (benchmarks/memory_accuracy.py prints them).

Data: benchmarks/data/modern_memory.jsonl, one row per measured number, copied verbatim with its
source (URL pinned to a commit, table and row), the counter it read and the configuration the
source states. Nothing is fitted to these rows.

Views (what each counter sees, in solver.cost.memory's items):
  allocated  torch.cuda.max_memory_allocated, or torchtune's "peak memory active" (torch's
             active_bytes.all.peak: the allocated blocks plus freed ones still awaiting a stream,
             which the model does not count). Each view is solver.cost.memory.views' (the breakdown's).
  reserved   torch.cuda.max_memory_reserved (what torchtitan logs as `memory: X GiB`): the
             allocated items plus the caching allocator's cache, grown into the room the row's
             GPU leaves (CATALOG_GPU: its memory in clusters/gpus/; solver.cost.memory.views.
             estimate_memory_views_with_room: 11.56% of allocated where it fits, 5% under
             pressure).
  device     nvidia-smi / pynvml's used memory: every item, CUDA context and NCCL included.

Fixed rules, one per source, where a source leaves a detail out:
  torchtitan, trainy, torchao  torchao's tables are torchtitan runs; their "Peak Memory (GB)" is
             the largest `memory:` value of torchtitan's log, which is max reserved in GiB
             (benchmarks/float8/training/parse_torchtitan_logs.py prints it as GiB). The loss is
             compiled with the model when the torchtitan commit is from 2025-04-02 (bbb1b61:
             build_cross_entropy_loss compiles it under training.compile) or later and compile is
             on, eager before. "Llama3-8b" is Llama 3 8B, whose shapes are llama3.1-8b's. A model
             "with N layers" keeps the first N entries of every per-layer list of the catalog
             spec.
  torchtune  the first README table names no counter ("Peak Memory per GPU"); it is read as the
             counter the second table names, peak memory active (torchtune.training.memory
             get_memory_stats logs active, allocated and reserved). The recipe config of the same
             commit gives what the README leaves out. torchtune is plain PyTorch (one device or
             FSDP2, torch.optim): the generic profile. Its `dtype: bf16` is pure bf16 training
             (training_states pure_bf16: full_finetune_single_device.py, "all activations,
             gradients and optimizer states are in bfloat16"); `compile` compiles the decoder
             layers (training/_compile.py compile_model: fused_elementwise) and the loss
             (compile_loss); the loss is CEWithChunkedOutputLoss (chunked) where the row's
             `needs` names it, else compiled with compile on, else eager.
  nvidia-dgxc  Megatron's log line `mem-max-allocated-gigabytes` (torch.cuda.max_memory_allocated
             / 1e9, training_log in megatron/training/training.py).
  huggingface-transformers
             "GPU memory occupied: N MB" is pynvml's used memory // 1024**2: nvidia-smi, in MiB.
             The Trainer is plain PyTorch: the generic profile.

A row's `needs` names what the source ran beyond the profile's defaults. Those in
MAPPED_FEATURES become one feature of the profile each, the same for every row (pure bf16
states, 8-bit Adam, the chunked loss, the unfused attention); a row that also needs one of
MISSING_FEATURES (LoRA, fp32 training, a BERT encoder spec, torchtitan's chunked LM head, ...)
is listed with that reason and not compared: mapping it onto something else would measure the
mapping.

torchtune's loss is counted as torchtune runs it (build_torchtune_loss_options): its decoder
returns fp32 logits (modules/transformer.py TransformerDecoder.forward, `self.output(h).float()`
@1814feb) unless chunked, so its eager loss holds torchtitan's 12 B per logit and its compiled
loss 8 B (fp32 logits saved, fp32 gradient), and compile_loss compiles each chunk of
CEWithChunkedOutputLoss, 2 + 2/8 = 2.25 B (solver.cost.memory.loss) [B: read from the code,
not measured].

Known gap of the mapping, left in the comparison (nothing is fitted): the generic profile
counts the gradients whole beside the activations at the loss, where torch.optim's
zero_grad(set_to_none=True) (the recipe's) leaves them to be allocated during the backward:
with full recompute, little else is held there ('+ Activation Checkpointing', +13.9%).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from solver.catalog import load_gpu_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import EAGER_CROSS_ENTROPY_LOGITS_BYTES, build_framework_profile
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.spec import JobSpec, ModelSpec, ParallelConfig

MODERN_PATH = Path(__file__).resolve().parent / "data" / "modern_memory.jsonl"
# The view each counter measures (module docstring).
COUNTER_VIEW = {"max_allocated": "allocated", "max_active": "allocated",
                "max_reserved": "reserved", "device": "device"}
UNIT_BYTES = {"GiB": 2**30, "GB": 1e9, "MiB": 2**20}
# The catalog GPU (clusters/gpus/) of each row's `gpu`, whose memory bounds the allocator's
# cache (solver.cost.memory.views.estimate_memory_views_with_room); a GPU the catalog lacks
# (RTX A6000, V100) keeps the views under pressure.
CATALOG_GPU = {"H100-96GB": "h100-96gb", "H100": "h100-sxm", "H200-141GB": "h200",
               "B200": "b200", "MI300X": "mi300x", "A100": "a100-80gb", "RTX 4090": "rtx-4090"}
# The profile each source's framework ran under (module docstring): torchtune and the Hugging
# Face Trainer are plain PyTorch, the generic profile.
FRAMEWORK_PROFILE = {"torchtitan": "torchtitan", "megatron": "megatron",
                     "torchtune": "generic", "hf-trainer": "generic"}
# What a row's `needs` may name that the memory model has: the profile feature each becomes
# (solver.spec.framework.FrameworkFeatures), one rule for every row.
MAPPED_FEATURES = {
    "loss_implementation=chunked": {"loss_implementation": "chunked"},  # CEWithChunkedOutputLoss
    "bf16_training_states": {"training_states": "pure_bf16"},  # torchtune dtype bf16
    "8bit_adam": {"training_states": "adam8bit"},  # bitsandbytes AdamW8bit / PagedAdamW8bit
    "unfused_attention_memory": {"attention_kernel": "unfused"},  # eager scores and softmax
}
# What a row's `needs` may name that the memory model does not have yet (issues 42, 43).
MISSING_FEATURES = {
    "chunked_linear_loss": "the LM head and the loss run chunk by chunk, each chunk's backward "
                           "before the next (torchtitan ChunkedLossWrapper, components/loss.py "
                           "@73aed7f, 8 chunks): neither the chunked loss (full logits held) "
                           "nor Liger's fused linear one (its own chunk size)",
    "optimizer_in_backward": "the optimizer step fused into the backward, each gradient freed "
                             "as it is applied (torchtune optimizer_in_bwd)",
    "activation_offload_torchtune": "torchtune's activation offloading to the host",
    "fsdp_cpu_offload": "FSDP parameter, gradient and optimizer offload to the host",
    "lora": "LoRA fine-tuning (issue 42)",
    "qlora": "QLoRA: 4-bit NF4 frozen weights with LoRA adapters (issue 42)",
    "unpacked_sequences": "an unpacked dataset: the sequence length varies per batch",
    "per_module_precision": "low precision in some modules only (MXFP8 for the linears or the "
                            "grouped GEMMs alone, an NVFP4 model with a bf16 tail)",
    "fp32_training": "fp32 weights, gradients, Adam states and activations",
    "amp_fp32_weights": "fp16 autocast over fp32 weights (fp32 gradients, fp16 activations)",
    "adafactor": "Adafactor's factored second moment",
    "bert_encoder_model": "BERT-large (encoder, learned positions, no LM head) in the catalog",
}
NUM_WORST = 8


def load_public_rows(path: Path = MODERN_PATH) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


def build_mapped_features(needs: list[str]) -> dict[str, Any]:
    """The profile features a row's mapped `needs` ask for (MAPPED_FEATURES); pure bf16 states
    with 8-bit Adam are pure_bf16_adam8bit (solver.cost.step.training_states)."""
    features: dict[str, Any] = {}
    for need in needs:
        features.update(MAPPED_FEATURES.get(need, {}))
    if {"bf16_training_states", "8bit_adam"} <= set(needs):
        features["training_states"] = "pure_bf16_adam8bit"
    return features


def build_row_model_spec(row: dict[str, Any]) -> ModelSpec:
    """The catalog spec, cut to the row's layer count where the source ran fewer layers (the
    first N entries of every per-layer list)."""
    spec = load_model_spec(row["model"])
    layers = row["num_hidden_layers"]
    if layers is None:
        return spec
    fields = spec.model_dump()
    full = spec.num_hidden_layers
    cut = {name: list(value)[:layers] for name, value in fields.items()
           if isinstance(value, (list, tuple)) and len(value) == full}
    return ModelSpec.model_validate({**fields, **cut, "num_hidden_layers": layers})


def build_torchtune_loss_options(loss_implementation: str, loss_compiled: bool
                                 ) -> dict[str, Any]:
    """What torchtune's loss holds, as MemoryOptions (module docstring, torchtune @1814feb):
    unchunked, the decoder returns fp32 logits (`.float()`), so its eager F.cross_entropy runs
    torchtitan's ops (12 B per logit, frameworks.EAGER_CROSS_ENTROPY_LOGITS_BYTES) and its
    compiled loss keeps fp32 logits (8 B); chunked, the chunks stay bf16 and compile_loss
    compiles each chunk's cross-entropy (2.25 B)."""
    return {"logits_fp32_from_model": loss_implementation != "chunked",
            "logits_bytes": EAGER_CROSS_ENTROPY_LOGITS_BYTES,
            "loss_chunks_compiled": loss_implementation == "chunked" and loss_compiled}


def build_row_problem(row: dict[str, Any]
                      ) -> tuple[ModelSpec, JobSpec, ParallelConfig, MemoryOptions]:
    """The row's model, job, degrees and memory options under its framework's profile."""
    config = ParallelConfig(tp=row["tp"], pp=row["pp"], dp=row["dp"], cp=row["cp"], ep=row["ep"],
                            zero=row["zero"], micro_batch=row["micro_batch"],
                            recompute=row["recompute"])
    job = JobSpec(seq_len=row["seq_len"], global_batch=row["global_batch"],
                  precision=row["precision"])
    # torch.compile fuses the model's element-wise ops (solver.cost.memory.eager: what eager
    # ops keep); the loss is compiled or not apart (torchtitan's and torchtune's eager
    # cross-entropy or the compiled one, solver.cost.memory.loss): the row says whether its
    # release compiled each; a mapped need (MAPPED_FEATURES) overrides the loss.
    features: dict[str, Any] = {}
    if row["framework"] in ("torchtitan", "torchtune"):
        features = {"fused_elementwise": bool(row["torch_compile"]),
                    "loss_implementation": "compiled" if row["loss_compiled"] else "eager"}
    if row["fp8_all_gather"]:
        features["fp8_all_gather"] = True
    features.update(build_mapped_features(row["needs"]))
    options = build_framework_profile(FRAMEWORK_PROFILE[row["framework"]],
                                      features).memory_options()
    if row["framework"] == "torchtune":
        options = options.model_copy(update=build_torchtune_loss_options(
            features["loss_implementation"], bool(row["loss_compiled"])))
    return build_row_model_spec(row), job, config, options


def predict_view_bytes(row: dict[str, Any]) -> float:
    """The row's counter, predicted: its view's items under its framework's profile; on a
    catalog GPU as the counter reads it there, through MemoryBreakdown.views_with_room, the
    function every plan's observed views come from (solver.api.estimate_plans)."""
    model_spec, job, config, options = build_row_problem(row)
    breakdown = estimate_memory(model_spec, job, Candidates.from_configs([config]), options)
    view = COUNTER_VIEW[row["measured_kind"]]
    if row["gpu"] not in CATALOG_GPU:
        return float(breakdown.views[view][0])
    capacity = load_gpu_spec(CATALOG_GPU[row["gpu"]]).memory_gib * 2**30
    return float(breakdown.views_with_room(capacity)[view][0])


def summarize_errors(rows: list[dict[str, Any]]) -> dict[str, Any]:
    errors = np.array([abs(r["relative_error"]) for r in rows])
    return {"count": len(rows), "median_abs_error": float(np.median(errors)),
            "p90_abs_error": float(np.percentile(errors, 90)),
            "mean_signed_error": float(np.mean([r["relative_error"] for r in rows]))}


def group_summaries(rows: list[dict[str, Any]], key: str) -> dict[str, dict[str, Any]]:
    return {name: summarize_errors([r for r in rows if r[key] == name])
            for name in sorted({r[key] for r in rows})}


def summarize_public(path: Path = MODERN_PATH) -> dict[str, Any]:
    """Compared rows with their relative errors, skipped rows with their reasons, and the
    median / p90 |error| overall, per framework profile and per source document."""
    compared, skipped = [], []
    for row in load_public_rows(path):
        common = {"id": row["id"], "source": row["source"], "framework": row["framework"],
                  "kind": row["measured_kind"], "view": COUNTER_VIEW[row["measured_kind"]],
                  "source_url": row["source_url"], "source_locator": row["source_locator"]}
        measured = row["measured"] * UNIT_BYTES[row["measured_unit"]]
        missing = [need for need in row["needs"] if need not in MAPPED_FEATURES]
        if missing:
            skipped.append({**common, "measured_gb": measured / 1e9,
                            "reason": "needs " + ", ".join(missing)})
            continue
        predicted = predict_view_bytes(row)
        compared.append({**common, "measured_gb": measured / 1e9, "predicted_gb": predicted / 1e9,
                         "relative_error": predicted / measured - 1.0})
    worst = sorted(compared, key=lambda r: -abs(r["relative_error"]))[:NUM_WORST]
    return {"rows": compared, "skipped": skipped, **summarize_errors(compared),
            "by_framework": group_summaries(compared, "framework"),
            "by_source": group_summaries(compared, "source"),
            "worst": [r["id"] for r in worst]}


def render_public(summary: dict[str, Any]) -> None:
    print(f"\nPublic measurements ({MODERN_PATH.name}; each in the view its counter measured)")
    print(f"{'row':38} {'view':>9} {'meas GB':>8} {'pred GB':>8} {'error':>7}  source")
    for r in summary["rows"]:
        print(f"{r['id']:38} {r['view']:>9} {r['measured_gb']:>8.1f} {r['predicted_gb']:>8.1f} "
              f"{100 * r['relative_error']:+6.1f}%  {r['source_url']} ({r['source_locator']})")
    print(f"{summary['count']} compared: median |error| {100 * summary['median_abs_error']:.1f}%"
          f"   p90 |error| {100 * summary['p90_abs_error']:.1f}%"
          f"   mean signed error {100 * summary['mean_signed_error']:+.1f}%")
    for title, key in (("framework", "by_framework"), ("source", "by_source")):
        print(f"\nper {title:10} {'rows':>5} {'median':>7} {'p90':>7} {'signed':>7}")
        for name, s in summary[key].items():
            print(f"    {name:14} {s['count']:>5} {100 * s['median_abs_error']:>6.1f}% "
                  f"{100 * s['p90_abs_error']:>6.1f}% {100 * s['mean_signed_error']:>+6.1f}%")
    by_id = {r["id"]: r for r in summary["rows"]}
    print("\nworst rows: " + ", ".join(
        f"{name} {100 * by_id[name]['relative_error']:+.1f}%" for name in summary["worst"]))
    print(f"\n{len(summary['skipped'])} rows not compared (a feature the memory model lacks):")
    for r in summary["skipped"]:
        print(f"  {r['id']:38} {r['view']:>9} {r['measured_gb']:>8.1f} GB  {r['reason']}")
