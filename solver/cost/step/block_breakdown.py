"""A configuration's time and memory split by block kind (the `estimate` breakdown of a model
with a block pattern): read off the layout coefficients (solver.cost.step.layout_terms), so the
split is the very cost model `estimate` composes, not a second one.

Per kind present in the model: its layers, one layer's forward + backward seconds per
micro-batch (exposed TP / CP / EP traffic included) and what full recompute adds, its seconds
per step summed over every stage (layers x seconds x micro-batches: the work, not the critical
path) and that work's share, and one layer's bytes per GPU on the worst stage (states and its
in-flight activations) with that stage's layers of the kind.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.step.layout_terms import estimate_layout_coefficients
from solver.cost.memory.layout import build_default_layout, layout_layer_counts
from solver.cost.memory.options import MemoryOptions
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig, PipelineLayout


@dataclass(frozen=True)
class BlockKindCost:
    """One block kind's share of a configuration (module docstring)."""

    kind: str
    layers: int
    seconds_per_layer: float
    recompute_seconds_per_layer: float
    step_seconds: float
    work_share: float
    bytes_per_layer: float
    layers_on_worst_stage: int


def name_kind(mixer: str, mlp: str) -> str:
    """"mamba", "full_attention + moe", "dense" (an MLP-only layer)..."""
    return " + ".join(part for part in (mixer, mlp) if part != "none")


def estimate_block_breakdown(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                             config: ParallelConfig, options: MemoryOptions | None = None,
                             constants: TimeConstants | None = None,
                             layout: PipelineLayout | None = None) -> list[BlockKindCost]:
    """The per-kind split of `config` under `layout` (None: the even split)."""
    options = options or MemoryOptions()
    co = estimate_layout_coefficients(model_spec, cluster, job, config, options, constants)
    layout = layout or build_default_layout(model_spec, config, options)
    layers, recompute = layout_layer_counts(co.kinds, layout, len(co.layer_s))
    worst = int(np.argmax(co.memory_bytes(layers, recompute)))
    counts = np.bincount(co.kinds, minlength=len(co.layer_s))
    work = counts * co.layer_s * co.num_micro + recompute.sum(axis=0) * co.recompute_s * co.num_micro
    total = float(work.sum()) or 1.0
    return [BlockKindCost(kind=name_kind(*model_spec.block_kinds[k]), layers=int(counts[k]),
                          seconds_per_layer=float(co.layer_s[k]),
                          recompute_seconds_per_layer=float(co.recompute_s[k]),
                          step_seconds=float(work[k]), work_share=float(work[k]) / total,
                          bytes_per_layer=float(co.layer_bytes[worst, k]),
                          layers_on_worst_stage=int(layers[worst, k]))
            for k in np.flatnonzero(counts)]
