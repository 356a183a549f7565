"""Per-GPU memory of a pipeline stage, itemized; the worst stage of each candidate; every stage
of one configuration. One implementation: the single-configuration path evaluates the same
vectorised function with one row per stage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.distinct import distinct_inverse
from solver.cost.memory.activations import estimate_logits_bytes, estimate_stage_activations
from solver.cost.memory.layout import estimate_stage_layers, estimate_stage_layout
from solver.cost.memory.options import MemoryOptions
from solver.cost.memory.overheads import (
    estimate_fixed_bytes,
    estimate_fragmentation_bytes,
    estimate_zero3_gather_bytes,
)
from solver.cost.memory.states import estimate_model_states, estimate_stage_params
from solver.spec import JobSpec, ModelSpec, ParallelConfig

MAIN_ITEMS = ("weights", "grads", "optimizer", "activations")
OTHER_ITEMS = ("logits", "zero3_gather", "comm_buckets", "cuda_context", "nccl", "fragmentation")
ITEMS = MAIN_ITEMS + OTHER_ITEMS
# What PyTorch's caching allocator hands out (the fragmentation applies to these).
ALLOCATED_ITEMS = MAIN_ITEMS + ("logits", "zero3_gather", "comm_buckets")


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by item (ITEMS order), one entry per row; `stage` is the pipeline stage
    each row describes. `other` sums OTHER_ITEMS; `total` sums everything."""

    stage: np.ndarray
    items: dict[str, np.ndarray]

    @property
    def other(self) -> np.ndarray:
        return sum((self.items[name] for name in OTHER_ITEMS), np.zeros(len(self.stage)))

    @property
    def total(self) -> np.ndarray:
        return sum((self.items[name] for name in ITEMS), np.zeros(len(self.stage)))

    def take(self, index: np.ndarray | int) -> MemoryBreakdown:
        index = np.atleast_1d(index)
        return MemoryBreakdown(self.stage[index], {k: v[index] for k, v in self.items.items()})

    def __len__(self) -> int:
        return int(self.stage.shape[0])


def estimate_stage_memory(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                          stage: np.ndarray | int, options: MemoryOptions | None = None,
                          ) -> MemoryBreakdown:
    """Itemized bytes per GPU on pipeline stage `stage` (0-based, per candidate) of each
    candidate: weights, grads, optimizer, activations and the OTHER_ITEMS overheads.

        total = states (ZeRO 0-3) + activations (Korthikanti, in-flight micro-batches)
                + logits (last stage) + ZeRO-3 gathers + buckets + CUDA context + NCCL
                + fragmentation * (everything allocated)
    Sources in the item functions (states, activations, overheads) and MemoryOptions.
    Worked number: Llama-3.1-8B, 8 GPUs, dp = 8, ZeRO-1, b = 4, s = 8192, no recompute:
    weights 16.1 + grads 32.1 + optimizer 12.0 + activations 116.6 + logits 25.2 + buckets
    0.3 = 202.4 GB allocated (the dgxc log: 194.4 GB peak allocated, notes §3.2); with the
    CUDA context, NCCL and 12% fragmentation, 229.4 GB.
    """
    options = options or MemoryOptions()
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(candidates),))
    layout = estimate_stage_layout(model_spec, job, candidates, stage,
                                   options.account_for_embedding_in_pipeline_split)
    params = estimate_stage_params(model_spec, candidates, layout, options)
    items = estimate_model_states(job, candidates, params, options)
    items["activations"] = estimate_stage_activations(model_spec, job, candidates, layout, options)
    items["logits"] = estimate_logits_bytes(model_spec, job, candidates, layout, options)
    items["zero3_gather"] = estimate_zero3_gather_bytes(candidates, params, options)
    items.update(estimate_fixed_bytes(candidates, options))
    allocated = sum(items[name] for name in ALLOCATED_ITEMS)
    items["fragmentation"] = estimate_fragmentation_bytes(allocated, options)
    return MemoryBreakdown(stage=stage.copy(), items={name: items[name] for name in ITEMS})


