"""What per-tensor FP8 with current scaling costs beyond delayed scaling (TE Float8CurrentScaling;
Megatron --fp8-recipe tensorwise; Megatron-Bridge's H100 "fp8_cs" performance recipes;
TimeConstants.fp8_current_scaling).

Transformer Engine quantizes a tensor under current scaling in three kernels
(transformer_engine/pytorch/csrc/quantizer.cpp, Float8CurrentScalingQuantizer::quantize_impl,
TE 2.9 to 2.16): nvte_compute_amax reads the BF16 tensor, nvte_compute_scale_from_amax turns
the amax into a scale, nvte_quantize_v2 casts (and on Hopper writes the transpose). Delayed
scaling casts with the last step's scale and takes the amax out of the cast itself, all of a
grouped GEMM's splits in one nvte_multi_cast_transpose; current scaling has no such fused path
(csrc/extensions/cast.cpp multi_tensor_quantize_impl: "Currently only have fused kernel for FP8
delayed scaling"; split_quantize allocates its splits one by one), so TE GroupedLinear's
split_quantize runs the three kernels per local expert for fc1's and fc2's inputs, and
GroupedLinear's backward again for their output gradients.

What the kernel tables time already: their FP8 Linear rows quantize the input dynamically per
tensor (TensorRT-LLM FP8QDQLinearMethod with no input_scale loaded, as AIConfigurator's
collector/trtllm/collect_gemm.py builds it: quantize_e4m3_per_tensor, amax and cast), so the
dense GEMMs' lookups hold an amax pass; the fused-MoE rows (TensorRT-LLM's CUTLASS FP8 MoE
built without loaded weights, collect_moe.py) cast once with the module's static input scale.
So over a fused-MoE lookup a routed layer pays, per token copy and pass:
  forward   the amax reads of fc1's input (h) and fc2's input (F / etp): 2 (h + F / etp) B;
  backward  the amax reads of fc2's and fc1's output gradients (h and g F / etp, g = 2 gated,
            1 plain): 2 (h + g F / etp) B;
The host launches three kernels per split (precision.estimate_quantize_kernels_per_split:
solver.cost.layers.host_time counts them). On the GPU those 3 L kernels per quantized tensor (L local
experts; two tensors a pass), where the lookup holds one cast, take their bytes above and a
launch gap each; the gap is not charged [B]: at ComputeConstants.gemm_kernel_s (8.5 us, fitted
on GEMMs, what solver.cost.layers.moe_eager charges an eager kernel) it would add 2 (3 L - 1) x 8.5 us
a pass, 0.391 ms at L = 8, several times what a one-block scale kernel or an amax read of a few
MB takes, and no measurement of these kernels inside a training step is at hand.
"""

from __future__ import annotations

import numpy as np

from solver.cost.kernels.efficiency import ComputeConstants, estimate_streaming_s
from solver.cost.kernels.precision import PrecisionRecipe
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import GpuSpec, ModelSpec

AMAX_READ_BYTES = 2.0  # the amax pass reads a BF16 tensor once


def estimate_routed_current_scaling_s(model_spec: ModelSpec, gpu: GpuSpec,
                                      constants: ComputeConstants, copies: np.ndarray,
                                      etp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds current scaling's amax reads add to one MoE layer's routed
    experts over the fused-MoE lookup, for `copies` token copies on a GPU whose experts are
    split `etp` ways (module docstring). Worked number (Qwen3-30B-A3B at ep 16 on an H100, one
    4,096-token sequence: 32,768 copies, h 2,048, F 768): forward 2 x 2,816 B x 32,768 =
    184.5 MB, 0.0688 ms at 0.8 x 3.35 TB/s; backward 2 x 3,584 B x 32,768 = 234.9 MB,
    0.0876 ms."""
    copies, etp = np.broadcast_arrays(np.asarray(copies, dtype=float),
                                      np.asarray(etp, dtype=float))
    h = float(model_spec.moe_token_width)
    inter = model_spec.moe_intermediate_size / etp
    gate = 2.0 if model_spec.mlp_type == "gated" else 1.0
    forward = estimate_streaming_s(gpu, AMAX_READ_BYTES * copies * (h + inter), constants)
    backward = estimate_streaming_s(gpu, AMAX_READ_BYTES * copies * (h + gate * inter),
                                    constants)
    return forward, backward


def estimate_routed_scaling_s(model_spec: ModelSpec, gpu: GpuSpec, constants: TimeConstants,
                              recipe: PrecisionRecipe, fused: bool, copies: np.ndarray,
                              etp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """estimate_routed_current_scaling_s where it applies (per-tensor `fp8` under
    TimeConstants.fp8_current_scaling, the routed experts timed by a fused-MoE lookup), zeros
    elsewhere."""
    if not (fused and recipe.name == "fp8" and constants.fp8_current_scaling):
        zero = np.zeros(np.broadcast_shapes(np.shape(copies), np.shape(etp)))
        return zero, zero
    return estimate_routed_current_scaling_s(model_spec, gpu, constants.compute, copies, etp)
