"""A stage's memory in the three views users measure it in (issue 43), from its items (ITEMS):

    allocated  torch.cuda.max_memory_allocated(): the tensors PyTorch's caching allocator
               hands out: ALLOCATED_ITEMS, and the all-gather dispatcher's buffer (a tensor of
               Megatron's GlobalMemoryBuffer).
    reserved   torch.cuda.max_memory_reserved(): the allocator's segments, allocated plus its
               cached-but-unused blocks (the "fragmentation" item).
    device     nvidia-smi, and what an out-of-memory error is about: reserved plus what the
               allocator never sees: the CUDA context, NCCL's communicators and buffers, and
               the DeepEP / HybridEP buffers.

Where the dispatchers' buffers live (deepseek-ai/DeepEP):
  DeepEP     the NVLink buffer through SharedMemoryAllocator.malloc (cudaMalloc, or cuMemCreate
             with fabric handles), the RDMA buffer through nvshmem_align and a 32 MiB workspace
             through cudaMalloc (main @dd758ca csrc/legacy/buffer.hpp Buffer::Buffer and
             Buffer::sync, csrc/utils/shared_memory.hpp, csrc/kernels/backend/nvshmem.cu
             alloc; the same calls in csrc/deep_ep.cpp before EPv2): device only.
  HybridEP   every NVLink, RDMA and all-gather buffer through ExtendedMemoryAllocator::allocate
             (cuMemCreate, or cudaMalloc) or cudaMalloc (branch hybrid-ep @94a9f8f:
             csrc/hybrid_ep/allocator/allocator.cu, buffer/intranode.cu NVLCoordinator::
             allocate_dispatch_buffers / allocate_combine_buffers, buffer/internode_doca.cu
             RDMACoordinator::allocate_buffers, extension/allgather.cu allocate_ag_buffer):
             device only; torch::empty holds only the IPC handles exchanged.
  all-gather Megatron's GlobalMemoryBuffer.get_tensor (megatron/core/utils.py: torch.empty),
             allocated once and kept: allocated, without fragmentation
             (solver.cost.memory.dispatcher).
The all-to-all dispatcher keeps no buffer of its own.

By construction allocated <= reserved <= device (every item is >= 0), and device is the total
every fit is judged on (memory_fits_hbm).

On a GPU with room to spare (estimate_memory_views_with_room) the allocator keeps more: PyTorch's
caching allocator returns freed blocks to its cache, not to the device, and releases cached
blocks only when a cudaMalloc fails (c10/cuda/CUDACachingAllocator.cpp DeviceCachingAllocator::
malloc: release_cached_blocks, then the retry its num_alloc_retries counts; expandable segments
unmap pages on the same path). The fragmentation item is what it keeps under pressure (5%,
MemoryOptions.fragmentation); with room and no retry it keeps ROOMY_CACHE_FRACTION, what the
dgxc Llama-3.1-8B log shows: max reserved 216.89 GB over max allocated 194.41 GB with
"mem-alloc-retires: 0" (dgxc-benchmarking llama3.1/README.md line 490 @841f546).
Every plan carries these views of its GPU as its observed ones (solver.spec.plan.OBSERVED_VIEWS,
`reserved_gb_observed` and `device_gb_observed`: solver.api.estimate_plans), and
benchmarks/memory_public.py compares its public counters through the same function.
Worked number: Llama-3.1-8B, dp 8, ZeRO-1, b 4, s 8192, no recompute, default options:
allocated 202.4 GB (dgxc log: max allocated 194.41 GB), reserved 202.4 x 1.05 = 212.5 GB
(216.89 GB), device 212.5 + 1 GiB + 1.5 GiB = 215.2 GB.
"""

from __future__ import annotations

import numpy as np

from solver.cost.memory.options import MemoryOptions
from solver.cost.memory.terms import ALLOCATED_ITEMS, ITEMS
from solver.spec.plan import MEMORY_VIEWS

VIEWS = tuple(MEMORY_VIEWS)  # allocated, reserved, device
# Reserved over allocated where the allocator never had to release its cache (module
# docstring): 216.89 / 194.41 - 1 = 0.1156.
ROOMY_CACHE_FRACTION = 216.89 / 194.41 - 1.0
# Dispatchers whose buffers are tensors of PyTorch's caching allocator (module docstring).
TENSOR_DISPATCHERS = ("allgather",)


def allocator_items(options: MemoryOptions) -> tuple[str, ...]:
    """The items PyTorch's caching allocator holds under `options`: ALLOCATED_ITEMS, and the
    dispatcher's buffer where it is a tensor (the all-gather dispatcher)."""
    if options.moe_dispatcher in TENSOR_DISPATCHERS:
        return ALLOCATED_ITEMS + ("dispatcher",)
    return ALLOCATED_ITEMS


def estimate_memory_views(items: dict[str, np.ndarray], allocated_items: tuple[str, ...]
                          ) -> dict[str, np.ndarray]:
    """Bytes per GPU in each view (VIEWS) of stages with `items` (ITEMS), `allocated_items`
    being those the caching allocator holds (allocator_items):

        allocated = sum of allocated_items
        reserved  = allocated + fragmentation
        device    = reserved + every other item (CUDA context, NCCL, DeepEP / HybridEP)
    Worked number in the module docstring."""
    allocated = sum((items[name] for name in allocated_items), np.zeros_like(items["weights"]))
    reserved = allocated + items["fragmentation"]
    outside = [name for name in ITEMS if name not in allocated_items and name != "fragmentation"]
    device = reserved + sum((items[name] for name in outside), np.zeros_like(reserved))
    return {"allocated": allocated, "reserved": reserved, "device": device}


def estimate_memory_views_with_room(views: dict[str, np.ndarray], capacity_bytes: float
                                    ) -> dict[str, np.ndarray]:
    """The views (estimate_memory_views) on a GPU of `capacity_bytes`, the allocator's cache
    grown into the room the GPU leaves (module docstring):

        outside = device - reserved                    (CUDA context, NCCL, DeepEP buffers)
        cache   = max(reserved - allocated,            (what it keeps under pressure)
                      min(ROOMY_CACHE_FRACTION * allocated, capacity - outside - allocated))
        reserved' = allocated + cache,  device' = reserved' + outside
    The cache grows only into memory the GPU has, so device' <= capacity wherever
    device <= capacity, and device' = device where it does not fit: what fits is unchanged.
    Worked number: allocated 194.41 GB, reserved 204.1 GB (5%), outside 2.68 GB, on a
    288 GB GPU: cache = min(22.48, 90.9) = 22.48 GB, reserved' = 216.89 GB (the log's); on a
    200 GB GPU the room is 2.91 GB, below the 9.72 GB kept under pressure: reserved stays
    204.1 GB."""
    allocated, reserved = views["allocated"], views["reserved"]
    outside = views["device"] - reserved
    room = capacity_bytes - outside - allocated
    cache = np.maximum(reserved - allocated,
                       np.minimum(ROOMY_CACHE_FRACTION * allocated, room))
    return {"allocated": allocated, "reserved": allocated + cache,
            "device": allocated + cache + outside}
