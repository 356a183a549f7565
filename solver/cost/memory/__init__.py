"""Per-GPU training memory, per pipeline stage and itemized, vectorised over candidates.

    options      MemoryOptions: every constant, with its source
    layout       layers per stage, micro-batches in flight (1F1B, interleaved)
    states       weights, gradients, optimizer state under ZeRO 0-3
    activations  Korthikanti et al. 2022 per layer, adapted to GQA / MLA / gated MLP / MoE
    eager        what eager ops and an unfused attention core keep beyond fused kernels
    overheads    ZeRO-3 gathers, buckets, CUDA context, NCCL, fragmentation
    dispatcher   the MoE dispatcher's own buffers (DeepEP, HybridEP, all-gather)
    terms        a stage's memory as an affine function of what it holds (one composition)
    estimate     one stage, the worst stage, every stage of one configuration
    views        allocated, reserved, device: the numbers torch.cuda and nvidia-smi report
"""

from solver.cost.memory.activations import estimate_layer_activation_bytes
from solver.cost.memory.estimate import (
    ITEMS,
    MAIN_ITEMS,
    OTHER_ITEMS,
    MemoryBreakdown,
    estimate_all_stages,
    estimate_layout_memory,
    estimate_memory,
    estimate_memory_total,
    estimate_stage_memory,
)
from solver.cost.memory.options import MemoryOptions
from solver.cost.memory.views import VIEWS, allocator_items, estimate_memory_views

__all__ = [
    "ITEMS",
    "MAIN_ITEMS",
    "OTHER_ITEMS",
    "VIEWS",
    "MemoryBreakdown",
    "MemoryOptions",
    "allocator_items",
    "estimate_all_stages",
    "estimate_layout_memory",
    "estimate_layer_activation_bytes",
    "estimate_memory",
    "estimate_memory_total",
    "estimate_memory_views",
    "estimate_stage_memory",
]
