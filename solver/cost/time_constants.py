"""The constants and switches of the step-time model (solver.cost.steptime), and what each
training framework does with them (`framework_time_constants`): which DP collectives overlap
compute, how often they run, in which dtype gradients are reduced.

Every constant has a physical meaning and a source; the switches are framework behaviour read
from the frameworks' code or documentation, never fitted.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from solver.cost.efficiency import ComputeConstants


class TimeConstants(BaseModel):
    """Constants of the step-time model; each has a physical meaning and a source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: ComputeConstants = ComputeConstants()
    # Megatron keeps fp32 main gradients and reduces them in fp32 for bf16 training
    # (arguments.py forces accumulate_allreduce_grads_in_fp32 with --bf16); FSDP / ZeRO-3
    # recipes reduce in the parameter dtype (LLM Foundry "PURE" mixed precision).
    grad_reduce_bytes: float = Field(default=4.0, gt=0)
    zero3_grad_reduce_bytes: float = Field(default=2.0, gt=0)
    # Adam: read fp32 param, grad, m, v; write param, m, v (7 x 4 B) and the bf16 copy (2 B).
    optimizer_bytes_per_param: float = Field(default=30.0, gt=0)
    # Gradient accumulation outside the GEMMs, bytes per parameter per micro-batch. Megatron
    # accumulates into fp32 main_grad inside the weight-gradient GEMM
    # (--gradient-accumulation-fusion): 0. DeepSpeed's pipeline engine with its bf16 optimizer
    # (the one built for BLOOM) calls update_hp_grads after every micro-batch's backward,
    # `hp.grad.add_(lp.grad.to(float32))`: read bf16 (2), write and read an fp32 copy (4 + 4),
    # read and write the fp32 gradient (4 + 4) = 18 B (a framework switch, not fitted).
    grad_accumulation_bytes_per_param: float = Field(default=0.0, ge=0)
    # FlashAttention's backward recomputes QK^T: 2.5x the forward FLOPs (Dao 2023 §3.1.2).
    attention_backward_ratio: float = Field(default=2.5, gt=0)
    # Framework switches (not fitted). Sequence parallel splits norms, residual adds and the
    # pipeline hand-off over TP (Megatron since 2022, DESIGN.md: on whenever tp > 1); older
    # Megatron-DeepSpeed runs (BLOOM) replicate them on every TP rank. TP communication
    # overlap (Transformer Engine userbuffers, `--tp-comm-overlap`) hides the SP all-gathers
    # and reduce-scatters behind the layer's GEMMs (NeMo communication_overlap.rst).
    sequence_parallel: bool = True
    # FlashAttention (every framework today); Megatron-DeepSpeed's 2022 attention (BLOOM) was
    # unfused: batched GEMMs around a fused softmax, which lose the tensor cores when the head
    # dimension is not 16-byte aligned (solver.cost.efficiency.estimate_attention_core_s).
    flash_attention: bool = True
    # Attention kernels written for the GPU's own tensor-core instructions (FlashAttention-3 or
    # cuDNN's fused attention on Hopper). 2023-era kernels (FlashAttention-1/2, Triton) use
    # Ampere's mma.sync and reach at most GpuSpec.legacy_mma_fraction of a Hopper peak.
    native_attention_kernels: bool = True
    tp_comm_overlap: bool = False
    # Whether DP collectives overlap compute: "always" (Megatron --overlap-grad-reduce /
    # --overlap-param-gather, FSDP's prefetch, DeepSpeed ZeRO's overlap_comm), "never", or
    # "without_pipeline" (DeepSpeed: its pipeline engine schedules them itself, the ReduceGrads
    # instruction after the last backward and ZeRO-1's parameter all-gather after the
    # optimizer step; pipe/engine.py "We schedule the all-reduces", schedule.py
    # TrainSchedule): where they do not overlap, nothing hides.
    dp_overlap: Literal["always", "never", "without_pipeline"] = "always"
    # ZeRO-1 reduce-scatters the gradients (Megatron's distributed optimizer); DeepSpeed's
    # pipeline engine all-reduces the whole gradient (_exec_reduce_grads ->
    # buffered_allreduce_fallback) before each rank updates its shard: twice the traffic.
    zero1_grad_all_reduce: bool = False
    # ZeRO 1-2 gather the updated parameters after the optimizer step; Megatron hides the
    # gather behind the next forward (--overlap-param-gather), DeepSpeed does it inside the
    # step (stage_1_and_2.py: all_gather_dp_groups after the update): exposed.
    params_gather_overlap: bool = True
    # ZeRO-0 (plain DDP) buckets its gradient all-reduce into the backward (torch DDP,
    # Megatron --overlap-grad-reduce); DeepSpeed's engine all-reduces after the whole backward
    # (engine.py backward -> allreduce_gradients at the accumulation boundary): exposed.
    zero0_grad_overlap: bool = True
    # ZeRO-2 in DeepSpeed reduces gradients after every micro-batch's backward, not once per
    # step (stage_1_and_2.py, reduce_ready_partitions_and_remove_grads: "if
    # self.partition_gradients or self.is_gradient_accumulation_boundary").
    zero2_reduce_every_micro_batch: bool = False
    # EP all-to-all overlap (Megatron-Core `--overlap-moe-expert-parallel-comm`, "EP A2A
    # communication overlap with computation in both 1F1B pipelining and non-pipelined
    # training", Megatron-Bridge 0.1.0 changelog; notes §4.5): one micro-batch's dispatch and
    # combine run while another's layer computes, so only what exceeds the layer's compute is
    # exposed, plus the SM share of the hidden part.
    ep_comm_overlap: bool = False
    # SMs that overlapped NCCL / userbuffer kernels occupy: NeMo's TP-overlap default is 16
    # (communication_overlap.rst; notes §4.5), NCCL's channel count is of the same order.
    comm_sms: int = Field(default=16, gt=0)


