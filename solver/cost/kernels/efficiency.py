"""How fast a GPU runs the work of one layer: GEMMs, the attention core, element-wise passes.

A GPU with a kernel table (GpuSpec.kernel_table) takes its GEMM and attention times from the
measured kernels (solver.cost.kernels.kernels): a forward GEMM y[m,n] = x[m,k] W[n,k]^T is the table's
(m, n, k) in the precision recipe's dtype, its GEMM part at the rate of the kernel training
runs (estimate_training_table_gemm_s); its backward is the two GEMMs the gradients need,
looked up in the same table (kernel README caveat 2): dgrad dx[m,k] = dy[m,n] W[n,k], the
table's (m, k, n), and wgrad dW[n,k] = dy^T[n,m] x[m,k], the table's (n, k, m). Fused attention
forward is the table's kernel at the GPU's share of heads; backward is the forward times
FlashAttention-3's measured backward/forward time ratio (solver.cost.kernels.kernels). The rest of this
docstring is the datasheet path, which every GPU without a table keeps.

GEMM time follows a roofline with a fixed cost per kernel:

    t(M, K, N) = max(2MKN / (f_gemm * peak), 2(MK + KN + MN) bytes / (f_hbm * HBM)) + t_kernel

`f_gemm` is the fraction of the dense peak that the best GEMM shapes reach on that GPU, measured
(MAMF, stored in the GPU catalog; a default for GPUs without a measurement), and `t_kernel` is
the fixed launch/ramp/tail cost of one GEMM, the one fitted constant: `benchmarks/fit_gemm.py`
fits it to measured GEMM efficiencies by shape (benchmarks/data/gemm_efficiency.csv). Their
physical meaning lets them carry over to other GPUs: small GEMMs (large TP, small micro-batches, fine-grained
experts) lose efficiency through t_kernel and through the memory roofline, newer GPUs with a
higher peak need bigger GEMMs to reach the same fraction (notes §5.3 take-aways 2 and 3).

The attention core (FlashAttention) runs at `f_attention` of the peak: FlashAttention-2
reaches 50-73% of the A100 peak forward and less backward (Dao 2023, arXiv 2307.08691 §4.1);
FlashAttention-3 about 75% forward on H100 (Shah et al. 2024, arXiv 2407.08608). Element-wise
passes (norms, residual adds, rotary, the MLP activation) stream their tensors through HBM.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from solver.cost.kernels.kernels import (
    MLA_QK_HEAD_DIM,
    MLA_V_HEAD_DIM,
    KernelTable,
    estimate_table_gemm_s,
    estimate_table_quantize_s,
    load_kernel_table,
)
from solver.cost.kernels.kernels_attention import (
    ATTENTION_BACKWARD_FLOP_RATIO,
    attention_backward_ratio,
    estimate_table_attention_rate,
    estimate_table_mla_rate,
    estimate_table_window_rate,
    legacy_attention_factors,
    triton_attention_rates,
)
from solver.cost.kernels.precision import PrecisionRecipe, load_recipe
from solver.spec import GpuSpec

BF16_BYTES = 2
# Tensor-core GEMM kernels need every row of A and B to start on a 16-byte boundary: dims a
# multiple of 8 for 16-bit types (NVIDIA Matrix Multiplication Background guide §2.2, "Tensor
# Core Requirements"; cuBLAS "Tensor Core Usage").
TENSOR_CORE_ALIGNMENT_BYTES = 16
# Megatron-DeepSpeed's unfused causal attention: baddbmm computes the full s x s scores, then
# scaled_upper_triang_masked_softmax masks them; `flops` count the causal half.
UNFUSED_CAUSAL_FACTOR = 2.0


class ComputeConstants(BaseModel):
    """Constants of the compute model; `fitted` ones come from benchmarks/fit_time.py."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Used only for GPUs without a measured MAMF fraction: the median of the measured ones.
    gemm_peak_fraction: float = Field(default=0.78, gt=0, le=1)
    # The datasheet path's (GPUs without a kernel table) fixed cost per GEMM, also each
    # element-wise kernel's; fitted by benchmarks/fit_gemm.py.
    gemm_kernel_s: float = Field(default=8.5e-6, ge=0)
    # Fused attention's share of the BF16 peak on the datasheet path (and unfused attention's
    # batched GEMMs); fitted by benchmarks/fit_time.py on all dense runs before the kernel
    # tables, kept since (the runs left on this path are one source's: fit_time.py).
    attention_peak_fraction: float = Field(default=0.35, gt=0, le=1)
    hbm_fraction: float = Field(default=0.8, gt=0, le=1)
    # Element-wise traffic actually streamed over the minimal count (fp32 up-casts, unfused
    # kernels, saved tensors re-read in backward); fitted by benchmarks/fit_time.py (3.75 before
    # the kernel tables; 2.75 with them and table_rate_fraction; 3.00 since LLM Foundry's runs
    # take FlashAttention-in-Triton's rates).
    elementwise_traffic_factor: float = Field(default=3.0, ge=1)  # fitted
    # The share of a measured kernel's rate (solver.cost.kernels.kernels: TensorRT-LLM kernels timed
    # alone, back to back under CUDA graphs) that the same work reaches inside a training step
    # (eager launches, training kernels, other streams on the SMs and HBM; the kernel
    # README's caveat 1: "expect kernel times inside a training step to be at or above these
    # numbers"). Fitted with elementwise_traffic_factor by benchmarks/fit_time.py.
    table_rate_fraction: float = Field(default=0.92, gt=0, le=1)  # fitted
    # Forward non-GEMM kernels per layer, counted in a Megatron/PyTorch block: 2 norms,
    # rotary, 2 residual adds, the MLP activation, 2 casts or bias adds; each pays t_kernel.
    elementwise_kernels_per_layer: int = Field(default=8, ge=0)


