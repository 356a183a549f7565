"""The host's time to issue a decoder layer's ops, and the GPU's wait for it: what each pass
of solver.cost.layers.layer_time pays where the host, not the GPU, sets the pace. Ops are counted per
framework (TimeConstants.launches, KernelLaunches says what each block holds), at the cluster
CPU's time per op (solver.cost.layers.time_constants.estimate_host_op_s); a dropless MoE layer syncs
on its token counts before the dispatch, so what follows cannot be issued ahead of the GPU.
"""

from __future__ import annotations

import numpy as np

from solver.cost.kernels.precision import estimate_quantize_kernels_per_split, load_recipe
from solver.cost.layers.time_constants import TE_MODULE_OPS, TimeConstants, estimate_host_op_s
from solver.spec import ClusterSpec, JobSpec, ModelSpec


def estimate_host_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                     d: dict[str, np.ndarray], constants: TimeConstants, is_moe: bool
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Host seconds to issue one layer's forward pass (the backward issues
    KernelLaunches.backward_ratio times as many), split where the host waits for the GPU:
    (after, before) the synchronisation. A dropless MoE layer copies its token counts per
    expert to the host before the dispatch (Megatron token_dispatcher.py: cuda_sync_point
    "before_ep_alltoall", the splits the all-to-all needs on the host; the guide's future work:
    "eliminate the device-host sync ... to get the tokens per expert"), so its dispatch, expert
    and combine ops (after) cannot be issued ahead of the GPU's attention and router; a dense
    layer has no such sync (after = 0).

    Ops (TimeConstants.launches, KernelLaunches says what each holds), times
    estimate_host_op_s: attention (MLA's where the model has it), the SP collectives (around
    attention, and around a dense MLP) and CP ring steps (a send and a receive each); a dense
    MLP, or an MoE layer's router (fused under moe_router_fusion), shared experts and
    preprocess, then its dispatch, experts and, per local expert (num_experts / ep), the
    grouped GEMMs' own ops and the recipe's quantize kernels per split
    (solver.cost.kernels.precision.estimate_quantize_kernels_per_split). CUDA graphs replay the
    captured block with one TE-module-like call (TE_MODULE_OPS): the whole dense layer; in a
    dropless MoE layer everything before the sync, while dispatch, experts and combine stay
    eager (Megatron cuda_graph.md, --cuda-graph-modules attn moe_router moe_preprocess).
    Worked number: Megatron, Qwen3-30B-A3B MoE layer (no shared experts) at ep 8 (16 local
    experts), tp 1, bf16, on a DGX H100 (13.48 us per op), T = 2.6877: before the sync
    (4 + 3T) + (T + 72) + 10 = 96.75 ops, 1.304 ms; after it 10 + (1 + 2T) + 2 x 16 = 48.38
    ops, 0.652 ms. At mxfp8 the 16 local experts add 2 x 16 quantize kernels after it, at
    fp8 with current scaling 2 x 3 x 16."""
    n, host_op_s = constants.launches, estimate_host_op_s(constants, cluster)
    comm = (np.where(d["tp"] > 1, 2.0 if is_moe else 4.0, 0.0)
            + 2.0 * (np.asarray(d["cp"], dtype=float) - 1.0))
    attention = n.mla_attention if model_spec.is_mla else n.attention
    if is_moe:
        local_experts = model_spec.num_experts / np.asarray(d["ep"], dtype=float)
        captured = attention + moe_ops_before_sync(model_spec, constants)
        quantize = n.quantized_splits_per_local_expert * (
            estimate_quantize_kernels_per_split(load_recipe(job.precision),
                                                constants.fp8_current_scaling))
        after = n.dispatch + n.experts + (n.per_local_expert + quantize) * local_experts
    else:
        captured, after = attention + n.mlp, np.zeros(np.shape(comm))
    before = TE_MODULE_OPS + 0.0 * comm if constants.cuda_graphs else captured + comm
    return (np.broadcast_to(after * host_op_s, np.shape(comm)).astype(float),
            np.broadcast_to(before * host_op_s, np.shape(comm)).astype(float))


def estimate_host_wait_s(gpu_s: np.ndarray, gpu_after_s: np.ndarray,
                          host: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """The GPU's wait for the host in one forward pass of a layer (estimate_host_s's
    (after, before) split): from the sync on, the host issues the `after` ops while the GPU,
    drained, runs their `gpu_after_s`; then both go on with the rest without a sync, the host
    ahead by whatever it gained. The pass ends at max(max(h_a, g_a) + g_b, h_a + h_b), a
    wait of max(0, h_a - g_a, H - G) over the GPU's G = g_a + g_b (H = h_a + h_b): the
    plain roofline max(0, H - G) where nothing syncs (h_a = 0). Worked number: h_a 2 ms over
    g_a 1.5 ms, h_b 1 ms under g_b 3 ms: the pass waits 0.5 ms, where the roofline gives 0."""
    after, before = host
    return np.maximum(np.maximum(after - gpu_after_s, after + before - gpu_s), 0.0)


def estimate_selective_host_s(model_spec: ModelSpec, cluster: ClusterSpec,
                               constants: TimeConstants, is_moe: bool,
                               host: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Host seconds of what `--recompute selective` re-runs in the backward
    (_estimate_selective_s): under op-level checkpointing the whole forward's ops; under
    Megatron's module list (TimeConstants.recompute_modules) each module's own: mlp the dense
    MLP, moe the router, shared experts, preprocess and everything after the sync (the layer
    but its attention), shared_experts those, moe_act the experts' activation (one op),
    layernorm the two norms and mla_up_proj the two up-projections (TE modules each),
    core_attn the attention core (one TE module; free under FlashAttention, whose backward
    recomputes it anyway: _estimate_selective_s)."""
    if constants.selective_recompute == "op_level":
        return host[0] + host[1]
    n, modules = constants.launches, set(constants.recompute_modules)
    te_modules = (("core_attn" in modules) + 2.0 * ("layernorm" in modules)
                  + 2.0 * ("mla_up_proj" in modules and model_spec.is_mla))
    ops, after = te_modules * TE_MODULE_OPS, np.zeros(np.shape(host[0]))
    if not is_moe:
        ops += n.mlp if "mlp" in modules else 0.0
    elif "moe" in modules:
        ops += moe_ops_before_sync(model_spec, constants)
        after = host[0]
    else:
        shared = n.shared_experts if model_spec.num_shared_experts else 0.0
        ops += (shared if "shared_experts" in modules else 0.0) + (
            1.0 if "moe_act" in modules else 0.0)
    return ops * estimate_host_op_s(constants, cluster) + after


def moe_ops_before_sync(model_spec: ModelSpec, constants: TimeConstants) -> float:
    """An MoE layer's ops between its attention and its token-count sync: the router (fused
    under TimeConstants.moe_router_fusion where the framework has a fused one), the shared
    experts (where the model has them) and the dispatcher's preprocess."""
    n = constants.launches
    router = (n.router_fused if constants.moe_router_fusion and n.router_fused is not None
              else n.router)
    return router + (n.shared_experts if model_spec.num_shared_experts else 0.0) + n.preprocess
