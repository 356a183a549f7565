"""A YaRN model's RoPE as Megatron-Core runs it: eager PyTorch ops, not the fused kernel the
step time otherwise takes to be inside the measured attention (solver.cost.layers.layer_compute: "The
measured attention kernel applies RoPE itself").

Read from Megatron-Core at the commits Megatron-Bridge v0.2.0-v0.5.0 pin (NeMo 25.11-26.06:
0d8e071 core_r0.15.0, b0cc270 core_r0.16.0, d728871 core_r0.17.0, d0b3b77 core_r0.18.0), the same
at each. megatron/core/transformer/attention.py rotates q and k with apply_rotary_pos_emb(...,
mscale=_yarn_get_concentration_factor_from_config(config)), YaRN's attention factor
(ModelSpec.rope_attention_factor: 1.3466 for gpt-oss). megatron/core/models/common/embeddings/
rope_utils.py apply_rotary_pos_emb, even with --apply-rope-fusion: "mscale={mscale} is not
supported by TE's fused RoPE. Using unfused implementation.", i.e. _apply_rotary_pos_emb_bshd,
once for q and once for k. (Megatron-Bridge gets there earlier: its performance scripts ask for
the fusion, scripts/performance/utils/overrides.py _set_common_perf_overrides, but the provider
drops it for any position embedding other than plain "rope", gpt-oss's being "yarn":
src/megatron/bridge/utils/fusions.py validate_rope_fusion_compatibility, v0.2.0-v0.5.0.)

  cos_ = (torch.cos(freqs) * mscale).to(t.dtype), sin_ likewise      6 kernels on the [s, 64]
                                                                     table (no traffic counted)
  t * cos_                                  read E, write E          4 B per element (bf16)
  _rotate_half: -x2, torch.cat((-x2, x1))   E/2 each way; E each way  2 + 4 B
  _rotate_half(t) * sin_, the sum           4 + 6 B
  torch.cat((t, t_pass)), t_pass empty      a copy                   4 B
  forward: 12 kernels, 24 B per element of q or k

The backward (autograd, tools/autograd/derivatives.yaml): the two products' gradients g cos_
and g sin_ (4 + 4 B), the negation's (2 B), chunk's backward concatenating the halves (4 B),
t's two gradients summed (6 B), and t_pass = t[..., rot_dim:], empty but a slice: its backward
(slice_backward) zero-fills a gradient of t's full size (2 B) that is summed in too (6 B):
7 kernels, 28 B per element. (t[..., :rot_dim] with rot_dim the head dim is t itself: PyTorch's
indexing returns a full slice as is.)

Charged here is what this costs beyond Transformer Engine's fused RoPE (fused_rope.py: one
kernel reading and writing q or k, each way: 4 B and 1 kernel), which the step time already
takes as part of the measured attention: forward 20 B and 11 kernels, backward 24 B and 6
kernels, per element and per tensor, for E = rows x heads/tp x head_dim (q) and rows x
max(kv_heads/tp, 1) x head_dim (k), streamed at the HBM fraction; every kernel pays
ComputeConstants.gemm_kernel_s, as the layer's element-wise kernels do. Nothing where the
factor is 1 (no YaRN, or DeepSeek's mscale = mscale_all_dim), for multi-latent attention (its
own RoPE path, not read here) or under another framework (TimeConstants.scaled_rope_eager off:
the model's RoPE costs there what any model's does).

Worked number (gpt-oss-120b, H100 SXM, tp 1, one 4096-token sequence): E = 4096 x (64 + 8)
x 64 = 18,874,368; forward 20 E = 377.5 MB, 0.141 ms + 22 x 8.5 us = 0.328 ms; backward
24 E = 453.0 MB, 0.169 ms + 12 x 8.5 us = 0.271 ms.
"""

from __future__ import annotations

import numpy as np

from solver.cost.kernels.efficiency import ComputeConstants, estimate_streaming_s
from solver.spec import GpuSpec, ModelSpec

ROPE_TENSORS = 2  # q and k, each its own apply_rotary_pos_emb call
# Beyond the fused kernel (module docstring): bytes per element of q or k, kernels per tensor.
EXTRA_BYTES_PER_ELEMENT = (24.0 - 4.0, 28.0 - 4.0)  # forward, backward
EXTRA_KERNELS_PER_TENSOR = (12.0 - 1.0, 7.0 - 1.0)


def estimate_eager_rope_s(model_spec: ModelSpec, gpu: GpuSpec, constants: ComputeConstants,
                          rows: np.ndarray, tp: np.ndarray, scaled_rope_eager: bool
                          ) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) seconds one layer's eager YaRN RoPE adds over the fused kernel for
    `rows` tokens at TP degree `tp` (module docstring); zeros where the model's attention
    factor is 1, for MLA, or without `scaled_rope_eager` (the framework's switch)."""
    rows, tp = np.broadcast_arrays(np.asarray(rows, dtype=float), np.asarray(tp, dtype=float))
    zero = np.zeros(rows.shape)
    if (not scaled_rope_eager or model_spec.rope_attention_factor == 1.0
            or model_spec.is_mla or model_spec.position_embedding_type != "rope"):
        return zero, zero
    heads = model_spec.num_attention_heads / tp + np.maximum(model_spec.kv_heads / tp, 1.0)
    elements = rows * heads * model_spec.qk_head_dim
    kernel_s = constants.gemm_kernel_s

    def stream(bytes_per_element: float, kernels_per_tensor: float) -> np.ndarray:
        return (estimate_streaming_s(gpu, bytes_per_element * elements, constants)
                + ROPE_TENSORS * kernels_per_tensor * kernel_s)

    return (stream(EXTRA_BYTES_PER_ELEMENT[0], EXTRA_KERNELS_PER_TENSOR[0]),
            stream(EXTRA_BYTES_PER_ELEMENT[1], EXTRA_KERNELS_PER_TENSOR[1]))
