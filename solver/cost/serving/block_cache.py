"""What one sequence keeps between serving steps, per layer of a block pattern
(solver.spec.blocks): the KV cache of full, sliding and chunked attention, the constant
recurrent state of Mamba-2 and gated DeltaNet, under vLLM's cache specs; and a mixer's weights
on one TP rank."""

from __future__ import annotations

import numpy as np

from solver.cost.layers.blocks import BF16_BYTES, estimate_mixer_core_flops
from solver.spec import ModelSpec
from solver.spec.blocks import ATTENTION_MIXERS


def estimate_layer_cache_bytes(model_spec: ModelSpec, mixer: str, context: int,
                               tp: np.ndarray, element_bytes: float,
                               state_bytes: float = BF16_BYTES) -> np.ndarray:
    """Bytes one sequence of `context` tokens keeps on one TP rank for one layer, under vLLM's
    KV-cache specs (vllm/v1/kv_cache_interface.py):
      full_attention     FullAttentionSpec: every token's K and V, max(kv_heads / tp, 1) heads
      sliding_attention  SlidingWindowSpec: the last sliding_window tokens (older blocks freed)
      chunked_attention  ChunkedLocalAttentionSpec: the tokens of the current chunk, at most
                         attention_chunk_size
      mamba              MambaSpec: a constant state per sequence, the conv state
                         (conv_kernel - 1) x (d_inner + 2 G N) / tp and the SSM state
                         H / tp x P x N (vLLM MambaStateShapeCalculator.mamba2_state_shape)
      linear_attention   the same for gated DeltaNet: conv state (kernel - 1) x
                         (2 key_dim + value_dim) / tp, recurrent state H_v / tp x d_k x d_v
                         (gated_delta_net_state_shape)
    `element_bytes`: the KV cache's element (bf16 2, fp8 1); `state_bytes`: the recurrent
    states' (vLLM's mamba_ssm_cache_dtype "auto": the model's bf16).
    Worked number: Nemotron-H-8B's Mamba at tp 1: 3 x 10,240 x 2 + 128 x 64 x 128 x 2 =
    61,440 + 2,097,152 = 2,158,592 B per sequence, whatever its length."""
    m = model_spec
    tp = np.asarray(tp, dtype=float)
    if mixer in ATTENTION_MIXERS:
        tokens = float(context)
        if mixer == "sliding_attention" and m.sliding_window:
            tokens = min(tokens, m.sliding_window)
        if mixer == "chunked_attention" and m.attention_chunk_size:
            tokens = min(tokens, m.attention_chunk_size)
        kv_per_rank = np.maximum(m.kv_heads / tp, 1.0)
        return tokens * kv_per_rank * (m.qk_head_dim + m.value_head_dim) * element_bytes
    if mixer == "mamba":
        heads, inner = m.mamba_num_heads or 0, (m.mamba_num_heads or 0) * (m.mamba_head_dim or 0)
        conv = (m.conv_kernel - 1) * (inner + 2 * (m.n_groups or 0) * (m.ssm_state_size or 0))
        ssm = heads * (m.mamba_head_dim or 0) * (m.ssm_state_size or 0)
        return (conv + ssm) / tp * state_bytes
    if mixer == "linear_attention":
        key_dim = (m.linear_num_key_heads or 0) * (m.linear_key_head_dim or 0)
        value_heads = m.linear_num_value_heads or 0
        value_dim = value_heads * (m.linear_value_head_dim or 0)
        conv = (m.linear_conv_kernel_dim - 1) * (2 * key_dim + value_dim)
        state = value_heads * (m.linear_key_head_dim or 0) * (m.linear_value_head_dim or 0)
        return (conv + state) / tp * state_bytes
    return np.zeros_like(tp)


def estimate_cache_bytes_per_token(model_spec: ModelSpec, context: int, tp: np.ndarray,
                                   element_bytes: float) -> np.ndarray:
    """A model's per-layer cache averaged over its layers, per token of a `context`-token
    sequence: sum over layers of estimate_layer_cache_bytes / (context x num_hidden_layers);
    times a stage's layer count it is that stage's share. A windowed or recurrent layer's
    bytes do not grow with the context, so this falls as the context grows."""
    counts: dict[str, int] = {}
    for mixer in model_spec.layer_mixers:
        counts[mixer] = counts.get(mixer, 0) + 1
    total = sum(n * estimate_layer_cache_bytes(model_spec, mixer, context, tp, element_bytes)
                for mixer, n in counts.items())
    return total / (context * model_spec.num_hidden_layers) + np.zeros(np.shape(tp))


def estimate_mixer_params_per_gpu(model_spec: ModelSpec, mixer: str, tp: np.ndarray,
                                  attention_per_gpu: np.ndarray) -> np.ndarray:
    """A mixer's parameters on one TP rank: attention's as the caller's serving layout counts
    them (`attention_per_gpu`), Mamba-2 and DeltaNet split by tp."""
    if mixer in ATTENTION_MIXERS:
        return attention_per_gpu
    return model_spec.mixer_params(mixer) / np.asarray(tp, dtype=float)


def estimate_prefill_core_share(model_spec: ModelSpec, context: np.ndarray) -> np.ndarray:
    """A block pattern's prefill attention work per layer, averaged over its layers, as a
    share of one full causal attention layer's over prompts of `context` tokens: a full layer
    1, a sliding or chunked one its window's share of the context
    (ModelSpec.context_tokens, vectorised over contexts), a Mamba, DeltaNet
    or mixer-less layer 0 (their scans: estimate_prefill_scan_flops). Worked number: Gemma 3
    27B (52 of 62 layers sliding over 1024 tokens) at 8192: (10 + 52 x 960.06 / 4096) / 62 =
    0.358."""
    m, s = model_spec, np.maximum(np.asarray(context, dtype=float), 1.0)
    full = s / 2.0
    total = np.zeros_like(s)
    for mixer in m.layer_mixers:
        if mixer == "sliding_attention" and m.sliding_window:
            w = float(m.sliding_window)
            total = total + np.where(w < s, np.minimum(full, w - w * (w - 1) / (2.0 * s)),
                                     full) / full
        elif mixer == "chunked_attention" and m.attention_chunk_size:
            c = float(m.attention_chunk_size)
            total = total + np.where(c < s, c / 2.0, full) / full
        elif mixer in ATTENTION_MIXERS:
            total = total + 1.0
    return total / m.num_hidden_layers


def estimate_prefill_scan_flops(model_spec: ModelSpec) -> float:
    """FLOPs per prefill token of a block pattern's Mamba-2 and DeltaNet scans, averaged over
    its layers (solver.cost.layers.blocks.estimate_mixer_core_flops; a scan's work per token does not
    depend on the context)."""
    m = model_spec
    return sum(estimate_mixer_core_flops(m, mixer, 1) for mixer in m.layer_mixers
               if mixer in ("mamba", "linear_attention")) / m.num_hidden_layers
