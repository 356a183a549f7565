"""The MoE token dispatcher's own communication buffers, allocated once per GPU outside
PyTorch's caching allocator (so not part of its fragmentation).

DeepEP (Megatron's flex dispatcher with --moe-flex-dispatcher-backend deepep) allocates one
`deep_ep.Buffer` for the EP group, sized by the larger of its dispatch and combine configs'
hints (megatron/core/transformer/moe/fused_a2a.py get_buffer; deepseek-ai/DeepEP
csrc/config.hpp Config.get_nvl_buffer_size_hint / get_rdma_buffer_size_hint, deep_ep/buffer.py
get_dispatch_config / get_combine_config, Buffer.num_sms = 20):

  NVLink buffer  C N ((2R + 3) 4 + T_nvl (H + 2056))
  RDMA buffer    C R (144 + 2 T_rdma (H + 2072)) + 1 MiB, only when the group spans nodes
with C = num_sms / 2 = 10 channels, N = min(ep, 8) NVLink ranks, R = max(ep / 8, 1) RDMA ranks,
H the hidden size in bytes (bf16: 2h), T the configs' receive-token counts (T_rdma rounded up
to a multiple of the send chunk), and per received token its top-k indices and weights and
its scales at their maxima (128 x 8, 128 x 4, 128 x 4 B) and an 8 B source record (+16 B per
RDMA slot). Worked number: DeepSeek-V3 (h 7168), ep 64: NVLink 10 x 8 x (76 + 288 x 16,392) =
377.7 MB, RDMA 10 x 8 x (144 + 280 x 16,408) + 1 MiB = 368.6 MB: 0.746 GB per GPU.

DeepEP's tables list EP sizes 2-160; another size takes the next listed one (the largest above
160). HybridEP's buffers and the NCCL dispatchers' buffers (MemoryOptions.nccl_gib) are not
counted here.
"""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory.options import MemoryOptions
from solver.spec import ModelSpec

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


def estimate_dispatcher_bytes(model_spec: ModelSpec, candidates: Candidates,
                              options: MemoryOptions) -> np.ndarray:
    """The dispatcher's buffers per GPU of each candidate: DeepEP's where the profile
    dispatches with it (MemoryOptions.moe_dispatcher), else 0."""
    if options.moe_dispatcher != "deepep" or not model_spec.is_moe:
        return np.zeros(len(candidates))
    # DeepEP's buffers are sized by the dispatched tensor (core_v0.16.1 moe/fused_a2a.py:
    # get_buffer(group, get_hidden_bytes(x))): latent tokens under LatentMoE.
    hidden_bytes = 2 * model_spec.moe_token_width
    sizes = {int(ep): estimate_deepep_buffer_bytes(hidden_bytes, int(ep))
             for ep in np.unique(candidates.ep)}
    return np.array([sizes[int(ep)] for ep in candidates.ep], dtype=float)
