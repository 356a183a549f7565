"""The block pattern of a decoder: which token mixer and which MLP each layer holds.

Vocabulary (HF's `layer_types` names where HF has one):
  mixer   full_attention     softmax attention over every earlier token
          sliding_attention  attention over the last `sliding_window` tokens (Mistral, Gemma
                             2/3, gpt-oss)
          chunked_attention  attention inside aligned chunks of `attention_chunk_size` tokens
                             (Llama 4's RoPE layers)
          linear_attention   gated DeltaNet (Qwen3-Next; Yang et al. 2024, arXiv:2412.06464)
          mamba              a Mamba-2 mixer (Dao & Gu 2024, arXiv:2405.21060; Nemotron-H)
          none               no mixer (Nemotron-H's MLP-only and MoE-only layers)
  mlp     dense | moe | none
A layer's **kind** is its (mixer, mlp) pair. Kinds 0 and 1 are always (full_attention, dense)
and (full_attention, moe), the two kinds of a plain transformer; other kinds follow in order
of first appearance, so a model without a pattern has exactly today's two kinds.

Parameter counts follow the HF modeling code cited at each function; `spec` is a ModelSpec.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from solver.spec.model import ModelSpec

Mixer = Literal["full_attention", "sliding_attention", "chunked_attention", "linear_attention",
                "mamba", "none"]
Mlp = Literal["dense", "moe", "none"]
MIXERS: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention",
                           "linear_attention", "mamba", "none")
ATTENTION_MIXERS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
BASE_KINDS: tuple[tuple[str, str], ...] = (("full_attention", "dense"), ("full_attention", "moe"))
# One letter per mixer and MLP for `models show` (Nemotron-H's own letters where it has them).
MIXER_LETTERS = {"full_attention": "*", "sliding_attention": "s", "chunked_attention": "c",
                 "linear_attention": "L", "mamba": "M", "none": ""}
MLP_LETTERS = {"dense": "-", "moe": "E", "none": ""}


def estimate_mamba_params(spec: ModelSpec) -> int:
    """One Mamba-2 mixer (transformers NemotronHMamba2Mixer / Megatron MambaMixer): in_proj
    h -> 2 d_inner + 2 G N + H (z, x, B, C, dt), a depthwise conv1d of width conv_kernel over
    the d_inner + 2 G N channels x, B, C (with bias when use_conv_bias), dt_bias, A_log and D
    per head, the gated RMSNorm over d_inner and out_proj d_inner -> h; d_inner = H x P.
    Nemotron-H-8B (h 4096, H 128, P 64, G 8, N 128, kernel 4): 76,021,760 + 51,200 + 384
    + 8,192 + 33,554,432 = 109,635,968."""
    h, heads = spec.hidden_size, spec.mamba_num_heads or 0
    inner = heads * (spec.mamba_head_dim or 0)
    bc = 2 * (spec.n_groups or 0) * (spec.ssm_state_size or 0)
    conv_channels = inner + bc
    in_proj = h * (2 * inner + bc + heads) + (2 * inner + bc + heads if spec.mamba_proj_bias else 0)
    conv = conv_channels * spec.conv_kernel + (conv_channels if spec.use_conv_bias else 0)
    out_proj = inner * h + (h if spec.mamba_proj_bias else 0)
    return in_proj + conv + 3 * heads + inner + out_proj


def estimate_deltanet_params(spec: ModelSpec) -> int:
    """One gated DeltaNet mixer (transformers Qwen3NextGatedDeltaNet): in_proj_qkvz
    h -> 2 key_dim + 2 value_dim, in_proj_ba h -> 2 value heads, a bias-free depthwise conv1d
    over q, k, v (2 key_dim + value_dim channels), dt_bias and A_log per value head, the gated
    RMSNorm over one value head and out_proj value_dim -> h.
    Qwen3-Next-80B-A3B (h 2048, 16 key / 32 value heads of 128, kernel 4): 25,165,824 + 131,072
    + 32,768 + 64 + 128 + 8,388,608 = 33,718,464."""
    h = spec.hidden_size
    key_dim = (spec.linear_num_key_heads or 0) * (spec.linear_key_head_dim or 0)
    value_heads = spec.linear_num_value_heads or 0
    value_dim = value_heads * (spec.linear_value_head_dim or 0)
    projections = h * (2 * key_dim + 2 * value_dim) + h * 2 * value_heads
    conv = (2 * key_dim + value_dim) * spec.linear_conv_kernel_dim
    return (projections + conv + 2 * value_heads + (spec.linear_value_head_dim or 0)
            + value_dim * h)


def estimate_mixer_params(spec: ModelSpec, mixer: str) -> int:
    """Parameters of one layer's token mixer."""
    if mixer in ATTENTION_MIXERS:
        return spec.attention_params_per_layer
    if mixer == "mamba":
        return estimate_mamba_params(spec)
    if mixer == "linear_attention":
        return estimate_deltanet_params(spec)
    return 0


def estimate_mlp_params(spec: ModelSpec, mlp: str, active: bool = False) -> int:
    """Parameters of one layer's MLP (`active`: the top-k routed experts only)."""
    if mlp == "dense":
        return spec.dense_mlp_params_per_layer
    if mlp == "moe":
        routed = spec.num_experts_per_tok if active else spec.num_experts
        return (spec.router_params_per_layer + routed * spec.expert_params
                + spec.shared_expert_params_per_layer + spec.latent_projection_params_per_layer)
    return 0


def estimate_context_tokens(spec: ModelSpec, mixer: str, seq_len: int,
                            causal: bool = True) -> float:
    """Keys a query attends to on average in an attention layer of a sequence of seq_len.

        full      s/2 causal (s otherwise)
        sliding   w - w(w-1)/(2s) for w < s (query i sees min(i, w) keys, the exact mean),
                  never above full attention's s/2
        chunked   c/2 causal inside chunks of c <= s (c otherwise), else as full
    (FlashAttention skips the blocks a window masks out, so its work follows these counts.)
    Worked number: Gemma 3, w = 1024, s = 8192: 1024 - 1024 * 1023 / 16384 = 960.06."""
    full = seq_len / 2 if causal else float(seq_len)
    if mixer == "sliding_attention" and spec.sliding_window and spec.sliding_window < seq_len:
        w = spec.sliding_window
        return min(full, w - w * (w - 1) / (2.0 * seq_len)) if causal else float(w)
    if (mixer == "chunked_attention" and spec.attention_chunk_size
            and spec.attention_chunk_size < seq_len):
        c = spec.attention_chunk_size
        return c / 2 if causal else float(c)
    return full


def render_pattern(spec: ModelSpec) -> str:
    """The block pattern in letters, one group per layer: Nemotron-H's own string for its
    models (M mamba, * attention, - MLP, E MoE; a layer with both shows both), s sliding, c
    chunked and L linear attention."""
    return "".join(MIXER_LETTERS[mixer] + MLP_LETTERS[mlp]
                   for mixer, mlp in zip(spec.layer_mixers, spec.layer_mlps))
