"""The public training runs of benchmarks/data/published_runs.jsonl, mapped onto parplan's specs.

The file (copied from the shared reference data; see its README) holds 337 runs from four
source groups: MosaicML LLM Foundry MPT benchmarks (`llm-foundry`), the BigScience BLOOM-176B
topology sweeps and production run (`bloom`), the Megatron-LM README H100 scaling table
(`megatron-lm`) and the Megatron-Bridge performance tables (`megatron-bridge`).

`load_published_runs` turns every row it can map faithfully into a `PublishedRun` (ModelSpec,
ClusterSpec, JobSpec, ParallelConfig and the measured tokens/s per GPU) and lists the others
with a reason. Anything the source does not state but a run needs is filled in by a fixed rule
per source group, never per row, and named in the run's `assumptions`.

Measured throughput, in order of preference (the first field the row has):
  tokens_per_sec_per_gpu                                  as published
  tokens_per_sec_total / num_gpus
  samples_per_sec * seq_len / num_gpus
  global_batch * seq_len / step_time_s / num_gpus         (BLOOM's seconds per iteration)
  tflops_per_gpu / Megatron model FLOPs per token          (the Megatron-LM table, whose
                                                          TFLOP/s use that formula)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solver.catalog import load_cluster_spec, load_model_spec
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig

DATA_PATH = Path(__file__).resolve().parent / "data" / "published_runs.jsonl"

# The presets' network tier is line rate x 0.80 (clusters/presets/*.toml, "network 0.80");
# a fabric rebuilt from a source's own line rate uses the same efficiency.
NETWORK_EFFICIENCY = 0.80

# Megatron pads the vocabulary to a multiple of this times tp (make_vocab_size_divisible_by).
MEGATRON_VOCAB_MULTIPLE = 128

# Row `model` (before any " (...)" suffix) -> zoo file. Llama 3 and 3.1 share their shapes.
ZOO_NAMES = {
    "LLAMA3_8B": "llama3.1-8b",
    "LLAMA3_70B": "llama3.1-70b",
    "LLAMA3.1_405B": "llama3.1-405b",
    "DeepSeekV3": "deepseek-v3",
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "GPT OSS 120B": "gpt-oss-120b",
    "BLOOM-176B": "bloom-176b",
    "Nemotron_3_Nano": "nemotron-3-nano-30b-a3b",
}

# The rows' arch_type -> PublishedRun.arch_kind; a hybrid (Mamba-2 and attention layers, MoE
# MLPs) is reported apart from the plain MoE transformers, and only from the zoo.
ARCH_KINDS = {"dense": "dense", "moe": "moe", "hybrid_mamba_moe": "hybrid"}

PRESETS = {("A100", 40): "dgx-a100-40gb", ("A100", 80): "dgx-a100-80gb", ("H100", 80): "dgx-h100"}


@dataclass(frozen=True)
class PublishedRun:
    """One public run in parplan's vocabulary, with what it measured."""

    id: str
    source: str
    source_group: str  # llm-foundry | bloom | megatron-lm | megatron-bridge
    gpu: str  # e.g. "A100-40GB"
    arch_kind: str  # dense | moe | hybrid
    precision: str  # bf16 | fp8
    num_gpus: int
    model_spec: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    parallel: ParallelConfig
    tokens_per_sec_per_gpu: float
    measured_from: str  # the row field the throughput comes from
    params_ratio: float | None  # model_spec.total_params / the row's total_params_b
    assumptions: tuple[str, ...]
    # Composer's FSDP mixed-precision mode where the row states it (LLM Foundry: DEFAULT | PURE)
    mixed_precision_mode: str | None = None


class _Unmappable(Exception):
    """A row that cannot be mapped faithfully; the message is the reason."""


def load_published_runs(path: Path = DATA_PATH) -> tuple[list[PublishedRun], list[tuple[str, str]]]:
    """Every mappable `ok` row as a PublishedRun, and (row id, reason) for the others."""
    runs: list[PublishedRun] = []
    skipped: list[tuple[str, str]] = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        try:
            runs.append(_map_row(row))
        except _Unmappable as exc:
            skipped.append((row["id"], str(exc)))
    return runs, skipped


def source_group(row: dict[str, Any]) -> str:
    framework = row["framework"] or ""
    for prefix, group in (("LLM Foundry", "llm-foundry"), ("Megatron-DeepSpeed", "bloom"),
                          ("Megatron-Core", "megatron-lm"), ("Megatron-Bridge", "megatron-bridge")):
        if framework.startswith(prefix):
            return group
    raise _Unmappable(f"unknown framework {framework!r}")


