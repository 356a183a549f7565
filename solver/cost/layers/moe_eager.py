"""The routed experts' eager element-wise work around the grouped GEMMs: what Megatron-Core's
TEGroupedMLP runs outside the fused kernels, which the measured fused-MoE rows (solver.cost.
kernels: one TensorRT-LLM kernel with the activation and biases inside) do not time.

Read from Megatron-Core core_v0.17.0 (NeMo 26.04), megatron/core/transformer/moe/experts.py
TEGroupedMLP and megatron/core/fusions/fused_bias_geglu.py, the same in core_v0.15.0 and
core_v0.16.0 (NeMo 25.11-26.02):

  fc2 bias   linear_fc2 is built with skip_bias_add=True: its bias must be scaled by each
             token's routing probability, which no grouped-GEMM epilogue does, so _apply_bias
             splits the output by local expert and computes `t + b * p` per expert, then
             torch.cat: per token copy of width w (bf16; the alltoall dispatcher keeps the
             router's bf16 probabilities) b * p writes 2w bytes, the add reads 4w and writes
             2w, the cat reads and writes 2w: 12w forward. Backward: autograd's mul backward
             forms g * p and g * b (read 2w, write 2w each) and reduces them (read 2w each):
             12w. Kernels: 2 per local expert and the cat forward, 4 per local expert backward.
  SwiGLU     weighted_bias_quick_geglu_impl with activation_func_clamp_value (gpt-oss's
  limit      swiglu_limit 7.0) clamps the two halves and concatenates them eagerly before the
             compiled activation: per token copy of fc1 width 2F (F = moe_intermediate_size /
             etp) the two clamps read and write F each and the cat reads and writes 2F: 8F
             elements, 16F bytes forward (3 kernels). Backward: each clamp's gradient reads the
             gradient and the input and writes F: 12F bytes (2 kernels; the cat's backward is
             views).
  moe_act    --recompute-modules moe_act checkpoints the whole activation function
  recompute  (CheckpointWithoutOutput around bias_act_func): the backward re-runs the clamp
             path and the compiled activation. The step-time model leaves the fused
             element-wise re-runs of moe_act and layernorm uncharged (a few percent of a
             layer; solver.cost.step.recompute_modules builds its module ladder on that), so only
             the clamp path's forward is charged here.

Every kernel also pays ComputeConstants.gemm_kernel_s, as the layer's element-wise kernels do.
Worked number (gpt-oss-120b, H100, ep 8, one 4096-token sequence: 16,384 copies on 16 local
experts, w = F = 2880): bias 566 MB each way, 0.211 ms + 33 and 64 kernels; clamp 755 MB
forward (0.282 ms, re-run under moe_act), 566 MB backward (0.211 ms).
"""

from __future__ import annotations

import numpy as np

from solver.cost.kernels.efficiency import ComputeConstants, estimate_streaming_s
from solver.spec import GpuSpec, ModelSpec

BIAS_BYTES_PER_WIDTH = (12.0, 12.0)  # forward, backward; per token copy, times w
BIAS_KERNELS_PER_EXPERT = (2.0, 4.0)  # forward (and one cat), backward
CLAMP_BYTES_PER_WIDTH = (16.0, 12.0)  # forward, backward; per token copy, times F
CLAMP_KERNELS = (3.0, 2.0)


def estimate_permuted_elements_per_token(num_experts_per_tok: int, fused: bool,
                                         measured_kernel: bool = False) -> float:
    """Token widths an MoE layer's permutation and un-permutation stream per token in a
    forward pass (read + written; the backward streams as much, as every element-wise pass:
    layer_compute.estimate_backward_s) that no kernel table times.

    Unfused (Megatron-Core moe_utils.py permute / unpermute with fused=False, core_v0.16): the
    permutation gathers k copies (tokens.index_select: read k, write k) and the
    un-permutation scatter-adds them back (read k, write k): 4k. The probabilities' multiply
    and the zero fill that the unfused un-permutation also runs are not charged (the count this
    model has always used).
    Fused (--moe-permute-fusion: TransformerEngine transformer_engine/common/triton/
    permutation.py at d0067d0, _permute_kernel loads each token's row once and stores it to its
    k destinations; _unpermute_kernel loads the k rows, weighs them by merging_probs and stores
    the token once): k + 1 each way, 2k + 2.
    `measured_kernel`: the routed experts were timed as one fused MoE kernel (solver.cost.
    kernels.kernels_moe, TensorRT-LLM), which permutes and un-permutes itself in the same two
    passes [B: as TE's fused kernels]: only what the framework streams beyond them is left,
    nothing when fused, 2k - 2 when not (charged as a pure copy, layer_compute).
    Worked number: Qwen3-30B-A3B (k 8, h 2048, bf16): 32 -> 18 widths, 131.1 -> 73.7 kB a
    token; next to a measured kernel 14 -> 0 (57.3 kB a token)."""
    k = float(num_experts_per_tok)
    widths = 2.0 * k + 2.0 if fused else 4.0 * k
    return widths - (2.0 * k + 2.0) if measured_kernel else widths


def estimate_expert_eager_s(model_spec: ModelSpec, gpu: GpuSpec, constants: ComputeConstants,
                            copies: np.ndarray, local_experts: np.ndarray, etp: np.ndarray
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(forward, backward, moe_act recompute) seconds of one MoE layer's eager expert work for
    `copies` token copies on a GPU holding `local_experts` experts split `etp` ways (module
    docstring); zeros for a model without expert biases or a SwiGLU limit."""
    copies, local_experts, etp = np.broadcast_arrays(
        np.asarray(copies, dtype=float), np.asarray(local_experts, dtype=float),
        np.asarray(etp, dtype=float))
    kernel_s = constants.gemm_kernel_s
    inter = model_spec.moe_intermediate_size / etp

    def stream(bytes_per_copy: np.ndarray | float, kernels: np.ndarray | float) -> np.ndarray:
        return estimate_streaming_s(gpu, bytes_per_copy * copies, constants) + kernels * kernel_s

    zero = np.zeros(copies.shape)
    forward, backward, clamp = zero, zero, zero
    if model_spec.mlp_bias:
        width = float(model_spec.moe_token_width)
        forward = stream(BIAS_BYTES_PER_WIDTH[0] * width,
                         BIAS_KERNELS_PER_EXPERT[0] * local_experts + 1.0)
        backward = stream(BIAS_BYTES_PER_WIDTH[1] * width,
                          BIAS_KERNELS_PER_EXPERT[1] * local_experts)
    if model_spec.swiglu_limit is not None:
        clamp = stream(CLAMP_BYTES_PER_WIDTH[0] * inter, CLAMP_KERNELS[0])
        forward = forward + clamp
        backward = backward + stream(CLAMP_BYTES_PER_WIDTH[1] * inter, CLAMP_KERNELS[1])
    return forward, backward, clamp
