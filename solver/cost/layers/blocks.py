"""Costs of the block kinds beyond attention + MLP (solver.spec.blocks): FLOPs, parameters per
GPU, activation bytes and compute time of Mamba-2, gated DeltaNet, windowed (sliding / chunked)
attention and single-block layers (Nemotron-H's mixer-only and MLP-only layers).

Kinds 0 and 1 (full attention + dense MLP, full attention + MoE) stay with the plain-transformer
code paths, unchanged. The other kinds are costed here, two ways:
  windowed  (sliding or chunked attention, dense or MoE MLP): the plain kind's costs with the
            attention core's FLOPs and time scaled by the context the window leaves
            (ModelSpec.context_tokens); parameters and saved activations
            are the plain kind's (FlashAttention keeps one log-sum-exp per head and token
            whatever the window; an eager masked softmax still stores s x s scores), so a
            windowed layer never costs more than a full one;
  composed  any other kind: its mixer's and its MLP's pieces added up, the attention and
            MLP pieces being exactly the plain kinds' own.

Tensor parallelism (Megatron-LM megatron/core/ssm/mamba_mixer.py, MambaMixer: in_proj is
column-parallel over (z, x, B, C, dt), conv1d, A, D, dt_bias and the gated norm are split by
heads; it asserts ngroups % tp == 0 and nheads % tp == 0): a Mamba-2 mixer splits its heads and
groups over TP like attention splits its heads; gated DeltaNet splits its key and value heads
the same way (solver.search.constraints: tp_divides_mamba_groups, tp_divides_linear_heads).
Context parallelism: Megatron's MambaMixer runs CP by all-to-all
(megatron/core/ssm/mamba_context_parallel.py: sequence-sharded to head-sharded and back around
the scan), priced by estimate_mixer_cp_s; so does its gated DeltaNet from core_v0.18.0
(gated_delta_net.py; before it, no CP: solver.search.constraints
megatron_linear_attention_no_cp). Each CP rank needs whole heads (cp_splits_mamba_heads,
cp_splits_linear_heads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from solver.cost.kernels.efficiency import (
    ComputeConstants,
    estimate_elementwise_s,
    estimate_streaming_s,
)
from solver.spec import GpuSpec, ModelSpec
from solver.spec.blocks import ATTENTION_MIXERS

BF16_BYTES = 2.0
FP32_BYTES = 4.0
# fla's chunk_gated_delta_rule (flash-linear-attention, ops/gated_delta_rule/chunk.py) works
# in chunks of 64 tokens.
DELTANET_CHUNK = 64
# The SSD chunk scan's achieved share of the dense bf16 tensor-core peak: the median over the
# measured B200 mamba_chunk_scan_combined rows of >= 8192 tokens (benchmarks/mamba_scan.py;
# no other GPU has scan timings). Gated DeltaNet's chunked scan is taken to run alike [B].
SSD_SCAN_PEAK_FRACTION = 0.035


def is_windowed_kind(model_spec: ModelSpec, kind: int) -> bool:
    """Whether kind `kind` (>= 2) is a plain kind with a windowed attention core."""
    mixer, mlp = model_spec.block_kinds[kind]
    return mixer in ATTENTION_MIXERS and mlp in ("dense", "moe")


def base_kind(model_spec: ModelSpec, kind: int) -> int:
    """The plain kind (0 dense, 1 MoE) whose MLP kind `kind` has (dense for none)."""
    return 1 if model_spec.block_kinds[kind][1] == "moe" else 0


def hybrid_kinds(model_spec: ModelSpec) -> range:
    """The kinds this module costs (none for a model without a block pattern)."""
    return range(2, len(model_spec.block_kinds)) if model_spec.is_hybrid else range(0)


# ---- FLOPs ---------------------------------------------------------------------------------


def estimate_mixer_core_flops(model_spec: ModelSpec, mixer: str, seq_len: int,
                              causal: bool = True) -> float:
    """Forward FLOPs per token of a mixer's non-GEMM core (the GEMMs are 2 x its parameters).

        attention  2 ctx a (d_qk + d_v), ctx from ModelSpec.context_tokens (window, chunk)
        mamba      SSD with chunks of Q (Dao & Gu 2024, arXiv:2405.21060, §6): C B^T per group
                   2 Q N G, its masked product with X 2 Q P H, chunk states and the output
                   from them 2 N P H each: 2 Q N G + 2 Q P H + 4 N P H
        linear     chunked gated delta rule (Yang et al. 2024, arXiv:2412.06464, §3; chunks
                   of C = 64), per value head: K K^T, W = T K, Q K^T 2 C d_k each, U = T V and
                   the intra-chunk output 2 C d_v each, three state products 2 d_k d_v each:
                   H_v (2 C (3 d_k + 2 d_v) + 6 d_k d_v)
    Worked number: Nemotron-H-8B's Mamba (Q 128, N 128, G 8, P 64, H 128):
    262,144 + 2,097,152 + 4,194,304 = 6,553,600 per token."""
    m = model_spec
    if mixer in ATTENTION_MIXERS:
        ctx = m.context_tokens(mixer, seq_len, causal)
        return 2.0 * ctx * m.num_attention_heads * (m.qk_head_dim + m.value_head_dim)
    if mixer == "mamba":
        q, n, g = m.chunk_size, m.ssm_state_size or 0, m.n_groups or 0
        p, h = m.mamba_head_dim or 0, m.mamba_num_heads or 0
        return 2.0 * q * n * g + 2.0 * q * p * h + 4.0 * n * p * h
    if mixer == "linear_attention":
        dk, dv = m.linear_key_head_dim or 0, m.linear_value_head_dim or 0
        per_head = 2.0 * DELTANET_CHUNK * (3 * dk + 2 * dv) + 6.0 * dk * dv
        return (m.linear_num_value_heads or 0) * per_head
    return 0.0


def estimate_pattern_forward_flops(model_spec: ModelSpec, seq_len: int) -> float:
    """Forward FLOPs per token of every decoder layer of a model with a block pattern: 2 per
    active GEMM weight (the mixer's parameters, the top-k experts' MLP) plus each mixer's
    core."""
    total = 0.0
    for mixer, mlp in zip(model_spec.layer_mixers, model_spec.layer_mlps):
        gemm = model_spec.mixer_params(mixer)
        if mlp == "dense":
            gemm += model_spec.dense_mlp_params_per_layer
        elif mlp == "moe":
            gemm += (model_spec.router_params_per_layer + model_spec.shared_expert_params_per_layer
                     + model_spec.latent_projection_params_per_layer
                     + model_spec.experts_per_token * model_spec.expert_params)
        total += 2.0 * gemm + estimate_mixer_core_flops(model_spec, mixer, seq_len)
    return total


# ---- parameters per GPU ----------------------------------------------------------------------


@dataclass(frozen=True)
class KindParams:
    """Parameters one GPU holds of one layer of a kind (the fields of
    solver.cost.memory.states.StageParams)."""

    dense: np.ndarray
    expert: np.ndarray
    gemm: np.ndarray
    largest_layer: np.ndarray
    gemm_expert: np.ndarray


def estimate_kind_params(model_spec: ModelSpec, tp: np.ndarray, ep: np.ndarray,
                         etp: np.ndarray, kind: int) -> KindParams:
    """One layer of kind `kind` per GPU: its mixer, norms, dense MLP and shared experts split
    by tp, the router replicated (as for a plain MoE layer), the routed experts
    num_experts / ep each split by etp. Its GEMM weights (the fp8-cast ones) are taken as all
    of its mixer's parameters (a Mamba's conv1d, A, D and norm are < 0.1% of them).
    LatentMoE's projections are replicated over TP like the router (Megatron-Core
    core_v0.16.1 moe_layer.py: TELinear parallel_mode="duplicated"; vLLM nemotron_h.py:
    ReplicatedLinear) and are GEMM weights."""
    m = model_spec
    mixer, mlp = m.block_kinds[kind]
    split = float(m.mixer_params(mixer))
    gemm_split = split
    split += m.norm_params_per_layer
    replicated, replicated_gemm, expert = 0.0, 0.0, np.zeros(np.shape(tp))
    if mlp == "dense":
        split += m.dense_mlp_params_per_layer
        gemm_split += m.dense_mlp_params_per_layer
    elif mlp == "moe":
        split += m.shared_expert_params_per_layer
        gemm_split += m.shared_expert_params_per_layer
        replicated_gemm = float(m.latent_projection_params_per_layer)
        replicated = float(m.router_params_per_layer) + replicated_gemm
        expert = m.num_experts / ep * m.expert_params / etp
    dense = split / tp + replicated
    return KindParams(dense=dense, expert=expert,
                      gemm=gemm_split / tp + replicated_gemm + expert,
                      largest_layer=dense + expert, gemm_expert=expert)


# ---- activations -----------------------------------------------------------------------------


def estimate_mixer_activation_bytes(model_spec: ModelSpec, mixer: str, linear_bytes: float
                                    ) -> tuple[float, float]:
    """(split by TP, replicated unless sequence parallel) bytes per token a Mamba-2 or gated
    DeltaNet mixer saves for its backward pass, its norm input (2h) and projection input
    included; `linear_bytes` a GEMM input's element (2 bf16, 1 fp8).
      mamba   mamba_ssm's MambaSplitConv1dScanCombinedFn (ops/triton/ssd_combined.py) saves
              the in_proj output zxbcdt (2 d_inner + 2 G N + H) and the scan output (d_inner)
              and recomputes the rest; out_proj keeps its input (d_inner)
      linear  the conv1d input and output over q, k, v (2 key_dim + value_dim each), the gate
              z and the output o (value_dim each), g and beta in fp32 per value head
              (fla's chunk_gated_delta_rule recomputes its chunk states), out_proj's input
    Worked number: Nemotron-H-8B, bf16: 2 (16384 + 2048 + 128) + 2 * 8192 + 2 * 8192 =
    69,888 B split, 16,384 B replicated per token."""
    m, h = model_spec, model_spec.hidden_size
    replicated = BF16_BYTES * h + linear_bytes * h
    if mixer == "mamba":
        inner = (m.mamba_num_heads or 0) * (m.mamba_head_dim or 0)
        zxbcdt = 2 * inner + 2 * (m.n_groups or 0) * (m.ssm_state_size or 0) + (
            m.mamba_num_heads or 0)
        return BF16_BYTES * (zxbcdt + inner) + linear_bytes * inner, replicated
    if mixer == "linear_attention":
        key_dim = (m.linear_num_key_heads or 0) * (m.linear_key_head_dim or 0)
        value_heads = m.linear_num_value_heads or 0
        value_dim = value_heads * (m.linear_value_head_dim or 0)
        conv = 2 * (2 * key_dim + value_dim)
        split = (BF16_BYTES * (conv + 2 * value_dim) + FP32_BYTES * 2 * value_heads
                 + linear_bytes * value_dim)
        return split, replicated
    return 0.0, 0.0


def compose_kind_activation_bytes(model_spec: ModelSpec, kind: int,
                                  mixer_bytes: Callable[[str], tuple], mlp_bytes: Callable[[str], tuple],
                                  ) -> tuple:
    """(split, replicated) bytes per token of one layer of a composed kind: its mixer's
    (`mixer_bytes(mixer)`: attention's from solver.cost.memory.activations, the others from
    estimate_mixer_activation_bytes) plus its MLP's (`mlp_bytes("dense" | "moe")`)."""
    mixer, mlp = model_spec.block_kinds[kind]
    split, replicated = mixer_bytes(mixer) if mixer != "none" else (0.0, 0.0)
    if mlp != "none":
        mlp_split, mlp_replicated = mlp_bytes(mlp)
        split, replicated = split + mlp_split, replicated + mlp_replicated
    return split, replicated


# ---- compute time ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerPieces:
    """What solver.cost.layers.layer_compute works out for the plain kinds, for composing the others:
    the plain kinds' parts, the attention and dense-MLP GEMMs (forward, backward), `gemms`
    (params -> forward, backward seconds of a block of two GEMMs, as the plain kinds' are
    timed), `cast` (input elements -> seconds), the GEMM inputs of one block, tokens per GPU
    and the element-wise traffic terms of layer_compute (rotary's head bytes, each MLP's
    TP-split bytes per token)."""

    dense: dict[str, np.ndarray]
    moe: dict[str, np.ndarray]
    attention: tuple[np.ndarray, np.ndarray]
    dense_mlp: tuple[np.ndarray, np.ndarray]
    gemms: Callable[[float], tuple[np.ndarray, np.ndarray]]
    cast: Callable[[np.ndarray], np.ndarray]
    gemm_inputs: np.ndarray
    rows: np.ndarray
    tp: np.ndarray
    sequence_split: np.ndarray | int
    head_bytes: float
    mlp_split_bytes: dict[str, float]
    gpu: GpuSpec
    compute: ComputeConstants
    attention_backward_ratio: float
    # A sliding-window core's (forward, backward) from the measured window kernel, where the
    # GPU's table has the model's window (solver.cost.layers.layer_compute._window_core)
    window_core: tuple[np.ndarray, np.ndarray] | None = None


def _core_ratio(model_spec: ModelSpec, mixer: str, seq_len: int) -> float:
    """A windowed attention core's work over full attention's."""
    full = model_spec.context_tokens("full_attention", seq_len)
    return model_spec.context_tokens(mixer, seq_len) / full


def _scan_s(model_spec: ModelSpec, mixer: str, seq_len: int, p: LayerPieces
            ) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of a Mamba-2 or DeltaNet scan on one GPU: its FLOPs (TP
    splits the heads) at SSD_SCAN_PEAK_FRACTION of the bf16 peak (measured: the chunk scan
    is latency- and memory-bound, a few percent of the tensor cores), and no less than
    streaming its saved inputs and output once; the backward `attention_backward_ratio` times
    the forward (mamba_ssm's backward recomputes the chunk states and runs the transposed
    products). Worked number: Nemotron 3 Nano at 65,536 tokens on a B200: 2.23e11 FLOPs at
    0.035 x 2.25e15 FLOP/s = 2.8 ms (measured 2.5 ms)."""
    flops = p.rows * estimate_mixer_core_flops(model_spec, mixer, seq_len) / p.tp
    split, _ = estimate_mixer_activation_bytes(model_spec, mixer, BF16_BYTES)
    streamed = estimate_streaming_s(p.gpu, p.rows * split / p.tp, p.compute)
    rate = SSD_SCAN_PEAK_FRACTION * p.gpu.peak_flop_per_s("bf16")
    forward = np.maximum(flops / rate, streamed)
    return forward, p.attention_backward_ratio * forward


def _mixer_elementwise_bytes(model_spec: ModelSpec, mixer: str, p: LayerPieces) -> float:
    """TP-split element-wise bytes per token of a mixer: attention's rotary (layer_compute's
    head bytes); a Mamba's conv1d (read and write its channels), gate and norm (read 2,
    write 1 d_inner); DeltaNet's conv1d over q, k, v, its gate and norm (3 value_dim)."""
    m = model_spec
    if mixer in ATTENTION_MIXERS:
        return p.head_bytes
    if mixer == "mamba":
        inner = (m.mamba_num_heads or 0) * (m.mamba_head_dim or 0)
        channels = inner + 2 * (m.n_groups or 0) * (m.ssm_state_size or 0)
        return BF16_BYTES * (2 * channels + 3 * inner)
    if mixer == "linear_attention":
        key_dim = (m.linear_num_key_heads or 0) * (m.linear_key_head_dim or 0)
        value_dim = (m.linear_num_value_heads or 0) * (m.linear_value_head_dim or 0)
        return BF16_BYTES * (2 * (2 * key_dim + value_dim) + 3 * value_dim)
    return 0.0


