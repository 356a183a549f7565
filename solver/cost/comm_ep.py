"""What an MoE layer's expert-parallel all-to-alls leave exposed, with and without Megatron's
EP all-to-all overlap (`--overlap-moe-expert-parallel-comm`), per layer and micro-batch.

Without overlap every pass's dispatch and combine wait on the compute stream. With it,
Megatron merges the forward of one micro-batch with the backward of the previous one, layer
by layer, in three phases on two streams (megatron-core 0.16.1
megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):

    comm stream:  combine_bwd | dispatch_fwd -> dispatch_bwd     | combine_fwd
    comp stream:  attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd

where `attn` is everything up to the dispatch (attention, norms, router, permutation) and `mlp`
the experts. A phase takes as long as the longer of its two streams, so what a phase's
all-to-alls exceed its compute is exposed: with c one all-to-all pass (half the forward's EP
time),

    exposed = max(c - attn_fwd, 0) + max(2c - mlp_fwd - mlp_bwd, 0) + max(c - attn_bwd, 0)

and the hidden rest slows the compute stream by the SMs the communication kernels hold
(`contention`, solver.cost.layer_time.sm_contention). Passes beyond the merged forward and
backward pair with nothing and stay exposed: a recomputed `moe` module's all-to-alls run
inside the backward's compute (Megatron refuses full recompute with the overlap:
transformer_config.py "disable full recomputation when enabling
overlap_moe_expert_parallel_comm"). Worked number: c =
1 ms, attn 0.8 / 1.6 ms forward / backward, experts 2 / 4 ms: 0.2 + 0 + 0 = 0.2 ms exposed
of 4 ms, where pooling the layer's 8.4 ms of compute would hide all of it.
"""

from __future__ import annotations

import numpy as np

from solver.spec.hardware import DispatcherRates


def estimate_ep_exposed_s(ep_fwd_s: np.ndarray, passes: float, overlap: bool,
                          contention: float | np.ndarray, attn_s: tuple, mlp_s: tuple
                          ) -> np.ndarray:
    """Exposed EP seconds of one layer and micro-batch for `passes` forward-equivalents of
    dispatch + combine (`ep_fwd_s` each; 2 = forward and backward). `attn_s`, `mlp_s`:
    (forward, backward) compute seconds of the two sides (module docstring)."""
    ep_fwd_s = np.asarray(ep_fwd_s, dtype=float)
    if not overlap or passes < 2.0:
        return ep_fwd_s * passes
    one = 0.5 * ep_fwd_s  # one all-to-all: the forward's dispatch or its combine
    (attn_fwd, attn_bwd), (mlp_fwd, mlp_bwd) = attn_s, mlp_s
    exposed = (np.maximum(one - attn_fwd, 0.0) + np.maximum(2.0 * one - mlp_fwd - mlp_bwd, 0.0)
               + np.maximum(one - attn_bwd, 0.0))
    hidden = 2.0 * ep_fwd_s - exposed
    return exposed + hidden * contention + ep_fwd_s * (passes - 2.0)


def estimate_dispatcher_s(rates: DispatcherRates, sent_bytes: np.ndarray, ep: np.ndarray
                          ) -> np.ndarray:
    """Seconds of one dispatch and one combine (one forward's pass) of a flex-dispatcher
    backend across nodes, at the rates its library measured on the cluster
    (ClusterSpec.dispatcher_rates): `sent_bytes` / dispatch rate + `sent_bytes` / combine rate,
    each rate interpolated linearly in log2(ep) between the measured group sizes and held
    beyond them. `sent_bytes` counts what the measurement counts: a token's bytes once for
    every node its k experts reach, its own node included (solver.cost.layer_time's
    all-to-all bytes times _domain_dedup).

    The measurement (DeepEP's HybridEP on H100 with 400 Gb/s InfiniBand, 16 SMs: 54.47 /
    53.35 GB/s at 16 ranks) sits below what the fabric tier's all-to-all gives the same
    bytes across two nodes, S x (n - m) / n / 40 GB/s = S / 80 GB/s: its 2-node rate
    carries the backend's own work (the routing metadata, the NVLink forwarding the node's
    tokens wait on) on 4 MB-per-rank messages. Worked number: Qwen3-30B-A3B at ep 16 on
    two DGX H100 nodes, 4,096 tokens of 2 x 2,048 B to 2 (1 - 2^-8) = 1.992 nodes each:
    33.4 MB, 0.614 ms dispatch + 0.627 ms combine = 1.240 ms (the fabric's all-to-all:
    0.928 ms)."""
    log_ranks = np.log2(np.asarray(rates.ranks, dtype=float))
    at = np.log2(np.asarray(ep, dtype=float))
    dispatch = np.interp(at, log_ranks, rates.dispatch_gb_per_s) * 1e9
    combine = np.interp(at, log_ranks, rates.combine_gb_per_s) * 1e9
    sent = np.asarray(sent_bytes, dtype=float)
    return sent / dispatch + sent / combine
