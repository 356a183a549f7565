"""The routed experts of one MoE layer in a serving step, by weight format and GPU (issue 38
item 4): which kernel path the engine runs and what it costs on one GPU for the step's tokens.

  table    the measured fused MoE (TensorRT-LLM's, shared kernel tables) where the GPU has rows
           of the format: bf16 everywhere, fp8 where the GPU has FP8 tensor cores, NVFP4 on
           Blackwell (block-scaled FP4 MMA). Below the table's smallest token count (256) the
           latency at 256 scaled by the share of local experts the tokens touch,
           1 - (1 - k/E)^tokens (the kernel streams only the experts it is given rows of).
  grouped  no table rows of the format on this GPU: MXFP4 (gpt-oss) and int4 (AWQ/GPTQ) on
           Hopper and Ampere, which have no FP4 MMA and run weight-only dequantising grouped
           GEMMs (vLLM vllm/model_executor/layers/quantization/mxfp4.py: on sm90 the
           triton_kernels matmul_ogs backend with HopperMXValueLayout, else Marlin MoE with
           mxfp4_w4a16_moe_quant_config; Marlin MoE for AWQ/GPTQ), and every format on a GPU
           without a kernel table. One launch for the gate-up projection of all local experts
           and one for the down projection, each over the whole batch's routed rows ("ogs":
           gather, GEMM, scatter in one kernel), at the datasheet roofline:

               t = 2 t_kernel + max(touched x E_local x W_e x b / (0.8 HBM),
                                    2 x tokens x k x W_e / etp / (mamf x peak))

           with W_e an expert's parameters on this GPU, b the bytes per weight (0.5625 for
           4-bit), the FLOPs at the bf16 peak (the dequantised weights meet bf16 activations:
           W4A16). Its seconds never fall and its rate (tokens per second) never falls as the
           tokens grow: touched/tokens falls, the FLOPs are linear.

Before this module the grouped path charged two GEMMs per touched expert, each with its own
kernel cost: gpt-oss-120b at tp 2 on H100 paid 36 layers x 128 experts x 2 x 8.5 us = 78 ms
a round of 64 decodes (the per-expert loop), where one grouped launch per projection is
36 x 2 x 8.5 us = 0.6 ms plus the weights.

Worked number (gpt-oss-120b on one H100, tp 2, one decode row): 4 of 128 experts touched,
each 3 x 2880 x 2880 / 2 = 12.4 M parameters per GPU at 0.5625 B: 28.0 MB streamed at
0.8 x 3,350 GB/s = 10.4 us, plus 2 x 8.5 us: 27.4 us a layer.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.kernels.kernels import load_kernel_table
from solver.cost.kernels.kernels_moe import estimate_table_moe_s
from solver.cost.kernels.precision import load_recipe
from solver.spec import GpuSpec, ModelSpec

MOE_TABLE_MIN_TOKENS = 256  # the smallest token count of the MoE grids (kernel tables)
GROUPED_LAUNCHES = 2  # gate-up and down projections of all local experts, one launch each

ExpertPath = Literal["table", "grouped"]


def gemm_precision(gpu: GpuSpec, weights: str) -> str | None:
    """The GEMM recipe of `weights` (bf16, fp8, int4, fp4) on `gpu`: fp8 where the GPU has
    fp8, NVFP4 GEMMs where it has block-scaled FP4 tensor cores (Blackwell), None for
    weight-only int4 and for fp4 elsewhere (dequantising W4A16 kernels: vLLM's Marlin and
    triton matmul_ogs)."""
    if weights == "fp4":
        return "nvfp4" if "nvfp4" in gpu.block_scaled_formats else None
    if weights == "int4":
        return None
    return "fp8" if weights == "fp8" and gpu.peak_tflops_fp8 else "bf16"


def expert_path(model_spec: ModelSpec, gpu: GpuSpec, weights: str) -> ExpertPath:
    """The kernel path of the routed experts (module docstring): "table" where the GPU's
    kernel table has fused-MoE rows of the weights' format, else "grouped"."""
    precision = gemm_precision(gpu, weights)
    if gpu.kernel_table is None or precision is None:
        return "grouped"
    table = load_kernel_table(gpu.kernel_table)
    probe = estimate_table_moe_s(
        table, load_recipe(precision).table_dtype, hidden=model_spec.moe_token_width,
        inter=model_spec.moe_intermediate_size, topk=model_spec.experts_per_token,
        experts=model_spec.num_experts, gated=model_spec.mlp_type == "gated",
        tokens=np.array([float(MOE_TABLE_MIN_TOKENS)]), etp=np.array([1.0]),
        ep=np.array([1.0]))
    return "grouped" if probe is None else "table"


