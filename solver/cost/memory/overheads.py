"""Temporary buffers and fixed per-GPU overheads: ZeRO-3 gathers, communication buckets, the
CUDA context, NCCL, and the caching allocator's fragmentation (notes §3.1 FSDP, §3.4)."""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory.options import GIB, MemoryOptions
from solver.spec import JobSpec, ModelSpec

FLOAT8_BYTES = 1.0
BF16_BYTES = 2.0


def estimate_zero3_gather_bytes(candidates: Candidates, largest_layer_params: np.ndarray,
                                options: MemoryOptions, fp8_copy_bytes: float = 0.0
                                ) -> np.ndarray:
    """ZeRO-3 working copies: (1 + prefetch) gathered layers in the parameter dtype plus the
    unsharded gradients of the layer being reduce-scattered; 0 below ZeRO-3.

        (1 + zero3_prefetch_layers) * P_layer * (param_bytes + fp8_copy_bytes)
        + P_layer * grad_bytes
    Source: PyTorch FSDP2 (two all-gather outputs alive at once; backward keeps the current
    unit's unsharded gradients; notes §3.1). The seed's "temp parameter gather (one layer)"
    counts one gathered copy only. Below bf16, each gathered layer also has its quantised
    copies (fp8_copy_bytes per parameter, states.estimate_fp8_copy_bytes_per_param).
    Worked number: Llama-3.1-405B layer 3.188e9 / tp 8 = 398.5e6 parameters:
    2 * 398.5e6 * 2 B + 398.5e6 * 4 B = 3.19 GB (the seed: "~0.8 GB").
    """
    gathered = ((1 + options.zero3_prefetch_layers)
                * (estimate_gathered_param_bytes(options) + fp8_copy_bytes) + options.grad_bytes)
    # Where the whole stage stays gathered (fsdp_unsharded_under_pp, counted in the states)
    # no layer is gathered apart.
    kept = (candidates.pp > 1) & options.fsdp_unsharded_under_pp
    return np.where((candidates.zero >= 3) & ~kept, largest_layer_params * gathered, 0.0)


def estimate_gathered_param_bytes(options: MemoryOptions) -> float:
    """Bytes of a parameter gathered by ZeRO-3: float8 under torchao's FSDP float8 all-gather
    (MemoryOptions.fp8_all_gather), else param_bytes."""
    return FLOAT8_BYTES if options.fp8_all_gather else options.param_bytes


def estimate_fixed_bytes(candidates: Candidates, options: MemoryOptions) -> dict[str, np.ndarray]:
    """Per-GPU items independent of the configuration: communication buckets, the CUDA
    context and NCCL's communicators (defaults and sources in MemoryOptions).
    Worked number: 0.32 GB + 1 GiB + 1.5 GiB = 3.0 GB, the seeds' "Buffers 3 GB"."""
    ones = np.ones(len(candidates))
    return {
        "comm_buckets": ones * options.comm_bucket_bytes,
        "cuda_context": ones * options.cuda_context_gib * GIB,
        "nccl": ones * options.nccl_gib * GIB,
    }


def estimate_fragmentation_bytes(allocated: np.ndarray, options: MemoryOptions) -> np.ndarray:
    """The allocator's cached-but-unused blocks: fragmentation * allocated bytes.
    Worked number: 194.4 GB allocated * 0.12 = 23.3 GB, the 216.9 GB reserved of the
    Llama-3.1-8B log (notes §3.4)."""
    return allocated * options.fragmentation



def estimate_pipeline_grad_buffer_bytes(model_spec: ModelSpec, job: JobSpec,
                                        candidates: Candidates, options: MemoryOptions
                                        ) -> np.ndarray:
    """Bytes per GPU of the gradient receive buffers torch.distributed.pipelining keeps for one
    (virtual) stage that is not the last (MemoryOptions.pipeline_grad_buffers), 0 without them:

        num_microbatches * (s * b / cp) * h * 2 B / (tp under sequence parallelism)
    one buffer of the stage's bf16 output per micro-batch of the step (global_batch /
    (dp * micro_batch)); the composition counts it on every stage but the last
    (solver.cost.memory.terms; once per GPU, though each virtual stage of an interleaved
    schedule keeps its own: a lower bound there).
    Worked number: Llama-3.1-405B, tp 8, pp 8, dp 8, b 4, s 8192 (torchtitan 2024-12, Table
    5, 1F1B): 8 micro-batches x 4 x 1,024 x 16,384 x 2 B = 1.07 GB on each stage but the last.
    """
    if not options.pipeline_grad_buffers:
        return np.zeros(len(candidates))
    num_micro = np.maximum(job.global_batch // (candidates.dp * candidates.micro_batch), 1)
    tokens = job.seq_len * candidates.micro_batch / candidates.cp
    sharded = candidates.tp if options.sequence_parallel else 1
    return num_micro * tokens * model_spec.hidden_size * BF16_BYTES / sharded


def estimate_frozen_zero3_gather_bytes(candidates: Candidates, largest_layer_params: np.ndarray,
                                       options: MemoryOptions, base_bytes: float
                                       ) -> np.ndarray:
    """ZeRO-3 working copies of a frozen base (LoRA, QLoRA; solver.cost.layers.finetune):
    (1 + prefetch) gathered layers at the base's bytes a weight, and no unsharded gradients
    (the frozen weights have none; the adapters' are under 1% of a layer's, not counted).

        (1 + zero3_prefetch_layers) * P_layer * base_bytes        at ZeRO-3, else 0
    An NF4 base is gathered as NF4: torchao's NF4Tensor implements FSDP2's
    fsdp_pre_all_gather / fsdp_post_all_gather over its quantized data and scalers
    (torchao/quantization/quantize_/workflows/nf4/nf4_tensor.py @36027d8).
    Worked number: a Llama-3.1-405B layer (3.188e9) under QLoRA: 2 x 3.188e9 x 0.5159 = 3.29 GB
    (bf16 LoRA: 12.75 GB; full training adds 3.188e9 x 4 B of gradients)."""
    kept = (candidates.pp > 1) & options.fsdp_unsharded_under_pp
    gathered = (1 + options.zero3_prefetch_layers) * base_bytes
    return np.where((candidates.zero >= 3) & ~kept, largest_layer_params * gathered, 0.0)