def estimate_kind_compute_parts(model_spec: ModelSpec, seq_len: int, kind: int,
                                p: LayerPieces) -> dict[str, np.ndarray]:
    """The parts (solver.cost.layers.layer_compute.LAYER_PARTS) of one layer of kind `kind` (>= 2).

    Windowed: the plain kind's parts with core and core_bwd the measured window kernel's
    (LayerPieces.window_core) or, without one, full attention's times the window's share of
    the context. Composed: GEMMs = the mixer's (attention's own, or a two-GEMM block of the mixer's
    parameters) + the MLP's (dense: the dense MLP's; MoE: the MoE layer's less attention, with
    its routed experts); core = attention's (windowed) or the scan; element-wise = per
    sublayer its norm and residual add (5 h bytes, as layer_compute counts 10 h for two) plus
    the mixer's and the MLP's own traffic; cast = the GEMM inputs' quantisation."""
    mixer, mlp = model_spec.block_kinds[kind]
    base = p.moe if mlp == "moe" else p.dense
    ratio = _core_ratio(model_spec, mixer, seq_len) if mixer in ATTENTION_MIXERS else 0.0
    measured = p.window_core if mixer == "sliding_attention" else None
    if is_windowed_kind(model_spec, kind):
        core, core_bwd = measured or (base["core"] * ratio, base["core_bwd"] * ratio)
        return {**base, "core": core, "core_bwd": core_bwd}
    zero = np.zeros_like(p.rows, dtype=float)
    if mixer in ATTENTION_MIXERS:
        gemm, gemm_bwd = p.attention
        core, core_bwd = measured or (p.dense["core"] * ratio, p.dense["core_bwd"] * ratio)
    elif mixer != "none":
        gemm, gemm_bwd = p.gemms(float(model_spec.mixer_params(mixer)))
        core, core_bwd = _scan_s(model_spec, mixer, seq_len, p)
    else:
        gemm, gemm_bwd, core, core_bwd = zero, zero, zero, zero
    h = model_spec.hidden_size
    sublayers = (mixer != "none") + (mlp != "none")
    split_bytes = _mixer_elementwise_bytes(model_spec, mixer, p)
    cast = p.cast(p.gemm_inputs) if mixer != "none" else zero
    parts = {"routed": zero, "routed_bwd": zero, "moe_act": zero}
    if mlp != "none":
        split_bytes += p.mlp_split_bytes[mlp]
    if mlp == "dense":
        gemm, gemm_bwd = gemm + p.dense_mlp[0], gemm_bwd + p.dense_mlp[1]
        cast = cast + p.cast(p.gemm_inputs)
    elif mlp == "moe":
        gemm = gemm + p.moe["gemm"] - p.attention[0]
        gemm_bwd = gemm_bwd + p.moe["gemm_bwd"] - p.attention[1]
        parts = {name: p.moe.get(name, zero) for name in ("routed", "routed_bwd", "moe_act")}
        cast = cast + p.moe["cast"] - p.cast(p.gemm_inputs)
    elementwise = estimate_elementwise_s(p.gpu, p.rows * (
        BF16_BYTES * 5 * h * sublayers / p.sequence_split + split_bytes / p.tp), p.compute)
    return {"gemm": gemm, "gemm_bwd": gemm_bwd, **parts, "core": core, "core_bwd": core_bwd,
            "elementwise": elementwise, "cast": cast}