def touched_share(model_spec: ModelSpec, tokens) -> np.ndarray:
    """The share of experts that `tokens` tokens routed top-k of E touch: 1 - (1 - k/E)^t."""
    k, experts = model_spec.experts_per_token, model_spec.num_experts
    return 1.0 - (1.0 - k / experts) ** np.asarray(tokens, dtype=float)


def estimate_routed_experts_s(model_spec: ModelSpec, gpu: GpuSpec, weights: str, *, tp, dp,
                              ep, weight_bytes_per_element: float, rows,
                              constants: ComputeConstants = ComputeConstants()) -> np.ndarray:
    """One MoE layer's routed experts on one GPU for `rows` tokens per DP rank (module
    docstring); tp, dp, ep are arrays over candidates. Experts are sharded over the tp x dp
    GPUs: by expert where ep > 1, else each expert split tp x dp ways."""
    m = model_spec
    rows = np.asarray(rows, dtype=float)
    if not m.is_moe:
        return np.zeros_like(rows)
    # The experts' tokens are moe_token_width wide (the latent width under LatentMoE).
    h, k, experts = m.moe_token_width, m.experts_per_token, m.num_experts
    expert_parallel = np.asarray(ep) > 1
    ep_ = np.where(expert_parallel, ep, 1).astype(float)
    etp = np.where(expert_parallel, 1, np.asarray(tp) * np.asarray(dp)).astype(float)
    tokens = rows * dp
    if expert_path(m, gpu, weights) == "table":
        precision = gemm_precision(gpu, weights)
        table = load_kernel_table(gpu.kernel_table)
        floor = np.maximum(tokens, MOE_TABLE_MIN_TOKENS)
        fused = estimate_table_moe_s(table, load_recipe(precision).table_dtype, hidden=h,
                                     inter=m.moe_intermediate_size, topk=k, experts=experts,
                                     gated=m.mlp_type == "gated", tokens=floor, etp=etp, ep=ep_)
        share = touched_share(m, tokens) / touched_share(m, floor)
        return np.where(tokens > 0, fused * np.where(tokens < floor, share, 1.0), 0.0)
    return estimate_grouped_experts_s(m, gpu, weights, tokens=tokens, etp=etp, ep=ep_,
                                      weight_bytes_per_element=weight_bytes_per_element,
                                      constants=constants)


def estimate_grouped_experts_s(model_spec: ModelSpec, gpu: GpuSpec, weights: str, *, tokens,
                               etp, ep, weight_bytes_per_element: float,
                               constants: ComputeConstants = ComputeConstants()) -> np.ndarray:
    """The grouped path (module docstring): `tokens` routed over all experts of the EP group,
    this GPU holding E / ep experts split etp ways."""
    m = model_spec
    tokens = np.asarray(tokens, dtype=float)
    local = m.num_experts / ep
    expert_params = m.expert_params / etp  # one expert's weights on this GPU
    # A token reaches this GPU's experts k x local / E times on average.
    routed_rows = tokens * m.experts_per_token * local / m.num_experts
    precision = gemm_precision(gpu, weights) or "bf16"
    fraction = gpu.mamf_fraction(precision) or constants.gemm_peak_fraction
    compute_s = 2.0 * routed_rows * expert_params / (fraction * gpu.peak_flop_per_s(precision))
    streamed = touched_share(m, tokens) * local * expert_params * weight_bytes_per_element
    memory_s = streamed / (constants.hbm_fraction * gpu.hbm_gb_per_s * 1e9)
    seconds = np.maximum(compute_s, memory_s) + GROUPED_LAUNCHES * constants.gemm_kernel_s
    return np.where(tokens > 0, seconds, 0.0)
