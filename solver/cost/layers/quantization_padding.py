"""The copies Megatron-Core's grouped experts make to pad each local expert's rows for FP8 and FP4
GEMMs (TimeConstants.moe_quantization_padding).

Transformer Engine's quantized grouped GEMM wants every split's rows a multiple of the recipe's
alignment (16 for FP8, 32 for MXFP8: TE fp8_padding.py Fp8Padding, "32 for MXFP8 and 16 for
others"). Megatron-Core's TEGroupedMLP.forward therefore pads the permuted tokens whenever
fp8 (or fp4) is on (megatron/core/transformer/moe/experts.py, core_r0.13.0 to core_v0.18.0:
`if self.config.fp8: ... self.fp8_padding(permuted_local_hidden_states, tokens_per_expert)`,
`quantization_padding` from core_v0.16.0) and un-pads the experts' output
(`self.fp8_unpadding(output, actual_tokens_per_expert)`). Each is one TE kernel that reads
every row and writes it to a new buffer (fp8_padding.py _Fp8Padding.forward:
torch.empty + tex.fused_multi_row_padding; fp8_unpadding.py likewise with
fused_multi_row_unpadding), and each one's backward is the other copy of the gradient. TE skips
the copy only when every split is already aligned (`if m_splits == padded_m_splits: return
inp`), which is what the router's own padding (--moe-router-padding-for-quantization, or
--moe-router-padding-for-fp8 before core_v0.16.0) and HybridEP's dispatch (which pads as it
permutes: token_dispatcher.py _HybridEPManager.dispatch, pad_multiple from core_v0.16.0;
"HybridEP/NCCL-EP pad as part of their fused dispatch/permute operation", experts.py at
d98e8a64) arrange. Otherwise dropless routing leaves the splits unaligned, and with L local
experts all are aligned by chance once in align^L steps [B: with one local expert, one step in
16 or 32 skips the copy; charged in full].

Per token copy a GPU's experts compute (BF16 rows of the token width h, the experts' input and
output), per pass:
  forward   pad the input and un-pad the output, each read + written: 2 x 2 x 2 h B = 8 h B;
  backward  the same two copies of the output's and the input's gradients: 8 h B.
The permuted router probabilities are padded as well (one value a row, under 0.1% of this at
h >= 2048): not charged. Nor is the host's launch of the two kernels (host_time counts TE
modules, not these).
"""

from __future__ import annotations

import numpy as np

from solver.cost.kernels.efficiency import ComputeConstants, estimate_streaming_s
from solver.cost.kernels.precision import BF16, PrecisionRecipe
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import GpuSpec, ModelSpec

BF16_BYTES = 2.0
# Two copies a pass (pad the input, un-pad the output), each reading and writing every row.
COPY_PASSES = 2.0 * 2.0
# Dispatchers that hand the experts aligned splits themselves (module docstring).
PADDING_DISPATCHERS = ("hybridep",)


def estimate_expert_padding_s(model_spec: ModelSpec, gpu: GpuSpec, constants: ComputeConstants,
                              copies: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds of one MoE layer's padding and un-padding copies for `copies`
    token copies on a GPU (module docstring). Worked number (Qwen3-235B-A22B at tp 2 on an
    H100, one 4,096-token sequence: 2,048 tokens x top-8 = 16,384 copies of h 4,096):
    8 x 16,384 x 4,096 B = 536.9 MB, 0.200 ms a pass at 0.8 x 3.35 TB/s."""
    copies = np.asarray(copies, dtype=float)
    seconds = estimate_streaming_s(
        gpu, COPY_PASSES * copies * model_spec.moe_token_width * BF16_BYTES, constants)
    return seconds, seconds


def estimate_routed_padding_s(model_spec: ModelSpec, gpu: GpuSpec, constants: TimeConstants,
                              recipe: PrecisionRecipe, copies: np.ndarray
                              ) -> tuple[np.ndarray, np.ndarray]:
    """estimate_expert_padding_s where it applies (a quantized recipe, a framework whose
    experts pad, TimeConstants.moe_quantization_padding, and a dispatcher that does not pad
    for them), zeros elsewhere."""
    if (recipe.name == BF16.name or not constants.moe_quantization_padding
            or constants.moe_dispatcher in PADDING_DISPATCHERS):
        zero = np.zeros(np.shape(copies))
        return zero, zero
    return estimate_expert_padding_s(model_spec, gpu, constants.compute, copies)
