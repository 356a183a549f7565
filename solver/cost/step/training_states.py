"""Training states below mixed precision (issue 43, `--training-states`): what each parameter
keeps on the GPU and what the optimizer step streams through HBM, per named choice.

  mixed               the framework's own mixed precision (MemoryOptions' defaults: bf16
                      weights, fp32 gradients, fp32 master weights and Adam m and v:
                      2 + 4 + 12 = 18 B per parameter, Megatron dist_optimizer.md).
  pure_bf16           bf16 weights, bf16 gradients, bf16 Adam m and v and no fp32 master:
                      2 + 2 + 2 + 2 = 8 B. torch.optim.AdamW allocates its moments like the
                      parameter (torch/optim/adamw.py _init_group: exp_avg =
                      torch.zeros_like(p, memory_format=torch.preserve_format)), so a model
                      held in bf16 trains in bf16 throughout, as torchtune's recipes do (docs
                      tutorials/memory_optimizations.rst, "Model Precision": bfloat16 "uses 2
                      bytes per model and optimizer parameter"; "we don't support
                      mixed-precision training in torchtune"; `dtype: bf16`) and nanoGPT-style
                      loops over model.to(torch.bfloat16).
  adam8bit            the framework's weights, gradients and fp32 master; Adam's m and v in 8
                      bits, quantised block-wise: bitsandbytes Adam8bit / AdamW8bit /
                      PagedAdamW8bit (bitsandbytes/optim/optimizer.py Optimizer2State.
                      init_state: state1 and state2 torch.uint8, and with block_wise (the
                      default) absmax1 and absmax2 torch.float32 of `blocks = n // 256` (+1)
                      elements); torchao's AdamW8bit keeps the same (block_size=256, an fp32
                      scale per block). 1 + 4/256 = 1.015625 B a moment, 2.03 B for both
                      against 8 B in fp32: the bitsandbytes docs' "75% less memory" of the
                      states ("8-bit optimizers").
  pure_bf16_adam8bit  both: 2 + 2 + 2.03 = 6.03 B; torchtune's full fine-tuning recipes with
                      `dtype: bf16` and `optimizer: bitsandbytes.optim.PagedAdamW8bit`
                      (memory_optimizations.rst, "Lower Precision Optimizers").

DeepSpeed's pure bf16 (ds_config bf16.bf16_master_weights_and_grads with bf16_optimizer_states,
ZeRO 1-3 only: runtime/engine.py asserts "Bf16_master_weights_and_grads is only supported with
ZeRO Stage 1, 2, or 3") keeps its master as a bf16 clone of the rank's partition beside the
bf16 weights (runtime/zero/stage_1_and_2.py: weights_partition = the bit16 partition
.detach().clone().to(dtype=self.master_weights_and_grads_dtype)): 2 B more of optimizer state,
sharded like it (TimeConstants.bf16_master_copy), 10 B per parameter unsharded; its step reads
and writes that copy and writes the bf16 weights from it (2 B more).

Not modelled: bitsandbytes keeps tensors under min_8bit_size = 4,096 elements in 32-bit states
(biases and norm weights narrower than 4,096: under 0.01% of a 1B+ model's parameters), its
256-entry fp32 quantisation maps (1 KiB per state tensor), and paged optimizers' eviction to
host memory under pressure (PagedAdamW8bit pages only when the GPU runs out).
"""

from __future__ import annotations

from typing import Any

from solver.cost.memory.options import MemoryOptions
from solver.spec.framework import TrainingStates

FP32_BYTES = 4.0
BF16_BYTES = 2.0
# bitsandbytes' block-wise 8-bit state: one uint8 code per element and one fp32 absmax per
# block of 256 (Optimizer2State.init_state, module docstring).
ADAM8BIT_BLOCK_ELEMENTS = 256
ADAM8BIT_MOMENT_BYTES = 1.0 + FP32_BYTES / ADAM8BIT_BLOCK_ELEMENTS
ADAM_MOMENTS = 2  # m and v
# The optimizer step of torch.optim.AdamW (foreach or fused) over bf16 parameters: read the
# parameter, gradient, m and v, write the parameter, m and v: 7 x 2 B.
PURE_BF16_STEP_BYTES = 7 * BF16_BYTES


def is_pure(states: TrainingStates) -> bool:
    """Whether `states` keeps no fp32 master (pure_bf16, pure_bf16_adam8bit)."""
    return states.startswith("pure_bf16")


