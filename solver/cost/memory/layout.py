"""Which layers a pipeline stage holds, and how many micro-batches it keeps in flight.

A stage holds `vpp` model chunks (virtual stages i, i + pp, ..., i + (vpp-1)*pp). The L decoder
layers are split over the pp*vpp virtual stages in order; when pp*vpp does not divide L the
first L % (pp*vpp) virtual stages take one layer more (conservative: the first stage also holds
the embedding and the most micro-batches in flight). The first stage also holds the embedding,
the last the final norm and LM head (optionally each in a layer slot of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.distinct import distinct_inverse, distinct_rows
from solver.cost.memory.options import MemoryOptions
from solver.spec import JobSpec, ModelSpec, ParallelConfig, PipelineLayout, VirtualStage

# Candidates x virtual chunks below which a stage's chunks are counted in one 2-D pass.
CHUNKS_AT_ONCE = 1 << 16
# Longer candidate arrays are reduced to their distinct (pp, vpp, stage) first.
DISTINCT_ABOVE = 1024


@dataclass(frozen=True)
class StageLayout:
    """Per candidate, for one stage position: its layers by kind and its in-flight work."""

    num_dense_layers: np.ndarray
    num_moe_layers: np.ndarray
    is_first: np.ndarray
    is_last: np.ndarray
    num_microbatches: np.ndarray
    in_flight: np.ndarray
    kind_layers: np.ndarray | None = None  # (N, kinds) with a block pattern

    @property
    def num_layers(self) -> np.ndarray:
        return self.num_dense_layers + self.num_moe_layers


def _count_multiples_below(x: np.ndarray, step: int) -> np.ndarray:
    """How many of 0, step, 2*step, ... are < x (x >= 0)."""
    return (x + step - 1) // step


def _count_moe_layers(model_spec: ModelSpec, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """MoE layers among indices [start, end): i >= first_k_dense_layers, i % freq == 0."""
    if not model_spec.is_moe:
        return np.zeros_like(start)
    first = np.maximum(start, model_spec.first_k_dense_layers)
    freq = model_spec.moe_layer_freq
    count = _count_multiples_below(end, freq) - _count_multiples_below(first, freq)
    return np.where(end > first, count, 0)


def estimate_in_flight(candidates: Candidates, stage: np.ndarray,
                       num_microbatches: np.ndarray) -> np.ndarray:
    """Micro-batches whose activations stage `stage` holds at its peak, in units of "all the
    stage's layers for one micro-batch".

    1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1; Megatron `forward_backward_pipelining_
    without_interleaving`): stage i runs p - i - 1 warm-up forwards, so it holds min(p - i, m).
    Interleaved 1F1B with v chunks (Megatron's warm-up of 2(p - i - 1) + (v - 1)p chunk
    forwards): 2(p - i - 1) + (v - 1)p + 1 chunks of 1/v of the stage's layers, at most m*v.
    Worked number: p = 4, v = 2, stage 0: (6 + 4 + 1)/2 = 5.5 = p(1 + (p-1)/(pv)), the first-
    stage factor of Megatron's theoretical_memory_usage (notes §3.3).
    """
    pp, vpp = candidates.pp, candidates.vpp
    plain = np.minimum(pp - stage, num_microbatches)
    chunks = np.minimum(2 * (pp - stage - 1) + (vpp - 1) * pp + 1, num_microbatches * vpp)
    return np.where(vpp > 1, chunks / vpp, plain).astype(float)


def _chunk_layers(model_spec: ModelSpec, virtual: np.ndarray, per_chunk: np.ndarray,
                  extra: np.ndarray, offset: np.ndarray, held: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Layers (all, MoE) of virtual stage `virtual` (arrays of any one shape): the first
    `extra` virtual stages take per_chunk + 1 slots, the others per_chunk; slot s holds layer
    s - offset (the embedding and head slots hold none); 0 where not `held`."""
    num_layers = model_spec.num_hidden_layers
    first_slot = virtual * per_chunk + np.minimum(virtual, extra)
    start = np.clip(first_slot - offset, 0, num_layers)
    end = np.clip(first_slot + per_chunk + (virtual < extra) - offset, 0, num_layers)
    return (np.where(held, end - start, 0),
            np.where(held, _count_moe_layers(model_spec, start, end), 0))


