"""The compute of one decoder layer (and of the LM head) for one micro-batch on one GPU, by
part, forward and backward, vectorised over candidates (solver.cost.layers.layer_time adds the
communication, overlap and host terms).

A layer kind is attention + dense MLP or attention + MoE (router, top-k routed experts on
ep*etp GPUs, shared experts split by TP). Its parts (LAYER_PARTS):
  gemm, gemm_bwd        projections, dense MLP, shared experts, router (solver.cost.kernels.efficiency:
                        measured tables where the GPU has one, else the datasheet roofline;
                        backward = the dgrad and wgrad lookups, or twice the forward);
                        the attention block's also what an eager YaRN RoPE adds over the
                        fused one (solver.cost.layers.rope_eager)
  routed, routed_bwd    the routed experts: the table's fused MoE kernel where it has MoE rows
                        in the recipe's dtype (permutation included), else per-expert GEMMs;
                        backward: the GEMM table's dgrad + wgrad over forward ratio for the
                        expert GEMMs (else twice); plus the all-to-all dispatcher's sort of
                        the received copies by local expert and back (_chunk_sort_s),
                        the framework's eager work around the grouped GEMMs (expert biases,
                        a SwiGLU limit: solver.cost.layers.moe_eager), FP8 current scaling's
                        amax reads (solver.cost.layers.fp8_scaling) and the quantized grouped
                        GEMM's row padding copies (solver.cost.layers.quantization_padding)
  core, core_bwd        the attention core (measured kernel and FlashAttention-3's backward
                        ratio, or the datasheet fraction and TimeConstants' FLOP ratio;
                        unfused attention: its batched GEMMs, twice over backward, and the
                        score matrix streamed through HBM, UNFUSED_SCORE_BYTES)
  elementwise           norms, QK norms, residual adds, rotary, MLP activation, MoE permutation
                        (backward twice)
  cast                  the precision recipe's quantization outside the timed kernels
                        (solver.cost.kernels.precision; forward only)
  moe_act               (MoE kinds; not in the layer's passes) what --recompute-modules
                        moe_act re-runs that the model charges (solver.cost.layers.moe_eager)
Routing is taken as balanced, as in the vendor MoE benchmarks this is checked against.
"""

from __future__ import annotations

import numpy as np

from solver.cost.layers.blocks import LayerPieces, estimate_kind_compute_parts, hybrid_kinds
from solver.cost.kernels.efficiency import (
    ComputeConstants,
    estimate_attention_core_s,
    estimate_elementwise_s,
    estimate_gemm_backward_s,
    estimate_gemm_s,
    estimate_streaming_s,
    estimate_table_attention_s,
    estimate_table_window_attention_s,
    estimate_triton_attention_s,
    gemm_table,
)
from solver.cost.layers.finetune import estimate_adapter_gemm_s, estimate_dequantize_s
from solver.cost.layers.flops import estimate_attention_core_flops
from solver.cost.layers.sparse_attention import indexer_params_per_layer
from solver.cost.layers.fp8_scaling import estimate_routed_scaling_s
from solver.cost.kernels.kernels import load_kernel_table
from solver.cost.kernels.kernels_moe import estimate_table_moe_backward_s, estimate_table_moe_s
from solver.cost.layers.moe_eager import (
    estimate_expert_eager_s,
    estimate_permuted_elements_per_token,
)
from solver.cost.kernels.precision import BF16, load_recipe
from solver.cost.layers.quantization_padding import estimate_routed_padding_s
from solver.cost.layers.rope_eager import estimate_eager_rope_s
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ClusterSpec, JobSpec, ModelSpec

