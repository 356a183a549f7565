"""Context parallelism's ring attention as the frameworks run it: what each CP rank sends, what
hides behind which attention step, and the merges the ring adds (solver.cost.layers.layer_time adds the
result to a layer's "cp" part).

With cp ranks and load balancing (each rank holds two of 2 cp sequence chunks), a rank's
attention is cp steps of equal work, one per KV shard: step 0 its own causal block, each later
step a received shard (all its queries against half the keys, or half its queries against all
of them). The attention core (solver.cost.layers.layer_compute) already times one such call per step:
its table rate is looked up at the s / cp tokens a step computes. The rings differ in what
overlaps (ContextParallelRing):

  transformer_engine  Megatron-Core's default --cp-comm-type p2p, Transformer Engine's
                      AttnFuncWithCPAndKVP2P (transformer_engine/pytorch/attention/
                      dot_product_attention/context_parallel.py, TransformerEngine@d0067d0):
                      step i waits for its KV and sends shard i + 1 before computing, so each
                      of the cp - 1 transfers hides behind one step. The backward sends the
                      KV and the dKV accumulated so far (both in the KV dtype outside fp8) at
                      the start of each step and waits after it. Outputs merge in one fused
                      kernel per step (flash_attn_fwd_out_correction), in the output's dtype
                      outside fp8 (flash_attn_fwd_out_correction_init returns the step's).
  torch_allgather     PyTorch's experimental context_parallel (torch/distributed/tensor/
                      experimental/_attention.py _templated_ring_attention and its backward,
                      pytorch@0123248; _context_parallel/_attention.py, pytorch@09b101c),
                      torchtitan's default context_parallel_rotate_method "allgather"
                      (job_config.py v0.2.2: "all-gather all kv shards on ranks after the first
                      sub-SDPA computation"): the _AllGatherRotater gathers every shard at once,
                      issued before step 0 and waited at step 1, so only step 0 hides it. Each
                      step's output merges into fp32 in eager ATen ops (_SDPAMerger,
                      convert_to_f32). The backward gathers the KV again (behind step 0), and
                      sends the fp32 dKV on (an _AllToAllRotater permute) after each step,
                      waited after the next: cp - 1 transfers each behind one step, the last
                      exposed; dQ, dK and dV accumulate in fp32 (accum_dtype) in eager ops.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.cost.kernels.efficiency import ComputeConstants, estimate_streaming_s
from solver.spec import ClusterSpec, JobSpec, ModelSpec

ContextParallelRing = Literal["transformer_engine", "torch_allgather"]

BF16_BYTES = 2.0
FP32_BYTES = 4.0

# Bytes each ring's merges move per element, counted from the code named in the module
# docstring (the log-sum-exp vectors, 1 / head_dim of an output, left out).
# PyTorch, forward: a step's output cast to fp32 (read 2, write 4), then
# out - block_out (8 + 4), sigmoid(lse diff) * that (4 + 4), out - that (8 + 4): 6 + 38 per
# later step; the merged fp32 output cast back (4 + 2); the K, V concatenation sent on before
# every step but the last (read 2, write 2 per K/V element).
TORCH_FIRST_STEP_OUT_BYTES = 6.0 + 6.0
TORCH_MERGE_OUT_BYTES = 38.0
TORCH_KV_CAT_BYTES = 4.0
# PyTorch, backward: fp32 zeros for dQ, dK, dV (4); per step dQ += bf16 (read 4 + 2, write 4);
# dK, dV: step 0 += (10), later steps _partial_update on half (5) then torch.cat (8) and the
# fp32 concatenation sent on (8) after every step, the bf16 K, V concatenation before every
# step but the last (4); dQ and dKV cast back to bf16 (6).
TORCH_BWD_Q_FIXED_BYTES = 4.0 + 6.0
TORCH_BWD_Q_STEP_BYTES = 10.0
TORCH_BWD_KV_FIXED_BYTES = 4.0 + 10.0 + 6.0
TORCH_BWD_KV_LATER_STEP_BYTES = 5.0 + 8.0 + 4.0
TORCH_BWD_KV_SEND_BYTES = 8.0
# Transformer Engine outside fp8, forward: step 0's output rescaled into the output (read 2,
# write 2), each later step's fused correction (read 2 + 2, write 2); K and V concatenated once
# (4). Backward: dQ, dK, dV copied at step 0 (read 2, write 2), then added in the KV dtype
# (read 2 + 2, write 2).
TE_FIRST_STEP_OUT_BYTES = 4.0
TE_MERGE_OUT_BYTES = 6.0
TE_KV_CAT_BYTES = 4.0
TE_BWD_FIRST_BYTES = 4.0
TE_BWD_STEP_BYTES = 6.0


@dataclass(frozen=True)
class RingTraffic:
    """One layer's ring for one micro-batch on one GPU, arrays over candidates: the seconds of
    one KV shard's send/recv (`kv_step_s`), of gathering every shard (`kv_gather_s`), of one
    dKV shard sent on in the backward (`dkv_step_s`), and of the merges' HBM traffic
    (`merge_fwd_s`, `merge_bwd_s`)."""

    ring: ContextParallelRing
    cp: np.ndarray
    kv_step_s: np.ndarray
    kv_gather_s: np.ndarray
    dkv_step_s: np.ndarray
    merge_fwd_s: np.ndarray
    merge_bwd_s: np.ndarray


def estimate_ring_traffic(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                          d: dict[str, np.ndarray], ring: ContextParallelRing,
                          compute: ComputeConstants) -> RingTraffic:
    """The ring's transfers and merges of one layer (RingTraffic), per micro-batch on one GPU.

    A rank's K and V shard: mb (s / cp) kv_heads_r (d_qk + d_v) 2 B, kv_heads_r =
    max(kv_heads / tp, 1); dKV the same in the KV dtype (Transformer Engine) or fp32 (PyTorch).
    Merge bytes per element (the constants above) of the rank's output E_out = mb (s / cp)
    heads_r d_v, its queries E_q (d_qk) and its K, V E_kv, for the rank whose every later step is
    a full one (cp - 1 of them; load balancing gives the last rank no half steps):
      transformer_engine  fwd (4 + 6 (cp - 1)) E_out + 4 E_kv
                          bwd (4 + 6 (cp - 1)) (E_q + E_kv)
      torch_allgather     fwd (12 + 38 (cp - 1)) E_out + 4 (cp - 1) E_kv
                          bwd (10 + 10 cp) E_q + (20 + 17 (cp - 1) + 8 cp) E_kv
    Worked number (torch_allgather): Llama-3.1-8B, 262,144 tokens on cp 8, tp 1, mb 1: a rank
    holds 32,768 tokens, E_out = 32,768 x 32 x 128 = 134.2M, E_kv = 32,768 x 8 x 256 = 67.1M;
    the forward merges move 278 x 134.2M + 28 x 67.1M = 39.2 GB, 20.4 ms a layer on an H100
    96 GB (2.4 TB/s x 0.8), against an attention core of about 0.2 s."""
    m, tp, cp, mb = model_spec, d["tp"], d["cp"], d["micro_batch"]
    rows = mb * job.seq_len / cp
    heads = m.num_attention_heads / tp
    kv_heads = np.maximum(m.kv_heads / tp, 1.0)
    e_out = rows * heads * m.value_head_dim
    e_q = rows * heads * m.qk_head_dim
    e_kv = rows * kv_heads * (m.qk_head_dim + m.value_head_dim)
    kv_bytes = e_kv * BF16_BYTES
    link = estimate_group_link(cluster, tp, cp)
    pair = np.where(cp > 1, 2, 1)
    kv_step = estimate_collective_s("send_recv", kv_bytes, pair, link)
    later = cp - 1.0
    if ring == "torch_allgather":
        gather = estimate_collective_s("all_gather", cp * kv_bytes, cp, link)
        dkv_step = estimate_collective_s("send_recv", e_kv * FP32_BYTES, pair, link)
        fwd_bytes = ((TORCH_FIRST_STEP_OUT_BYTES + TORCH_MERGE_OUT_BYTES * later) * e_out
                     + TORCH_KV_CAT_BYTES * later * e_kv)
        bwd_bytes = ((TORCH_BWD_Q_FIXED_BYTES + TORCH_BWD_Q_STEP_BYTES * cp) * e_q
                     + (TORCH_BWD_KV_FIXED_BYTES + TORCH_BWD_KV_LATER_STEP_BYTES * later
                        + TORCH_BWD_KV_SEND_BYTES * cp) * e_kv)
    else:
        gather = np.zeros_like(kv_step)
        dkv_step = kv_step  # the dKV travels in the KV dtype outside fp8
        fwd_bytes = ((TE_FIRST_STEP_OUT_BYTES + TE_MERGE_OUT_BYTES * later) * e_out
                     + TE_KV_CAT_BYTES * e_kv)
        bwd_bytes = (TE_BWD_FIRST_BYTES + TE_BWD_STEP_BYTES * later) * (e_q + e_kv)
    ringed = cp > 1
    return RingTraffic(
        ring=ring, cp=np.asarray(cp, dtype=float), kv_step_s=kv_step, kv_gather_s=gather,
        dkv_step_s=dkv_step,
        merge_fwd_s=np.where(ringed, estimate_streaming_s(cluster.gpu, fwd_bytes, compute), 0.0),
        merge_bwd_s=np.where(ringed, estimate_streaming_s(cluster.gpu, bwd_bytes, compute), 0.0))


def estimate_ring_exposed_s(traffic: RingTraffic, core_s: np.ndarray, core_bwd_s: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds the ring adds to a layer whose attention core takes
    `core_s` forward and `core_bwd_s` backward: exposed transfers plus merges. With f, b one
    step's core (core / cp), t, g, r the KV step, the KV gather and the dKV step:
      transformer_engine  fwd (cp - 1) max(t - f, 0)
                          bwd max(t - b, 0) + (cp - 2) max(t + r - b, 0) + max(r - b, 0)
      torch_allgather     fwd max(g - f, 0)
                          bwd max(g - b, 0) + (cp - 1) max(r - b, 0) + r
    each plus its merges; 0 at cp 1. Each transfer hides behind the one step the code overlaps
    it with (module docstring), not behind the whole ring: the last step of Transformer
    Engine's forward and every step but the first of PyTorch's hide nothing.
    Worked number: DeepSeek-V3 on H800s, 4,096 tokens, tp 1, cp 2 (Transformer Engine): a
    rank's K and V are 2,048 x 128 x (192 + 128) x 2 B = 167.8 MB, t = 1.064 ms over NVLink;
    the MLA core takes 0.993 ms forward, f = 0.496 ms: 1.064 - 0.496 = 0.568 ms exposed, plus
    0.251 ms of merges (the whole ring behind the whole core gave 0.071 ms)."""
    cp = traffic.cp
    step_f, step_b = core_s / cp, core_bwd_s / cp
    t, r = traffic.kv_step_s, traffic.dkv_step_s
    if traffic.ring == "torch_allgather":
        g = traffic.kv_gather_s
        fwd = np.maximum(g - step_f, 0.0)
        bwd = (np.maximum(g - step_b, 0.0) + (cp - 1.0) * np.maximum(r - step_b, 0.0) + r)
    else:
        fwd = (cp - 1.0) * np.maximum(t - step_f, 0.0)
        bwd = (np.maximum(t - step_b, 0.0) + np.maximum(cp - 2.0, 0.0)
               * np.maximum(t + r - step_b, 0.0) + np.maximum(r - step_b, 0.0))
    ringed = cp > 1
    return (np.where(ringed, fwd + traffic.merge_fwd_s, 0.0),
            np.where(ringed, bwd + traffic.merge_bwd_s, 0.0))
