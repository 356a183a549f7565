"""Model states per GPU: weights, gradients and optimizer state of one pipeline stage.

Parameters of a stage split in two groups that shard differently (Megatron parallel_state,
notes §3.1):
  dense   attention, dense MLPs, shared experts, norms, embedding and LM head: split by tp
          (vocabulary-parallel embedding and head), router replicated; gradients and optimizer
          sharded over the dp*cp ranks (the distributed optimizer shards over DP x CP);
  expert  routed experts: num_experts/ep experts per GPU, each split by etp; sharded over the
          expert-data-parallel group of tp*cp*dp/(ep*etp) ranks.

ZeRO stages (Rajbhandari et al. 2020 §5): 1 shards the optimizer state, 2 also the gradients,
3 also the weights (FSDP FULL_SHARD). Megatron's distributed optimizer is ZeRO-1 with the fp32
gradient buffer kept whole: with the defaults (2 + 4 + 12/d bytes) that is 6 + 12/d B/param.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.layers.blocks import estimate_kind_params
from solver.cost.layers.finetune import (
    estimate_adapter_params_per_layer,
    estimate_base_weight_bytes_per_param,
)
from solver.cost.layers.sparse_attention import estimate_indexer_replica_params
from solver.cost.candidates import Candidates
from solver.cost.memory.layout import StageLayout
from solver.cost.memory.options import MemoryOptions
from solver.cost.memory.overheads import estimate_gathered_param_bytes
from solver.cost.kernels.precision import load_recipe
from solver.spec import JobSpec, ModelSpec
from solver.spec.finetune import FinetuneSpec

# The two groups of parameters (module docstring).
PARAM_GROUPS = ("dense", "expert")
# fp32 master weights: part of MemoryOptions.optimizer_bytes (4 of the default 12).
MASTER_WEIGHT_BYTES = 4.0


@dataclass(frozen=True)
class StageParams:
    """Parameters one GPU of a stage holds (before ZeRO sharding)."""

    dense: np.ndarray
    expert: np.ndarray
    gemm: np.ndarray  # the weights Transformer Engine casts to fp8 (a subset of the two above)
    largest_layer: np.ndarray  # the biggest decoder layer on the stage (a ZeRO-3 gather unit)
    gemm_expert: np.ndarray | float = 0.0  # the routed experts' share of `gemm`
    # Fine-tuning adapters on the stage (solver.cost.layers.finetune; sharded like `dense`).
    adapter: np.ndarray | float = 0.0


def _mtp_split(model_spec: ModelSpec) -> tuple[int, int]:
    """(non-expert, routed-expert) parameters of the multi-token-prediction modules."""
    if not model_spec.mtp_modules:
        return 0, 0
    per_module_experts = model_spec.num_experts * model_spec.expert_params
    experts = model_spec.mtp_modules * per_module_experts  # a repeated module counts once
    return model_spec.mtp_params - experts, experts


def estimate_stage_params(model_spec: ModelSpec, candidates: Candidates, layout: StageLayout,
                          options: MemoryOptions, finetune: FinetuneSpec | None = None
                          ) -> StageParams:
    """Parameters per GPU on one stage, by sharding group, and the `finetune` adapters of its
    layers (split by tp like the linears they sit beside).

    Worked number: Llama-3.1-405B, tp = 8, pp = 2, first stage: 63 layers of 3.188e9 plus the
    embedding 2.101e9, / 8 = 25.37e9 per GPU (seed 003 example 3: "810 / 16 = 50.6 GB" bf16).
    """
    tp, ep, etp = candidates.tp, candidates.ep, candidates.etp
    m = model_spec
    n_dense, n_moe = layout.num_dense_layers, layout.num_moe_layers
    h = m.hidden_size

    moe_shared = m.attention_params_per_layer + m.shared_expert_params_per_layer
    # The router and LatentMoE's projections are replicated over TP (solver.cost.layers.blocks).
    latent = m.latent_projection_params_per_layer
    moe_dense_part = ((moe_shared + m.norm_params_per_layer) / tp + m.router_params_per_layer
                      + latent)
    moe_expert_part = m.num_experts / ep * m.expert_params / etp
    # DSA's indexer is duplicated on every TP rank: what that adds to an even 1/tp split.
    indexer = estimate_indexer_replica_params(m, tp)
    moe_dense_part = moe_dense_part + indexer

    # Megatron keeps a copy of a tied embedding on the last stage when pp > 1 (the embedding
    # group all-reduces the two copies' gradients).
    head = m.lm_head_params or np.where(candidates.pp > 1, m.vocab_size * h, 0)
    mtp_dense, mtp_expert = _mtp_split(m) if options.include_mtp else (0, 0)
    first = np.where(layout.is_first, m.embedding_params / tp, 0.0)
    last_dense = (head + m.final_norm_params + mtp_dense) / tp
    last = np.where(layout.is_last, last_dense, 0.0)
    last_expert = np.where(layout.is_last, mtp_expert / (ep * etp), 0.0)

    dense = n_dense * (m.dense_layer_params / tp + indexer) + n_moe * moe_dense_part + first + last
    expert = n_moe * moe_expert_part + last_expert
    gemm = (
        n_dense * ((m.attention_params_per_layer + m.dense_mlp_params_per_layer) / tp + indexer)
        + n_moe * (moe_shared / tp + indexer + latent + moe_expert_part)
    )
    largest = np.maximum(
        np.where(n_dense > 0, m.dense_layer_params / tp + indexer, 0.0),
        np.where(n_moe > 0, moe_dense_part + moe_expert_part, 0.0),
    )
    adapter = 0.0
    if finetune is not None and finetune.has_adapters:
        adapter = (n_dense + n_moe) * estimate_adapter_params_per_layer(m, finetune).total / tp
    return StageParams(dense=dense, expert=expert, gemm=gemm, largest_layer=largest,
                       gemm_expert=n_moe * moe_expert_part, adapter=adapter)


def estimate_kind_stage_params(model_spec: ModelSpec, candidates: Candidates, kind: int
                               ) -> StageParams:
    """Parameters per GPU of a stage holding one layer of block-pattern kind `kind`
    (solver.cost.layers.blocks.estimate_kind_params), sharded in the two groups above."""
    per_gpu = estimate_kind_params(model_spec, candidates.tp, candidates.ep, candidates.etp, kind)
    return StageParams(dense=per_gpu.dense, expert=per_gpu.expert, gemm=per_gpu.gemm,
                       largest_layer=per_gpu.largest_layer, gemm_expert=per_gpu.gemm_expert)


def estimate_fp8_copy_bytes_per_param(precision: str, options: MemoryOptions) -> float:
    """Bytes per GEMM weight of the quantised copies kept across micro-batches.

        transformer_engine: 2 * element_bytes * (1 - bf16_layer_share)     none: 0
    Transformer Engine quantises each weight once per step and caches it for the later
    micro-batches (TE docs, "FP8 weight caching": with is_first_microbatch=False "the cached
    FP8 weights are reused"), as two copies: row-wise for fprop and column-wise (transposed)
    for dgrad; on Hopper an FP8 GEMM takes only the TN layout, and MXFP8 / NVFP4 scale along
    one axis, so "both row-wise and column-wise quantized copies" are kept (TE docs,
    MXFP8BlockScaling, NVFP4BlockScaling), each with its block scales (the recipe's
    element_bytes, solver.cost.kernels.precision). Layers kept in BF16 (NVFP4's share) keep none.
    torchao float8 (torchtitan) keeps none: Float8Linear casts the weight in every forward
    (float8_experimental removed its weight cache, pytorch-labs/float8_experimental#181).
    Worked numbers: fp8 2.0 B; mxfp8 2 * 1.03125 = 2.06 B; nvfp4 2 * 0.5625 * (1 - 10/62)
    = 0.94 B.
    """
    recipe = load_recipe(precision)
    if not recipe.low_precision or options.fp8_weight_copies == "none":
        return 0.0
    return 2.0 * recipe.element_bytes * (1.0 - recipe.bf16_layer_share)


def estimate_fp8_param_saved_bytes_per_param(precision: str, options: MemoryOptions) -> float:
    """Bytes per GEMM weight that fp8 parameters (MemoryOptions.fp8_params, Megatron
    --fp8-param-gather) save: the bf16 copy of every low-precision GEMM weight, whose quantised
    tensors (estimate_fp8_copy_bytes_per_param) are then the parameters themselves.

        param_bytes * (1 - bf16_layer_share)     below bf16 with Transformer Engine; else 0
    Worked numbers: fp8 2.0 B (a GEMM weight keeps 2 B of row- and column-wise fp8 data
    instead of 2 + 2); nvfp4 2 * 52/62 = 1.68 B (its BF16 layers keep their bf16 weights)."""
    recipe = load_recipe(precision)
    if (not options.fp8_params or not recipe.low_precision
            or options.fp8_weight_copies == "none"):
        return 0.0
    return options.param_bytes * (1.0 - recipe.bf16_layer_share)


def estimate_master_saved_bytes_per_param(precision: str, options: MemoryOptions) -> float:
    """Bytes of the fp32 master Megatron's precision-aware optimizer does not keep
    (MemoryOptions.master_param_remainders): 2 of 4 with bf16 parameters, none below bf16.
    Worked number: Nemotron 3 Super's 64-H100 recipe (precision-aware, bf16 moments, bf16):
    optimizer state 4 + 2 + 2 = 8 B a parameter less 2 = 6 B."""
    if not options.master_param_remainders or load_recipe(precision).low_precision:
        return 0.0
    return MASTER_WEIGHT_BYTES - 2.0


def estimate_low_precision_weight_bytes_per_param(precision: str, options: MemoryOptions
                                                  ) -> float:
    """What a GEMM weight holds beyond param_bytes below bf16: its quantised copies less, with
    fp8 parameters, the bf16 copy they replace (the two functions above). Worked numbers:
    fp8 2.0 B with Transformer Engine's cache, 0.0 B with fp8 parameters."""
    return (estimate_fp8_copy_bytes_per_param(precision, options)
            - estimate_fp8_param_saved_bytes_per_param(precision, options))


def estimate_sharded_state_bytes_per_param(options: MemoryOptions) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter once fully sharded (ZeRO-3): the
    options' own, with the fp32 master moved into the weights under PyTorch FSDP
    (fp32_sharded_params), no optimizer state on the GPU where it is offloaded. Worked numbers:
    2 + 4 + 12 by default; 4 + 4 + 8 under FSDP; 2 + 4 + 0 offloaded."""
    if options.optimizer_offload:  # the optimizer state is host memory
        return options.param_bytes, options.grad_bytes, 0.0
    if not options.fp32_sharded_params:
        return options.param_bytes, options.grad_bytes, options.optimizer_bytes
    master = min(MASTER_WEIGHT_BYTES, options.optimizer_bytes)
    return (master or options.param_bytes), options.grad_bytes, options.optimizer_bytes - master


def estimate_model_states(job: JobSpec, candidates: Candidates, params: StageParams,
                          options: MemoryOptions
                          ) -> dict[str, np.ndarray]:
    """Bytes of weights, gradients and optimizer state per GPU under ZeRO 0-3.

        weights   = (P * param_bytes + P_gemm * fp8_copy_bytes)  / d  if zero == 3
                    (fp8_copy_bytes: estimate_low_precision_weight_bytes_per_param, the
                    copies less the bf16 weights fp8 parameters replace from ZeRO-1 on)
        grads     = P * grad_bytes                            / d  if zero >= 2
        optimizer = P * optimizer_bytes                       / d  if zero >= 1
    with d = dp*cp for dense parameters and tp*cp*dp/(ep*etp) for routed experts.

    Sources: ZeRO paper §5.1 (16 Psi, 4 Psi + 12 Psi/d, 2 Psi + 14 Psi/d, 16 Psi/d with
    2-byte gradients); Megatron dist_optimizer.md (18 B/param, 6 + 12/d with fp32 gradients).
    PyTorch FSDP (fp32_sharded_params): weights 4/d, optimizer (optimizer_bytes - 4)/d at
    ZeRO-3, the fp32 shard being the master copy (16 B / d with fp32 gradients); torchtitan
    under PP (fsdp_unsharded_under_pp) keeps the stage gathered at ZeRO-3 (+ P * param_bytes)
    and, at every ZeRO stage FSDP2 shards (1-3), its gradients unsharded in the reduce dtype:
    grads = P * fsdp_reduce_bytes in place of the shard (estimate_fsdp_accumulated_grad_bytes).
    Worked number: Llama-3.1-8B (8.03e9 params), dp = 8, ZeRO-1, defaults:
    weights + optimizer = 8.03e9 * (2 + 12/8) = 28.1 GB, plus 32.1 GB of fp32 gradients =
    60.2 GB, the "weights and optimizer" Megatron-Bridge logs for this run (notes §3.2).
    With adapters (LoRA, QLoRA) the base is frozen: solver.cost.memory.finetune_states.
    """
    if job.finetune.has_adapters:
        return estimate_adapter_model_states(job, candidates, params, options)
    zero = candidates.zero
    shards = {"dense": (candidates.dp * candidates.cp).astype(float),
              "expert": candidates.expert_dp}
    counts = {"dense": params.dense, "expert": params.expert}
    gemm = {"dense": params.gemm - params.gemm_expert, "expert": params.gemm_expert}

    def shard(bytes_per_param: float | np.ndarray, from_stage: int) -> np.ndarray:
        on = zero >= from_stage
        return sum((counts[k] * bytes_per_param / np.where(on, shards[k], 1.0) for k in PARAM_GROUPS),
                   np.zeros(len(candidates)))

    # The copies of the weights a GPU holds (less the bf16 weights fp8 parameters replace):
    # under ZeRO-3 its shard (the gathered layer's copies are a ZeRO-3 gather buffer,
    # estimate_zero3_gather_bytes), as Megatron-FSDP keeps fp8 parameters sharded
    # (--fp8-param-gather).
    # Megatron takes --fp8-param-gather only with its distributed optimizer (ZeRO >= 1).
    fp8_copy = (estimate_fp8_copy_bytes_per_param(job.precision, options)
                - np.where(zero >= 1, estimate_fp8_param_saved_bytes_per_param(
                    job.precision, options), 0.0))
    copies = sum((gemm[k] * fp8_copy / np.where(zero >= 3, shards[k], 1.0) for k in PARAM_GROUPS),
                 np.zeros(len(candidates)))
    # PyTorch FSDP's ZeRO-3 shard is the fp32 parameter the optimizer steps (MemoryOptions.
    # fp32_sharded_params): its 4 B move from the optimizer state to the weights.
    sharded_param, _, sharded_optimizer = estimate_sharded_state_bytes_per_param(options)
    full = zero >= 3
    # torchtitan's FSDP2 under PP keeps the stage gathered (ZeRO-3) and its gradients unsharded
    # (MemoryOptions.fsdp_unsharded_under_pp).
    stage = sum((counts[k] for k in PARAM_GROUPS), np.zeros(len(candidates)))
    kept = np.where(full & (candidates.pp > 1) & options.fsdp_unsharded_under_pp, stage, 0.0)
    accumulated = estimate_fsdp_accumulated_grad_bytes(candidates, stage, options)
    return {
        "weights": shard(np.where(full, sharded_param, options.param_bytes), 3) + copies
        + kept * estimate_gathered_param_bytes(options),
        "grads": np.where(accumulated > 0.0, accumulated, shard(options.grad_bytes, 2)),
        # Offloaded, the optimizer state is host memory (MemoryOptions.optimizer_offload).
        "optimizer": shard(np.where(full, sharded_optimizer, options.optimizer_bytes
                                    - estimate_master_saved_bytes_per_param(job.precision,
                                                                            options)), 1)
        * (0.0 if options.optimizer_offload else 1.0),
    }


def estimate_fsdp_accumulated_grad_bytes(candidates: Candidates, stage_params: np.ndarray,
                                         options: MemoryOptions) -> np.ndarray:
    """Bytes per GPU of the unsharded gradients torchtitan's FSDP2 accumulates under pipeline
    parallelism (MemoryOptions.fsdp_unsharded_under_pp), 0 where it does not:

        P_stage * fsdp_reduce_bytes     if pp > 1 and 1 <= zero (FSDP2 shards; ZeRO 0 is DDP)

    torch.distributed.pipelining runs every micro-batch's backward with
    set_requires_gradient_sync(False) and set_reshard_after_backward(False) and reduces once,
    after the last, in _post_backward (torch/distributed/pipelining/stage.py
    backward_maybe_with_nosync, _PipelineStageBase._post_backward, pytorch@0138610). Without
    the sync, FSDPParamGroup.post_backward casts each parameter's unsharded gradient to the
    reduce dtype and adds the later micro-batches into it (torch/distributed/fsdp/_fully_shard/
    _fsdp_param.py FSDPParam.to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed,
    pytorch@010ae4a; _fsdp_param_group.py post_backward, pytorch@002a76f): a whole stage of
    unsharded gradients in MixedPrecisionPolicy.reduce_dtype, fp32 in torchtitan
    (mixed_precision_reduce: Literal["float32"] in v0.1.0, v0.2.2 and main). They take the
    place of the sharded gradients, which are None until _post_backward reduce-scatters
    (torchtitan's train_step starts with optimizers.zero_grad(): torchtitan/train.py v0.2.2).
    Worked number: Llama-3.1-405B, tp 8, pp 8, dp 8: the first stage's 16 layers of 3.188e9 / 8
    and its 2.101e9 / 8 embedding = 6.639e9 parameters, x 4 B = 26.55 GB (sharded: 3.32 GB).
    """
    on = (candidates.pp > 1) & (candidates.zero >= 1) & options.fsdp_unsharded_under_pp
    return np.where(on, stage_params * options.fsdp_reduce_bytes, 0.0)


def estimate_adapter_model_states(job: JobSpec, candidates: Candidates, params: StageParams,
                                  options: MemoryOptions) -> dict[str, np.ndarray]:
    """Bytes of weights, gradients and optimizer state per GPU of a stage whose base is frozen
    and whose adapters train (job.finetune: lora, qlora; solver.cost.layers.finetune):

        weights   = (P - P_gemm) * param_bytes + P_gemm * (base_bytes + fp8_copy_bytes)
                    + A * param_bytes                                 all / d if zero == 3
        grads     = A * grad_bytes                                    / d if zero >= 2
        optimizer = A * optimizer_bytes                               / d if zero >= 1
    with P the stage's parameters, P_gemm its layers' linears (NF4 under qlora: 0.5159 B,
    base_bytes), A its adapters and d = dp*cp. The frozen base keeps no gradient and no
    optimizer state: PEFT's get_peft_model sets requires_grad False on every base parameter
    (tuners_utils.BaseTuner._mark_only_adapters_as_trainable), Megatron-Bridge's PEFT freezes
    the model (peft/base.py PEFT.freeze_model) and its DDP allocates main_grad buffers and
    the distributed optimizer shards only for parameters that require grad; torch.optim steps
    the adapters alone. The adapters keep the training states' bytes (--training-states:
    18 B under Megatron's mixed precision, 2 + 2 + 4 = 8 B in pure bf16 as torchtune keeps
    them); under PyTorch FSDP's ZeRO-3 their fp32 shard is the master (as for full training).
    Frozen weights under FSDP stay in the dtype they were loaded in (bf16).
    Worked number: Llama-3.1-8B (8.03e9, of which 6.98e9 in the layers' linears), LoRA r 16 on
    the seven PEFT linears (4.19e7 adapters), one GPU, mixed: 8.03e9 x 2 + 4.19e7 x 18 = 16.81 GB;
    QLoRA: 1.05e9 x 2 + 6.98e9 x 0.5159 + 4.19e7 x 18 = 6.45 GB.
    """
    finetune = job.finetune
    zero = candidates.zero
    shard = (candidates.dp * candidates.cp).astype(float)
    base = sum((np.asarray(getattr(params, k), dtype=float) for k in PARAM_GROUPS),
               np.zeros(len(candidates)))
    gemm = np.asarray(params.gemm, dtype=float)
    adapter = np.asarray(params.adapter, dtype=float) + np.zeros(len(candidates))
    gemm_bytes = (estimate_base_weight_bytes_per_param(finetune, options.param_bytes)
                  + estimate_fp8_copy_bytes_per_param(job.precision, options))
    frozen = (base - gemm) * options.param_bytes + gemm * gemm_bytes
    sharded_param, _, sharded_optimizer = estimate_sharded_state_bytes_per_param(options)
    full = zero >= 3
    adapter_weights = adapter * np.where(full, sharded_param, options.param_bytes)
    optimizer = np.where(full, sharded_optimizer,
                         options.optimizer_bytes
                         - estimate_master_saved_bytes_per_param(job.precision, options))
    return {
        "weights": (frozen + adapter_weights) / np.where(full, shard, 1.0),
        "grads": adapter * options.grad_bytes / np.where(zero >= 2, shard, 1.0),
        "optimizer": adapter * optimizer / np.where(zero >= 1, shard, 1.0)
        * (0.0 if options.optimizer_offload else 1.0),
    }


def estimate_whole_model_state_bytes(model_spec: ModelSpec, job: JobSpec,
                                     options: MemoryOptions) -> float:
    """Weights, gradients and optimizer state of the whole model, unsharded (the fit check of
    `optimize`'s explanation): every parameter at estimate_sharded_state_bytes_per_param's sum,
    or with adapters the frozen base (its layers' linears at the base bytes: NF4 under qlora)
    and the adapters at that sum. Worked numbers: Llama-3.1-70B (70.6e9) 2 + 4 + 12 = 18 B:
    1,270 GB; LoRA r 32 on linear_qkv: 70.6e9 x 2 + 4.72e7 x 18 = 142 GB; QLoRA: 2.1e9 x 2 +
    68.5e9 x 0.5159 + 4.72e7 x 18 = 40.4 GB."""
    per_param = sum(estimate_sharded_state_bytes_per_param(options))
    if not job.finetune.has_adapters:
        return per_param * model_spec.total_params
    adapters = model_spec.num_hidden_layers * estimate_adapter_params_per_layer(
        model_spec, job.finetune).total
    return estimate_frozen_weight_bytes(model_spec, job, options) + adapters * per_param


def estimate_frozen_weight_bytes(model_spec: ModelSpec, job: JobSpec,
                                 options: MemoryOptions) -> float:
    """Bytes of the whole model's weights as the job stores them, unsharded: param_bytes each,
    the layers' linears at NF4's 0.5159 B under qlora (the rule of thumb's minimum TP).
    Worked numbers: Llama-3.1-70B 141.1 GB in bf16; 2.10e9 x 2 + 68.45e9 x 0.5159 = 39.5 GB
    under QLoRA."""
    gemm = model_spec.num_hidden_layers * (model_spec.attention_params_per_layer
                                           + model_spec.dense_mlp_params_per_layer)
    if not job.finetune.quantized_base:
        return model_spec.total_params * options.param_bytes
    base = estimate_base_weight_bytes_per_param(job.finetune, options.param_bytes)
    return (model_spec.total_params - gemm) * options.param_bytes + gemm * base
