"""Training precision recipes (`--precision`): which GEMMs run in low precision, which measured
kernels time them, the cast work outside those kernels, and which GPUs have them.

  bf16           every GEMM in BF16.
  fp8            FP8 E4M3/E5M2 with one scale per tensor, delayed or current scaling
                 (Transformer Engine DelayedScaling / Float8CurrentScaling): table dtype `fp8`.
  fp8-blockwise  FP8 with 1x128 activation and 128x128 weight blocks, FP32 scales (DeepSeek-V3
                 §3.3.2; TE Float8BlockScaling): table dtype `fp8_block`.
  mxfp8          OCP MX FP8: one UE8M0 (power-of-two) scale per 32 elements (TE MXFP8BlockScaling),
                 Blackwell only: table dtype `fp8_block`, which on SM100/103 runs DeepGEMM with
                 UE8M0 scales, MXFP8-like (kernel README, dtype names).
  nvfp4          NVFP4: E2M1 values, one E4M3 scale per 16 elements and an FP32 tensor scale
                 (TE NVFP4BlockScaling), Blackwell only: table dtype `nvfp4`. NVIDIA's recipe
                 (Pretraining LLMs with NVFP4, arXiv 2509.25149 §4) runs fprop, dgrad and wgrad
                 in NVFP4 with 16x16 random Hadamard transforms on the wgrad inputs and
                 stochastic rounding of gradients, and keeps some linear layers in BF16: the
                 first two and the last eight blocks of its 62-block 12B model (16%), which
                 is the share kept here for any depth.

Every recipe keeps in BF16 what the frameworks keep there: attention's QK^T and PV (FP8
attention is a separate, default-off switch in TE and Megatron), the router, the embedding and
the output layer (Megatron-Core's output_layer is a plain ColumnParallelLinear, not a TE
module, so fp8_autocast does not reach it; the NVFP4 paper keeps the head in BF16 too).

Cast work. The forward tables time a Linear with its activation quantization inside; the
backward lookups (dgrad (m, k, n), wgrad (n, k, m): solver.cost.efficiency) time the
quantization of dy likewise. What no lookup times is the column-wise (transposed) quantized
copy of each GEMM input x that the weight gradient reads: TE writes it in the forward's fused
cast-transpose, `element_bytes` per element of x, once per micro-batch. Weight quantization
happens once per optimizer step (TE caches the quantized weights across micro-batches) and is
left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.spec import GpuSpec
from solver.spec.job import PRECISIONS


@dataclass(frozen=True)
class PrecisionRecipe:
    """One `--precision` value: see the module docstring for the sources."""

    name: str
    table_dtype: str  # the kernel tables' dtype of its low-precision GEMMs
    peak: str  # the GpuSpec peak its GEMMs run at on the datasheet path
    element_bytes: float  # bytes per quantized element, block scales included
    # The share of decoder layers whose GEMMs stay in BF16 (their first and last ones)
    bf16_layer_share: float = 0.0
    block_scaled_format: str | None = None  # the GpuSpec.block_scaled_formats entry it needs

    @property
    def low_precision(self) -> bool:
        return self.name != "bf16"


# arXiv 2509.25149 §4: of the 12B model's 62 blocks the first two and the last eight run in BF16.
NVFP4_BF16_BLOCKS, NVFP4_PAPER_BLOCKS = 2 + 8, 62
BF16 = PrecisionRecipe("bf16", "bfloat16", "bf16", 2.0)
RECIPES: dict[str, PrecisionRecipe] = {
    recipe.name: recipe for recipe in (
        BF16,
        PrecisionRecipe("fp8", "fp8", "fp8", 1.0),
        # one FP32 scale per 128 activation elements
        PrecisionRecipe("fp8-blockwise", "fp8_block", "fp8", 1.0 + 4.0 / 128),
        # one UE8M0 byte per 32 elements
        PrecisionRecipe("mxfp8", "fp8_block", "fp8", 1.0 + 1.0 / 32, block_scaled_format="mxfp8"),
        # half a byte per element and one E4M3 byte per 16; the paper's first two and last
        # eight of 62 blocks in BF16, kept as that share of any model's layers
        PrecisionRecipe("nvfp4", "nvfp4", "nvfp4", 0.5 + 1.0 / 16,
                        bf16_layer_share=NVFP4_BF16_BLOCKS / NVFP4_PAPER_BLOCKS,
                        block_scaled_format="nvfp4"),
    )
}
assert tuple(RECIPES) == PRECISIONS, "spec.job.PRECISIONS and the recipes must list the same"


def load_recipe(precision: str) -> PrecisionRecipe:
    return RECIPES[precision]


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