BF16_BYTES = 2.0
# Unfused attention (Megatron's and TE's baddbmm -> FusedScaleMaskSoftmax -> bmm) materialises
# the s x s scores in bf16, bytes per score moved: forward 8 (Q K^T writes S, the softmax reads
# S and writes P, P V reads P), backward 14 (dP = dO V^T writes dP, dV = P^T dO reads P, the
# softmax backward reads P and dP and writes dS, dQ = dS K and dK = dS^T Q read dS); its
# backward runs twice the forward's batched GEMMs (nothing is recomputed).
UNFUSED_SCORE_BYTES = (8.0, 14.0)
# Dropout on the attention probabilities (TimeConstants.attention_dropout; Megatron-DeepSpeed's
# `self.attention_dropout(attention_probs)`, a torch.nn.Dropout) adds, per score: forward read
# P and write the dropped P' and its bool mask (2 + 2 + 1), backward read dP' and the mask and
# write dP (2 + 1 + 2); P V and its weight gradient read P' where they read P.
UNFUSED_DROPOUT_BYTES = (5.0, 5.0)
UNFUSED_BACKWARD_GEMMS = 2.0
LAYER_PARTS = ("gemm", "gemm_bwd", "routed", "routed_bwd", "core", "core_bwd", "elementwise",
               "cast")


