"""What eager PyTorch code keeps for backward beyond the fused kernels, per token of one layer
(MemoryOptions.fused_elementwise False, `--eager-elementwise`), and what an unfused attention
core keeps (MemoryOptions.flash_attention False, `--attention-kernel unfused`).

The fused path is solver.cost.memory.activations' accounting (Korthikanti et al. 2022, Table 2,
with Megatron's fused kernels: TE / apex norms saving their input and rstd, the fused SwiGLU
saving its input, the fused RoPE saving nothing per token, the fused scale-mask-softmax saving
its bf16 output). Eager code keeps what each autograd node saves (PyTorch
tools/autograd/derivatives.yaml; a tensor is saved only for an input that requires grad:
torchgen gen_variable_type.py guard_for, `grad_fn->should_compute_output`):

  RMSNorm     written as x.float() ops (torchtitan models/norms.py RMSNorm @9dec370, 2024-12:
              `self._norm(x.float()).type_as(x) * self.weight`; HF LlamaRMSNorm alike): pow
              and mul save the fp32 copy of the input (4 B per element), rsqrt its fp32
              result (one per token), the weight multiply the bf16 normalized input (2 B),
              and the bf16 input is no longer saved: 4 + 2 - 2 = 4 B per element more than a
              fused norm (MemoryOptions.rmsnorm_fp32_copy). nn.RMSNorm on a PyTorch whose
              rms_norm dispatches to the CUDA `_fused_rms_norm` kernel (native_functions.yaml,
              torch 2.13) saves input and rstd as a fused norm does: 0. LayerNorm runs
              native_layer_norm (input, mean, rstd) eager or not: 0.
  SwiGLU      w2(F.silu(w1(x)) * w3(x)) (torchtitan FeedForward; Megatron mlp.py glu without
              bias_activation_fusion): silu saves its input (the gate), mul saves silu's output
              and the up projection, w2 its input; Megatron's fused SwiGLUFunction saves only
              the fc1 output (fused_bias_swiglu.py save_for_backward(input)): silu's bf16
              output, 2 B per intermediate element, more. Plain GeLU saves its input either
              way (gelu: self): 0.
  softmax     Megatron's unfused attention without the fused kernel (fused_softmax.py
              forward_torch_softmax, attention_softmax_in_fp32 True by default in
              transformer_config.py) and HF eager attention (softmax(dtype=float32).to(bf16)):
              _softmax saves its fp32 output (4 B per score: derivatives.yaml _softmax uses
              `result`), the cast bf16 probabilities are saved by the PV matmul (2 B) unless
              dropout saves its own output; the QK^T scores themselves are not saved.
  RoPE        complex or cos/sin multiplies by a frequency buffer that needs no grad
              (torchtitan common/rope.py apply_rotary_emb): mul saves only the buffer, shared
              by every token and layer: 0.
  dropout, residual adds
              native_dropout saves its 1-byte mask as the fused bias-dropout-add does; add
              saves nothing: 0.
"""

from __future__ import annotations

from solver.cost.memory.options import MemoryOptions
from solver.spec import ModelSpec

# Eager RMSNorm (x.float() ops) over a fused one, per normalized element: the fp32 input copy
# (4 B) and the bf16 normalized input (2 B) in place of the bf16 input (2 B).
RMSNORM_FP32_COPY_EXTRA_BYTES = 4.0 + 2.0 - 2.0
# Eager SwiGLU over Megatron's fused one, per intermediate element: silu's bf16 output.
SILU_OUTPUT_BYTES = 2.0
# Attention scores saved per query-key pair (bytes, bf16 activations): the fused softmax's
# output (2, Korthikanti Table 2: "softmax 2as^2b"), or, eager, its fp32 output (4) and the
# bf16 probabilities the PV matmul saves (2); dropout adds its 1-byte mask and its bf16 output
# (Table 2: "softmax dropout as^2b", "attention over values 2as^2b"), which the PV matmul
# saves in place of the probabilities.
FUSED_SOFTMAX_BYTES = 2.0
EAGER_SOFTMAX_BYTES = 4.0
PROBABILITIES_BYTES = 2.0
DROPOUT_MASK_BYTES = 1.0


