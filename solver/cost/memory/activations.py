"""Activation memory: what one decoder layer saves for its backward pass, and a stage's total.

Per layer and token, in bytes, after Korthikanti et al. 2022 (arXiv 2205.05198, §4 and
Table 2; notes §3.2), whose GPT layer (MHA, LayerNorm, GeLU MLP F = 4h, dropout) stores
34 h + 5 a s:
  attention  norm input 2h, QKV input 2h, Q 2h, K 2h, V 2h, output-projection input 2h,
             softmax output 2as, its dropout mask as and output 2as, output dropout mask h
  MLP        norm input 2h, fc1 input 2h, GeLU input 2F, fc2 input 2F, dropout mask h.
Generalised here: Q/K/V at their real widths (GQA: K and V are n_kv*d_h wide; MLA: the
latent inputs plus per-head K and V), the MLP interior 4F gated or not (Megatron's
theoretical_memory_usage coefficient 4F/h; the measured Llama-3.1-8B point in notes §3.2 fits
it, not the 6F an unfused SwiGLU would keep), no dropout masks unless `options.dropout`,
FlashAttention keeping only its fp32 log-sum-exp (4a bytes) instead of the s x s scores.
These are the fused kernels' bytes; eager ops add what fusion avoids (solver.cost.memory.eager:
silu's output, fp32 RMSNorm copies, an fp32 softmax output).
MoE layers store the router scores (4 bytes per expert) and, for k routed copies of each
token (times the capacity factor), the dispatched input, the expert interior 4F_e and the
output the combine weights; with expert-TP each of the etp ranks holds the full-width input
and output of its tokens.

Tensor parallelism divides Q/K/V, the attention core, the output-projection input and the
MLP interior by t; sequence parallelism also divides the rest (norm, QKV/fc1 inputs, masks),
giving 34 h / t + 5 a s / t. Context parallelism divides every term by cp (each rank keeps its
s/cp tokens). Recompute: selective drops the attention core (Korthikanti §5), full keeps only
each layer's input 2h (/t with SP) plus, while a layer is recomputed, that layer's working
set. With precision fp8, GEMM inputs (QKV, output projection, fc1, fc2) are saved in 1 byte.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from solver.cost.layers.blocks import (
    base_kind,
    compose_kind_activation_bytes,
    estimate_mixer_activation_bytes,
    hybrid_kinds,
    is_windowed_kind,
)
from solver.cost.candidates import (
    RECOMPUTE_FULL,
    RECOMPUTE_NONE,
    RECOMPUTE_SELECTIVE,
    Candidates,
)
from solver.cost.layers.finetune import estimate_adapter_activation_bytes_per_token
from solver.cost.layers.sparse_attention import estimate_indexer_saved_bytes_per_token
from solver.cost.memory import eager
from solver.cost.memory.op_level import estimate_op_level_bytes
from solver.cost.memory.options import MemoryOptions
from solver.spec import JobSpec, ModelSpec
from solver.spec.blocks import ATTENTION_MIXERS

BF16_BYTES = 2.0
FP32_BYTES = 4.0


def _linear_input_bytes(job: JobSpec) -> float:
    return BF16_BYTES if job.precision == "bf16" else 1.0  # fp8-like recipes alike (issue 12)


def _mlp_interior_bytes(width: float, job: JobSpec, model_spec: ModelSpec,
                        options: MemoryOptions) -> float:
    """Activation input 2F plus the fc2 input 2F (1F in fp8) per token, and an eager SwiGLU's
    silu output (solver.cost.memory.eager)."""
    return (BF16_BYTES * width + _linear_input_bytes(job) * width
            + eager.estimate_eager_swiglu_bytes(model_spec, options, width))


def _attention_bytes(model_spec: ModelSpec, job: JobSpec, recompute: np.ndarray,
                     options: MemoryOptions, tp: np.ndarray | int = 1
                     ) -> tuple[np.ndarray, float]:
    """(divided by tp, replicated without SP) bytes per token of one attention block. With
    tp above the KV heads each rank keeps one K and one V head (Megatron core_v0.16
    attention.py: num_query_groups_per_partition = 1), so they count as tp heads."""
    m, lin = model_spec, _linear_input_bytes(job)
    h, heads = m.hidden_size, m.num_attention_heads
    k_heads = heads if m.is_mla else np.maximum(m.kv_heads, tp)
    q_width = heads * m.qk_head_dim
    k_width, v_width = k_heads * m.qk_head_dim, k_heads * m.value_head_dim
    mask = 1.0 * h if options.dropout else 0.0
    replicated = BF16_BYTES * h + lin * h + mask
    if m.is_mla:
        q_rank, kv_rank = m.q_lora_rank or 0, m.kv_lora_rank or 0
        replicated += (BF16_BYTES + lin) * (q_rank + kv_rank) + BF16_BYTES * m.qk_rope_head_dim
    norms_split, norms_replicated = eager.estimate_eager_attention_norm_bytes(m, options,
                                                                              k_heads)
    replicated += norms_replicated
    if options.flash_attention:
        core_none = FP32_BYTES * heads
    else:
        core_none = eager.estimate_unfused_core_bytes(heads, job.seq_len, options)
    # Megatron's selective recompute drops the core only when core_attn is among its modules.
    keeps_core = (options.selective_recompute == "attention_core"
                  and "core_attn" not in options.recompute_modules)
    kept = (recompute == RECOMPUTE_NONE) | ((recompute == RECOMPUTE_SELECTIVE) & keeps_core)
    core = np.where(kept, core_none, 0.0)
    split = (BF16_BYTES * (q_width + k_width + v_width) + lin * heads * m.value_head_dim + core
             + norms_split)
    # DSA's indexer keeps its tensors whole on every TP rank (x tp against the split's / tp),
    # and only where the core is kept (core_attn recomputes it with the attention).
    split = split + np.where(kept, estimate_indexer_saved_bytes_per_token(m), 0.0) * tp
    return split, replicated


def _mlp_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
               options: MemoryOptions, moe: bool) -> tuple[np.ndarray | float, float]:
    """(divided by tp, replicated without SP) bytes per token of one MLP or MoE block."""
    m, lin = model_spec, _linear_input_bytes(job)
    h = m.hidden_size
    # the dropout mask, and what the eager pre-MLP norm keeps beyond a fused one
    mask = ((1.0 * h if options.dropout else 0.0)
            + eager.estimate_eager_mlp_norm_bytes(m, options))
    if not moe:
        return (_mlp_interior_bytes(m.intermediate_size, job, m, options),
                BF16_BYTES * h + lin * h + mask)
    shared_width = m.num_shared_experts * (
        m.shared_expert_intermediate_size or m.moe_intermediate_size or 0)
    routed_copies = m.experts_per_token * options.moe_capacity_factor
    # Routed copies travel at moe_token_width; LatentMoE's fc2_latent_proj (replicated over
    # TP) keeps its latent input (fc1's input is the norm output, already counted).
    width = m.moe_token_width
    per_copy = candidates.etp * (lin + BF16_BYTES) * width + _mlp_interior_bytes(
        m.moe_intermediate_size or 0, job, m, options)
    split = _mlp_interior_bytes(shared_width, job, m, options) + routed_copies * per_copy
    replicated = 2 * BF16_BYTES * h + FP32_BYTES * m.num_experts + mask
    if m.moe_latent_size:
        replicated += lin * m.moe_latent_size
    return split, replicated


def estimate_module_recompute_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                                    options: MemoryOptions, moe: bool
                                    ) -> tuple[np.ndarray | float, float]:
    """(divided by tp, replicated without SP) bytes per token that Megatron's selective
    recompute of options.recompute_modules drops beyond the attention core (core_attn is
    _attention_bytes'). Each recomputed module keeps its input and drops what it saved inside
    (megatron/core/transformer/transformer_layer.py, mlp.py, moe/experts.py, moe/moe_layer.py,
    multi_latent_attention.py, CheckpointWithoutOutput):
      layernorm       the pre-MLP norm's output of an MoE layer (dense layers fuse both norms
                      into TE LayerNormLinear, which the option leaves alone): 2h replicated
      mlp             a dense MLP's interior (activation input 2F, fc2 input F in fp8, 2F)
      moe_act         the routed experts' fc2 inputs (the activation's output), k copies
      shared_experts  the shared experts' interior
      moe             the whole MoE block but its input: the dispatched copies, the expert
                      interiors, the shared experts, the router scores and the norm output
                      (moe_act and shared_experts included)
      mla_up_proj     MLA's per-head Q, K and V from the latent (the up-projections and RoPE)
    Worked number: Llama-3.1-8B (F 14336, bf16) with mlp: 2 * 14336 * 2 = 57,344 B per token
    of the layer's 110,720 dropped."""
    m, lin = model_spec, _linear_input_bytes(job)
    modules, h = set(options.recompute_modules), m.hidden_size
    split: np.ndarray | float = 0.0
    replicated = 0.0
    if "mla_up_proj" in modules and m.is_mla:
        heads = m.num_attention_heads
        split = split + BF16_BYTES * heads * (2 * m.qk_head_dim + m.value_head_dim)
    if not moe:
        if "mlp" in modules:
            split = split + _mlp_interior_bytes(m.intermediate_size, job, m, options)
        return split, replicated
    shared_width = m.num_shared_experts * (
        m.shared_expert_intermediate_size or m.moe_intermediate_size or 0)
    if "moe" in modules:  # LatentMoE's fc2_latent_proj input is inside the block too
        moe_split, _ = _mlp_bytes(m, job, candidates, options, moe=True)
        return split + moe_split, (BF16_BYTES * h + FP32_BYTES * m.num_experts
                                   + lin * (m.moe_latent_size or 0))
    copies = m.experts_per_token * options.moe_capacity_factor
    if "moe_act" in modules:  # the fc2 inputs, and an eager SwiGLU's silu output
        width = m.moe_intermediate_size or 0
        split = split + copies * (lin * width
                                  + eager.estimate_eager_swiglu_bytes(m, options, width))
    if "shared_experts" in modules:
        split = split + _mlp_interior_bytes(shared_width, job, m, options)
    if "layernorm" in modules:  # and what an eager pre-MLP norm keeps beyond a fused one
        replicated += BF16_BYTES * h + (eager.estimate_eager_norm_bytes(m, options, h)
                                        if m.norms_per_layer >= 2 else 0.0)
    return split, replicated


