"""The MoE token dispatcher's own communication buffers, allocated once per GPU outside
PyTorch's caching allocator (so not part of its fragmentation).

DeepEP (Megatron's flex dispatcher with --moe-flex-dispatcher-backend deepep) allocates one
`deep_ep.Buffer` for the ETPxEP group (token_dispatcher.py MoEFlexTokenDispatcher:
tp_ep_group), sized by the larger of its dispatch and combine configs'
hints (megatron/core/transformer/moe/fused_a2a.py get_buffer; deepseek-ai/DeepEP
csrc/config.hpp Config.get_nvl_buffer_size_hint / get_rdma_buffer_size_hint, deep_ep/buffer.py
get_dispatch_config / get_combine_config, Buffer.num_sms = 20):

  NVLink buffer  C N ((2R + 3) 4 + T_nvl (H + 2056))
  RDMA buffer    C R (144 + 2 T_rdma (H + 2072)) + 1 MiB, only when the group spans nodes
with C = num_sms / 2 = 10 channels, N = min(etp ep, 8) NVLink ranks, R = max(etp ep / 8, 1) RDMA
ranks,
H the hidden size in bytes (bf16: 2h), T the configs' receive-token counts (T_rdma rounded up
to a multiple of the send chunk), and per received token its top-k indices and weights and
its scales at their maxima (128 x 8, 128 x 4, 128 x 4 B) and an 8 B source record (+16 B per
RDMA slot). Worked number: DeepSeek-V3 (h 7168), ep 64: NVLink 10 x 8 x (76 + 288 x 16,392) =
377.7 MB, RDMA 10 x 8 x (144 + 280 x 16,408) + 1 MiB = 368.6 MB: 0.746 GB per GPU.

DeepEP's tables list EP sizes 2-160; another size takes the next listed one (the largest above
160).

HybridEP (--moe-flex-dispatcher-backend hybridep) allocates one `HybridEPBuffer` for the ETPxEP
group on the first dispatch, sized for the worst case, every token of the group routed to this
rank's experts (deepseek-ai/DeepEP branch hybrid-ep @94a9f8f: deep_ep/hybrid_ep_buffer.py,
csrc/hybrid_ep/config.cuh Configurer, buffer/intranode.cu NVLCoordinator, buffer/
internode_doca.cu RDMACoordinator, extension/allgather.cu; Megatron-Core fused_a2a.py
init_hybrid_ep_buffer(group, hidden_dim, num_tokens = x.shape[-2], ...), dispatch and combine
sharing one buffer, use_shared_buffer = True, bf16 tokens: fp8 dispatch is refused):

  NVLink   T N (2H + 4 e n + 4 H/128)         tokens, probabilities, scaling factors
  gather   T N E                              the routing map, one byte per expert
  RDMA     T (2H + 4 e N + 4 H/128)           attention-side input, when the group spans
           + T (m - 1) (6H + 12 e n + 4 H/128) domains: the dispatch group buffers, the combine
                                               reduction and group buffers
with T = max(tokens, 512) rounded up to the 64-token combine chunk, tokens = s b / (tp cp) the
rank's sequence-parallel share, N = etp ep ranks, n = min(N, G) ranks per NVLink domain (G the
GPUs of the job's NVLink domain, MemoryOptions.nvlink_domain_gpus: 8 on HGX), m = N / n domains, e = E / ep local experts, H the hidden size (elements, latent under LatentMoE).
Flags and preprocessing scratch (under 1 MB) are left out. Worked number: DeepSeek-V3
(H 7168, E 256), tokens 4,096, ep 64: NVLink 4,096 x 64 x (14,336 + 128 + 224) = 3,850.4 MB,
gather 4,096 x 64 x 256 = 67.1 MB, RDMA 4,096 x (14,336 + 1,024 + 224) = 63.8 MB and
7 x 4,096 x (43,008 + 384 + 224) = 1,250.6 MB: 5.232 GB per GPU on 8-GPU nodes; in one NVLink
domain of 64 (GB200 NVL72) 4,096 x 64 x (14,336 + 1,024 + 224) = 4,085.3 MB and the 67.1 MB
map: 4.152 GB, no RDMA buffers.

The all-gather dispatcher gathers the ETPxEP group's tokens into Megatron's global memory
buffer (tensor_parallel/mappings.py _gather_along_first_dim(use_global_buffer=True),
GlobalMemoryBuffer "mpu"), which stays allocated: 2 H bytes for each of tokens x N gathered
tokens (a caching-allocator tensor: in the allocated view, without fragmentation,
solver.cost.memory.views). The all-to-all dispatcher keeps nothing of its own: its permuted and received copies are
the MoE block's activations (activations._mlp_bytes). NCCL's own buffers are
MemoryOptions.nccl_gib.
"""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory.options import MemoryOptions
from solver.spec import JobSpec, ModelSpec

# deep_ep/buffer.py: per EP size, (NVLink receive tokens, RDMA send chunk, RDMA receive tokens)
# of the dispatch and of the combine config (Config(num_sms, nvl_send, nvl_recv, rdma_send,
# rdma_recv)).
DEEPEP_DISPATCH = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 20, 128),
                   24: (288, 32, 128), 32: (288, 32, 128), 64: (288, 28, 128),
                   128: (560, 32, 128), 144: (720, 12, 128), 160: (720, 12, 128)}
DEEPEP_COMBINE = {2: (256, 6, 128), 4: (256, 6, 128), 8: (256, 6, 128), 16: (288, 28, 128),
                  24: (288, 20, 128), 32: (288, 20, 128), 64: (288, 20, 128),
                  128: (560, 12, 128), 144: (720, 8, 128), 160: (720, 8, 128)}
