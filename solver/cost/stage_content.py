"""What the pipeline stages of each candidate hold, for the step time (solver.cost.steptime).

A candidate's stages are described by S stage rows, each with its layers of every kind (dense,
MoE and a block pattern's others), the layers it recomputes in full, whether it is the last
stage (LM head, loss, MTP) and how many of its stages are alike. The even split groups the
pp x vpp virtual stages of solver.cost.memory.layout into their distinct rows (a 126-layer
model on pp 8 has two: 15 and 16 layers); a given layout has one row per pipeline rank.
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
    """What the stages of each candidate hold, for the step time: S stage rows per candidate,
    `count` of them alike (0 pads). layers, recompute: (N, S, kinds); is_last, count: (N, S)."""

    layers: np.ndarray
    recompute: np.ndarray
    is_last: np.ndarray
    count: np.ndarray


def layout_stage_time_content(model_spec: ModelSpec, configs: Sequence[ParallelConfig],
                              layouts: Sequence[PipelineLayout]) -> StageTimeContent:
    """What the stages of each configuration hold under its layout: one stage row per
    pipeline rank, the last one holding the LM head."""
    kinds, num_kinds = layer_kinds(model_spec), num_layer_kinds(model_spec)
    width = max(config.pp for config in configs)
    layers = np.zeros((len(configs), width, num_kinds))
    recompute = np.zeros((len(configs), width, num_kinds))
    is_last = np.zeros((len(configs), width))
    count = np.zeros((len(configs), width))
    for row, (config, layout) in enumerate(zip(configs, layouts)):
        assert (layout.pp, layout.vpp) == (config.pp, config.vpp)
        layers[row, :config.pp], recompute[row, :config.pp] = layout_layer_counts(
            kinds, layout, num_kinds)
        is_last[row, config.pp - 1] = 1.0
        count[row, :config.pp] = 1.0
    return StageTimeContent(layers=layers, recompute=recompute, is_last=is_last, count=count)


@functools.lru_cache(maxsize=4096)
def _even_stages(model_spec: ModelSpec, pp: int, vpp: int, embedding_slots: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The distinct stages of the even split of pp x vpp (layers of each kind: dense, MoE and a
    block pattern's others; whether last) and how many stages are alike; the search asks for
    the same few splits many times."""
    stage = np.arange(pp)
    kinds = estimate_stage_kind_layers(model_spec, np.full(pp, pp), np.full(pp, vpp), stage,
                                       embedding_slots)
    seen = np.column_stack([kinds, stage == pp - 1])
    distinct, counts = np.unique(seen, axis=0, return_counts=True)
    distinct.flags.writeable = counts.flags.writeable = False
    return distinct, counts


def even_stage_time_content(model_spec: ModelSpec, d: dict[str, np.ndarray],
                            embedding_slots: bool = False) -> StageTimeContent:
    """The distinct stages of each candidate's even split (solver.cost.memory.layout) with how
    many stages are alike; every layer recomputes where the candidate recomputes in full."""
    pp, vpp = d["pp"], d["vpp"]
    width = int(vpp.max(initial=1)) + 1
    keys, pair_of = distinct_inverse(pp * width + vpp)
    rows = [_even_stages(model_spec, int(key // width), int(key % width), embedding_slots)
            for key in keys]
    num_rows = max((len(counts) for _, counts in rows), default=1)
    num_kinds = num_layer_kinds(model_spec)
    table = np.zeros((len(keys), num_rows, num_kinds + 1))
    count = np.zeros((len(keys), num_rows))
    for index, (distinct, counts) in enumerate(rows):
        table[index, :len(counts)] = distinct
        count[index, :len(counts)] = counts
    layers = table[pair_of, :, :num_kinds]
    full = (d["recompute"] == RECOMPUTE_FULL)[:, None, None]
    return StageTimeContent(layers=layers, recompute=np.where(full, layers, 0.0),
                            is_last=table[pair_of, :, num_kinds], count=count[pair_of])