def estimate_offload_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                           options: MemoryOptions, moe: bool) -> np.ndarray:
    """Bytes per GPU of one layer and micro-batch that Megatron's fine-grained activation
    offloading moves to the host (MemoryOptions.activation_offload), at the candidates'
    recompute level (none or selective): what the offloaded modules save for backward, each
    module's autograd-saved tensors (fine_grained_activation_offload.py: saved_tensors_hooks
    between group_start and group_offload):
      core_attn   Q, K and V at their widths and the log-sum-exp (the attention core's
                  saved tensors, less what --recompute-modules already drops)
      attn_proj   the output projection's input
      expert_fc1  the routed copies' fc1 input (h wide on each of the etp ranks)
      moe_act     the routed experts' activation input (2 F_e per copy)
    The dense MLP, the norms and the router stay (Megatron offers no module for the dense
    MLP; attn_norm / mlp_norm are fused into TE's LayerNormLinear in dense layers). Only what
    is saved moves: a recomputed core_attn or mla_up_proj leaves its checkpoint's inputs, and
    a MoE block recomputed whole (--recompute-modules moe) keeps only its input, which
    Megatron refuses to combine with offloading expert_fc1 / moe_act (asserted here, refused
    by solver.cost.step.offload.refuse_activation_offload).
    Worked number: Llama-3.1-8B (h 4096, 32 heads of 128, 8 KV heads), bf16, s 8192, b 1,
    tp 1: Q, K, V 2 x (4096 + 1024 + 1024) + the projection input 2 x 4096 + the LSE 4 x 32 =
    20,608 B per token, 168.8 MB per layer."""
    attention_split, _ = _attention_bytes(model_spec, job, candidates.recompute, options)
    split = attention_split
    if "mla_up_proj" in options.recompute_modules and model_spec.is_mla:
        mla, _ = estimate_module_recompute_bytes(
            model_spec, job, candidates, options.model_copy(
                update={"recompute_modules": ("mla_up_proj",)}), moe)
        split = split - mla
    if moe:
        # The routed experts' inputs are saved, so offloadable, only where the MoE block runs
        # outside a recompute checkpoint: the callers refuse selective recompute of the moe
        # module with the offload, as Megatron does (solver.cost.step.offload.
        # refuse_activation_offload: offload_not_inside_recomputed_moe).
        assert "moe" not in options.recompute_modules or not np.any(
            candidates.recompute == RECOMPUTE_SELECTIVE), "offload inside a recomputed MoE"
        m = model_spec
        copies = m.experts_per_token * options.moe_capacity_factor
        split = split + copies * (candidates.etp * _linear_input_bytes(job) * m.hidden_size
                                  + BF16_BYTES * (m.moe_intermediate_size or 0))
    full = candidates.recompute == RECOMPUTE_FULL
    return np.where(full, 0.0, _per_gpu(job, candidates, options, split, 0.0))