def _map_row(row: dict[str, Any]) -> PublishedRun:
    if row["status"] != "ok":
        raise _Unmappable(f"status {row['status']!r}: nothing measured")
    group = source_group(row)
    notes: list[str] = []
    parallel = _parallel_config(row, group, notes)
    model_spec = _model_spec(row, group, parallel, notes)
    job = JobSpec(seq_len=row["seq_len"], global_batch=row["global_batch_size"],
                  precision=_precision(row, notes))
    cluster = _cluster(row, notes)
    tokens, measured_from = _measured_tokens_per_gpu(row, notes)
    total_b = row["total_params_b"]
    return PublishedRun(
        id=row["id"], source=row["source"], source_group=group,
        gpu=f"{row['gpu_type']}-{row['gpu_memory_gb'] or 80}GB",
        arch_kind=ARCH_KINDS[row["arch_type"]],
        precision=job.precision, num_gpus=row["num_gpus"], model_spec=model_spec,
        cluster=cluster, job=job, parallel=parallel, tokens_per_sec_per_gpu=tokens,
        measured_from=measured_from,
        params_ratio=model_spec.total_params / (total_b * 1e9) if total_b else None,
        assumptions=tuple(notes),
        mixed_precision_mode=_mixed_precision_mode(row),
    )


# ---- model ------------------------------------------------------------------------------------

def _model_spec(row: dict[str, Any], group: str, parallel: ParallelConfig,
                notes: list[str]) -> ModelSpec:
    if row["arch_type"] not in ARCH_KINDS:
        raise _Unmappable(f"arch_type {row['arch_type']!r}: not a kind parplan models")
    base_name = (row["model"] or "").split(" (")[0]
    if base_name in ZOO_NAMES:
        return _zoo_model(row, ZOO_NAMES[base_name], parallel.tp)
    if ARCH_KINDS[row["arch_type"]] == "hybrid":
        raise _Unmappable(f"hybrid model {row['model']!r} is not in the zoo")
    if group == "bloom" and row["layers"] is None and BLOOM_0220 in row["source"]:
        row = {**row, "layers": bloom_layers_fitting_pp(row, parallel.pp)}
        notes.append(f"layers = {row['layers']}: the multiple of pp nearest the count the "
                     f"row's size ({row['total_params_b']}B) implies (not stated per row)")
    missing = [k for k in ("layers", "hidden", "heads", "vocab") if row[k] is None]
    if missing:
        raise _Unmappable(f"architecture incomplete: {', '.join(missing)} not given"
                          + (" (varied per row to fit PP)" if "layers" in missing else ""))
    if group == "llm-foundry":
        return _mpt_model(row)
    if group == "bloom":
        return _bloom_prototype_model(row)
    if group == "megatron-lm":
        return _megatron_gpt_model(row, notes)
    raise _Unmappable(f"model {row['model']!r} is neither in the zoo nor a known family")


# BLOOM's 02-20 tables (the topology table and its micro-batch follow-ups, same models) fix
# NHIDDEN and change NLAYERS per row "to fit PP" (chronicles-prequel.md, "Choosing the fastest
# 3D Topology"); the rows give the model size, not the layer count.
BLOOM_0220 = "(02-20 "


def bloom_layers_fitting_pp(row: dict[str, Any], pp: int) -> int:
    """The layer count of a BLOOM 02-20 row (layers_fitting_pp of its printed size)."""
    return layers_fitting_pp(row["total_params_b"] * 1e9, row["hidden"], row["vocab"],
                             row["seq_len"], pp)


def layers_fitting_pp(stated_params: float, hidden: int, vocab: int, seq_len: int,
                      pp: int) -> int:
    """The multiple of pp nearest the layer count a printed model size implies by the BLOOM
    document's own size formula, l (12 h^2 + 13 h) + v h + s h + 2 h (chronicles-prequel.md,
    "Formula to get model size"). The same document's 02-17 runs state NLAYERS=80 at
    NHIDDEN=14400 ("200B", pp 10), which the rule reproduces. Worked number: 183B at h 14400,
    v 250k, s 2048 implies 72.1 layers; pp 12 -> 72 (the next multiple, 84, is 12 layers
    away; in every row of the 02-20 tables the runner-up is at least 2.9 layers further than
    the pick, so the size's 1B rounding cannot change it). Used by the time benchmark and by
    benchmarks/memory_accuracy.py."""
    h = hidden
    implied = (stated_params - vocab * h - seq_len * h - 2 * h) / (12 * h * h + 13 * h)
    return max(pp, pp * round(implied / pp))