def estimate_unfused_core_bytes(num_heads: int, seq_len: int, options: MemoryOptions) -> float:
    """Bytes per token that an unfused attention core saves for its heads' s x s scores:
    heads x s x (softmax output + what the PV matmul saves).

      fused softmax, no dropout   2 a s          (the one bf16 output, saved by both)
      fused softmax, dropout      (2 + 1 + 2) a s = 5 a s   (Korthikanti et al. Table 2)
      eager softmax, no dropout   (4 + 2) a s = 6 a s
      eager softmax, dropout      (4 + 1 + 2) a s = 7 a s
    Worked number: GPT-3 175B (a = 96), s = 2048, eager, dropout: 7 x 96 x 2048 = 1,376,256 B
    per token, against 983,040 B fused."""
    softmax = FUSED_SOFTMAX_BYTES if options.fused_elementwise else EAGER_SOFTMAX_BYTES
    if options.dropout:
        after = DROPOUT_MASK_BYTES + PROBABILITIES_BYTES
    else:
        after = 0.0 if options.fused_elementwise else PROBABILITIES_BYTES
    return (softmax + after) * num_heads * seq_len


def estimate_eager_norm_bytes(model_spec: ModelSpec, options: MemoryOptions,
                              width: float) -> float:
    """Bytes per token that one eager RMSNorm over `width` elements keeps beyond a fused one:
    4 B per element (RMSNORM_FP32_COPY_EXTRA_BYTES) where the norm is RMSNorm written as x.float()
    ops (MemoryOptions.rmsnorm_fp32_copy), else 0. Worked number: Llama-3.1-8B (h 4096), one
    pre-norm: 16,384 B per token."""
    if (options.fused_elementwise or not options.rmsnorm_fp32_copy
            or model_spec.norm_type != "rmsnorm"):
        return 0.0
    return RMSNORM_FP32_COPY_EXTRA_BYTES * width


def estimate_eager_swiglu_bytes(model_spec: ModelSpec, options: MemoryOptions,
                                width: float) -> float:
    """Bytes per token that an eager SwiGLU of `width` intermediate elements keeps beyond the
    fused one: silu's bf16 output, 2 B per element; 0 for a plain (GeLU) MLP. Worked number:
    Llama-3.1-8B (F 14336): 28,672 B per token."""
    if options.fused_elementwise or model_spec.mlp_type != "gated":
        return 0.0
    return SILU_OUTPUT_BYTES * width


def estimate_eager_attention_norm_bytes(model_spec: ModelSpec, options: MemoryOptions,
                                        tp_heads: float) -> tuple[float, float]:
    """(divided by tp, replicated without SP) bytes per token the attention block's eager
    norms keep beyond fused ones: the pre-attention norm (h), MLA's q and kv latent norms
    (replicated over TP), and the q/k norms (over the local heads' q and k, `tp_heads` K heads
    counted as _attention_bytes counts them)."""
    m, h = model_spec, model_spec.hidden_size
    replicated = estimate_eager_norm_bytes(m, options, h) if m.norms_per_layer else 0.0
    if m.is_mla:
        replicated += estimate_eager_norm_bytes(m, options, (m.q_lora_rank or 0)
                                                + (m.kv_lora_rank or 0))
    split = 0.0
    if m.qk_norm:
        width = m.num_attention_heads * m.qk_head_dim + tp_heads * m.qk_head_dim
        split = estimate_eager_norm_bytes(m, options, width)
    return split, replicated


def estimate_eager_mlp_norm_bytes(model_spec: ModelSpec, options: MemoryOptions) -> float:
    """Replicated bytes per token the layer's other eager norms keep beyond fused ones: the
    pre-MLP norm and any further ones (norms_per_layer beyond 2: Gemma's post-norms)."""
    others = max(model_spec.norms_per_layer - 1, 0)
    return others * estimate_eager_norm_bytes(model_spec, options, model_spec.hidden_size)