def estimate_kind_offload_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                                options: MemoryOptions) -> np.ndarray:
    """(N, kinds): estimate_offload_bytes of a layer of each kind (dense, MoE, a block
    pattern's others: a windowed kind its plain kind's, other mixers none)."""
    dense = estimate_offload_bytes(model_spec, job, candidates, options, moe=False)
    moe = (estimate_offload_bytes(model_spec, job, candidates, options, moe=True)
           if model_spec.is_moe else dense)
    plain = (dense, moe)
    extra = [plain[base_kind(model_spec, kind)] if is_windowed_kind(model_spec, kind)
             else np.zeros(len(candidates)) for kind in hybrid_kinds(model_spec)]
    return np.stack([dense, moe, *extra], axis=1)


def _per_gpu(job: JobSpec, candidates: Candidates, options: MemoryOptions,
             split: np.ndarray | float, replicated: np.ndarray | float) -> np.ndarray:
    """Bytes per GPU for one micro-batch from per-token bytes: (s*b/cp) tokens per rank."""
    tp = candidates.tp
    tokens = job.seq_len * candidates.micro_batch / candidates.cp
    replicated_over = tp if options.sequence_parallel else 1
    return tokens * (split / tp + replicated / replicated_over)


def estimate_layer_activation_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                                    options: MemoryOptions, moe: bool = False) -> np.ndarray:
    """Bytes one decoder layer saves per GPU for one micro-batch at each candidate's
    recompute level (full: the layer input only).

    Korthikanti et al. 2022 Table 2 (dropout on, no FlashAttention, GPT layer):
    none s*b*h*(34 + 5as/h); with TP and SP s*b*h*(34/t + 5as/(ht)); TP without SP
    s*b*h*(10 + 24/t + 5as/(ht)); selective drops the 5as/h term; full keeps 2sbh (/t with SP).
    Worked number: GPT-3 175B (h = 12288, a = 96), s = 2048, b = 1, t = 8 with SP, none,
    dropout, no FlashAttention: 2048 * 12288 * (34 + 5*96*2048/12288) / 8 = 358.6 MB.
    """
    attention_split, attention_replicated = _attention_bytes(
        model_spec, job, candidates.recompute, options, candidates.tp)
    mlp_split, mlp_replicated = _mlp_bytes(model_spec, job, candidates, options, moe)
    saved = _per_gpu(job, candidates, options, attention_split + mlp_split,
                     attention_replicated + mlp_replicated)
    layer_input = _per_gpu(job, candidates, options, 0.0, BF16_BYTES * model_spec.hidden_size)
    selective = candidates.recompute == RECOMPUTE_SELECTIVE
    if options.selective_recompute == "op_level":
        op_level = _per_gpu(job, candidates, options,
                            *estimate_op_level_bytes(model_spec, moe))
        saved = np.where(selective, op_level, saved)
    elif set(options.recompute_modules) - {"core_attn"}:
        dropped = _per_gpu(job, candidates, options, *estimate_module_recompute_bytes(
            model_spec, job, candidates, options, moe))
        # A recomputed module keeps its input, so the layer keeps at least its own
        # (tests/test_offload_recompute.py checks it rather than a clamp here).
        saved = np.where(selective, saved - dropped, saved)
    # LoRA's rank-r intermediates (B's inputs), split over TP with the linears they sit
    # beside (solver.cost.layers.finetune); the base linears' inputs are counted above.
    saved = saved + _per_gpu(job, candidates, options,
                             estimate_adapter_activation_bytes_per_token(model_spec,
                                                                         job.finetune), 0.0)
    return np.where(candidates.recompute == RECOMPUTE_FULL, layer_input, saved)