def _zoo_model(row: dict[str, Any], zoo_name: str, tp: int) -> ModelSpec:
    """The zoo model, after checking that every architecture number the row gives agrees."""
    spec = load_model_spec(zoo_name)
    checks = {
        "layers": spec.num_hidden_layers, "hidden": spec.hidden_size, "heads":
        spec.num_attention_heads, "kv_heads": spec.kv_heads,
        "ffn_hidden": spec.intermediate_size if spec.num_dense_layers else None,
        "moe_num_experts": spec.num_experts or None, "moe_top_k": spec.num_experts_per_tok or None,
        "moe_expert_ffn_hidden": spec.moe_intermediate_size,
        "moe_shared_experts": spec.num_shared_experts if spec.is_moe else None,
    }
    disagree = [f"{k} {row[k]} vs {v}" for k, v in checks.items()
                if row[k] is not None and v is not None and row[k] != v]
    vocab = row["vocab"]
    if vocab is not None and spec.vocab_size not in (vocab, _megatron_padded_vocab(vocab, tp)):
        disagree.append(f"vocab {vocab} vs {spec.vocab_size}")
    if disagree:
        raise _Unmappable(f"row disagrees with zoo model {zoo_name}: {'; '.join(disagree)}")
    return spec


def _megatron_padded_vocab(vocab: int, tp: int) -> int:
    multiple = MEGATRON_VOCAB_MULTIPLE * tp
    return math.ceil(vocab / multiple) * multiple


def _mpt_model(row: dict[str, Any]) -> ModelSpec:
    """LLM Foundry's benchmark MPTs: no linear biases, LayerNorm without bias, plain GELU MLP,
    tied embeddings, and learned positions (the table's NumParams grows by seq_len x d_model
    with the sequence length; 50368-token vocabulary, not the released 50432)."""
    return ModelSpec(
        name=row["model"], model_type="mpt", source=row["source_locator"],
        hidden_size=row["hidden"], intermediate_size=row["ffn_hidden"] or 4 * row["hidden"],
        num_hidden_layers=row["layers"], num_attention_heads=row["heads"],
        num_key_value_heads=row["kv_heads"], vocab_size=row["vocab"], tie_word_embeddings=True,
        max_position_embeddings=row["seq_len"], mlp_type="plain", norm_type="layernorm",
        norm_bias=False, position_embedding_type="learned",
    )


def _bloom_prototype_model(row: dict[str, Any]) -> ModelSpec:
    """A BLOOM-shaped model (bloom-176b's ALiBi, embedding LayerNorm, biases, tied embeddings)
    with the row's width, depth, heads and vocabulary."""
    data = load_model_spec("bloom-176b").model_dump()
    data.update(
        name=row["model"], source=row["source_locator"], hidden_size=row["hidden"],
        intermediate_size=row["ffn_hidden"] or 4 * row["hidden"],
        num_hidden_layers=row["layers"], num_attention_heads=row["heads"],
        num_key_value_heads=row["kv_heads"], vocab_size=row["vocab"],
    )
    return ModelSpec.model_validate(data)


def _megatron_gpt_model(row: dict[str, Any], notes: list[str]) -> ModelSpec:
    """Megatron-Core's GPT defaults: biases, LayerNorm, plain GELU 4h MLP, learned positions.
    Embeddings are untied: the table's names match untied counts (GPT 7.1B: 30 x 12 x 4096^2
    + 2 x 131072 x 4096 = 7.11e9; tied would be 6.6e9)."""
    if row["ffn_hidden"] is None or row["kv_heads"] is None:
        notes.append("ffn_hidden = 4 x hidden and kv_heads = heads (Megatron defaults; "
                     "the table gives neither)")
    return ModelSpec(
        name=row["model"], model_type="gpt", source=row["source_locator"],
        hidden_size=row["hidden"], intermediate_size=row["ffn_hidden"] or 4 * row["hidden"],
        num_hidden_layers=row["layers"], num_attention_heads=row["heads"],
        num_key_value_heads=row["kv_heads"], vocab_size=row["vocab"], tie_word_embeddings=False,
        max_position_embeddings=row["seq_len"], mlp_type="plain", norm_type="layernorm",
        position_embedding_type="learned", qkv_bias=True, o_bias=True, mlp_bias=True,
    )