def is_8bit(states: TrainingStates) -> bool:
    """Whether `states` quantises Adam's moments to 8 bits (adam8bit, pure_bf16_adam8bit)."""
    return states.endswith("adam8bit")


def estimate_adam_moment_bytes(states: TrainingStates) -> float:
    """Bytes per parameter of one Adam moment: fp32 (4) under mixed precision, bf16 (2) in
    pure bf16, 1 + 4/256 = 1.015625 block-wise 8-bit (bitsandbytes, torchao)."""
    if is_8bit(states):
        return ADAM8BIT_MOMENT_BYTES
    return BF16_BYTES if is_pure(states) else FP32_BYTES


def estimate_training_state_options(states: TrainingStates, base: MemoryOptions,
                                    bf16_master_copy: bool = False) -> dict[str, Any]:
    """The MemoryOptions update of `states` over the framework's options `base`:

        adam8bit        optimizer_bytes = base - 2 x 4 + 2 x 1.015625
        pure_*          param_bytes 2, grad_bytes 2, optimizer_bytes = 2 x moment bytes
                        (+ 2 for a bf16 master copy, DeepSpeed), no fp32 parameter shard (FSDP's
                        shard is the bf16 parameter) and no master remainders; gradients
                        accumulate in bf16 (fsdp_reduce_bytes 2)
        mixed           nothing
    Worked numbers (B per parameter, unsharded): Megatron's 2 + 4 + 12 = 18 becomes
    2 + 4 + 6.03 = 12.03 with adam8bit; pure_bf16 2 + 2 + 4 = 8; pure_bf16_adam8bit
    2 + 2 + 2.03 = 6.03. Llama-3.1-8B (8.03e9) pure_bf16 under ZeRO-3 over 8 GPUs: 8.03 GB of
    states per GPU, against 16 x 8.03e9 / 8 = 16.06 GB under PyTorch FSDP's mixed precision.
    """
    moments = ADAM_MOMENTS * estimate_adam_moment_bytes(states)
    if is_pure(states):
        master = BF16_BYTES if bf16_master_copy else 0.0
        return {"param_bytes": BF16_BYTES, "grad_bytes": BF16_BYTES,
                "optimizer_bytes": moments + master,
                "fp32_sharded_params": False, "master_param_remainders": False,
                "fsdp_reduce_bytes": BF16_BYTES}
    if is_8bit(states):
        fp32_moments = ADAM_MOMENTS * FP32_BYTES
        return {"optimizer_bytes": max(base.optimizer_bytes - fp32_moments, 0.0) + moments}
    return {}


def estimate_optimizer_step_bytes(states: TrainingStates, mixed_bytes: float,
                                  bf16_master_copy: bool = False) -> float:
    """Bytes per parameter the optimizer step streams through HBM under `states`, given the
    framework's mixed-precision count `mixed_bytes` (TimeConstants.optimizer_bytes_per_param:
    30 = the fp32 parameter, gradient, m and v read, parameter, m and v written, and the bf16
    copy written):

        adam8bit            mixed - 2 x 2 x 4 + 2 x 2 x 1.015625   (m and v read and written)
        pure_bf16           7 x 2 = 14                              (torch AdamW over bf16)
        pure_bf16_adam8bit  14 - 2 x 2 x 2 + 2 x 2 x 1.015625
    and 2 B more for a bf16 master copy (DeepSpeed: the weights written from it).
    The 8-bit kernels dequantise each block in registers (bitsandbytes kOptimizerStatic8bit2
    StateBlockwise: the 256-entry map in shared memory), so the step is counted as memory
    traffic only, at the HBM rate of the mixed step. Worked numbers: 30 -> 18.06 (adam8bit),
    14 (pure_bf16), 10.06 (pure_bf16_adam8bit); 8.03e9 parameters on one H100 at 80% of
    3.35 TB/s: 0.090 s -> 0.054 s, 0.042 s, 0.030 s.
    """
    read_write = 2 * ADAM_MOMENTS
    eight_bit = read_write * ADAM8BIT_MOMENT_BYTES
    if is_pure(states):
        copy = BF16_BYTES if bf16_master_copy else 0.0
        if is_8bit(states):
            return PURE_BF16_STEP_BYTES - read_write * BF16_BYTES + eight_bit + copy
        return PURE_BF16_STEP_BYTES + copy
    if is_8bit(states):
        return mixed_bytes - read_write * FP32_BYTES + eight_bit
    return mixed_bytes