def estimate_kind_activation_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                                   options: MemoryOptions, kind: int,
                                   plain: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Bytes one layer of block-pattern kind `kind` saves per GPU for one micro-batch, at the
    candidates' recompute level (none or selective). `plain`: the dense and MoE layers' bytes
    at that level. A windowed kind saves what its plain kind saves (solver.cost.layers.blocks); the
    others add up their mixer's bytes (attention's as _attention_bytes counts them, Mamba's
    and DeltaNet's from solver.cost.layers.blocks) and their MLP's (_mlp_bytes)."""
    if is_windowed_kind(model_spec, kind):
        return plain[base_kind(model_spec, kind)]
    lin = _linear_input_bytes(job)

    def mixer_bytes(mixer: str) -> tuple:
        if mixer in ATTENTION_MIXERS:
            return _attention_bytes(model_spec, job, candidates.recompute, options,
                                    candidates.tp)
        return estimate_mixer_activation_bytes(model_spec, mixer, lin)

    def mlp_bytes(mlp: str) -> tuple:
        # The MLP modules Megatron recomputes drop from a one-block MLP layer what they drop
        # from a plain layer (estimate_module_recompute_bytes).
        split, replicated = _mlp_bytes(model_spec, job, candidates, options, mlp == "moe")
        if options.selective_recompute != "op_level":
            selective = candidates.recompute == RECOMPUTE_SELECTIVE
            dropped = estimate_module_recompute_bytes(model_spec, job, candidates, options,
                                                      mlp == "moe")
            split = split - np.where(selective, dropped[0], 0.0)
            replicated = replicated - np.where(selective, dropped[1], 0.0)
        return split, replicated

    split, replicated = compose_kind_activation_bytes(model_spec, kind, mixer_bytes, mlp_bytes)
    return _per_gpu(job, candidates, options, split, replicated) + np.zeros(len(candidates))


def estimate_activation_terms(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                              options: MemoryOptions) -> dict[str, np.ndarray]:
    """The parts a stage's activation bytes per GPU are made of (composed by
    solver.cost.memory.terms; one micro-batch each):

        layer[k]     a decoder layer of kind k (0 dense, 1 MoE) at the configuration's level
                     (none or selective; full recompute is counted per layer, below), per
                     micro-batch in flight
        recompute[k] what a layer of kind k that recomputes in full saves (keeps its input
                     only), per micro-batch in flight (<= 0)
        first        the embedding's output norm input / dropout mask, per micro-batch in flight
        last         final-norm and LM-head inputs (4h), the MTP modules (at the configuration's
                     recompute level), one micro-batch
        not_last     DeepSpeed's kept stage output (a 1/tp slice), per micro-batch in flight,
                     on every stage but the last
        working      while a layer is recomputed, the working set of the model's largest layer
                     less its input (on a stage where some layer recomputes in full)
        offload_margin  under activation offload, the largest layer's offloaded bytes, kept
                     on every stage (the reload margin; layer[k] is net of what moves)
    Worked number: Llama-3.1-8B, s = 8192, b = 4, tp = pp = 1, none, FlashAttention:
    27.03 h bytes per token per layer = 3.63 GB per layer, 116.1 GB for 32 layers, plus
    0.54 GB of final-norm and LM-head inputs (notes §3.2: Megatron's s*b*h*(18 + 4F/h) is
    4.29 GB per layer for MHA; GQA's narrower K and V save 3h).
    """
    m, h = model_spec, model_spec.hidden_size
    base = replace(candidates, recompute=np.where(candidates.recompute == RECOMPUTE_FULL,
                                                  RECOMPUTE_NONE, candidates.recompute))
    dense = estimate_layer_activation_bytes(m, job, base, options, moe=False)
    moe = estimate_layer_activation_bytes(m, job, base, options, moe=True) if m.is_moe \
        else dense
    layer_input = _per_gpu(job, candidates, options, 0.0, BF16_BYTES * h)

    embedding = (BF16_BYTES if m.embedding_norm else 0.0) * h + (h if options.dropout else 0.0)
    head = _per_gpu(job, candidates, options, 0.0, 2 * BF16_BYTES * h
                    + eager.estimate_eager_norm_bytes(m, options, h))
    # The MTP depths recompute as the configuration does (full: their input only); a repeated
    # module keeps one set of activations per depth.
    mtp_layer = estimate_layer_activation_bytes(m, job, candidates, options, moe=m.is_moe)
    mtp = m.mtp_depths * (mtp_layer + head) if options.include_mtp else 0.0
    zeros = np.zeros(len(candidates))
    not_last = (_per_gpu(job, candidates, options, BF16_BYTES * h, 0.0)
                if options.keep_stage_outputs else zeros)
    replay = replace(candidates, recompute=np.full(len(candidates), RECOMPUTE_NONE))
    largest = estimate_layer_activation_bytes(m, job, replay, options, moe=False)
    if m.is_moe:
        largest = np.maximum(largest, estimate_layer_activation_bytes(m, job, replay, options,
                                                                      moe=True))
    # A block pattern's other kinds (solver.cost.layers.blocks), after dense and MoE.
    extra = [estimate_kind_activation_bytes(m, job, base, options, kind, (dense, moe))
             for kind in hybrid_kinds(m)]
    if extra:  # the largest layer the model has, kinds of the pattern included
        replayed = (estimate_layer_activation_bytes(m, job, replay, options, moe=False),
                    estimate_layer_activation_bytes(m, job, replay, options, moe=m.is_moe))
        present = set(m.layer_kind_indices)
        largest = np.maximum.reduce([
            *(replayed[kind] for kind in (0, 1) if kind in present),
            *(estimate_kind_activation_bytes(m, job, replay, options, kind, replayed)
              for kind in hybrid_kinds(m))])
    layer = np.stack([dense, moe, *extra], axis=1)
    margin = np.zeros(len(candidates))
    if options.activation_offload:  # MemoryOptions.activation_offload: the rest stays
        offloaded = estimate_kind_offload_bytes(m, job, base, options)
        layer = layer - offloaded
        # The reload margin: the last layer's groups are kept (its backward comes first).
        present = sorted(set(m.layer_kind_indices)) if m.has_block_kinds else \
            [k for k, held in ((0, m.num_dense_layers), (1, m.is_moe)) if held]
        # (Under full recompute, which the offload does not run with, nothing is offloaded.)
        margin = np.where(candidates.recompute == RECOMPUTE_FULL, 0.0,
                          offloaded[:, present].max(axis=1))
    return {
        "layer": layer,
        "recompute": layer_input[:, None] - layer,
        "first": zeros + _per_gpu(job, candidates, options, 0.0, embedding),
        "last": zeros + head + mtp,
        "not_last": zeros + not_last,
        "working": np.maximum(largest - layer_input, 0.0),
        "offload_margin": margin,
    }