def estimate_mixer_cp_s(model_spec: ModelSpec, cluster, d: dict[str, np.ndarray], mixer: str,
                        rows: np.ndarray) -> np.ndarray:
    """Forward seconds of a Mamba-2 or DeltaNet mixer's context-parallel traffic, 0 without CP:
    rows/tp x width x 2 B all-to-all over the CP group, the mixer's inputs from sequence-
    to head-sharded before the conv and the scan, and its output back:
      mamba   z, x, B, C, dt in and y out: 3 d_inner + 2 G N + H (Megatron core_v0.16.1
              megatron/core/ssm/mamba_context_parallel.py, pre_conv_ssm and post_conv_ssm)
      linear  q, k, v, z, beta, alpha in and the gated norm's output out: 2 key_dim
              + 3 value_dim + 2 H_v (core_v0.18.0 megatron/core/ssm/gated_delta_net.py,
              tensor_a2a_cp2hp of qkvzba and tensor_a2a_hp2cp of norm_out)
    Worked number: Nemotron-H-8B's Mamba moves 3 x 8192 + 2048 + 128 = 26,752 values a token."""
    from solver.cost.comm.comm import estimate_collective_s, estimate_group_link

    m, tp, cp = model_spec, d["tp"], d["cp"]
    if mixer == "mamba":
        inner = (m.mamba_num_heads or 0) * (m.mamba_head_dim or 0)
        width = (3 * inner + 2 * (m.n_groups or 0) * (m.ssm_state_size or 0)
                 + (m.mamba_num_heads or 0))
    elif mixer == "linear_attention":
        key_dim = (m.linear_num_key_heads or 0) * (m.linear_key_head_dim or 0)
        value_dim = (m.linear_num_value_heads or 0) * (m.linear_value_head_dim or 0)
        width = 2 * key_dim + 3 * value_dim + 2 * (m.linear_num_value_heads or 0)
    else:
        return np.zeros(np.shape(cp))
    link = estimate_group_link(cluster, tp, cp, all_to_all=True)
    moved = estimate_collective_s("all_to_all", rows / tp * width * BF16_BYTES, cp, link)
    return np.where(cp > 1, moved, 0.0)