def estimate_memory(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                    options: MemoryOptions | None = None) -> MemoryBreakdown:
    """The worst (largest total) stage of each candidate, itemized; it decides whether the
    candidate fits. Every stage position is considered, so uneven layer splits and MoE models
    whose first layers are dense are handled (the worst stage is not always the first).

    A stage that holds the same layers (of each kind) as the stage before it, and is not the
    last, is not evaluated: it holds the same states and no more micro-batches in flight
    (estimate_in_flight never grows with the stage), so it is never the worst. Deep pipelines
    of even splits cost one or two stage evaluations instead of pp (tests check the result
    equals evaluating every stage).
    Worked number: DeepSeek-V3, seq 4096, pp 16, ep 64, dp 128, ZeRO-1, full recompute: the
    last stage (3 layers, the MTP module, the LM head and the logits) is the worst, 36.3 GB.
    """
    options = options or MemoryOptions()
    worst = estimate_stage_memory(model_spec, job, candidates, 0, options)
    # The layers a stage holds depend on (pp, vpp) and the position only: work them out once
    # per distinct pair, for every position at once.
    width = int(candidates.vpp.max(initial=1)) + 1
    keys, pair_of = distinct_inverse(candidates.pp * width + candidates.vpp)
    pairs = np.stack([keys // width, keys % width], axis=1)
    evaluate = _stages_to_evaluate(model_spec, pairs, int(candidates.pp.max(initial=1)),
                                   options)
    for position in np.flatnonzero(evaluate.any(axis=0)):
        held = np.flatnonzero(evaluate[pair_of, position])
        here = estimate_stage_memory(model_spec, job, candidates.take(held), int(position),
                                     options)
        pick = here.total > worst.total[held]
        rows = held[pick]
        worst.stage[rows] = position
        for name in ITEMS:
            worst.items[name][rows] = here.items[name][pick]
    return worst


def _stages_to_evaluate(model_spec: ModelSpec, pairs: np.ndarray, num_positions: int,
                        options: MemoryOptions) -> np.ndarray:
    """[pair, position]: whether stage `position` (>= 1) of (pp, vpp) = pairs[pair] must be
    evaluated: it exists, and it is the last stage or holds other layers than the stage before
    it (estimate_memory's docstring says why the others cannot be the worst)."""
    pp, vpp = pairs[:, 0], pairs[:, 1]
    position = np.arange(num_positions)
    total, moe = estimate_stage_layers(
        model_spec, np.repeat(pp, num_positions), np.repeat(vpp, num_positions),
        np.tile(position, len(pairs)), options.account_for_embedding_in_pipeline_split)
    total = total.reshape(len(pairs), num_positions)
    moe = moe.reshape(len(pairs), num_positions)
    exists = position[None, :] < pp[:, None]
    changed = np.zeros_like(exists)
    changed[:, 1:] = (total[:, 1:] != total[:, :-1]) | (moe[:, 1:] != moe[:, :-1])
    last = position[None, :] == pp[:, None] - 1
    evaluate = exists & (changed | last)
    evaluate[:, 0] = False  # stage 0 is evaluated for every candidate
    return evaluate


def estimate_all_stages(model_spec: ModelSpec, job: JobSpec, config: ParallelConfig,
                        options: MemoryOptions | None = None) -> MemoryBreakdown:
    """Every stage of one configuration (row i = stage i), through the vectorised path (the
    `--per-stage` view). Worked number: Llama-3.1-405B, tp 8, pp 2, dp 16, ZeRO-3, seq 8192,
    full recompute: 43.7 GB on stage 0 (2 micro-batches in flight), 42.3 GB on stage 1."""
    rows = Candidates.from_configs([config] * config.pp)
    return estimate_stage_memory(model_spec, job, rows, np.arange(config.pp), options)
