"""Per-GPU memory of a pipeline stage, itemized; the worst stage of each candidate; every stage
of one configuration. One implementation: the single-configuration path evaluates the same
vectorised function with one row per stage."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.distinct import distinct_inverse
from solver.cost.memory.layout import (
    estimate_in_flight,
    estimate_stage_kind_layers,
    estimate_stage_layers,
    estimate_stage_layout,
    layer_kinds,
    layout_layer_counts,
    num_layer_kinds,
)
from solver.cost.memory.options import MemoryOptions
from solver.cost.memory.terms import (
    ITEMS,
    MAIN_ITEMS,
    OTHER_ITEMS,
    MemoryTerms,
    StageContent,
    compose_stage_memory,
    compose_stage_total,
    estimate_memory_terms,
)
from solver.cost.memory.views import (
    allocator_items,
    estimate_memory_views,
    estimate_memory_views_with_room,
)
from solver.spec import JobSpec, ModelSpec, ParallelConfig, PipelineLayout

__all__ = ["ITEMS", "MAIN_ITEMS", "OTHER_ITEMS"]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU by item (ITEMS order), one entry per row; `stage` is the pipeline stage
    each row describes; `allocator_items`: the items PyTorch's caching allocator holds
    (solver.cost.memory.views.allocator_items). `other` sums OTHER_ITEMS; `views` gives the
    allocated, reserved and device bytes (solver.cost.memory.views); `total`, everything, is
    the device view."""

    stage: np.ndarray
    items: dict[str, np.ndarray]
    allocator_items: tuple[str, ...]

    @property
    def other(self) -> np.ndarray:
        return sum((self.items[name] for name in OTHER_ITEMS), np.zeros(len(self.stage)))

    @property
    def views(self) -> dict[str, np.ndarray]:
        return estimate_memory_views(self.items, self.allocator_items)

    @property
    def total(self) -> np.ndarray:
        return self.views["device"]

    def views_with_room(self, capacity_bytes: float) -> dict[str, np.ndarray]:
        """The views on a GPU of `capacity_bytes`, the allocator's cache grown into its room
        (solver.cost.memory.views.estimate_memory_views_with_room); fits are unchanged."""
        return estimate_memory_views_with_room(self.views, capacity_bytes)

    def take(self, index: np.ndarray | int) -> MemoryBreakdown:
        index = np.atleast_1d(index)
        return MemoryBreakdown(self.stage[index], {k: v[index] for k, v in self.items.items()},
                               self.allocator_items)

    def __len__(self) -> int:
        return int(self.stage.shape[0])


def even_stage_content(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                       stage: np.ndarray, embedding_slots: bool = False) -> StageContent:
    """What stage `stage` of each candidate holds under the even split
    (solver.cost.memory.layout): its layers by kind, all recomputing where the candidate
    recomputes in full."""
    layout = estimate_stage_layout(model_spec, job, candidates, stage, embedding_slots)
    layers = (layout.kind_layers if layout.kind_layers is not None
              else np.stack([layout.num_dense_layers, layout.num_moe_layers], axis=1))
    full = (candidates.recompute == RECOMPUTE_FULL)[:, None]
    return StageContent(layers=layers, recompute=np.where(full, layers, 0.0),
                        is_first=layout.is_first, is_last=layout.is_last,
                        in_flight=layout.in_flight)


def estimate_stage_memory(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                          stage: np.ndarray | int, options: MemoryOptions | None = None,
                          terms: MemoryTerms | None = None) -> MemoryBreakdown:
    """Itemized bytes per GPU on pipeline stage `stage` (0-based, per candidate) of each
    candidate under the even split: weights, grads, optimizer, activations and the OTHER_ITEMS
    overheads.

        total = states (ZeRO 0-3) + activations (Korthikanti, in-flight micro-batches)
                + logits (last stage) + ZeRO-3 gathers + buckets + CUDA context + NCCL
                + fragmentation * (everything allocated)
    Sources in the item functions (states, activations, overheads) and MemoryOptions; the
    composition in solver.cost.memory.terms. `terms`: the candidates' MemoryTerms when the
    caller has them already.
    Worked number: Llama-3.1-8B, 8 GPUs, dp = 8, ZeRO-1, b = 4, s = 8192, no recompute:
    weights 16.1 + grads 32.1 + optimizer 12.0 + activations 116.6 + logits 25.2 + buckets
    0.3 = 202.4 GB allocated (the dgxc log: 194.4 GB peak allocated, notes §3.2); with the
    CUDA context, NCCL and 12% fragmentation, 229.4 GB (the device view; the views:
    solver.cost.memory.views).
    """
    options = options or MemoryOptions()
    stage = np.broadcast_to(np.asarray(stage, dtype=np.int64), (len(candidates),))
    content = even_stage_content(model_spec, job, candidates, stage,
                                 options.account_for_embedding_in_pipeline_split)
    terms = terms if terms is not None else estimate_memory_terms(model_spec, job, candidates,
                                                                  options)
    return MemoryBreakdown(stage=stage.copy(), items=compose_stage_memory(terms, content),
                           allocator_items=allocator_items(options))