DEEPEP_NUM_SMS = 20
NVL_PEERS = 8  # NUM_MAX_NVL_PEERS
# Per received token beside its hidden bytes: top-k indices (128 x 8 B), top-k weights
# (128 x 4 B), scales (128 x 4 B) and the 8 B source record (SourceMeta: two ints).
TOKEN_EXTRA_BYTES = 128 * 8 + 128 * 4 + 128 * 4 + 8
RDMA_SLOT_EXTRA_BYTES = 16  # one int4 per RDMA slot


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def estimate_deepep_buffer_bytes(hidden_bytes: int, ep: int) -> int:
    """One GPU's DeepEP buffer for an EP group of `ep` ranks (module docstring); 0 for ep 1."""
    if ep <= 1:
        return 0
    key = min((size for size in DEEPEP_DISPATCH if size >= ep), default=max(DEEPEP_DISPATCH))
    channels = DEEPEP_NUM_SMS // 2
    nvl_ranks, rdma_ranks = min(ep, NVL_PEERS), max(ep // NVL_PEERS, 1)
    nvl = rdma = 0
    for nvl_recv, rdma_send, rdma_recv in (DEEPEP_DISPATCH[key], DEEPEP_COMBINE[key]):
        size = channels * nvl_ranks * ((2 * rdma_ranks + 3) * 4
                                       + nvl_recv * (hidden_bytes + TOKEN_EXTRA_BYTES))
        nvl = max(nvl, _align(size, 128))
        if ep > NVL_PEERS:
            slots = _align(rdma_recv, rdma_send)
            size = channels * rdma_ranks * (
                (NVL_PEERS * 2 + 2) * 2 * 4
                + 2 * slots * (hidden_bytes + TOKEN_EXTRA_BYTES + RDMA_SLOT_EXTRA_BYTES)) + 2**20
            rdma = max(rdma, _align(size, 128))
    return nvl + rdma


# HybridEP (module docstring): tokens per rank are at least 512 and rounded up to the combine
# API's chunk (config.cuh Configurer: NUM_OF_TOKENS_PER_CHUNK_COMBINE_API default 64); one scaling
# factor (fp32) per 128 hidden elements; an NVLink domain of an 8-GPU node.
HYBRIDEP_MIN_TOKENS = 512
HYBRIDEP_CHUNK_TOKENS = 64
HYBRIDEP_SCALE_BLOCK = 128
TOKEN_BYTES, PROB_BYTES = 2, 4  # uint16 (bf16) tokens, fp32 probabilities and scales


def estimate_hybridep_buffer_bytes(hidden: int, tokens: int, ranks: int, num_experts: int,
                                   local_experts: int, domain_gpus: int = 8) -> int:
    """One GPU's HybridEP buffer (module docstring) for `ranks` = etp x ep ranks, each
    dispatching `tokens` tokens of `hidden` elements, in NVLink domains of `domain_gpus`;
    0 for a group of one."""
    if ranks <= 1:
        return 0
    slots = _align(max(tokens, HYBRIDEP_MIN_TOKENS), HYBRIDEP_CHUNK_TOKENS)
    nvl_ranks = min(ranks, domain_gpus)
    domains = -(-ranks // nvl_ranks)
    scales = PROB_BYTES * (hidden // HYBRIDEP_SCALE_BLOCK)
    probs = PROB_BYTES * local_experts * nvl_ranks
    nvl = slots * ranks * (TOKEN_BYTES * hidden + probs + scales)
    gather = slots * ranks * num_experts
    rdma = 0
    if domains > 1:
        rdma = slots * (TOKEN_BYTES * hidden + PROB_BYTES * local_experts * ranks + scales)
        rdma += slots * (domains - 1) * (3 * TOKEN_BYTES * hidden + 3 * probs + scales)
    return nvl + gather + rdma


def estimate_dispatcher_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                              options: MemoryOptions) -> np.ndarray:
    """The dispatcher's buffers per GPU of each candidate, by the profile's dispatcher
    (MemoryOptions.moe_dispatcher): DeepEP's and HybridEP's buffers, the all-gather
    dispatcher's global buffer, nothing for the all-to-all dispatcher (module docstring)."""
    n = len(candidates)
    dispatcher = options.moe_dispatcher
    if dispatcher == "alltoall" or not model_spec.is_moe:
        return np.zeros(n)
    # The dispatched tensor's width (core_v0.16.1 moe/fused_a2a.py: get_buffer(group,
    # get_hidden_bytes(x)), HybridEP's hidden_dim = x.shape[-1]): latent under LatentMoE.
    hidden = model_spec.moe_token_width
    ranks = candidates.etp * candidates.ep
    if dispatcher == "deepep":
        sizes = {int(r): estimate_deepep_buffer_bytes(TOKEN_BYTES * hidden, int(r))
                 for r in np.unique(ranks)}
        return np.array([sizes[int(r)] for r in ranks], dtype=float)
    tokens = job.seq_len * candidates.micro_batch // (candidates.tp * candidates.cp)
    if dispatcher == "allgather":
        return np.where(ranks > 1, TOKEN_BYTES * hidden * tokens * ranks, 0).astype(float)
    experts = model_spec.num_experts
    rows = {key: estimate_hybridep_buffer_bytes(hidden, key[0], key[1], experts,
                                                experts // key[2], options.nvlink_domain_gpus)
            for key in set(zip(tokens.tolist(), ranks.tolist(), candidates.ep.tolist()))}
    return np.array([rows[key] for key in zip(tokens.tolist(), ranks.tolist(),
                                              candidates.ep.tolist())], dtype=float)