def megatron_flops_per_token(row: dict[str, Any]) -> float:
    """Megatron-LM's model FLOPs per token (training.py num_floating_point_operations, r0.8):
    12 L h^2 (1 + kv/heads + s/h + ffn/h x gated x routed + V / (2 L h)), attention not halved
    for causality. Worked number (GPT 1.7B: L 24, h 2048, s 4096, V 131072, ffn 4h, MHA):
    12 x 24 x 2048^2 x (2 + 2 + 4 + 1.333) = 1.127e10."""
    layers, h, s = row["layers"], row["hidden"], row["seq_len"]
    heads = row["heads"]
    kv = row["kv_heads"] or heads
    ffn = row["ffn_hidden"] or 4 * h
    routed = row["moe_top_k"] or 1
    return 12.0 * layers * h * h * (
        1 + kv / heads + s / h + ffn / h * routed + row["vocab"] / (2 * layers * h)
    )


# ---- parallel layout and job -----------------------------------------------------------------

def _parallel_config(row: dict[str, Any], group: str, notes: list[str]) -> ParallelConfig:
    num_gpus = row["num_gpus"]
    if row["tp"] is None and row["pp"] is None and row["dp"] is None:
        raise _Unmappable("parallel layout (tp/pp/dp) not stated by the source")
    tp, pp, cp = (row[k] or 1 for k in ("tp", "pp", "cp"))
    ep, etp, vpp = (row[k] or 1 for k in ("ep", "etp", "vpp"))
    dp = row["dp"]
    if dp is None:
        if num_gpus % (tp * pp * cp):
            raise _Unmappable(f"tp*pp*cp ({tp * pp * cp}) does not divide num_gpus ({num_gpus})")
        dp = num_gpus // (tp * pp * cp)
    if tp * pp * dp * cp != num_gpus:
        raise _Unmappable(f"tp*pp*dp*cp = {tp * pp * dp * cp} != num_gpus ({num_gpus})")
    if (tp * cp * dp) % (ep * etp):
        raise _Unmappable(f"ep*etp ({ep * etp}) does not divide tp*cp*dp ({tp * cp * dp})")
    micro_batch = row["micro_batch_size"]
    if micro_batch is None:
        micro_batch = 1
        notes.append("micro_batch = 1 (not stated)")
    return ParallelConfig(
        tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, vpp=vpp,
        zero=_zero_stage(row, group, notes), micro_batch=micro_batch,
        recompute=_recompute(row, group, notes),
    )


def _zero_stage(row: dict[str, Any], group: str, notes: list[str]) -> int:
    """FSDP FULL_SHARD and Megatron FSDP -> 3, SHARD_GRAD_OP -> 2, ZeRO-1 or the distributed
    optimizer -> 1, DDP without a distributed optimizer -> 0."""
    sharding = (row["dp_sharding"] or "").upper()
    if "FULL_SHARD" in sharding or "MEGATRON FSDP" in sharding:
        return 3
    if "SHARD_GRAD_OP" in sharding:
        return 2
    if "ZERO-1" in sharding or row["distributed_optimizer"] is True:
        return 1
    if "distributed optimizer" in (row["notes"] or ""):
        notes.append("zero = 1: the source's flags imply Megatron's distributed optimizer")
        return 1
    if group == "megatron-bridge" and row["distributed_optimizer"] is None:
        # The table's FSDP = 0 only says Megatron FSDP is off; the performance recipes set
        # ddp.use_distributed_optimizer = true (Megatron-Bridge scripts/performance configs).
        notes.append("zero = 1: Megatron-Bridge performance recipes use the distributed optimizer")
        return 1
    if "DDP" in sharding and row["distributed_optimizer"] is False:
        return 0
    raise _Unmappable(f"data-parallel sharding not stated (dp_sharding {row['dp_sharding']!r})")


def _recompute(row: dict[str, Any], group: str, notes: list[str]) -> str:
    text = (row["activation_recompute"] or "").lower()
    for level in ("full", "selective", "none"):
        if text.startswith(level):
            return level
    if not text and group in ("megatron-lm", "megatron-bridge"):
        notes.append("recompute = selective (not stated; Megatron-Core's default granularity)")
        return "selective"
    raise _Unmappable(f"activation_recompute {row['activation_recompute']!r} not understood")


def _mixed_precision_mode(row: dict[str, Any]) -> str | None:
    """"amp_bf16 (mixed-precision mode DEFAULT)" -> "DEFAULT"; None where not stated."""
    match = re.search(r"mixed-precision mode (\w+)", row["precision"] or "")
    return match.group(1).upper() if match else None