def estimate_layout_memory(model_spec: ModelSpec, job: JobSpec, config: ParallelConfig,
                           layout: PipelineLayout, options: MemoryOptions | None = None
                           ) -> MemoryBreakdown:
    """Every pipeline stage of one configuration under `layout` (row i = stage i): the same
    composition as the even split, with the layout's layers and recompute per stage."""
    options = options or MemoryOptions()
    rows = Candidates.from_configs([config] * config.pp)
    stage = np.arange(config.pp)
    layers, recompute = layout_layer_counts(layer_kinds(model_spec), layout,
                                            num_layer_kinds(model_spec))
    num_micro = np.full(config.pp, max(job.global_batch // (config.dp * config.micro_batch), 1))
    content = StageContent(layers=layers, recompute=recompute, is_first=stage == 0,
                           is_last=stage == config.pp - 1,
                           in_flight=estimate_in_flight(rows, stage, num_micro))
    terms = estimate_memory_terms(model_spec, job, rows, options)
    return MemoryBreakdown(stage=stage, items=compose_stage_memory(terms, content),
                           allocator_items=allocator_items(options))


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
    _, stage = estimate_memory_total(model_spec, job, candidates, options)
    return estimate_stage_memory(model_spec, job, candidates, stage, options)


def estimate_memory_total(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                          options: MemoryOptions | None = None
                          ) -> tuple[np.ndarray, np.ndarray]:
    """The worst stage's total bytes per GPU of each candidate, and which stage it is (the
    first of equals): estimate_memory without the items, for the search."""
    options = options or MemoryOptions()
    totals = estimate_memory_terms(model_spec, job, candidates, options, totals=True)
    slots = options.account_for_embedding_in_pipeline_split

    def total(rows: np.ndarray, position: int) -> np.ndarray:
        content = even_stage_content(model_spec, job, candidates.take(rows),
                                     np.full(len(rows), position), slots)
        return compose_stage_total(totals.take(rows), content)

    everyone = np.arange(len(candidates))
    worst, stage = total(everyone, 0), np.zeros(len(candidates), dtype=np.int64)
    # The layers a stage holds depend on (pp, vpp) and the position only: work them out once
    # per distinct pair, for every position at once.
    width = int(candidates.vpp.max(initial=1)) + 1
    keys, pair_of = distinct_inverse(candidates.pp * width + candidates.vpp)
    pairs = np.stack([keys // width, keys % width], axis=1)
    evaluate = _stages_to_evaluate(model_spec, pairs, int(candidates.pp.max(initial=1)),
                                   options)
    for position in np.flatnonzero(evaluate.any(axis=0)):
        held = np.flatnonzero(evaluate[pair_of, position])
        here = total(held, int(position))
        pick = here > worst[held]
        worst[held[pick]] = here[pick]
        stage[held[pick]] = position
    return worst, stage


def _stages_to_evaluate(model_spec: ModelSpec, pairs: np.ndarray, num_positions: int,
                        options: MemoryOptions) -> np.ndarray:
    """[pair, position]: whether stage `position` (>= 1) of (pp, vpp) = pairs[pair] must be
    evaluated: it exists, and it is the last stage or holds other layers than the stage before
    it (estimate_memory's docstring says why the others cannot be the worst)."""
    pp, vpp = pairs[:, 0], pairs[:, 1]
    position = np.arange(num_positions)
    exists = position[None, :] < pp[:, None]
    changed = np.zeros_like(exists)
    if model_spec.is_hybrid:  # any kind's count changes
        kinds = estimate_stage_kind_layers(
            model_spec, np.repeat(pp, num_positions), np.repeat(vpp, num_positions),
            np.tile(position, len(pairs)), options.account_for_embedding_in_pipeline_split)
        kinds = kinds.reshape(len(pairs), num_positions, -1)
        changed[:, 1:] = (kinds[:, 1:] != kinds[:, :-1]).any(axis=2)
    else:
        total, moe = estimate_stage_layers(
            model_spec, np.repeat(pp, num_positions), np.repeat(vpp, num_positions),
            np.tile(position, len(pairs)), options.account_for_embedding_in_pipeline_split)
        total = total.reshape(len(pairs), num_positions)
        moe = moe.reshape(len(pairs), num_positions)
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
