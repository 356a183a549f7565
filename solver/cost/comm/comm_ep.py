"""What an MoE layer's expert-parallel all-to-alls leave exposed, with and without Megatron's
EP all-to-all overlap (`--overlap-moe-expert-parallel-comm`), per layer and micro-batch.

Without overlap every pass's dispatch and combine wait on the compute stream. With it,
Megatron merges the forward of one micro-batch with the backward of the previous one, layer
by layer, in three phases on two streams (megatron-core 0.16.1
megatron/core/models/common/model_chunk_schedule_plan.py, TransformerLayerSchedulePlan.run):

    comm stream:  combine_bwd | dispatch_fwd -> dispatch_bwd     | combine_fwd
    comp stream:  attn_fwd    | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | attn_bwd

where `attn` is everything up to the dispatch (attention, norms, router, permutation) and `mlp`
the experts, with the experts' weight gradient delayed after their data gradient
(--delay-wgrad-compute, which Megatron-Bridge's performance scripts set with the overlap:
scripts/performance/utils/overrides.py _set_moe_a2a_overlap_overrides, v0.3.0-v0.5.0;
run_script.py A2A_1F1B, 25.09). A phase ends when both streams have, and the next waits for it
(each phase's work needs the previous phase's outputs), so what a phase's all-to-alls exceed
its compute is exposed; inside the middle phase the forward's experts wait for their dispatch
and the backward's dispatch for the experts' data gradient (estimate_merged_experts_phase_s).
With c one all-to-all pass (half the forward's EP time),

    exposed = max(c - attn_fwd, 0) + middle(c, mlp_fwd, mlp_bwd) - mlp_fwd - mlp_bwd
              + max(c - attn_bwd, 0)

and the hidden rest slows the compute stream by the SMs the communication kernels hold
(`contention`, solver.cost.layers.layer_time.sm_contention). Passes beyond the merged forward and
backward pair with nothing and stay exposed: a recomputed `moe` module's all-to-alls run
inside the backward's compute (Megatron refuses full recompute with the overlap:
transformer_config.py "disable full recomputation when enabling
overlap_moe_expert_parallel_comm"). Worked number: c =
1 ms, attn 0.8 / 1.6 ms forward / backward, experts 2 / 4 ms: 0.2 + 0 + 0 = 0.2 ms exposed
of 4 ms, where pooling the layer's 8.4 ms of compute would hide all of it.
"""

from __future__ import annotations

import math

import numpy as np

from solver.spec.hardware import DispatcherRates

BF16_BYTES = 2.0
# FP8 dispatch bytes over BF16's: 1 B a value and a 4-B scale per 128 (DeepEP
# tests/test_hybrid_ep.py fp8_factor).
FP8_DISPATCH_BYTES = (1.0 + 4.0 / 128.0) / 2.0


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
    exposed = (np.maximum(one - attn_fwd, 0.0)
               + estimate_merged_experts_phase_s(one, mlp_fwd, mlp_bwd)
               - (mlp_fwd + mlp_bwd) + np.maximum(one - attn_bwd, 0.0))
    hidden = 2.0 * ep_fwd_s - exposed
    return exposed + hidden * contention + ep_fwd_s * (passes - 2.0)


def estimate_merged_experts_phase_s(one_s, mlp_fwd_s, mlp_bwd_s) -> np.ndarray:
    """Seconds of the merged pair's middle phase (module docstring): the backward's expert
    data gradient, then its weight gradient (delayed: --delay-wgrad-compute), then the
    forward's experts on the compute stream; the forward's dispatch, then the backward's on
    the communication stream. The forward's experts wait for their dispatch and the
    backward's dispatch for its data gradient, so

        max(max(c, dgrad) + c, max(dgrad + wgrad, c) + mlp_fwd)

    with dgrad = wgrad = mlp_bwd / 2 (each 2 m n k FLOPs, as the forward's GEMM: Narayanan
    et al. 2021 §3.3). Worked number: c = 1.5 ms, experts 1 / 2 ms: max(3, 3) = 3 ms, 0
    exposed where the phase's pooled 3 ms of traffic against 3 ms of compute is also 0; with
    experts 1.2 / 1.0 ms: max(3, 2.7) = 3 ms, 0.8 ms exposed where pooling gives 0.8 ms;
    with experts 2 / 1 ms: max(3, 3.5) = 3.5 ms, 0.5 ms exposed where pooling hides it all."""
    one = np.asarray(one_s, dtype=float)
    dgrad = wgrad = 0.5 * np.asarray(mlp_bwd_s, dtype=float)
    return np.maximum(np.maximum(one, dgrad) + one,
                      np.maximum(dgrad + wgrad, one) + mlp_fwd_s)