def estimate_stage_layers(model_spec: ModelSpec, pp: np.ndarray, vpp: np.ndarray,
                          stage: np.ndarray, embedding_slots: bool = False
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(all, MoE) decoder layers on stage `stage` under (pp, vpp), element-wise; each distinct
    (pp, vpp, stage) is worked out once (candidate arrays repeat a few of them many times)."""
    pp, vpp, stage = np.broadcast_arrays(np.asarray(pp, dtype=np.int64),
                                         np.asarray(vpp, dtype=np.int64),
                                         np.asarray(stage, dtype=np.int64))
    if len(pp) > DISTINCT_ABOVE:
        width_v, width_s = int(vpp.max()) + 1, int(stage.max()) + 1
        key = (pp * width_v + vpp) * width_s + stage
        distinct, back = distinct_inverse(key)
        total, moe = _count_stage_layers(
            model_spec, distinct // (width_v * width_s), distinct // width_s % width_v,
            distinct % width_s, embedding_slots)
        return total[back], moe[back]
    return _count_stage_layers(model_spec, pp, vpp, stage, embedding_slots)


def _count_stage_layers(model_spec: ModelSpec, pp: np.ndarray, vpp: np.ndarray,
                        stage: np.ndarray, embedding_slots: bool
                        ) -> tuple[np.ndarray, np.ndarray]:
    """estimate_stage_layers on 1-D arrays of one length, element by element."""
    num_virtual = pp * vpp
    offset = np.where(embedding_slots | (num_virtual > model_spec.num_hidden_layers), 1, 0)
    num_slots = model_spec.num_hidden_layers + 2 * offset
    per_chunk, extra = num_slots // num_virtual, num_slots % num_virtual
    num_chunks = int(vpp.max(initial=0))
    if len(pp) * num_chunks <= CHUNKS_AT_ONCE:  # every chunk in one 2-D pass
        chunk = np.arange(num_chunks)[None, :]
        total, moe = _chunk_layers(model_spec, stage[:, None] + chunk * pp[:, None],
                                   per_chunk[:, None], extra[:, None], offset[:, None],
                                   chunk < vpp[:, None])
        return total.sum(axis=1), moe.sum(axis=1)
    total = np.zeros(len(pp), dtype=np.int64)
    moe = np.zeros(len(pp), dtype=np.int64)
    for chunk in range(num_chunks):
        layers, moe_layers = _chunk_layers(model_spec, stage + chunk * pp, per_chunk, extra,
                                           offset, chunk < vpp)
        total, moe = total + layers, moe + moe_layers
    return total, moe


def estimate_stage_layout(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                          stage: np.ndarray, embedding_slots: bool = False) -> StageLayout:
    """Layers by kind on stage `stage` (an int array, 0-based) of each candidate.

    With `embedding_slots`, or when the virtual stages outnumber the layers, the split is over
    L + 2 slots, the first taken by the embedding and the last by the LM head (Megatron's
    --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split).
    Worked number: DeepSeek-V3 (61 layers, first 3 dense), pp = 16: stages 0-12 hold 4 layers,
    13-15 hold 3; stage 0 = 3 dense + 1 MoE, stage 1 = 4 MoE. BLOOM (70 layers), pp = 12 with
    embedding slots: 72 slots, stage 0 = embedding + 5 layers, stages 1-10 = 6, stage 11 = 5.
    """
    stage = np.asarray(stage, dtype=np.int64)
    pp = candidates.pp
    total, moe = estimate_stage_layers(model_spec, pp, candidates.vpp, stage, embedding_slots)
    num_micro = np.maximum(job.global_batch // (candidates.dp * candidates.micro_batch), 1)
    kind_layers = None
    if model_spec.is_hybrid:  # kinds 0 and 1 are the plain ones; the others apart
        kind_layers = estimate_stage_kind_layers(model_spec, pp, candidates.vpp, stage,
                                                 embedding_slots)
        total, moe = kind_layers[:, 0] + kind_layers[:, 1], kind_layers[:, 1]
    return StageLayout(
        num_dense_layers=(total - moe).astype(float),
        num_moe_layers=moe.astype(float),
        is_first=stage == 0,
        is_last=stage == pp - 1,
        num_microbatches=num_micro,
        in_flight=estimate_in_flight(candidates, stage, num_micro),
        kind_layers=kind_layers,
    )


def layer_kinds(model_spec: ModelSpec) -> np.ndarray:
    """The kind of each decoder layer in model order: 0 dense, 1 MoE (layer i is MoE when
    i >= first_k_dense_layers and i % moe_layer_freq == 0, as _count_moe_layers counts); with
    a block pattern, the index into ModelSpec.block_kinds (0 and 1 the same two kinds)."""
    if model_spec.is_hybrid:
        return np.asarray(model_spec.layer_kind_indices, dtype=np.int64)
    index = np.arange(model_spec.num_hidden_layers)
    return _count_moe_layers(model_spec, index, index + 1).astype(np.int64)


def num_layer_kinds(model_spec: ModelSpec) -> int:
    """How many layer kinds the cost arrays carry: dense and MoE, and a block pattern's others."""
    return len(model_spec.block_kinds) if model_spec.is_hybrid else 2


def layout_layer_counts(kinds: np.ndarray, layout: PipelineLayout, num_kinds: int = 2
                        ) -> tuple[np.ndarray, np.ndarray]:
    """(layers, recomputed layers) by kind, arrays (pp, num_kinds), of each pipeline stage
    under `layout`: virtual stage v holds the next `layers` decoder layers in model order and
    runs on stage v % pp; its first `recompute_layers` recompute (Megatron's block method).
    `kinds`: layer_kinds of the model."""
    num_kinds = max(num_kinds, int(kinds.max(initial=0)) + 1)
    layers = np.zeros((layout.pp, num_kinds))
    recompute = np.zeros((layout.pp, num_kinds))
    start = 0
    for virtual, chunk in enumerate(layout.stages):
        stage = layout.stage_of(virtual)
        layers[stage] += np.bincount(kinds[start:start + chunk.layers], minlength=num_kinds)
        recompute[stage] += np.bincount(kinds[start:start + chunk.recompute_layers],
                                        minlength=num_kinds)
        start += chunk.layers
    return layers, recompute


def estimate_stage_kind_layers(model_spec: ModelSpec, pp: np.ndarray, vpp: np.ndarray,
                               stage: np.ndarray, embedding_slots: bool = False) -> np.ndarray:
    """Decoder layers of each kind (N, num_layer_kinds) on stage `stage` under (pp, vpp), the
    even split of estimate_stage_layers: (dense, MoE) for a plain model; with a block pattern
    each distinct (pp, vpp, stage) is split by build_even_layout and its kinds counted."""
    if not model_spec.is_hybrid:
        total, moe = estimate_stage_layers(model_spec, pp, vpp, stage, embedding_slots)
        return np.stack([total - moe, moe], axis=1)
    pp, vpp, stage = np.broadcast_arrays(np.asarray(pp, dtype=np.int64),
                                         np.asarray(vpp, dtype=np.int64),
                                         np.asarray(stage, dtype=np.int64))
    # A few hundred distinct (pp, vpp, stage) among up to a million rows: count those.
    first, back = distinct_rows({"pp": pp, "vpp": vpp, "stage": stage}, ("pp", "vpp", "stage"))
    if len(first) < len(pp):
        return _kind_layers(model_spec, pp[first], vpp[first], stage[first],
                            embedding_slots)[back]
    return _kind_layers(model_spec, pp, vpp, stage, embedding_slots)


def _kind_layers(model_spec: ModelSpec, pp: np.ndarray, vpp: np.ndarray, stage: np.ndarray,
                 embedding_slots: bool) -> np.ndarray:
    """estimate_stage_kind_layers of a block pattern, row by row (arrays of one length)."""
    num_layers = model_spec.num_hidden_layers
    # D_k(x): layers of kind k among the first x, for x = 0..L.
    prefix = np.zeros((num_layers + 1, num_layer_kinds(model_spec)))
    prefix[1:] = np.cumsum(np.eye(prefix.shape[1])[layer_kinds(model_spec)], axis=0)
    num_virtual = pp * vpp
    offset = np.where(embedding_slots | (num_virtual > num_layers), 1, 0)
    per_chunk, extra = (num_layers + 2 * offset) // num_virtual, (num_layers + 2 * offset) % num_virtual
    counts = np.zeros((len(pp), prefix.shape[1]))
    for chunk in range(int(vpp.max(initial=0))):  # as _chunk_layers splits the slots
        virtual = stage + chunk * pp
        first_slot = virtual * per_chunk + np.minimum(virtual, extra)
        start = np.clip(first_slot - offset, 0, num_layers)
        end = np.clip(first_slot + per_chunk + (virtual < extra) - offset, 0, num_layers)
        held = (chunk < vpp)[:, None]
        counts += np.where(held, prefix[end] - prefix[start], 0.0)
    return counts


def build_even_layout(model_spec: ModelSpec, pp: int, vpp: int, recompute_full: bool,
                      embedding_slots: bool = False, mtp_layers: int = 0) -> PipelineLayout:
    """The split estimate_stage_layout costs, as a PipelineLayout: pp x vpp virtual stages
    (over L + 2 slots when the embedding and the loss take one each, or when the virtual stages
    outnumber the layers), the first ones one layer more; every layer recomputing when
    `recompute_full`."""
    num_virtual = pp * vpp
    offset = 1 if embedding_slots or num_virtual > model_spec.num_hidden_layers else 0
    per_chunk, extra = divmod(model_spec.num_hidden_layers + 2 * offset, num_virtual)
    sizes = [per_chunk + (1 if v < extra else 0) for v in range(num_virtual)]
    sizes[0] -= offset
    sizes[-1] -= offset
    stages = [VirtualStage(layers=n, recompute_layers=n if recompute_full else 0,
                           embedding=v == 0, loss=v == num_virtual - 1,
                           mtp_layers=mtp_layers if v == num_virtual - 1 else 0)
              for v, n in enumerate(sizes)]
    return PipelineLayout(pp=pp, vpp=vpp, stages=tuple(stages))


def build_default_layout(model_spec: ModelSpec, config: ParallelConfig,
                         options: MemoryOptions) -> PipelineLayout:
    """The even split of `config`'s layers under the memory options (embedding and loss
    slots, the MTP modules): what `optimize --engine even` and `estimate` without --layout
    cost."""
    return build_even_layout(
        model_spec, config.pp, config.vpp, config.recompute == "full",
        options.account_for_embedding_in_pipeline_split,
        model_spec.mtp_depths if options.include_mtp else 0)
