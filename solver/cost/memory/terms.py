"""The memory of a pipeline stage as an affine function of what the stage holds.

A stage holds, per layer kind k (KINDS: dense, MoE, then a block pattern's other kinds,
solver.cost.layers.blocks), `layers[k]` decoder layers of which
`recompute[k]` recompute in full; it is or is not the first stage (the embedding) and the last
(final norm, LM head, loss, MTP modules, logits); it keeps `in_flight` micro-batches of
activations at its peak (solver.cost.memory.layout.estimate_in_flight). Per GPU, by item:

    bytes = fixed + sum_k layers[k] * (per_layer[k] + in_flight * per_layer_in_flight[k])
                  + sum_k recompute[k] * in_flight * recompute_in_flight[k]
                  + is_first * (first + in_flight * first_in_flight)
                  + is_last * last + (1 - is_last) * in_flight * not_last_in_flight
                  + (some layer recomputes) * working
    fragmentation = options.fragmentation * (the allocated items)

`estimate_memory_terms` works out every coefficient from the item functions (states,
activations, overheads), once per candidate; `compose_stage_memory` is the one composition: the
even split of `parplan optimize`, any layout of `parplan estimate --layout` and the integer
coefficients of the layout program (solver.search.layout_program) all go through it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory.activations import estimate_activation_terms
from solver.cost.memory.dispatcher import estimate_dispatcher_bytes
from solver.cost.memory.layer_offload import estimate_layer_offload_saved_bytes
from solver.cost.memory.loss import estimate_logits_bytes
from solver.cost.memory.options import MemoryOptions
from solver.cost.layers.finetune import (
    estimate_adapter_params,
    estimate_base_weight_bytes_per_param,
)
from solver.cost.memory.overheads import (
    estimate_fixed_bytes,
    estimate_frozen_zero3_gather_bytes,
    estimate_pipeline_grad_buffer_bytes,
    estimate_zero3_gather_bytes,
)
from solver.cost.layers.blocks import hybrid_kinds
from solver.cost.memory.states import (
    StageParams,
    estimate_kind_stage_params,
    estimate_low_precision_weight_bytes_per_param,
    estimate_model_states,
    estimate_stage_params,
)
from solver.cost.row_memo import RowMemo
from solver.spec import JobSpec, ModelSpec
from solver.spec.job import PARALLEL_FIELDS

KINDS = ("dense", "moe")
# What the memory terms depend on: every degree but vpp.
MEMORY_DEGREES = tuple(f for f in PARALLEL_FIELDS if f != "vpp")
_TERMS = RowMemo(keep=6)
MAIN_ITEMS = ("weights", "grads", "optimizer", "activations")
OTHER_ITEMS = ("logits", "zero3_gather", "comm_buckets", "dispatcher", "cuda_context", "nccl",
               "fragmentation")
ITEMS = MAIN_ITEMS + OTHER_ITEMS
# What PyTorch's caching allocator hands out (the fragmentation applies to these).
ALLOCATED_ITEMS = MAIN_ITEMS + ("logits", "zero3_gather", "comm_buckets")
# The items a term holds (fragmentation is derived).
TERM_ITEMS = ITEMS[:-1]
STATE_ITEMS = ("weights", "grads", "optimizer")


@dataclass(frozen=True)
class StageContent:
    """What one pipeline stage holds, one row per candidate (see the module docstring).
    layers, recompute: (N, len(KINDS)); the rest (N,)."""

    layers: np.ndarray
    recompute: np.ndarray
    is_first: np.ndarray
    is_last: np.ndarray
    in_flight: np.ndarray


@dataclass(frozen=True)
class MemoryTerms:
    """Coefficients of the stage memory, bytes per GPU: arrays (N, len(TERM_ITEMS)) for the
    per-stage terms and (N, len(KINDS), len(TERM_ITEMS)) for the per-layer ones."""

    fixed: np.ndarray
    per_layer: np.ndarray
    per_layer_in_flight: np.ndarray
    recompute_in_flight: np.ndarray
    first: np.ndarray
    first_in_flight: np.ndarray
    last: np.ndarray
    not_last_in_flight: np.ndarray
    working: np.ndarray
    fragmentation: float

    def totals(self) -> MemoryTerms:
        """The same terms with their items summed, fragmentation folded in (one item left):
        for compose_stage_total."""
        weight = np.array([1.0 + (self.fragmentation if name in ALLOCATED_ITEMS else 0.0)
                           for name in TERM_ITEMS])
        values = {name: (getattr(self, name) @ weight)[..., None]
                  for name in self.__dataclass_fields__ if name != "fragmentation"}
        return MemoryTerms(fragmentation=0.0, **values)

    def take(self, index: np.ndarray) -> MemoryTerms:
        values = {name: getattr(self, name)[index] for name in self.__dataclass_fields__
                  if name != "fragmentation"}
        return MemoryTerms(fragmentation=self.fragmentation, **values)


class _Counts:
    """The attributes estimate_stage_params reads, for a stage of given counts."""

    def __init__(self, n: int, dense: float, moe: float, first: bool, last: bool) -> None:
        self.num_dense_layers = np.full(n, dense)
        self.num_moe_layers = np.full(n, moe)
        self.is_first = np.full(n, first)
        self.is_last = np.full(n, last)


def _item_matrix(n: int, values: dict[str, np.ndarray]) -> np.ndarray:
    out = np.zeros((n, len(TERM_ITEMS)))
    for name, value in values.items():
        out[:, TERM_ITEMS.index(name)] = value
    return out


def estimate_memory_terms(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                          options: MemoryOptions | None = None, totals: bool = False
                          ) -> MemoryTerms:
    """Every coefficient of the stage memory of each candidate (module docstring). The model
    states are linear in the parameters a stage holds, so a layer's states are those of a stage
    holding that one layer. ZeRO-3 gathers the model's largest layer (whichever stage).
    `totals`: MemoryTerms.totals() of the answer (summed before the rows are indexed)."""
    options = options or MemoryOptions()
    # Nothing here reads vpp: worked out once per distinct other degrees, and kept for the
    # search's later calls (solver.cost.row_memo).
    arrays = {name: getattr(candidates, name) for name in PARALLEL_FIELDS}
    kept = _TERMS.rows((model_spec, job), (options, totals), arrays, MEMORY_DEGREES,
                       lambda rows: _as_arrays(_memory_terms(model_spec, job, Candidates(**rows),
                                                             options, totals)))
    return MemoryTerms(fragmentation=0.0 if totals else options.fragmentation, **kept)


def _as_arrays(terms: MemoryTerms) -> dict[str, np.ndarray]:
    return {name: getattr(terms, name) for name in terms.__dataclass_fields__
            if name != "fragmentation"}


def _memory_terms(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                  options: MemoryOptions, totals: bool) -> MemoryTerms:
    """estimate_memory_terms of distinct candidates."""
    n = len(candidates)

    def params(dense: float = 0, moe: float = 0, first: bool = False, last: bool = False
               ) -> StageParams:
        return estimate_stage_params(model_spec, candidates, _Counts(n, dense, moe, first, last),
                                     options, job.finetune)

    def states(stage_params: StageParams) -> np.ndarray:
        return _item_matrix(n, estimate_model_states(job, candidates, stage_params, options))

    dense, first, last = params(dense=1), params(first=True), params(last=True)
    moe = params(moe=1) if model_spec.is_moe else dense
    largest = np.maximum(dense.largest_layer if model_spec.num_dense_layers else 0.0,
                         moe.largest_layer if model_spec.is_moe else 0.0)
    # A block pattern's other kinds (solver.cost.layers.blocks), after dense and MoE.
    extra = [estimate_kind_stage_params(model_spec, candidates, kind)
             for kind in hybrid_kinds(model_spec)]
    if model_spec.has_block_kinds:  # the largest layer among the kinds the model has
        present = set(model_spec.layer_kind_indices)
        largest = np.maximum.reduce([kind.largest_layer for index, kind in
                                     enumerate([dense, moe, *extra]) if index in present])
    gather = estimate_zero3_gather_bytes(
        candidates, largest, options,
        estimate_low_precision_weight_bytes_per_param(job.precision, options))
    fixed_bytes = estimate_fixed_bytes(candidates, options)
    if job.finetune.has_adapters:  # a frozen base (solver.cost.layers.finetune)
        gather = estimate_frozen_zero3_gather_bytes(
            candidates, largest, options,
            estimate_base_weight_bytes_per_param(job.finetune, options.param_bytes))
        # The buckets gradients are reduced through hold at most the adapters' gradients.
        fixed_bytes["comm_buckets"] = np.minimum(
            fixed_bytes["comm_buckets"], estimate_adapter_params(model_spec, job.finetune)
            * options.grad_bytes)
    activation = estimate_activation_terms(model_spec, job, candidates, options)
    logits = estimate_logits_bytes(model_spec, job, candidates, options)
    # torch.distributed.pipelining's gradient receive buffers, none on the last stage (fixed
    # on every stage, taken back on the last). Interleaved, each virtual stage keeps its own:
    # counted once, a lower bound (the terms do not depend on vpp, MEMORY_DEGREES).
    grad_buffers = estimate_pipeline_grad_buffer_bytes(model_spec, job, candidates, options)

    def activations(values: np.ndarray) -> np.ndarray:
        return _item_matrix(n, {"activations": values})

    num_kinds = activation["layer"].shape[1]
    per_kind = [activations(activation["layer"][:, k]) for k in range(num_kinds)]
    saved = [activations(activation["recompute"][:, k]) for k in range(num_kinds)]
    fixed = {"zero3_gather": gather, **fixed_bytes,
             "dispatcher": estimate_dispatcher_bytes(model_spec, job, candidates, options),
             # Layer-level CPU offloading (one stage, one micro-batch: layer_offload).
             "activations": activation["offload_margin"] - estimate_layer_offload_saved_bytes(
                 model_spec, candidates, options.cpu_offloading_num_layers,
                 activation["layer"]) + grad_buffers}
    terms = MemoryTerms(
        fixed=_item_matrix(n, fixed),
        per_layer=np.stack([states(dense), states(moe), *map(states, extra)], axis=1),
        per_layer_in_flight=np.stack(per_kind, axis=1),
        recompute_in_flight=np.stack(saved, axis=1),
        first=states(first),
        first_in_flight=activations(activation["first"]),
        last=states(last) + activations(activation["last"] - grad_buffers)
        + _item_matrix(n, {"logits": logits}),
        not_last_in_flight=activations(activation["not_last"]),
        working=activations(activation["working"]),
        fragmentation=options.fragmentation,
    )
    return terms.totals() if totals else terms


def compose_stage_memory(terms: MemoryTerms, content: StageContent) -> dict[str, np.ndarray]:
    """Bytes per GPU by item (ITEMS) of stages holding `content`: the module docstring's sum.
    Row i of `content` goes with row i of `terms`."""
    total = _compose(terms, content)
    items = {name: total[:, TERM_ITEMS.index(name)] for name in TERM_ITEMS}
    allocated = sum(items[name] for name in ALLOCATED_ITEMS)
    items["fragmentation"] = allocated * terms.fragmentation
    return items


def compose_stage_total(totals: MemoryTerms, content: StageContent) -> np.ndarray:
    """The total bytes per GPU of stages holding `content`, from `MemoryTerms.totals()`:
    compose_stage_memory summed, with fewer numbers to move (the search needs no items)."""
    return _compose(totals, content)[:, 0]


def _compose(terms: MemoryTerms, content: StageContent) -> np.ndarray:
    """The module docstring's sum, per row and per item of the terms' last axis."""
    flight = content.in_flight[:, None]
    first = content.is_first[:, None].astype(float)
    last = content.is_last[:, None].astype(float)
    recomputes = (content.recompute.sum(axis=1) > 0)[:, None].astype(float)
    total = (terms.fixed + first * (terms.first + flight * terms.first_in_flight)
             + last * terms.last + (1.0 - last) * flight * terms.not_last_in_flight
             + recomputes * terms.working)
    for kind in range(content.layers.shape[1]):  # a few kinds: faster than einsum
        layers, recomputed = content.layers[:, kind, None], content.recompute[:, kind, None]
        total = total + layers * (terms.per_layer[:, kind]
                                  + flight * terms.per_layer_in_flight[:, kind])
        total = total + recomputed * flight * terms.recompute_in_flight[:, kind]
    return total