def gemm_table(gpu: GpuSpec, precision: str) -> KernelTable | None:
    """The GPU's kernel table if it holds GEMMs in `precision`'s dtype, else None."""
    if gpu.kernel_table is None:
        return None
    table = load_kernel_table(gpu.kernel_table)
    return table if table.has(f"gemm.{load_recipe(precision).table_dtype}") else None


def estimate_gemm_s(
    gpu: GpuSpec,
    precision: str,
    m: np.ndarray | float,
    k: np.ndarray | float,
    n: np.ndarray | float,
    constants: ComputeConstants,
    bytes_per_element: float | None = None,
    training: bool = True,
) -> np.ndarray:
    """Seconds for one forward (M x K) @ (K x N) GEMM on one GPU in `precision` (a recipe of
    solver.cost.kernels.precision; vectorised, zero where M*K*N = 0).

    With a kernel table: the measured (m, n, k) in the recipe's dtype (H100 bf16 8192^3: 1.40
    ms, 783 TFLOP/s), its GEMM part at the training kernel's rate
    (estimate_training_table_gemm_s) unless not `training` (serving runs the table's kernels).
    Datasheet path, worked number: M = 8192 tokens, K = 4096, N = 14336 on an H100 (989
    TFLOP/s bf16, MAMF fraction 0.803) with t_kernel = 8.5 us: 2MKN = 9.62e11 FLOPs -> 1.212
    ms + 0.0085 ms. `bytes_per_element` (default: the recipe's) sizes the datasheet path's
    memory roofline."""
    table = gemm_table(gpu, precision)
    if table is not None:
        recipe = load_recipe(precision)
        if not training:
            return estimate_table_gemm_s(table, recipe.table_dtype, m, n, k)
        return estimate_training_table_gemm_s(table, recipe, m, n, k)
    return estimate_datasheet_gemm_s(gpu, precision, m, k, n, constants, bytes_per_element)


