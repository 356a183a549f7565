"""What the pipeline stages of each candidate hold, for the step time (solver.cost.step.steptime).

A candidate's stages are described by S stage rows, each with its layers of every kind (dense,
MoE and a block pattern's others), the layers it recomputes in full and whether it is the last
stage (LM head, loss, MTP), and by the sums over all its stages (what the bubble reads). The
even split groups the pp x vpp virtual stages of solver.cost.memory.layout into their distinct
rows (a 126-layer model on pp 8 has two: 15 and 16 layers) and keeps only those that may be
the slowest: a row that holds no more of any kind than another, and is last only where that
one is, takes no longer whatever the per-layer times (all are >= 0). A hybrid's block pattern
makes most of its pp stages distinct, and few of them undominated. A given layout has one row
per pipeline rank.
"""

from __future__ import annotations

import functools

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL
from solver.cost.distinct import distinct_inverse
from solver.cost.memory.layout import (
    estimate_stage_kind_layers,
    layer_kinds,
    layout_layer_counts,
    num_layer_kinds,
)
from solver.spec import ModelSpec, ParallelConfig, PipelineLayout


@dataclass(frozen=True)
class StageTimeContent:
    """What the stages of each candidate hold, for the step time, as tables that candidates
    share: candidate n reads table row `table[n]` (the even splits of many candidates are a
    few). Each table row has S stage rows that may be its slowest (the first `num_rows`; the
    rest pad), and over all its stages the layers and recomputed layers of each kind and the
    number of stages. layers, recompute: (T, S, kinds); is_last: (T, S); num_rows,
    num_stages: (T,); total_layers, total_recompute: (T, kinds); table: (N,)."""

    layers: np.ndarray
    recompute: np.ndarray
    is_last: np.ndarray
    num_rows: np.ndarray
    total_layers: np.ndarray
    total_recompute: np.ndarray
    num_stages: np.ndarray
    table: np.ndarray

    @classmethod
    def of_stages(cls, layers: np.ndarray, recompute: np.ndarray, is_last: np.ndarray,
                  num_stages: np.ndarray) -> StageTimeContent:
        """One table row per candidate, one stage row per stage (the first `num_stages`; the
        rest pad and hold nothing)."""
        return cls(layers=layers, recompute=recompute, is_last=is_last,
                   num_rows=np.asarray(num_stages, dtype=np.int64),
                   total_layers=layers.sum(axis=1), total_recompute=recompute.sum(axis=1),
                   num_stages=np.asarray(num_stages, dtype=float),
                   table=np.arange(len(layers)))


def layout_stage_time_content(model_spec: ModelSpec, configs: Sequence[ParallelConfig],
                              layouts: Sequence[PipelineLayout]) -> StageTimeContent:
    """What the stages of each configuration hold under its layout: one stage row per
    pipeline rank, the last one holding the LM head."""
    kinds, num_kinds = layer_kinds(model_spec), num_layer_kinds(model_spec)
    width = max(config.pp for config in configs)
    layers = np.zeros((len(configs), width, num_kinds))
    recompute = np.zeros((len(configs), width, num_kinds))
    is_last = np.zeros((len(configs), width))
    for row, (config, layout) in enumerate(zip(configs, layouts)):
        assert (layout.pp, layout.vpp) == (config.pp, config.vpp)
        layers[row, :config.pp], recompute[row, :config.pp] = layout_layer_counts(
            kinds, layout, num_kinds)
        is_last[row, config.pp - 1] = 1.0
    return StageTimeContent.of_stages(layers, recompute, is_last,
                                      np.array([config.pp for config in configs]))


@functools.lru_cache(maxsize=4096)
def _even_stages(model_spec: ModelSpec, pp: int, vpp: int, embedding_slots: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct stages of the even split of pp x vpp (layers of each kind: dense, MoE and a
    block pattern's others; whether last) that no other stage dominates (module docstring),
    and the layers of each kind over all pp stages; the search asks for the same few splits
    many times."""
    stage = np.arange(pp)
    kinds = estimate_stage_kind_layers(model_spec, np.full(pp, pp), np.full(pp, vpp), stage,
                                       embedding_slots)
    seen = np.column_stack([kinds, stage == pp - 1]).astype(float)
    distinct = np.unique(seen, axis=0)
    # Row i is dominated where another row holds at least as much of everything (and, being
    # distinct, more of something).
    covers = (distinct[None, :, :] >= distinct[:, None, :]).all(axis=2)
    np.fill_diagonal(covers, False)
    kept = distinct[~covers.any(axis=1)]
    totals = kinds.sum(axis=0).astype(float)
    kept.flags.writeable = totals.flags.writeable = False
    return kept, totals


def even_stage_time_content(model_spec: ModelSpec, d: dict[str, np.ndarray],
                            embedding_slots: bool = False) -> StageTimeContent:
    """The stages of each candidate's even split (solver.cost.memory.layout) that may be its
    slowest, and its sums over all stages: one table row per (pp, vpp, full recompute); every
    layer recomputes where the candidate recomputes in full."""
    pp, vpp = d["pp"], d["vpp"]
    width = int(vpp.max(initial=1)) + 1
    full = (d["recompute"] == RECOMPUTE_FULL).astype(np.int64)
    keys, table_of = distinct_inverse((pp * width + vpp) * 2 + full)
    rows = [_even_stages(model_spec, int(key // 2 // width), int(key // 2 % width),
                         embedding_slots) for key in keys]
    num_rows = np.array([len(kept) for kept, _ in rows], dtype=np.int64)
    num_kinds = num_layer_kinds(model_spec)
    table = np.zeros((len(keys), int(num_rows.max(initial=1)), num_kinds + 1))
    totals = np.zeros((len(keys), num_kinds))
    for index, (kept, total) in enumerate(rows):
        table[index, :len(kept)] = kept
        totals[index] = total
    layers = table[:, :, :num_kinds]
    recomputed = (keys % 2 == 1).astype(float)
    return StageTimeContent(layers=layers, recompute=layers * recomputed[:, None, None],
                            is_last=table[:, :, num_kinds], num_rows=num_rows,
                            total_layers=totals,
                            total_recompute=totals * recomputed[:, None],
                            num_stages=(keys // 2 // width).astype(float), table=table_of)