def estimate_unmerged_share(pp: np.ndarray, vpp: np.ndarray, num_micro: np.ndarray
                            ) -> np.ndarray:
    """The share of a pipeline rank's model-chunk forwards (and as many backwards) that the EP
    all-to-all overlap runs alone, unmerged, where each exposes its dispatch and combine in
    full: W / (m v) for the first rank, whose warm-up is the longest (its extra time is on the
    step's critical path). Megatron-Core (core_v0.15.0-0.17.0): without pipelining the first
    micro-batch's forward and the last one's backward (combined_1f1b.py
    combined_1f1b_schedule_for_no_pipelining), W = 1; with it the interleaved schedule's
    warm-up forwards, (pp - 1) 2 + (v - 1) pp, plus the "one extra micro-batch forward step
    before the 1f1b stages" the overlap schedules (schedules.py
    get_pp_rank_microbatches, microbatch_group_size_per_vp_stage = pp), and the cool-down's as
    many backwards, W = min(2 (pp - 1) + (v - 1) pp + 1, m v); the overlap requires
    interleaving when pp > 1 (transformer_config.py), and v = 1 reads the same formula.
    Worked number: Qwen3-235B-A22B at pp 8, vpp 4 (Megatron-Bridge's H100 recipe): 39 of
    128 x 4 = 512 chunk passes, 7.6%, at a 2,048-sequence batch; 1.9% at 8,192."""
    pp, vpp, num_micro = (np.asarray(x, dtype=float) for x in (pp, vpp, num_micro))
    chunks = num_micro * vpp
    warm_up = np.where(pp > 1, 2.0 * (pp - 1.0) + (vpp - 1.0) * pp + 1.0, 1.0)
    return np.minimum(warm_up, chunks) / chunks


def estimate_dispatcher_s(rates: DispatcherRates, sent_bytes: np.ndarray, ep: np.ndarray
                          ) -> np.ndarray:
    """Seconds of one dispatch and one combine (one forward's pass) of a flex-dispatcher
    backend across nodes, at what its library measured on the cluster
    (ClusterSpec.dispatcher_rates). `sent_bytes` counts what the measurement counts: a token's
    bytes once for every node its k experts reach, its own node included (solver.cost.
    layer_time's all-to-all bytes times _domain_dedup).

    A combine takes `sent_bytes` / its measured rate. A dispatch measured in BF16 and in FP8
    (the same tokens, (1 + 4/128) / 2 the bytes) splits into a fixed part and a per-byte
    part (dispatcher_fit); without an FP8 column it is bytes / rate alike. Each is
    interpolated linearly in log2(ep) between the measured group sizes and held beyond them.

    Worked number (DeepEP's HybridEP on H100, 16 SMs, 400 Gb/s InfiniBand; Qwen3-30B-A3B at
    ep 16 on two DGX H100 nodes, one 4,096-token sequence): its tokens of 2 x 2,048 B reach
    2 (1 - 2^-8) = 1.992 nodes each, 33.4 MB; dispatch 0.294 ms + 33.4 MB / 63.1 GB/s =
    0.824 ms, combine 33.4 MB / 53.35 GB/s = 0.627 ms: 1.450 ms, where bytes over the BF16
    dispatch rate alone give 0.614 ms for the dispatch and the fabric tier's all-to-all
    (S / 80 GB/s across two nodes) 0.928 ms for both."""
    log_ranks = np.log2(np.asarray(rates.ranks, dtype=float))
    at = np.log2(np.asarray(ep, dtype=float))
    fixed_s, per_byte_s = dispatcher_fit(rates)
    sent = np.asarray(sent_bytes, dtype=float)
    dispatch = np.interp(at, log_ranks, fixed_s) + sent * np.interp(at, log_ranks, per_byte_s)
    combine = sent / (np.interp(at, log_ranks, rates.combine_gb_per_s) * 1e9)
    return dispatch + combine