def estimate_training_table_gemm_s(table: KernelTable, recipe: PrecisionRecipe, m, n, k
                                   ) -> np.ndarray:
    """Seconds of the table's forward GEMM y[m,n] = x[m,k] W[n,k]^T in `recipe`'s dtype as
    Transformer Engine runs it: the table row's quantization of x (estimate_table_quantize_s)
    plus the rest, its GEMM, at recipe.training_gemm_rate times the table kernel's rate
    (solver.cost.kernels.precision, "Training kernels"). Worked number: GB200 nvfp4, m = 8192, n = k
    = 16384: the row's 1,079.5 us hold 53.0 us of quantization, so 53.0 + 1,026.5 / 1.145 =
    949.5 us; a recipe at rate 1 keeps the table's time, a GEMM without work stays at 0."""
    seconds = estimate_table_gemm_s(table, recipe.table_dtype, m, n, k)
    if recipe.training_gemm_rate == 1.0:
        return seconds
    quantize = np.minimum(estimate_table_quantize_s(table, recipe.table_dtype, m, k), seconds)
    return quantize + (seconds - quantize) / recipe.training_gemm_rate


def estimate_gemm_backward_s(gpu: GpuSpec, precision: str, m: np.ndarray | float,
                             k: np.ndarray | float, n: np.ndarray | float,
                             constants: ComputeConstants, weight_gradient: bool = True
                             ) -> np.ndarray:
    """Seconds of the backward of a forward (M x K) @ (K x N) GEMM: with a kernel table the
    dgrad (m, k, n) and wgrad (n, k, m) lookups (module docstring) as training runs them
    (estimate_training_table_gemm_s), less one quantization of dy (M x N): each
    low-precision lookup times the dynamic quantization of its input, dy for dgrad and dy^T
    for wgrad, where Transformer Engine quantizes dy once for both
    (TransformerEngineBaseModule.grad_output_preprocess: one quantizer call, row- and
    column-wise usage); on the datasheet path twice the forward. Without a `weight_gradient`
    (a frozen weight: LoRA's base, solver.cost.layers.finetune) the dgrad alone: its lookup
    with its quantization of dy, or once the forward on the datasheet path."""
    table = gemm_table(gpu, precision)
    if table is None:
        passes = 2.0 if weight_gradient else 1.0
        return passes * estimate_datasheet_gemm_s(gpu, precision, m, k, n, constants)
    recipe = load_recipe(precision)
    if not weight_gradient:
        return estimate_training_table_gemm_s(table, recipe, m, k, n)
    return (estimate_training_table_gemm_s(table, recipe, m, k, n)
            + estimate_training_table_gemm_s(table, recipe, n, k, m)
            - estimate_table_quantize_s(table, recipe.table_dtype, m, n))


def estimate_datasheet_gemm_s(gpu: GpuSpec, precision: str, m: np.ndarray | float,
                              k: np.ndarray | float, n: np.ndarray | float,
                              constants: ComputeConstants,
                              bytes_per_element: float | None = None) -> np.ndarray:
    """The roofline with a fixed cost per kernel (module docstring), at the recipe's peak."""
    m, k, n = (np.asarray(x, dtype=float) for x in (m, k, n))
    recipe = load_recipe(precision)
    if bytes_per_element is None:
        bytes_per_element = recipe.element_bytes
    flops = 2.0 * m * k * n
    fraction = gpu.mamf_fraction(precision) or constants.gemm_peak_fraction
    compute_s = flops / (fraction * gpu.peak_flop_per_s(precision))
    traffic = bytes_per_element * (m * k + k * n + m * n)
    memory_s = traffic / (constants.hbm_fraction * gpu.hbm_gb_per_s * 1e9)
    return np.where(flops > 0, np.maximum(compute_s, memory_s) + constants.gemm_kernel_s, 0.0)