def _precision(row: dict[str, Any], notes: list[str]) -> str:
    text = (row["precision"] or "").lower()
    if "fp8" in text and "128x128 blockwise on h100" in text and row["gpu_type"] == "H100":
        # Megatron-Bridge 25.09's DeepSeek-V3 variant in parentheses: "MXFP8 32x32 on
        # GB200/B200, 128x128 blockwise on H100" (the row's own precision text).
        return "fp8-blockwise"
    if "fp8" in text:
        return "fp8"
    if "bf16" in text:
        return "bf16"
    if not text:
        # A100 bf16 and fp16 peaks are equal; Megatron-LM's H100 MFU is TFLOP/s over the bf16 peak.
        notes.append("precision = bf16 (not stated)")
        return "bf16"
    raise _Unmappable(f"precision {row['precision']!r} not understood")


# ---- cluster ----------------------------------------------------------------------------------

def _cluster(row: dict[str, Any], notes: list[str]) -> ClusterSpec:
    memory = row["gpu_memory_gb"] or 80
    if row["gpu_memory_gb"] is None:
        notes.append(f"{row['gpu_type']} with 80 GB (not stated)")
    preset = PRESETS.get((row["gpu_type"], memory))
    if preset is None:
        raise _Unmappable(f"no preset for {row['gpu_type']} {memory} GB")
    cluster = load_cluster_spec(preset, gpus_per_node=row["gpus_per_node"])
    interconnect = row["interconnect"] or ""
    if "1600 Gbps" in interconnect:
        # LLM Foundry: "1600 Gbps node-node interconnect (RoCE)" per 8-GPU node.
        return _with_fabric(cluster, f"{preset}-roce-1600g", 1600.0)
    if "Omni-Path" in interconnect:
        # BLOOM on Jean Zay: 4 Omni-Path links of 100 Gb/s per node of 8 A100 (bigscience
        # tr11-176B-ml README, "Hardware"); the NVLink tier of the DGX preset is kept.
        return _with_fabric(cluster, f"{preset}-jean-zay-opa", 4 * 100.0)
    if not interconnect:
        notes.append(f"interconnect not stated: preset {preset} as is")
    return cluster


def _with_fabric(cluster: ClusterSpec, name: str, node_line_rate_gbit_per_s: float) -> ClusterSpec:
    """The cluster with its network tier's bandwidth rebuilt from a node's line rate:
    Gb/s per node / 8 bits / GPUs per node x NETWORK_EFFICIENCY, as the presets do
    (1600 Gb/s per 8 GPUs -> 25 GB/s -> 20 GB/s; 400 Gb/s per 8 GPUs -> 6.25 -> 5 GB/s).
    The preset's fabric latency is kept."""
    per_gpu_gb_per_s = node_line_rate_gbit_per_s / 8.0 / cluster.gpus_per_node
    data = cluster.model_dump()
    for tier in data["tiers"]:
        if tier["kind"] == "network":
            tier["bandwidth_gb_per_s"] = per_gpu_gb_per_s * NETWORK_EFFICIENCY
    data["name"] = name
    return ClusterSpec.model_validate(data)


# ---- measured throughput ----------------------------------------------------------------------

def _measured_tokens_per_gpu(row: dict[str, Any], notes: list[str]) -> tuple[float, str]:
    num_gpus, seq_len = row["num_gpus"], row["seq_len"]
    if row["tokens_per_sec_per_gpu"] is not None:
        return float(row["tokens_per_sec_per_gpu"]), "tokens_per_sec_per_gpu"
    if row["tokens_per_sec_total"] is not None:
        return row["tokens_per_sec_total"] / num_gpus, "tokens_per_sec_total"
    if row["samples_per_sec"] is not None:
        return row["samples_per_sec"] * seq_len / num_gpus, "samples_per_sec"
    if row["step_time_s"] is not None:
        tokens = row["global_batch_size"] * seq_len
        return tokens / row["step_time_s"] / num_gpus, "step_time_s"
    convention = row["flops_convention"] or ""
    if row["tflops_per_gpu"] is not None and convention.startswith("Megatron model FLOPs"):
        notes.append("throughput from TFLOP/s / Megatron model FLOPs per token")
        return row["tflops_per_gpu"] * 1e12 / megatron_flops_per_token(row), "tflops_per_gpu"
    raise _Unmappable("no measured throughput that converts to tokens/s")