def dispatcher_fit(rates: DispatcherRates) -> tuple[np.ndarray, np.ndarray]:
    """(fixed seconds, seconds per byte) of one dispatch at each measured group size. The
    benchmark's own test counts S = T x reached(ranks / ranks_per_node, k) x hidden x 2 B
    (T tokens a rank, reached_domains); its BF16 dispatch takes t = S / BF16 rate, its FP8
    dispatch of the same tokens t' = f S / FP8 rate (f = FP8_DISPATCH_BYTES), so per byte
    (t - t') / ((1 - f) S) and fixed t - S x that (never below 0). Worked number (H100
    HybridEP, 16 ranks): S = 4,096 x 1.992 x 7,168 x 2 = 116.98 MB, t = 2.148 ms at 54.47
    GB/s, t' = 1.250 ms at 48.26 GB/s: 63.1 GB/s and 0.294 ms (32 ranks: 54.6 GB/s and 0.594
    ms; 64: 50.9 GB/s and 1.416 ms). Without an FP8 column: no fixed part, the BF16 rate."""
    ranks = np.asarray(rates.ranks, dtype=float)
    bf16 = np.asarray(rates.dispatch_gb_per_s) * 1e9
    if rates.dispatch_fp8_gb_per_s is None:
        return np.zeros_like(ranks), 1.0 / bf16
    reached = reached_domains(ranks / rates.ranks_per_node, rates.topk)
    measured = rates.tokens_per_rank * reached * rates.hidden_size * BF16_BYTES
    t_bf16 = measured / bf16
    t_fp8 = FP8_DISPATCH_BYTES * measured / (np.asarray(rates.dispatch_fp8_gb_per_s) * 1e9)
    per_byte = (t_bf16 - t_fp8) / ((1.0 - FP8_DISPATCH_BYTES) * measured)
    return np.maximum(t_bf16 - measured * per_byte, 0.0), per_byte


def reached_domains(domains: np.ndarray, k: int, n_group: int = 1, topk_group: int = 1
                    ) -> np.ndarray:
    """Expected number of the D `domains` of an EP group (experts laid out in order, equal
    shares) that one token's k routed copies reach, routing balanced. Without a group limit
    each copy lands in any domain alike: D (1 - (1 - 1/D)^k). Group-limited routing (the
    experts in n_group equal groups, a token's k from its topk_group chosen groups; DeepSeek-V3
    §2.1.2) confines them: with at most one group per domain, to the m = topk_group D / n_group
    domains the chosen groups cover, m (1 - (1 - 1/m)^k); with g = n_group / D groups per
    domain, a domain holds j of the chosen groups with the hypergeometric probability of j
    among g of the n_group, and is reached unless all k copies miss those j:
    D sum_j P(j) (1 - (1 - j / topk_group)^k). Worked number (DeepSeek-V3, ep 64 on 8 nodes,
    one group per node): 4 (1 - (3/4)^8) = 3.60 nodes, against 8 (1 - (7/8)^8) = 5.25."""
    d = np.asarray(domains, dtype=float)
    if n_group == 1:
        return d * (1.0 - (1.0 - 1.0 / d) ** k)
    per_domain = n_group / d
    m = np.minimum(topk_group * d / n_group, d)
    spread = m * (1.0 - (1.0 - 1.0 / np.maximum(m, 1.0)) ** k)
    result = spread.copy()
    for g in np.unique(np.round(per_domain[per_domain > 1.0])):
        g = int(g)
        chosen = range(0, min(g, topk_group) + 1)
        total = math.comb(n_group, topk_group)
        hit = sum(math.comb(g, j) * math.comb(n_group - g, topk_group - j) / total
                  * (1.0 - (1.0 - j / topk_group) ** k) for j in chosen)
        result = np.where((per_domain > 1.0) & (np.round(per_domain) == g), d * hit, result)
    return result
