"""Data-parallel traffic and the optimizer step of the largest pipeline stage, vectorised.

Parameters come in two kinds that synchronise over different groups (Megatron-Core's two rank
generators): the dense (non-expert) parameters, split by tp, are reduced over the dp x cp
ranks that hold the same shard (stride tp); the routed experts, split by ep x etp, over the
expert-data-parallel group of edp = tp x cp x dp / (ep x etp) ranks (stride ep x etp). Each
collective is the nccl-tests cost of its bytes on its group (solver.cost.comm.comm), and the two
kinds add up: they run one after the other on the same links.

Per step-sync (steptime.py decides what hides behind compute):
    grads_all_reduce       ZeRO 0: the gradients (grad_reduce_bytes per parameter)
    grads_reduce_scatter   ZeRO 1, 2: the same bytes, reduce-scattered
    params_all_gather      ZeRO 1-3: the bf16 parameters gathered back (ZeRO-3: every pass)
    zero3_reduce_scatter   ZeRO 3: each micro-batch's gradients (zero3_grad_reduce_bytes)
Each sync's bytes travel in several calls (estimate_dp_calls: FSDP units or the framework's
buckets), and each call pays NCCL's latency for its group's ranks and nodes
(solver.cost.comm.nccl_latency), which grows with the DP degree: a ring all-gather over 512 ranks
of 64 nodes waits 1.1 ms (LL128) where 128 ranks of 16 nodes wait 0.3 ms.
The optimizer streams optimizer_bytes_per_param through HBM for every parameter the GPU
updates: all of its shard (ZeRO 0) or 1 / (its DP group) of it (ZeRO >= 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from solver.cost.comm.comm import (
    Collective,
    GroupLink,
    collective_factor,
    estimate_collective_s,
    estimate_group_link,
    estimate_group_nodes,
)
from solver.cost.kernels.efficiency import estimate_streaming_s
from solver.cost.layers.finetune import estimate_adapter_params_per_layer
from solver.cost.comm.nccl_latency import estimate_nccl_time_s
from solver.cost.step.training_states import estimate_optimizer_step_bytes
from solver.spec import ClusterSpec, ModelSpec
from solver.spec.finetune import FinetuneSpec

if TYPE_CHECKING:
    from solver.cost.layers.time_constants import TimeConstants

BF16_BYTES = 2.0
FLOAT8_BYTES = 1.0
# Adam's m and v in bf16 (precision-aware optimizer): each read and written in 2 B, not 4.
PRECISION_AWARE_SAVED_BYTES = 2 * 2 * (4.0 - BF16_BYTES)
PARAM_KINDS = ("dense", "expert")
COLLECTIVES = ("grads_all_reduce", "grads_reduce_scatter", "params_all_gather",
               "zero3_reduce_scatter")


def estimate_largest_stage_params(model_spec: ModelSpec, pp: np.ndarray
                                  ) -> tuple[np.ndarray, np.ndarray]:
    """Dense (non-expert) and routed-expert parameters of the largest stage: its share of the
    layers plus the embedding (first stage) or LM head (last stage), whichever is larger; with
    pp = 1 the one stage holds both."""
    layers = np.ceil(model_spec.num_hidden_layers / np.asarray(pp))
    moe_share = model_spec.num_moe_layers / model_spec.num_hidden_layers
    expert_per_layer = model_spec.num_experts * model_spec.expert_params
    dense_per_layer = (
        (1 - moe_share) * model_spec.dense_layer_params
        + moe_share * (model_spec.moe_layer_params - expert_per_layer)
    )
    ends = _largest_stage_ends(model_spec, pp)
    return layers * dense_per_layer + ends, layers * moe_share * expert_per_layer


def _largest_stage_ends(model_spec: ModelSpec, pp: np.ndarray) -> np.ndarray:
    """The embedding / LM head parameters of the largest stage (estimate_largest_stage_params)."""
    return np.where(
        np.asarray(pp) == 1,
        model_spec.embedding_params + model_spec.lm_head_params + model_spec.final_norm_params,
        max(model_spec.embedding_params,
            model_spec.lm_head_params or model_spec.vocab_size * model_spec.hidden_size),
    )


def _shards(model_spec: ModelSpec, cluster: ClusterSpec, candidates: Any, kind: str
            ) -> tuple[np.ndarray, np.ndarray, Any]:
    """Parameters per GPU of one kind, its DP group size and that group's link."""
    c = candidates
    dense, expert = estimate_largest_stage_params(model_spec, c.pp)
    if kind == "dense":
        ranks = c.cp * c.dp
        return dense / c.tp, ranks, estimate_group_link(cluster, c.tp, ranks)
    if kind == "expert":
        ranks = np.maximum(c.tp * c.cp * c.dp // (c.ep * c.etp), 1)
        return expert / (c.ep * c.etp), ranks, estimate_group_link(cluster, c.etp * c.ep, ranks)
    raise AssertionError(f"unknown parameter kind {kind}")


def _trained(model_spec: ModelSpec, candidates: Any, kind: str, local: np.ndarray,
             finetune: FinetuneSpec | None) -> np.ndarray:
    """Parameters of `kind` per GPU that train, of the `local` ones the largest stage holds:
    all of them, or with adapters (LoRA, QLoRA: the base frozen) the adapters of the stage's
    ceil(L / pp) layers split by tp (solver.cost.layers.finetune), none of them routed experts.
    Only these have gradients to reduce and optimizer state to step; ZeRO-3 still gathers the
    frozen weights. Worked number: Llama-3.1-70B, LoRA r 32 on linear_qkv (80 x 589,824 =
    4.72e7 adapters), pp 4, tp 2: 20 x 589,824 / 2 = 5.90e6 a GPU against 8.7e9 weights."""
    if finetune is None or not finetune.has_adapters:
        return local
    if kind == "expert":
        return np.zeros_like(np.asarray(local, dtype=float))
    layers = np.ceil(model_spec.num_hidden_layers / np.asarray(candidates.pp))
    return layers * estimate_adapter_params_per_layer(model_spec, finetune).total / candidates.tp


def _gathered_bytes_per_param(model_spec: ModelSpec, candidates: Any, kind: str,
                              local: np.ndarray, constants: TimeConstants
                              ) -> np.ndarray | float:
    """Bytes per parameter the parameter all-gather moves: bf16, or under torchao float8's
    FSDP all-gather (TimeConstants.fp8_all_gather) 1 B for the layers' weights and bf16 for
    the embedding and LM head (nn.Embedding is no Float8Linear; the head counted with it).
    Worked number: Llama-3.1-8B at pp 1, tp 1: 1.05e9 of 8.03e9 parameters in the ends,
    (1.05 x 2 + 6.98 x 1) / 8.03 = 1.13 B per parameter."""
    if not constants.fp8_all_gather:
        return BF16_BYTES
    ends = (_largest_stage_ends(model_spec, candidates.pp) / candidates.tp
            if kind == "dense" else 0.0)
    ends = np.minimum(ends, local)
    return (ends * BF16_BYTES + (local - ends) * FLOAT8_BYTES) / np.maximum(local, 1.0)


def estimate_dp_collectives_s(model_spec: ModelSpec, cluster: ClusterSpec, candidates: Any,
                              constants: TimeConstants, finetune: FinetuneSpec | None = None
                              ) -> dict[str, np.ndarray]:
    """Seconds of each DP collective of the module docstring for the parameters of `kinds`
    (both by default). `candidates` has array attributes tp, pp, dp, cp, ep, etp. With
    adapters (`finetune`) the gradients and ZeRO 1-2's gather are the adapters' (_trained).

    Worked number: Llama-3.1-8B (8.03e9 parameters, one stage) with dp = 8 on one DGX H100 node
    (NVLink bus bandwidth ~360 GB/s): the fp32 gradient all-reduce moves 2 x 7/8 x 32.1 GB per
    GPU, ~0.16 s."""
    out = {name: 0.0 for name in COLLECTIVES}
    for kind in PARAM_KINDS:
        if kind == "expert" and not model_spec.is_moe:
            continue  # no collective at all (not even its latency)
        local, ranks, link = _shards(model_spec, cluster, candidates, kind)
        trained = _trained(model_spec, candidates, kind, local, finetune)
        gathered = np.where(np.asarray(candidates.zero) == 3, local, trained)
        bf16 = constants.grad_reduce_in_bf16  # TimeConstants.grad_reduce_in_bf16
        grad_bytes = BF16_BYTES if bf16 else constants.grad_reduce_bytes
        zero3_grad_bytes = BF16_BYTES if bf16 else constants.zero3_grad_reduce_bytes
        stride = candidates.tp if kind == "dense" else candidates.etp * candidates.ep
        nodes, nvlink = estimate_group_nodes(cluster, stride, ranks)
        for name, op, per_param, moved in (
                ("grads_all_reduce", "all_reduce", grad_bytes, trained),
                ("grads_reduce_scatter", "reduce_scatter", grad_bytes, trained),
                ("params_all_gather", "all_gather",
                 _gathered_bytes_per_param(model_spec, candidates, kind, local, constants),
                 gathered),
                ("zero3_reduce_scatter", "reduce_scatter", zero3_grad_bytes, trained)):
            calls = estimate_dp_calls(model_spec, candidates, constants, name, moved,
                                      moved * per_param, ranks)
            out[name] = out[name] + _estimate_calls_s(op, moved * per_param, ranks, nodes,
                                                      calls, link, nvlink)
    return out


def estimate_dp_calls(model_spec: ModelSpec, candidates: Any, constants: TimeConstants,
                      name: str, local: np.ndarray, size_bytes: np.ndarray, ranks: np.ndarray
                      ) -> np.ndarray:
    """How many collectives carry the DP collective `name` (COLLECTIVES) of one sync
    (TimeConstants.dp_bucket_params): one per FSDP unit (the largest stage's layers and the
    root unit), torch DDP's 25 MiB buckets for ZeRO-0 under FSDP frameworks, or the framework's
    buckets of parameters; ZeRO-3's gathers and reduce-scatters one per unit everywhere.

    Worked number: MPT-1b (24 layers) under LLM Foundry's FSDP: 25 all-gathers and 25
    reduce-scatters a sync; Megatron with dp 512 buckets of max(40e6, 512e6) = 512e6
    parameters: a 1.3e9-parameter shard in 3."""
    units = np.ceil(model_spec.num_hidden_layers / np.asarray(candidates.pp)) + 1.0
    if name == "zero3_reduce_scatter":
        return units
    if constants.dp_bucket_params is None:  # FSDP: per unit; its ZeRO-0 is torch DDP
        if name == "grads_all_reduce":
            return np.maximum(np.ceil(size_bytes / constants.ddp_bucket_bytes), 1.0)
        return units
    bucket = np.maximum(constants.dp_bucket_params,
                        constants.dp_bucket_params_per_rank * np.asarray(ranks))
    calls = np.maximum(np.ceil(local / bucket), 1.0)
    if name == "params_all_gather":  # ZeRO-3 gathers per unit, ZeRO 1-2 by bucket
        return np.where(np.asarray(candidates.zero) == 3, units, calls)
    return calls


def _estimate_calls_s(op: Collective, size_bytes: np.ndarray, ranks: np.ndarray,
                      nodes: np.ndarray, calls: np.ndarray, link: GroupLink, nvlink: bool
                      ) -> np.ndarray:
    """Seconds of `calls` equal collectives moving `size_bytes` in all: NCCL's choice of
    algorithm and protocol with its latency per call (solver.cost.comm.nccl_latency) at the link's
    bus bandwidth, or, on a calibrated tier, each call on the measured curve."""
    if link.tier_index is not None:
        return calls * estimate_collective_s(op, size_bytes / calls, ranks, link)
    seconds = estimate_nccl_time_s(op, size_bytes, ranks, nodes, calls,
                                   link.bandwidth_bytes_per_s, collective_factor(op, ranks),
                                   nvlink)
    return np.where(np.asarray(ranks) > 1, seconds, 0.0)


def estimate_optimizer_s(model_spec: ModelSpec, cluster: ClusterSpec, candidates: Any,
                         constants: TimeConstants, finetune: FinetuneSpec | None = None
                         ) -> np.ndarray:
    """Seconds of the optimizer step for the parameters of `kinds` a GPU updates.

    Worked number: 8.03e9 parameters on one H100 (3.35 TB/s HBM) without ZeRO stream
    30 B x 8.03e9 = 241 GB, 0.090 s at 80% of the HBM bandwidth
    (ComputeConstants.hbm_fraction); pure bf16 or 8-bit Adam states stream fewer bytes
    (solver.cost.step.training_states.estimate_optimizer_step_bytes: 14 B, 18.06 B)."""
    total = 0.0
    per_param = estimate_optimizer_step_bytes(
        constants.training_states, constants.optimizer_bytes_per_param - (
            PRECISION_AWARE_SAVED_BYTES if constants.precision_aware_optimizer else 0.0),
        constants.bf16_master_copy)
    for kind in PARAM_KINDS:
        updated = estimate_optimizer_shard_params(model_spec, cluster, candidates, kind,
                                                  finetune)
        total = total + estimate_streaming_s(
            cluster.gpu, updated * per_param, constants.compute)
    return np.asarray(total, dtype=float)


def estimate_optimizer_shard_params(model_spec: ModelSpec, cluster: ClusterSpec,
                                    candidates: Any, kind: str,
                                    finetune: FinetuneSpec | None = None) -> np.ndarray:
    """Parameters of `kind` (PARAM_KINDS) a GPU's optimizer step updates: its shard of the
    largest stage (ZeRO 0) or 1 / (its DP group) of it (ZeRO >= 1); with adapters, theirs."""
    local, ranks, _ = _shards(model_spec, cluster, candidates, kind)
    local = _trained(model_spec, candidates, kind, local, finetune)
    return np.where(np.asarray(candidates.zero) >= 1, local / ranks, local)


def estimate_grad_accumulation_s(model_spec: ModelSpec, cluster: ClusterSpec, candidates: Any,
                                 constants: TimeConstants, finetune: FinetuneSpec | None = None
                                 ) -> np.ndarray:
    """Seconds per micro-batch to add a GPU's gradients into their accumulation buffer outside
    the GEMMs (TimeConstants.grad_accumulation_bytes_per_param: zero where the framework fuses
    the accumulation into the weight-gradient GEMM, as Megatron does).

    Worked number: BLOOM-176B (h 14336, 70 layers) at tp 4, pp 12: the first stage holds 6
    layers (1.480e10 parameters) and the embedding (3.60e9), 4.60e9 per GPU; DeepSpeed's bf16
    optimizer streams 18 B of each after every micro-batch, 82.8 GB, 0.051 s at 80% of an
    A100's 2,039 GB/s."""
    if constants.grad_accumulation_bytes_per_param == 0:
        return np.zeros(np.shape(candidates.tp), dtype=float)
    total = 0.0
    for kind in PARAM_KINDS:
        local, _, _ = _shards(model_spec, cluster, candidates, kind)
        local = _trained(model_spec, candidates, kind, local, finetune)
        total = total + estimate_streaming_s(
            cluster.gpu, local * constants.grad_accumulation_bytes_per_param, constants.compute)
    return np.asarray(total, dtype=float)
