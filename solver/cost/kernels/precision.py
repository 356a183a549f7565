"""Training precision recipes (`--precision`): which GEMMs run in low precision, which measured
kernels time them, the cast work outside those kernels, and which GPUs have them.

  bf16           every GEMM in BF16.
  fp8            FP8 E4M3/E5M2 with one scale per tensor, delayed or current scaling
                 (Transformer Engine DelayedScaling / Float8CurrentScaling): table dtype `fp8`.
  fp8-blockwise  FP8 with 1x128 activation and 128x128 weight blocks, FP32 scales (DeepSeek-V3
                 §3.3.2; TE Float8BlockScaling): table dtype `fp8_block`.
  mxfp8          OCP MX FP8: one UE8M0 (power-of-two) scale per 32 elements (TE MXFP8BlockScaling),
                 Blackwell only: table dtype `fp8`. Transformer Engine runs MXFP8 and per-tensor
                 FP8 GEMMs through the same cuBLASLt call (general_gemm, the scaling mode an
                 attribute of the operands), and Blackwell's tensor cores run block-scaled FP8
                 (tcgen05.mma .kind::mxf8f6f4) at the FP8 rate: the GPU files' one FP8 peak;
                 cuBLASLt's MXFP8 GEMMs measure 0.951 of its per-tensor FP8 ones ("Training
                 kernels" below). The tables' `fp8` rows are TRT-LLM's cuBLAS FP8 Linear; their
                 `fp8_block` rows on SM100/103 are DeepGEMM (AIConfigurator
                 collector/trtllm/collect_gemm.py, kernel_source "deepgemm"), a kernel
                 Transformer Engine does not run.
  nvfp4          NVFP4: E2M1 values, one E4M3 scale per 16 elements and an FP32 tensor scale
                 (TE NVFP4BlockScaling), Blackwell only: table dtype `nvfp4`. NVIDIA's recipe
                 (Pretraining LLMs with NVFP4, arXiv 2509.25149 §4) runs fprop, dgrad and wgrad
                 in NVFP4 with 16x16 random Hadamard transforms on the wgrad inputs and
                 stochastic rounding of gradients. For accuracy the paper keeps the first two
                 and the last eight blocks of its 62-block 12B model in BF16; Megatron does
                 that only under --first-last-layers-bf16, off by default (megatron-core
                 0.16.1 transformer_config.py first_last_layers_bf16 = False, read for FP4 in
                 fp4_utils.py), and neither parplan's launch files nor Megatron-Bridge's NVFP4
                 preset (bf16_with_nvfp4_mixed, v0.3.0) turn it on: every decoder layer runs
                 in NVFP4 here, as in the runs parplan launches (`bf16_layer_share` 0).

Every recipe keeps in BF16 what the frameworks keep there: attention's QK^T and PV (FP8
attention is a separate, default-off switch in TE and Megatron), the router, the embedding and
the output layer (Megatron-Core's output_layer is a plain ColumnParallelLinear, not a TE
module, so fp8_autocast does not reach it; the NVFP4 paper keeps the head in BF16 too).

Cast work. The forward tables time a Linear with its activation quantization inside; the
backward lookups (dgrad (m, k, n), wgrad (n, k, m): solver.cost.kernels.efficiency) time the
quantization of dy likewise, each once, where Transformer Engine quantizes dy once for both:
the backward takes one off (solver.cost.kernels.kernels.estimate_table_quantize_s). What no lookup times, per element of a GEMM input x and once per
micro-batch (`cast_bytes_per_input`, from Transformer Engine 2.9's quantizers,
transformer_engine/pytorch/csrc/quantizer.cpp):
  fp8            the transposed copy of x the weight gradient reads, 1 B written by the
                 forward's fused cast-transpose, on Hopper only: from SM100 FP8 GEMMs take any
                 layout and TE writes no transpose (`with_transpose = columnwise_usage &&
                 !nvte_is_non_tn_fp8_gemm_supported()`; utils.is_non_tn_fp8_gemm_supported:
                 compute capability 10.x and 11.x).
  fp8-blockwise  the column-wise copy with its own 1x128 scales: 1 + 4/128 B.
  mxfp8          the column-wise copy with its own scale per 32 elements down each column
                 (MXFP8Quantizer::create_tensor allocates columnwise data and scales apart):
                 1 + 1/32 B, written by the same fused kernel.
  nvfp4          the global amax pass over x before quantizing (nvte_hadamard_transform_amax
                 reads x for the row-wise and the Hadamard-transformed column-wise amax; the
                 tables' NVFP4 input scale is computed outside their timing,
                 collect_gemm.py), the column-wise RHT cast that reads x again and writes
                 0.5 + 1/16 B, and the amax pass over dy (2 B): 2 + 2 + 0.5625 + 2 B.
Weight quantization happens once per optimizer step (TE caches the quantized weights across
micro-batches) and is left out.

Training kernels (`training_gemm_rate`). The tables' low-precision rows are TensorRT-LLM's
kernels; Transformer Engine runs every FP8 and FP4 GEMM through one cuBLASLt call
(general_gemm -> nvte_cublas_gemm_v2, transformer_engine/common/gemm/cublaslt_gemm.cu: the
first heuristic algorithm; NVFP4 TN only, CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3 scales;
MXFP8 VEC32_UE8M0), with every quantization outside it. The tables' `nvfp4` rows are not that
kernel: AIConfigurator's collector (collector/trtllm/collect_gemm.py at 095f58a) times TRT-LLM's
NVFP4 Linear, fp4_quantize of x with a static input scale, then torch.ops.trtllm.nvfp4_gemm,
without the autotuner (no `autotune()` context), so the AutoTuner's cache misses and runs its
fallback tactic, CUTLASS with getDefaultGemmConfig (TensorRT-LLM torch_custom_ops.py
NVFP4GemmUnifiedRunner.forward, tactic -1 -> ("cutlass", -1); cpp/tensorrt_llm/thop/
fp4Gemm.cpp getDefaultGemmConfig at 05289e8f: CTA tile 128x256x256B on SM103, 128x256x128B on
SM100, cluster 1x1x1 [B: read at a later commit than the tables' 1.3.0rc20]). The tables'
`fp8` rows are a cuBLASLt per-tensor FP8 GEMM as TE's per-tensor FP8 is (TRT-LLM
FP8QDQLinearMethod.apply: torch.ops.trtllm.cublas_scaled_mm). `training_gemm_rate` is the rate
of the GEMM TE runs over the rate of the table row's kernel at the same shapes, both without
their quantization (solver.cost.kernels.efficiency.estimate_training_table_gemm_s). Source: TE's GEMM
profiling guide (docs/examples/gemm_profiling/gemm_profiling.rst, TE PR 2863, 2026-06; NVIDIA
B300 SXM6 AC, the GPU of the b300_sxm table), its pre-quantized per-layer sums of the 12
forward, dgrad and wgrad GEMMs of a hidden 4,096, FFN 16,384 layer at 15,872 tokens, each
tex.generic_gemm on inputs quantized before the timed loop: FP8 current scaling 6.812 ms,
MXFP8 7.161, NVFP4 3.764. The table's per-tensor FP8 row is the yardstick, the cuBLASLt
kernel both run, whose rate parplan already takes for TE's per-tensor FP8 (fp8: 1):
  mxfp8  6.812 / 7.161 = 0.951: cuBLASLt's MXFP8 GEMMs against its per-tensor FP8 ones, one
         harness [B: measured on B300 only; taken for every Blackwell GPU].
  nvfp4  TE's NVFP4 over FP8 rate ratio, 6.812 / 3.764 = 1.810, over the b300_sxm table's at
         the same 12 shapes, less each row's own quantization (estimate_table_quantize_s),
         6.081 / 3.847 = 1.581: 1.145 [B on B300; C on B200 and GB200 (SM100), whose fallback
         tile is another, narrower in K, and where no TE measurement is published]. The
         table's BF16 rows as the yardstick instead (cuBLAS in both harnesses; TE 13.102 ms,
         table 11.863) give 1.129, and 0.938 for MXFP8.
Nothing measured supports more for GB300's FP4 (1.5x GB200's by the datasheets, 1.23x in the
tables at 8192^3): TE's NVFP4 kernel on B300 averages 5.1 PFLOP/s over those 12 GEMMs, the
table's GEMM 5.0 (no quantization in either), 36% of B300's 14 PFLOP/s dense FP4.

Quantize kernels per split. A grouped GEMM (TE GroupedLinear, one GEMM per local expert)
quantizes its input split by split (tex.split_quantize -> multi_tensor_quantize_impl,
transformer_engine/pytorch/csrc/extensions/cast.cpp at TE v2.9, the TE of NVIDIA's DeepSeek-V3
GB200 guide); each kernel is one more op the host launches per local expert
(`quantize_kernels_per_split`, solver.cost.layers.host_time.estimate_host_s; [A: read off TE
v2.9's code]):
  fp8            0: delayed scaling (TE's default, what `launch` asks for) quantizes every
                 split in one fused nvte_multi_cast_transpose; current scaling
                 (TimeConstants.fp8_current_scaling) launches three per split, amax, scale and
                 cast (Float8CurrentScalingQuantizer::quantize_impl, no fused multi-tensor
                 path up to TE 2.16: solver.cost.layers.fp8_scaling), estimate_quantize_kernels_per_split.
  fp8-blockwise  1: Float8BlockQuantizer::quantize, one nvte_quantize_v2 per split, into one
                 bulk allocation (bulk_allocate_fp8_blockwise_tensors).
  mxfp8          1: MXFP8Quantizer::quantize, one nvte_quantize_v2 per split (bulk allocation
                 since TE PRs 1793/1934/2134; the scale swizzles fused across splits by PR
                 2019, multi_tensor_swizzle_scaling_factors). Before those, each split also
                 zero-filled two scale buffers and swizzled two: the guide's §2.1.2-2.1.3.
  nvfp4          3: NVFP4Quantizer::quantize_impl, an amax pass (nvte_hadamard_transform_amax),
                 the row-wise cast and the column-wise Hadamard cast, per split (TE v2.9;
                 TE PR 2351, 2025-11, fuses them across splits where the width is a multiple
                 of 128).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

from solver.spec import GpuSpec
from solver.spec.job import PRECISIONS


@dataclass(frozen=True)
class PrecisionRecipe:
    """One `--precision` value: see the module docstring for the sources."""

    name: str
    table_dtype: str  # the kernel tables' dtype of its low-precision GEMMs
    peak: str  # the GpuSpec peak its GEMMs run at on the datasheet path
    element_bytes: float  # bytes per quantized element, block scales included
    # The share of decoder layers whose GEMMs stay in BF16 (their first and last ones; none
    # under Megatron's defaults: module docstring, nvfp4)
    bf16_layer_share: float = 0.0
    block_scaled_format: str | None = None  # the GpuSpec.block_scaled_formats entry it needs
    # Bytes per GEMM input element per micro-batch that no table lookup times (module
    # docstring "Cast work"); `hopper_cast_bytes` where FP8 GEMMs need the TN layout.
    cast_bytes: float = 0.0
    hopper_cast_bytes: float | None = None
    # Kernels a grouped GEMM launches per split to quantize its input (module docstring).
    quantize_kernels_per_split: float = 0.0
    # The GEMM Transformer Engine runs over the table row's kernel, rate against rate, their
    # quantization aside (module docstring "Training kernels").
    training_gemm_rate: float = 1.0

    def cast_bytes_per_input(self, gpu: GpuSpec) -> float:
        """Cast bytes per GEMM input element on `gpu` (module docstring): Blackwell (a GPU
        with block-scaled tensor cores, SM100/103) takes FP8 GEMMs in any layout."""
        if self.hopper_cast_bytes is not None and not gpu.block_scaled_formats:
            return self.hopper_cast_bytes
        return self.cast_bytes

    @property
    def low_precision(self) -> bool:
        return self.name != "bf16"

    @property
    def sp_gather_bytes(self) -> float:
        """Bytes per element of a sequence-parallel all-gather of a GEMM input: below BF16 the
        input is quantized before it is gathered (Transformer Engine 2.9
        module/layernorm_linear.py: `ln_out = quantizer(ln_out)`, then
        gather_along_first_dim(..., quantizer=quantizer) or the Userbuffers all-gather of
        the quantized tensor; Linear's backward gathers the quantized dy likewise), so an FP8
        gather moves 1 B, MXFP8 1 + 1/32, NVFP4 0.5 + 1/16; layers kept in BF16 gather 2 B.
        Reduce-scatters carry GEMM outputs, BF16 under every recipe."""
        if not self.low_precision:
            return BF16.element_bytes
        share = self.bf16_layer_share
        return (1.0 - share) * self.element_bytes + share * BF16.element_bytes


BF16_READ_BYTES = 2.0  # one pass reading a BF16 tensor
# TE's GEMM profiling guide, B300 SXM6 AC, pre-quantized: ms per layer of 12 GEMMs (module
# docstring "Training kernels"; nvfp4's rate also needs the b300_sxm table's own times).
TE_B300_PREQUANTIZED_MS = MappingProxyType({"bf16": 13.102, "fp8": 6.812, "mxfp8": 7.161,
                                           "nvfp4": 3.764})
BF16 = PrecisionRecipe("bf16", "bfloat16", "bf16", 2.0)
RECIPES: dict[str, PrecisionRecipe] = {
    recipe.name: recipe for recipe in (
        BF16,
        PrecisionRecipe("fp8", "fp8", "fp8", 1.0, hopper_cast_bytes=1.0),
        # one FP32 scale per 128 activation elements
        PrecisionRecipe("fp8-blockwise", "fp8_block", "fp8", 1.0 + 4.0 / 128,
                        cast_bytes=1.0 + 4.0 / 128, quantize_kernels_per_split=1.0),
        # one UE8M0 byte per 32 elements
        PrecisionRecipe("mxfp8", "fp8", "fp8", 1.0 + 1.0 / 32, block_scaled_format="mxfp8",
                        cast_bytes=1.0 + 1.0 / 32, quantize_kernels_per_split=1.0,
                        training_gemm_rate=TE_B300_PREQUANTIZED_MS["fp8"]
                        / TE_B300_PREQUANTIZED_MS["mxfp8"]),
        # half a byte per element and one E4M3 byte per 16; no decoder layer in BF16
        PrecisionRecipe("nvfp4", "nvfp4", "nvfp4", 0.5 + 1.0 / 16,
                        block_scaled_format="nvfp4",
                        cast_bytes=BF16_READ_BYTES * 3 + 0.5 + 1.0 / 16,
                        quantize_kernels_per_split=3.0, training_gemm_rate=1.145),
    )
}
assert tuple(RECIPES) == PRECISIONS, "spec.job.PRECISIONS and the recipes must list the same"


def load_recipe(precision: str) -> PrecisionRecipe:
    return RECIPES[precision]


CURRENT_SCALING_KERNELS_PER_SPLIT = 3.0  # amax, scale, cast (module docstring)


def estimate_quantize_kernels_per_split(recipe: PrecisionRecipe, current_scaling: bool
                                        ) -> float:
    """Kernels a grouped GEMM launches per split to quantize its input (module docstring):
    the recipe's, or three under per-tensor FP8 with current scaling."""
    if current_scaling and recipe.name == "fp8":
        return CURRENT_SCALING_KERNELS_PER_SPLIT
    return recipe.quantize_kernels_per_split


def check_precision_supported(gpu: GpuSpec, precision: str) -> None:
    """Raise InputError naming the flag, the GPU and the rule when `gpu` lacks `precision`."""
    from solver.errors import InputError

    recipe = RECIPES[precision]
    if recipe.block_scaled_format is not None:
        if recipe.block_scaled_format not in gpu.block_scaled_formats:
            raise InputError(
                f"--precision {precision}: gpu '{gpu.name}' has no {precision.upper()} tensor "
                f"cores (block-scaled {precision.upper()} GEMMs need Blackwell; its GPU file "
                f"lists block_scaled_formats = {list(gpu.block_scaled_formats)})")
    elif recipe.low_precision and gpu.peak_tflops_fp8 is None:
        raise InputError(f"--precision {precision}: gpu '{gpu.name}' has no fp8 support "
                         "(FP8 tensor cores need Ada, Hopper or newer; its GPU file gives no "
                         "peak_tflops_fp8)")