def estimate_layer_compute_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                             d: dict[str, np.ndarray], constants: TimeConstants
                             ) -> dict[str, dict[str, np.ndarray]]:
    """Seconds per micro-batch of one dense ("dense") and one MoE ("moe") layer on one GPU,
    by part (module docstring). GEMMs of the layers a recipe keeps in BF16 (NVFP4: 16%, its
    first and last layers) enter as their share of the layers."""
    gpu, cc = cluster.gpu, constants.compute
    recipe = load_recipe(job.precision)
    bf16_share = recipe.bf16_layer_share
    tp, cp = d["tp"], d["cp"]
    h = model_spec.hidden_size
    rows = d["micro_batch"] * job.seq_len / cp  # tokens in a GPU's GEMMs (SP gathers over tp)

    def blend(estimate, *args) -> np.ndarray:
        low = estimate(gpu, job.precision, *args, cc)
        if bf16_share == 0.0:
            return low
        return (1.0 - bf16_share) * low + bf16_share * estimate(gpu, BF16.name, *args, cc)

    measured_gemms = gemm_table(gpu, job.precision) is not None
    # A frozen base (LoRA, QLoRA) runs no weight-gradient GEMM (solver.cost.layers.finetune).
    wgrad = not job.finetune.has_adapters

    def two_gemms(params: float, rows_: np.ndarray, split: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
        # A block of `params` weights as two GEMMs (up/in and down/out) of equal size.
        width = params / (2.0 * h * split)
        return (in_step(2.0 * blend(estimate_gemm_s, rows_, h, width), cc, measured_gemms),
                in_step(2.0 * blend(lambda *a: estimate_gemm_backward_s(
                    *a, weight_gradient=wgrad), rows_, h, width), cc, measured_gemms))

    # DSA's indexer is duplicated on every TP rank (solver.cost.layers.sparse_attention).
    indexer = indexer_params_per_layer(model_spec)
    attention, attention_bwd = two_gemms(model_spec.attention_params_per_layer - indexer, rows, tp)
    if indexer:
        indexer_s = two_gemms(indexer, rows, np.ones_like(tp))
        attention, attention_bwd = attention + indexer_s[0], attention_bwd + indexer_s[1]
    attention, attention_bwd, adapted_mlp = _with_adapters(
        model_spec, cluster, job, rows, tp, cc, (attention, attention_bwd))
    rope, rope_bwd = estimate_eager_rope_s(model_spec, gpu, cc, rows, tp,
                                           constants.scaled_rope_eager)
    attention, attention_bwd = attention + rope, attention_bwd + rope_bwd
    core, core_bwd, table_attention = _attention_core(model_spec, cluster, job, d, constants)
    core, core_bwd = (in_step(core, cc, table_attention), in_step(core_bwd, cc, table_attention))
    q_width = model_spec.num_attention_heads * model_spec.qk_head_dim
    kv_width = 2 * model_spec.kv_heads * model_spec.qk_head_dim
    # Element-wise bytes per token: 2 norms (read + write h), 2 residual adds (2 reads + write),
    # rotary on q and k, the MLP activation (gated: read 2F, write F; plain: read F, write F).
    # Norms and residual adds work on the full hidden width: split over TP only under
    # sequence parallel; rotary and the MLP activation work on TP-split heads and widths.
    # The measured attention kernel applies RoPE itself (solver.cost.kernels.kernels): no rotary then.
    # QK norms (Qwen3, OLMoE; Megatron's q_layernorm / k_layernorm, a TE norm kernel each
    # outside the attention op) read and write q and k.
    sequence_bytes = BF16_BYTES * (4 * h + 6 * h)
    sequence_split = tp if constants.sequence_parallel else 1
    head_bytes = 0.0 if table_attention else BF16_BYTES * 2 * (q_width + kv_width)
    if model_spec.qk_norm:
        head_bytes += BF16_BYTES * 2 * (q_width + model_spec.kv_heads * model_spec.qk_head_dim)
    low_share = (1.0 - bf16_share) if recipe.low_precision else 0.0

    def elementwise(mlp_width: float, permuted_widths: float = 0.0) -> np.ndarray:
        factor = 3.0 if model_spec.mlp_type == "gated" else 2.0
        # MoE token permutation and un-permutation (estimate_permuted_elements_per_token; of
        # moe_token_width: the latent width under LatentMoE).
        permute = permuted_widths * model_spec.moe_token_width
        split_bytes = head_bytes + BF16_BYTES * (factor * mlp_width + permute)
        per_gpu = rows * (sequence_bytes / sequence_split + split_bytes / tp)
        return estimate_elementwise_s(gpu, per_gpu, cc)

    cast_bytes = low_share * recipe.cast_bytes_per_input(gpu)

    def cast(input_elements: np.ndarray) -> np.ndarray:
        # What no table lookup times of quantising every low-precision GEMM input and its
        # gradient (solver.cost.kernels.precision, "Cast work").
        return estimate_streaming_s(gpu, cast_bytes * input_elements, cc)

    dense_mlp, dense_mlp_bwd = two_gemms(model_spec.dense_mlp_params_per_layer, rows, tp)
    dense_mlp, dense_mlp_bwd = dense_mlp + adapted_mlp[0], dense_mlp_bwd + adapted_mlp[1]
    gemm_inputs = 2.0 * rows * h / tp  # two GEMMs per block, inputs sharded by SP
    dense = {
        "gemm": attention + dense_mlp, "gemm_bwd": attention_bwd + dense_mlp_bwd,
        "core": core, "core_bwd": core_bwd,
        "elementwise": elementwise(model_spec.intermediate_size),
        "cast": cast(2.0 * gemm_inputs),
    }
    factor = 3.0 if model_spec.mlp_type == "gated" else 2.0
    # What solver.cost.layers.blocks composes a block pattern's other kinds from.
    pieces = {"attention": (attention, attention_bwd), "dense_mlp": (dense_mlp, dense_mlp_bwd),
              "gemms": lambda params: two_gemms(params, rows, tp), "cast": cast,
              "gemm_inputs": gemm_inputs, "rows": rows, "tp": tp,
              "sequence_split": sequence_split, "head_bytes": head_bytes, "gpu": gpu,
              "compute": cc, "attention_backward_ratio": constants.attention_backward_ratio,
              "window_core": _window_core(model_spec, cluster, job, d, constants,
                                          (core, core_bwd))}
    mlp_bytes = {"dense": BF16_BYTES * factor * model_spec.intermediate_size}
    if not model_spec.is_moe:
        return _with_block_kinds(model_spec, job, {"dense": dense, "moe": dense}, pieces,
                                 {**mlp_bytes, "moe": 0.0})
    k, experts = model_spec.experts_per_token, model_spec.num_experts
    routed, routed_bwd, fused = _routed_experts(model_spec, cluster, job, d, constants,
                                                bf16_share)
    measured_routed = fused or measured_gemms
    routed = in_step(routed, cc, measured_routed)
    routed_bwd = in_step(routed_bwd, cc, measured_routed)
    shared, shared_bwd = two_gemms(model_spec.shared_expert_params_per_layer, rows, tp)
    # LatentMoE's projections, replicated over TP, each rank on its rows / tp tokens
    # (solver.cost.layers.blocks.estimate_kind_params).
    latent_params = model_spec.latent_projection_params_per_layer
    latent, latent_bwd = two_gemms(latent_params, rows / tp, 1) if latent_params else (0.0, 0.0)
    shared, shared_bwd = shared + latent, shared_bwd + latent_bwd
    measured_bf16 = gemm_table(gpu, BF16.name) is not None
    router = in_step(estimate_gemm_s(gpu, BF16.name, rows / tp, h, experts, cc), cc,
                     measured_bf16)
    router_bwd = in_step(estimate_gemm_backward_s(gpu, BF16.name, rows / tp, h, experts, cc),
                         cc, measured_bf16)
    moe_width = k * model_spec.moe_intermediate_size + (
        model_spec.num_shared_experts
        * (model_spec.shared_expert_intermediate_size or model_spec.moe_intermediate_size)
    )
    pairs = rows / tp * d["etp"] * k  # token copies a GPU's experts compute
    chunk_sort = _chunk_sort_s(model_spec, cluster, d, constants, pairs)
    eager, eager_bwd, moe_act = estimate_expert_eager_s(model_spec, gpu, cc, pairs,
                                                        experts / d["ep"], d["etp"])
    scaling, scaling_bwd = estimate_routed_scaling_s(model_spec, gpu, constants, recipe, fused,
                                                     pairs, d["etp"])
    padding, padding_bwd = estimate_routed_padding_s(model_spec, gpu, constants, recipe, pairs)
    token_width = model_spec.moe_token_width
    permuted_widths = estimate_permuted_elements_per_token(k, constants.moe_permute_fusion,
                                                           fused)
    # Next to a measured fused MoE kernel, what the framework's permutation streams beyond it
    # is a pure copy (as _chunk_sort_s: no element-wise traffic factor), once each pass.
    permute_copy = (estimate_streaming_s(gpu, rows / tp * permuted_widths * token_width
                                         * BF16_BYTES, cc) if fused else 0.0)
    permuted_widths = 0.0 if fused else permuted_widths
    routed = routed + chunk_sort + eager + scaling + padding + permute_copy
    routed_bwd = routed_bwd + chunk_sort + eager_bwd + scaling_bwd + padding_bwd + permute_copy
    routed_inputs = pairs * (token_width + model_spec.moe_intermediate_size / d["etp"])
    shared_inputs = gemm_inputs if model_spec.num_shared_experts else 0.0
    if latent_params:
        shared_inputs = shared_inputs + rows / tp * (h + token_width)
    moe = {
        "gemm": attention + shared + router, "gemm_bwd": attention_bwd + shared_bwd + router_bwd,
        "routed": routed, "routed_bwd": routed_bwd,
        "core": core, "core_bwd": core_bwd,
        # Unless a measured fused MoE kernel permutes itself (permute_copy above).
        "elementwise": elementwise(moe_width, permuted_widths),
        "cast": cast(gemm_inputs + shared_inputs + routed_inputs),
        "moe_act": moe_act,
    }
    # The MoE MLP's TP-split element-wise bytes, as elementwise() counts them above.
    permute = permuted_widths * token_width
    return _with_block_kinds(model_spec, job, {"dense": dense, "moe": moe}, pieces,
                             {**mlp_bytes, "moe": BF16_BYTES * (factor * moe_width + permute)})


def _with_adapters(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                   rows: np.ndarray, tp: np.ndarray, cc: ComputeConstants,
                   attention: tuple[np.ndarray, np.ndarray]
                   ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The attention block's (forward, backward) GEMM seconds with its LoRA adapters and the
    NF4 dequantization of its linears (solver.cost.layers.finetune), and what the MLP block
    adds (forward, backward): its adapters and dequantization. The dequantization runs once a
    pass (forward; backward for the input gradient), so a recomputed forward pays it again."""
    gpu, finetune = cluster.gpu, job.finetune
    adapters = estimate_adapter_gemm_s(model_spec, gpu, rows, tp, finetune, cc)
    measured = gemm_table(gpu, BF16.name) is not None
    added = {}
    for block, params in (("attention", model_spec.attention_params_per_layer),
                          ("mlp", model_spec.dense_mlp_params_per_layer)):
        dequantize = estimate_dequantize_s(gpu, params / tp, finetune, cc)
        forward, backward = adapters[block]
        added[block] = (in_step(forward, cc, measured) + dequantize,
                        in_step(backward, cc, measured) + dequantize)
    return (attention[0] + added["attention"][0], attention[1] + added["attention"][1],
            added["mlp"])


def _with_block_kinds(model_spec: ModelSpec, job: JobSpec, kinds: dict[str, dict],
                      pieces: dict, mlp_split_bytes: dict[str, float]) -> dict[str, dict]:
    """The plain kinds, and for a model with a block pattern its other kinds ("kind2", ...:
    solver.cost.layers.blocks composes them from `pieces`, solver.cost.layers.blocks.LayerPieces' fields)."""
    if not model_spec.has_block_kinds:
        return kinds
    layer_pieces = LayerPieces(dense=kinds["dense"], moe=kinds["moe"],
                               mlp_split_bytes=mlp_split_bytes, **pieces)
    return {**kinds, **{f"kind{k}": estimate_kind_compute_parts(model_spec, job.seq_len, k,
                                                                layer_pieces)
                        for k in hybrid_kinds(model_spec)}}


def _attention_core(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                    d: dict[str, np.ndarray], constants: TimeConstants
                    ) -> tuple[np.ndarray, np.ndarray, bool]:
    """(forward, backward, from measured kernel rates) seconds of the attention core. The
    table path needs fused attention (FlashAttention or its kind): unfused attention keeps the
    datasheet path, which models its batched GEMMs; FlashAttention in Triton
    (TimeConstants.triton_attention) takes its published rates, not the tables'."""
    gpu, tp, cp = cluster.gpu, d["tp"], d["cp"]
    rows = d["micro_batch"] * job.seq_len / cp
    core_flops = rows * estimate_attention_core_flops(model_spec, job.seq_len) / tp
    if constants.flash_attention and constants.triton_attention:
        head_dim = max(model_spec.qk_head_dim, model_spec.value_head_dim)
        return (*estimate_triton_attention_s(gpu, core_flops, job.seq_len / cp, head_dim), True)
    if constants.flash_attention:
        table = estimate_table_attention_s(
            gpu, core_flops, batch=d["micro_batch"], seq=job.seq_len / cp,
            heads=model_spec.num_attention_heads / tp,
            kv_heads=np.maximum(model_spec.kv_heads / tp, 1.0),
            qk_head_dim=model_spec.qk_head_dim, v_head_dim=model_spec.value_head_dim,
            native=constants.native_attention_kernels)
        if table is not None:
            return (*table, True)
    core = estimate_attention_core_s(gpu, job.precision, core_flops, constants.compute,
                                     head_dims=(model_spec.qk_head_dim,
                                                model_spec.value_head_dim),
                                     flash=constants.flash_attention,
                                     native=constants.native_attention_kernels)
    if constants.flash_attention:
        return core, constants.attention_backward_ratio * core, False
    scores = d["micro_batch"] * (model_spec.num_attention_heads / tp) * (job.seq_len / cp) ** 2
    forward_bytes, backward_bytes = UNFUSED_SCORE_BYTES
    if constants.attention_dropout:
        forward_bytes += UNFUSED_DROPOUT_BYTES[0]
        backward_bytes += UNFUSED_DROPOUT_BYTES[1]
    return (core + estimate_streaming_s(gpu, forward_bytes * scores, constants.compute),
            UNFUSED_BACKWARD_GEMMS * core
            + estimate_streaming_s(gpu, backward_bytes * scores, constants.compute), False)


def _window_core(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                 d: dict[str, np.ndarray], constants: TimeConstants,
                 full: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """(forward, backward) in-step seconds of a sliding-window layer's attention core from the
    table's measured window kernel (solver.cost.kernels.efficiency.estimate_table_window_attention_s),
    never above the `full` attention core's (below the grids' 512 tokens the window kernel's
    rate is extrapolated; a window never needs more than causal attention's work). None
    where the GPU's table did not measure the model's window, the window spans the sequence,
    or the core is not the tables' kernel (unfused, Triton): solver.cost.layers.blocks then scales
    full attention by the window's share of the work."""
    window = model_spec.sliding_window
    if not (window and window < job.seq_len and constants.flash_attention
            and not constants.triton_attention):
        return None
    tp, cp = d["tp"], d["cp"]
    share = (model_spec.context_tokens("sliding_attention", job.seq_len)
             / model_spec.context_tokens("full_attention", job.seq_len))
    rows = d["micro_batch"] * job.seq_len / cp
    flops = share * rows * estimate_attention_core_flops(model_spec, job.seq_len) / tp
    measured = estimate_table_window_attention_s(
        cluster.gpu, flops, window=window, batch=d["micro_batch"], seq=job.seq_len / cp,
        heads=model_spec.num_attention_heads / tp,
        kv_heads=np.maximum(model_spec.kv_heads / tp, 1.0),
        head_dim=(model_spec.qk_head_dim + model_spec.value_head_dim) / 2,
        native=constants.native_attention_kernels)
    if measured is None:
        return None
    forward, backward = (in_step(seconds, constants.compute, True) for seconds in measured)
    return np.minimum(forward, full[0]), np.minimum(backward, full[1])


def _routed_experts(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                    d: dict[str, np.ndarray], constants: TimeConstants, bf16_share: float
                    ) -> tuple[np.ndarray, np.ndarray, bool]:
    """(forward, backward, fused) seconds of the routed experts. The GPU's EP group routes
    ep*etp*rows/tp tokens over all experts; each GPU computes its experts/ep experts (split
    etp ways) for tokens*k/experts rows each, which is the table's MoE row at that token
    count (solver.cost.kernels.kernels_moe.estimate_table_moe_s: beyond the grid's tokens, the same work
    as more local experts of fewer rows); its backward is such a kernel's forward times the
    GEMM table's dgrad + wgrad over forward time for one expert's two GEMMs
    (estimate_table_moe_backward_s).
    Without such rows: experts/ep per-expert GEMM pairs of that many rows. The experts'
    tokens are moe_token_width wide (the latent width under LatentMoE)."""
    gpu, cc, h = cluster.gpu, constants.compute, model_spec.moe_token_width
    tp, ep, etp = d["tp"], d["ep"], d["etp"]
    k, experts = model_spec.experts_per_token, model_spec.num_experts
    rows = d["micro_batch"] * job.seq_len / d["cp"]
    recipe = load_recipe(job.precision)
    if gpu.kernel_table is not None:
        table = load_kernel_table(gpu.kernel_table)

        def fused(estimate, dtype: str) -> np.ndarray | None:
            return estimate(table, dtype, hidden=h, inter=model_spec.moe_intermediate_size,
                            topk=k, experts=experts, gated=model_spec.mlp_type == "gated",
                            tokens=rows / tp * ep * etp, etp=etp, ep=ep)

        low = fused(estimate_table_moe_s, recipe.table_dtype)
        high = fused(estimate_table_moe_s, BF16.table_dtype) if bf16_share else None
        if low is not None and (high is not None or bf16_share == 0.0):
            low_bwd = fused(estimate_table_moe_backward_s, recipe.table_dtype)
            if bf16_share == 0.0:
                return low, low_bwd, True
            high_bwd = fused(estimate_table_moe_backward_s, BF16.table_dtype)
            return ((1.0 - bf16_share) * low + bf16_share * high,
                    (1.0 - bf16_share) * low_bwd + bf16_share * high_bwd, True)
    expert_rows = rows * k * ep * etp / (experts * tp)
    width = model_spec.expert_params / (2.0 * h * etp)
    local = experts / ep

    def per_expert(estimate, precision: str) -> np.ndarray:
        return 2.0 * local * estimate(gpu, precision, expert_rows, h, width, cc)

    forward, backward = (per_expert(estimate_gemm_s, job.precision),
                         per_expert(estimate_gemm_backward_s, job.precision))
    if bf16_share:
        forward = (1.0 - bf16_share) * forward + bf16_share * per_expert(estimate_gemm_s, "bf16")
        backward = ((1.0 - bf16_share) * backward
                    + bf16_share * per_expert(estimate_gemm_backward_s, "bf16"))
    return forward, backward, False


def _chunk_sort_s(model_spec: ModelSpec, cluster: ClusterSpec, d: dict[str, np.ndarray],
                  constants: TimeConstants, pairs: np.ndarray) -> np.ndarray:
    """Seconds per pass (forward, and again backward) of the all-to-all dispatcher's second
    permutation. After the all-to-all a GPU holds its token copies grouped by source rank and
    re-sorts them by local expert, and un-sorts them before the combine (Megatron-LM
    megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher
    dispatch_postprocess "Permutation 2: Sort tokens by local expert" when num_local_experts
    > 1, combine_preprocess "Unpermutation 2"; moe_utils.sort_chunks_by_idxs): each reads and
    writes every copy, 4 x pairs x h x 2 B per pass, streamed at the HBM fraction (a pure copy:
    no element-wise traffic factor). The measured fused MoE kernel permutes once each way
    itself, which the flex dispatchers (DeepEP, HybridEP) and the all-gather dispatcher also
    do once (Megatron MoEFlexTokenDispatcher permutes the received tokens by expert), so only
    "alltoall" with more than one local expert pays this. Worked number: Qwen3-30B-A3B, ep 8,
    4096 tokens x top-8 = 32768 copies of h 2048: 537 MB, 0.20 ms on an H100 (3.35 TB/s x 0.8)."""
    if constants.moe_dispatcher != "alltoall":
        return np.zeros_like(np.asarray(pairs, dtype=float))
    copies_bytes = 4.0 * pairs * model_spec.hidden_size * BF16_BYTES
    several = model_spec.num_experts / np.asarray(d["ep"], dtype=float) > 1.0
    return np.where(several, estimate_streaming_s(cluster.gpu, copies_bytes, constants.compute),
                    0.0)


def in_step(seconds: np.ndarray, constants: ComputeConstants, measured: bool) -> np.ndarray:
    """A kernel's seconds inside a training step: a measured kernel (timed alone) runs at
    ComputeConstants.table_rate_fraction of its measured rate; the datasheet path's
    fractions describe training kernels already. Worked number: an H100 bf16 8192^3 GEMM
    measured at 1.40 ms takes 1.40 / 0.92 = 1.52 ms in a step."""
    return seconds / constants.table_rate_fraction if measured else seconds


def estimate_forward_s(fwd: dict[str, np.ndarray]) -> np.ndarray:
    """A layer's forward seconds from its parts."""
    return (fwd["gemm"] + fwd.get("routed", 0.0) + fwd["core"] + fwd["elementwise"]
            + fwd.get("cast", 0.0))


def estimate_backward_s(fwd: dict[str, np.ndarray]) -> np.ndarray:
    """A layer's backward seconds from its parts: the GEMMs' and the core's own backward,
    the element-wise passes twice (input gradients and the saved tensors they re-read)."""
    return (fwd["gemm_bwd"] + fwd.get("routed_bwd", 0.0) + fwd["core_bwd"]
            + 2.0 * fwd["elementwise"])


def estimate_head_compute_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                            d: dict[str, np.ndarray], constants: TimeConstants) -> np.ndarray:
    """Forward + backward seconds of the LM head (BF16 under every recipe: precision.py) and
    the cross-entropy loss, which reads the fp32 logits about three times (max, exp-sum,
    gradient)."""
    gpu, cc = cluster.gpu, constants.compute
    rows = d["micro_batch"] * job.seq_len / d["cp"]
    h, width = model_spec.hidden_size, model_spec.vocab_size / d["tp"]
    head = in_step(estimate_gemm_s(gpu, BF16.name, rows, h, width, cc)
                   + estimate_gemm_backward_s(gpu, BF16.name, rows, h, width, cc), cc,
                   gemm_table(gpu, BF16.name) is not None)
    loss = estimate_streaming_s(gpu, 3 * 4.0 * rows * width, cc)
    return head + loss
