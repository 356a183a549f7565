"""Megatron's layer-level CPU offloading (--cpu-offloading-num-layers N): the activations the
first N decoder layers save for backward leave the GPU (MemoryOptions.cpu_offloading_num_layers).

Megatron wraps each decoder layer's forward in Transformer Engine's offload context
(megatron/core/transformer/transformer_block.py: get_cpu_offload_context(cpu_offloading,
cpu_offloading_num_layers, num_layers, ...)). Under its default scheduling "First num_layers
layers are offloaded to CPU" and "At most (model_layers - num_layers) sets of activations are
on GPU at any time" (TransformerEngine docs/features/other_optimizations/cpu_offloading/
cpu_offloading.rst @d0067d0, Default Offloading Scheduling): at the end of the forward the last
L - N layers' sets are held, so the stage keeps its activations less those of the first N
layers, counted per layer kind in model order. Megatron refuses it with pipeline parallelism
or any recompute (transformer_config.py: "no support for Pipeline parallelism with CPU
offloading", "CPU offloading does not work when activation recomputation is enabled"), so it
saves memory only on such candidates (one stage, one micro-batch in flight); the checks and the
search's pins (solver.cost.step.offload.check_layer_offload) keep the others out.

Worked number: DeepSeek-V3's 61 layers, 3 dense first: N = 20 offloads 3 dense and 17 MoE
layers' activations.
"""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import RECOMPUTE_NONE, Candidates
from solver.spec import ModelSpec


def estimate_offloaded_layer_counts(model_spec: ModelSpec, num_offloaded: int) -> np.ndarray:
    """The first `num_offloaded` decoder layers counted by kind (the memory model's kind
    columns: dense, MoE, then a block pattern's other kinds)."""
    if model_spec.has_block_kinds:
        kinds = model_spec.layer_kind_indices
    else:
        kinds = tuple(int(model_spec.is_moe and i >= model_spec.first_k_dense_layers
                          and i % model_spec.moe_layer_freq == 0)
                      for i in range(model_spec.num_hidden_layers))
    width = max(2, max(kinds) + 1)
    return np.bincount(np.asarray(kinds[:num_offloaded], dtype=np.int64), minlength=width)


def estimate_layer_offload_saved_bytes(model_spec: ModelSpec, candidates: Candidates,
                                       num_offloaded: int, layer_bytes: np.ndarray) -> np.ndarray:
    """Activation bytes per GPU the offload takes off each candidate's (only) stage: the first
    `num_offloaded` layers' `layer_bytes` (N, kinds: one micro-batch of a layer of each kind),
    where Megatron runs it (pp 1, no recompute), else 0."""
    if not num_offloaded:
        return np.zeros(len(candidates))
    counts = estimate_offloaded_layer_counts(model_spec, num_offloaded)
    width = min(len(counts), layer_bytes.shape[1])
    saved = layer_bytes[:, :width] @ counts[:width].astype(float)
    runs = (candidates.pp == 1) & (candidates.recompute == RECOMPUTE_NONE)
    return np.where(runs, saved, 0.0)