def estimate_table_attention_s(gpu: GpuSpec, flops: np.ndarray | float, *, batch, seq, heads,
                               kv_heads, qk_head_dim: int, v_head_dim: int,
                               native: bool = True
                               ) -> tuple[np.ndarray, np.ndarray] | None:
    """(forward, backward) seconds of fused attention doing `flops` (causal count) on a GPU
    with a kernel table, None without one: the table's rate for `batch` sequences of `seq`
    tokens (the chunk each context-parallel rank computes at a time) and the GPU's `heads` and
    `kv_heads`, at the mean of the q/k and v head dims; DeepSeek's MLA geometry (192/128)
    uses the measured MLA kernel. Backward: forward x attention_backward_ratio(seq). Not
    `native` (2023-era kernels on a GPU with a GpuSpec.legacy_mma_fraction, i.e. Hopper): the
    measured FlashAttention-2 over FlashAttention-3 rates, forward and backward."""
    if gpu.kernel_table is None:
        return None
    table = load_kernel_table(gpu.kernel_table)
    if (qk_head_dim, v_head_dim) == (MLA_QK_HEAD_DIM, MLA_V_HEAD_DIM) and table.has("mla"):
        rate = estimate_table_mla_rate(table, batch, seq, heads)
    else:
        rate = estimate_table_attention_rate(table, batch, seq, heads, kv_heads,
                                             (qk_head_dim + v_head_dim) / 2)
    forward = np.asarray(flops, dtype=float) / rate
    backward = forward * attention_backward_ratio(seq)
    if not native and gpu.legacy_mma_fraction is not None:
        slow_forward, slow_backward = legacy_attention_factors(seq)
        return forward / slow_forward, backward / slow_backward
    return forward, backward


def estimate_table_window_attention_s(gpu: GpuSpec, flops: np.ndarray | float, *, window: int,
                                      batch, seq, heads, kv_heads, head_dim: float,
                                      native: bool = True
                                      ) -> tuple[np.ndarray, np.ndarray] | None:
    """(forward, backward) seconds of sliding-window attention doing `flops` (its own work,
    solver.cost.kernels.kernels.window_attention_flop) from the table's measured kernel for that
    window, None where the GPU's table has none (the caller then scales full attention by the
    work). Backward: forward x attention_backward_ratio at the keys a query sees, the window
    (FlashAttention-3's ratio rises as the key loop shortens; a 128 window takes its shortest
    measured, 512: 3.69). Not `native` on Hopper: as estimate_table_attention_s."""
    if gpu.kernel_table is None:
        return None
    table = load_kernel_table(gpu.kernel_table)
    rate = estimate_table_window_rate(table, window, batch, seq, heads, kv_heads, head_dim)
    if rate is None:
        return None
    forward = np.asarray(flops, dtype=float) / rate
    backward = forward * attention_backward_ratio(np.minimum(seq, window))
    if not native and gpu.legacy_mma_fraction is not None:
        slow_forward, slow_backward = legacy_attention_factors(window)
        return forward / slow_forward, backward / slow_backward
    return forward, backward