def dp_syncs_per_step(constants: TimeConstants, zero: np.ndarray, num_micro: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """How many times per step the backward-side and the forward-side DP collectives run:
    ZeRO-3 every micro-batch (both); DeepSpeed's ZeRO-2 reduces gradients every micro-batch
    (TimeConstants.zero2_reduce_every_micro_batch); the rest once per step."""
    zero = np.asarray(zero)
    backward = (zero == 3) | ((zero == 2) & constants.zero2_reduce_every_micro_batch)
    return np.where(backward, num_micro, 1.0), np.where(zero == 3, num_micro, 1.0)


def dp_part_overlaps(constants: TimeConstants, zero: np.ndarray, pp: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Whether the backward-side and the forward-side DP collectives overlap compute: both as
    TimeConstants.dp_overlap says, ZeRO-0's all-reduce only if zero0_grad_overlap too, the
    ZeRO 1-2 parameter gather only if params_gather_overlap too."""
    overlap = dp_overlaps(constants, pp)
    zero = np.asarray(zero)
    gather = constants.params_gather_overlap | (zero == 3)
    gradients = constants.zero0_grad_overlap | (zero != 0)
    return overlap & gradients, overlap & gather


def dp_overlaps(constants: TimeConstants, pp: np.ndarray) -> np.ndarray:
    """Per candidate, whether its DP collectives overlap compute (TimeConstants.dp_overlap)."""
    pp = np.asarray(pp)
    if constants.dp_overlap == "without_pipeline":
        return pp == 1
    return np.full(pp.shape, constants.dp_overlap == "always")


def framework_time_constants(framework: str) -> TimeConstants:
    """The step-time behaviour a framework brings (the planner's --framework), each from the
    framework's own code or defaults:
      megatron    fp32 main gradients, reduced in fp32 under Megatron-FSDP too (ZeRO-3: 4 B;
                  --grad-reduce-in-bf16 is opt-in); DP overlap (the launch settings ask for
                  --overlap-grad-reduce / --overlap-param-gather: solver.emit.megatron).
      torchtitan  FSDP2 reduces in mixed_precision_reduce = "float32" (its job config
                  default): ZeRO-2/3 gradients 4 B; prefetching overlaps DP traffic.
      deepspeed   its pipeline engine leaves DP traffic exposed (dp_overlap
                  "without_pipeline"), its ZeRO-0 all-reduces after the backward, its ZeRO 1-2
                  gather parameters inside the optimizer step and its ZeRO-2 reduces gradients
                  every micro-batch; ZeRO-3 reduces in the parameters' dtype (2 B) unless
                  communication_data_type says otherwise.
      generic     the defaults."""
    if framework == "deepspeed":
        return TimeConstants(dp_overlap="without_pipeline", params_gather_overlap=False,
                             zero2_reduce_every_micro_batch=True, zero0_grad_overlap=False)
    if framework in ("megatron", "torchtitan"):
        return TimeConstants(zero3_grad_reduce_bytes=4.0)
    return TimeConstants()