def estimate_triton_attention_s(gpu: GpuSpec, flops: np.ndarray | float, seq,
                                head_dim: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of FlashAttention in Triton doing `flops` (causal count)
    at `seq` tokens per sequence (solver.cost.kernels.kernels_attention.triton_attention_rates; published
    standalone kernel rates, like the tables'): LLM Foundry's 2023 tables ran it. Its tiles
    span the head dimension padded to a power of two (triton_padded_head_dim): MPT-30B's head
    dim 112 computes 128 columns, 1.14x its FLOPs."""
    forward_rate, backward_rate = triton_attention_rates(
        gpu.peak_flop_per_s("bf16"), gpu.legacy_mma_fraction is not None, seq)
    work = np.asarray(flops, dtype=float) * triton_padded_head_dim(head_dim) / head_dim
    return work / forward_rate, ATTENTION_BACKWARD_FLOP_RATIO * work / backward_rate


def triton_padded_head_dim(head_dim: int) -> int:
    """The head dimension FlashAttention in Triton computes: `BLOCK_HEADDIM =
    max(triton.next_power_of_2(d), 16)`, the width of every Q, K, V and output tile, columns
    beyond d masked to zero but multiplied (llm-foundry 5e85bd62
    llmfoundry/models/layers/flash_attn_triton.py lines 622 and 665, forward and backward;
    flash_attn/flash_attn_triton.py likewise)."""
    return max(1 << (int(head_dim) - 1).bit_length(), 16)


def estimate_attention_core_s(
    gpu: GpuSpec, precision: str, flops: np.ndarray | float, constants: ComputeConstants,
    head_dims: tuple[int, ...] = (), flash: bool = True, causal: bool = True,
    native: bool = True,
) -> np.ndarray:
    """Datasheet path: seconds for the attention core's `flops` (bf16 under every recipe).

    FlashAttention (`flash`, the default) pads any head dimension to a multiple of 8 and runs
    at `attention_peak_fraction` of the tensor-core peak. Unfused attention (two batched GEMMs,
    Q K^T and P V, around a softmax kernel: Megatron-DeepSpeed in 2022) runs at the same
    fraction while its GEMMs are aligned; with a head dimension (`head_dims`: query/key and
    value) whose rows are not a multiple of 16 bytes (8 bf16 elements) cuBLAS cannot use its
    tensor-core kernels (Tensor Core requirements, NVIDIA Matrix Multiplication Background
    guide §2.2) and the GEMMs run on the CUDA cores, at the GPU's FP32 peak x its matmul
    fraction (`misaligned_fraction`). These are the batched GEMMs alone: the score matrix
    they and the softmax stream through HBM, and the backward's GEMMs, are
    solver.cost.layers.layer_compute's (UNFUSED_SCORE_BYTES).

    Worked number: BLOOM's 02-20 prototypes (h 14400, 64 heads: head dim 225) on an A100
    (19.5 TFLOP/s FP32, MAMF fraction 0.869) run their scores at 16.9 TFLOP/s, twice as many
    of them as FlashAttention's causal count at 0.35 x 312 = 109 TFLOP/s: 13x the time. The
    source's own A/B tests (chronicles-prequel: h 14400 -> 13824, head dim 225 -> 216; 128 ->
    64 heads at h 13824, head dim 108 -> 216) measured 1.27x-1.44x; the model gives
    1.20x-1.27x (benchmarks/ab_checks.py, held by tests/test_published_loader.py)."""
    flops = np.asarray(flops, dtype=float)
    misaligned = [d for d in head_dims if (d * BF16_BYTES) % TENSOR_CORE_ALIGNMENT_BYTES]
    if flash or not misaligned:
        peak = gpu.peak_flop_per_s("bf16")  # every recipe keeps attention in BF16
        legacy = 1.0 if native or gpu.legacy_mma_fraction is None else gpu.legacy_mma_fraction
        return flops / (constants.attention_peak_fraction * legacy * peak)
    if gpu.peak_tflops_fp32 is None:
        from solver.errors import InputError

        raise InputError(f"gpu '{gpu.name}': peak_tflops_fp32 is not in the catalog; unfused "
                         f"attention with head dimension {misaligned[0]} runs on the CUDA cores")
    # Unfused attention computes every score and masks afterwards: twice the causal count.
    scores = UNFUSED_CAUSAL_FACTOR if causal else 1.0
    return scores * flops / (misaligned_fraction(gpu, constants) * gpu.peak_tflops_fp32 * 1e12)


def misaligned_fraction(gpu: GpuSpec, constants: ComputeConstants) -> float:
    """The fraction of the FP32 CUDA-core peak a misaligned GEMM reaches: the GPU's measured
    best-shape matmul fraction (the same kernels' tiling and tails), no separate constant."""
    return gpu.mamf_fraction("bf16") or constants.gemm_peak_fraction


def estimate_streaming_s(gpu: GpuSpec, num_bytes: np.ndarray | float,
                         constants: ComputeConstants) -> np.ndarray:
    """Seconds to stream `num_bytes` through HBM (read + write counted by the caller)."""
    return np.asarray(num_bytes, dtype=float) / (constants.hbm_fraction * gpu.hbm_gb_per_s * 1e9)


def estimate_elementwise_s(gpu: GpuSpec, minimal_bytes: np.ndarray | float,
                           constants: ComputeConstants) -> np.ndarray:
    """Forward element-wise passes of one layer: the minimal traffic times the traffic factor,
    streamed through HBM, plus a fixed cost per kernel."""
    traffic = np.asarray(minimal_bytes, dtype=float) * constants.elementwise_traffic_factor
    launches = constants.elementwise_kernels_per_layer * constants.gemm_kernel_s
    return estimate_streaming_s(gpu, traffic, constants) + launches
