"""MemoryOptions: the memory model's constants, each physical and each with its source.

Section numbers (§) refer to the project's cost-model research notes (notes/cost_model.md in
the shared brief), which cite the primary sources.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from solver.spec.framework import (
    Fp8WeightCopies,
    LossImplementation,
    MoeDispatcher,
    RecomputeModule,
    SelectiveRecompute,
)

GIB = 2**30


class MemoryOptions(BaseModel):
    """What the framework keeps per parameter and per token, and what the GPU loses to others.

    Model states (bytes per parameter; §3.1):
      param_bytes 2        bf16/fp16 working weights.
      grad_bytes 4         gradient buffers kept for every local parameter until the step
                           (sharded from ZeRO-2 on). 4 = Megatron's fp32 `main_grad` buffer
                           (dist_optimizer.md: bf16 params + fp32 grads = 18 B, or 6 + 12/d with
                           the distributed optimizer); 2 = the ZeRO paper's fp16 gradients;
                           6 = DeepSpeed's BF16_Optimizer (bf16 .grad plus an fp32 accumulation
                           buffer, "4 bytes x params ... not sharded", BLOOM chronicles).
      optimizer_bytes 12   fp32 master weights + Adam m and v (sharded from ZeRO-1 on);
                           16 = DeepSpeed ZeRO-1/2, whose partition also holds fp32 gradients.
      fp8_weight_copies "transformer_engine"
                           below bf16, the quantised weight copies kept across micro-batches
                           (solver.cost.memory.states.estimate_fp8_copy_bytes_per_param):
                           "transformer_engine" caches a row-wise and a column-wise (transposed)
                           copy of every GEMM weight it holds, scales included ("FP8 weight
                           caching", is_first_microbatch; MXFP8 and NVFP4 "need both row-wise and
                           column-wise quantised copies", TE docs), sharded like the weights;
                           "none": torchao float8 casts each weight on the fly in every forward
                           and keeps no copy (torchtitan). Embeddings, LM head, norms and router
                           stay bf16.
      fp8_params False     Megatron --fp8-param-gather: below bf16 the GEMM weights are the quantised
                           tensors themselves (Transformer Engine Float8Tensor / MXFP8Tensor
                           parameters, row-wise data plus its column-wise copy), so they keep no
                           bf16 copy: weights lose param_bytes per low-precision GEMM weight
                           (states.estimate_fp8_param_saved_bytes_per_param). The fp32 master
                           stays in the optimizer state. Megatron takes it with its distributed
                           optimizer only (ZeRO >= 1). Megatron-Bridge's fp8 current-scaling
                           and MXFP8 recipes set it (megatron/bridge/training/mixed_precision.py
                           bf16_with_fp8_current_scaling_mixed: fp8_param_gather = True).
      fp8_all_gather False torchao float8 (tensorwise) with FSDP2's float8 all-gather
                           (torchtitan v0.2.2 job_config.py Float8Linear.
                           enable_fsdp_float8_all_gather, default off; docs/float8.md: "cast
                           Float8Linear.weight from high precision to float8 before FSDP
                           all-gather"): under ZeRO-3 the gathered weights are float8, 1 B each
                           instead of param_bytes (the gather buffers, and a stage kept
                           gathered under PP); the fp32 shard is unchanged. The layer's norms,
                           gathered in bf16, are counted in float8 too (under 0.01% of a layer).
      fp32_sharded_params False
                           PyTorch FSDP's mixed precision (FSDP1 MixedPrecision, FSDP2
                           MixedPrecisionPolicy: param_dtype bf16) keeps each parameter's shard
                           in fp32 and the optimizer steps it in place: under ZeRO-3 that shard
                           is the master copy (4 B in "weights", taken out of optimizer_bytes),
                           and the bf16 weights exist only gathered (the ZeRO-3 gather buffer):
                           16 B per parameter / d, not 18 (ZeRO-0..2 hold the same bytes either
                           way). solver.cost.step.frameworks sets it for torchtitan and generic.
      master_param_remainders False
                           Megatron's precision-aware optimizer keeps the fp32 master as the 16
                           bits a bf16 parameter lacks (optimizer_config.py store_param_remainders,
                           default True with Transformer Engine >= 2.1; distrib_optimizer.py: the
                           master_param state is int16), or as fp16 (--main-params-dtype fp16):
                           2 B of optimizer_bytes' 4 with bf16 parameters. Below bf16 (other than
                           delayed scaling) Megatron keeps an fp32 master of its own (optimizer_
                           config.py use_precision_aware_optimizer_no_fp8_or_ds_fp8):
                           states.estimate_master_saved_bytes_per_param.
      fsdp_unsharded_under_pp False
                           torchtitan under pipeline parallelism: FSDP2 does not reshard after
                           forward ("for PP, by default do not reshard after forward to avoid
                           per-microbatch all-gathers", torchtitan/distributed/fsdp.py
                           get_fsdp_reshard_after_forward_policy) and the pipeline schedule turns
                           off resharding after backward and gradient sync until the last
                           micro-batch (torch/distributed/pipelining/stage.py
                           backward_maybe_with_nosync), so a ZeRO-3 stage also holds its
                           parameters gathered (param_bytes), and at every ZeRO stage FSDP2
                           shards (1-3) the stage's gradients stay unsharded, accumulated in the
                           reduce dtype (FSDPParam.to_accumulated_grad_if_needed:
                           fsdp_reduce_bytes), in place of the sharded ones (states.
                           estimate_fsdp_accumulated_grad_bytes). solver.cost.step.frameworks sets
                           it for torchtitan. Under it memory can rise with pp (1 -> 2).
      fsdp_reduce_bytes 4  FSDP2's MixedPrecisionPolicy.reduce_dtype, the dtype those unsharded
                           gradients accumulate in: fp32 (4) in torchtitan, whose
                           mixed_precision_reduce takes "float32" only (job_config.py v0.1.0,
                           v0.2.2 and main: Literal["float32"]); an FSDP2 reducing in its
                           param_dtype keeps the bf16 gradient (2: FSDPParam.init_dtype_attrs
                           clamps reduce_dtype to None).
    Activations (§3.2):
      sequence_parallel    Megatron shards norms, dropout and GEMM inputs over TP (on whenever
                           tp > 1, DESIGN.md); False reproduces frameworks without it
                           (Megatron-DeepSpeed 2022, which trained BLOOM).
      flash_attention      no s x s scores are stored (FlashAttention / fused attention).
      dropout              dropout masks are stored; Llama-style pretraining uses none.
      moe_capacity_factor 1.25
                           routed token copies on the busiest GPU over the average (§3.2 MoE:
                           "budget 1.0-1.25 with token dropping"; the upper end, since the
                           busiest GPU is the one that runs out of memory).
      moe_dispatcher "alltoall"
                           the profile's MoE token dispatcher: DeepEP, HybridEP and the
                           all-gather dispatcher keep buffers of their own, sized by the ETPxEP
                           group (solver.cost.memory.dispatcher, the "dispatcher" item).
      nvlink_domain_gpus 8 the GPUs of one NVLink domain the job's ranks fill (ClusterSpec.
                           job_segment_gpus, set from the cluster by FrameworkProfile.
                           memory_options; 8 for an HGX node, 64 of a GB200 NVL72): the ranks per
                           domain HybridEP detects (detect_accessible_ranks), which split its
                           buffers between NVLink and RDMA.
      logits_bytes 6       per logit on the last stage while the loss runs: the bf16 logits
                           plus the fp32 copy Megatron's vocab-parallel cross-entropy makes and
                           keeps for backward (theoretical_memory_usage counts the fp32 copy,
                           4 bytes; a fused cross-entropy needs 2). The per-logit bytes of the
                           framework's eager loss: torchtitan's F.cross_entropy holds 12
                           (solver.cost.step.frameworks.EAGER_CROSS_ENTROPY_LOGITS_BYTES).
      loss_implementation "eager"
                           how the loss is computed (solver.spec.framework.LossImplementation;
                           the framework profile's, FrameworkProfile.memory_options): "eager"
                           holds logits_bytes per logit, "compiled", "chunked" and "fused"
                           the bytes their code keeps, "fused_linear" (the LM head fused with
                           the loss) one chunk of logits and the head's input gradient
                           (solver.cost.memory.loss.estimate_logits_bytes, each with its source).
      logits_fp32_from_model False
                           the model hands the loss fp32 logits: torchtune's TransformerDecoder
                           returns `self.output(h).float()` (TiedEmbeddingTransformerDecoder
                           `F.linear(h, tok_embeddings.weight).float()`) unless its output is
                           chunked (modules/transformer.py @1814feb). A compiled loss then keeps
                           the fp32 logits and writes an fp32 gradient: 8 B per logit, not 4
                           (loss.estimate_compiled_loss_bytes_per_logit). An eager loss on them
                           runs the same ops as torchtitan's F.cross_entropy(pred.float()), whose
                           12 B logits_bytes gives.
      loss_chunks_compiled False
                           the chunked loss's per-chunk upcast and cross-entropy are compiled
                           (torchtune compile_loss: CEWithChunkedOutputLoss.compute_cross_entropy
                           under torch.compile, training/_compile.py @1814feb): 2 + 2/8 B per
                           logit, not the eager chunks' 4 + 8/8 (loss.
                           estimate_chunked_loss_bytes_per_logit).
    Temporary buffers and fixed overheads (§3.1 FSDP, §3.4):
      zero3_prefetch_layers 1
                           ZeRO-3 keeps the current and the prefetched layer gathered (FSDP2:
                           "two all-gather output tensors alive at once").
      comm_bucket_bytes 0.32e9
                           flat buffers gradient reduction copies into: two buckets (one being
                           reduced, one being filled) of Megatron's 40M-element bucket in fp32.
      cuda_context_gib 1.0 CUDA context and kernels: 0.47-0.92 GiB with PyTorch 2.1 on A100,
                           1.78 GiB with PyTorch 1.10 (ml-engineering, §3.4).
      nccl_gib 1.5         NCCL communicators and buffers: "expect ~1-2 GiB"; measured +1.45 GiB
                           after the first barrier (ml-engineering, §3.4).
      fragmentation 0.05   the caching allocator's excess over what is allocated, applied to
                           everything allocated, when memory is tight. On a roomy GPU the
                           allocator keeps more: reserved / allocated = 216.9 / 194.4 = 1.12
                           in the Llama-3.1-8B dgxc log (§3.4), yet the same recipe (TP1 CP2,
                           seq 8192) runs on 80 GB H100s, which bounds the excess under
                           pressure to 5.6% with PyTorch's expandable segments (recommended by
                           Megatron-Bridge). Older stacks without them keep ~12% even when
                           tight: BLOOM's 2022 nvidia-smi maxima and OOM points need 0.12
                           (benchmarks/memory_accuracy.py sets it for that era).
      include_mtp          DeepSeek's multi-token-prediction module on the last stage.
      selective_recompute  what `selective` keeps: "attention_core" (Megatron: all but the
                           attention core) or "op_level" (torchtitan's per-op SAC: the layer
                           input and the outputs of every second GEMM, the attention and the
                           all-to-alls; solver.cost.step.frameworks sets it per framework).
      recompute_modules ("core_attn",)
                           under attention_core, the modules `selective` recomputes (Megatron
                           --recompute-modules, default core_attn; what each drops:
                           activations.estimate_module_recompute_bytes).
    Offload to the host (solver.cost.step.offload has the step time they cost):
      optimizer_offload False
                           the optimizer state (fp32 master weights and Adam moments) lives in
                           host memory and the optimizer steps on the CPU: Megatron
                           --optimizer-cpu-offload --optimizer-offload-fraction 1.0
                           (megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py: the CPU
                           optimizer's fp32 parameters and states are host tensors), DeepSpeed
                           ZeRO-Offload (offload_optimizer.device "cpu": the fp32 partition and
                           its gradients on the host). The GPU keeps its bf16 weights and its
                           gradient buffer: "optimizer" is 0.
      activation_offload False
                           Megatron's fine-grained activation offloading
                           (--fine-grained-activation-offloading --offload-modules core_attn
                           attn_proj expert_fc1 moe_act, docs/user-guide/features/
                           fine_grained_activation_offloading.md): what those modules save for
                           backward goes to pinned host memory after their forward and comes
                           back before their backward; the last layer's groups stay (the
                           reload margin). activations.estimate_offload_bytes says what moves.
      cpu_offloading_num_layers 0
                           Megatron's layer-level CPU offloading (--cpu-offloading-num-layers N,
                           megatron/core/transformer/transformer_block.py: Transformer Engine's
                           get_cpu_offload_context(num_layers = N, model_layers = num_layers)):
                           every tensor the first N decoder layers save for backward goes to
                           the host, and "at most (model_layers - num_layers) sets of activations
                           are on GPU at any time" (TE docs/features/other_optimizations/
                           cpu_offloading/cpu_offloading.rst, Default Offloading Scheduling).
                           Megatron runs it without pipeline parallelism or recompute
                           (transformer_config.py); solver.cost.memory.layer_offload.
    Framework layouts, off by default (used to reproduce published runs):
      account_for_embedding_in_pipeline_split
                           the embedding and the LM head each take one layer slot of the
                           first and last stage (Megatron-Bridge's option of that name;
                           DeepSpeed's partition 'type:transformer|embedding' for BLOOM).
      keep_stage_outputs   a 1/tp slice of each in-flight micro-batch's stage output stays
                           alive until its backward (DeepSpeed's pipeline engine partitions it
                           over the TP group; Megatron frees it once sent).
                           torchtitan's torch.distributed.pipelining keeps it too: the stage's
                           forward_one_chunk stores `fwd_cache[chunk] = (output_tuple, inputs)`
                           until that micro-batch's backward (stage.py), its residual stream
                           sequence-sharded under TP (1/tp).
      pipeline_grad_buffers False
                           torch.distributed.pipelining allocates, on every stage but the last,
                           one buffer for the gradient of the stage's output per micro-batch of
                           the step, when the schedule is prepared, and keeps them
                           (stage.py _prepare_backward_infra: grad_recv_info[chunk] =
                           _create_grad_recv_info(...) for every chunk, each _RecvInfo holding
                           _make_tensor_from_meta(output meta)): num_microbatches x the stage
                           output per virtual stage held (overheads.
                           estimate_pipeline_grad_buffer_bytes). solver.cost.step.frameworks sets it
                           for torchtitan.
    Eager code (solver.cost.memory.eager; FrameworkProfile.memory_options sets both flags
    from the profile's attention kernel and fused_elementwise):
      fused_elementwise True
                           norms, SwiGLU, RoPE and the unfused attention's softmax run as fused
                           kernels (TE, apex, Megatron's fusions, torch.compile); False
                           (`--eager-elementwise`): as eager PyTorch ops, each keeping what its
                           autograd node saves (an eager SwiGLU also silu's output, an eager
                           unfused softmax its fp32 output).
      rmsnorm_fp32_copy True
                           an eager RMSNorm is written as x.float() ops and keeps the fp32 copy
                           of its input (torchtitan norms.py of 2024, HF LlamaRMSNorm); False
                           where nn.RMSNorm dispatches to PyTorch's CUDA _fused_rms_norm kernel,
                           which saves what a fused norm saves. The default counts the larger.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    param_bytes: float = Field(default=2.0, gt=0)
    grad_bytes: float = Field(default=4.0, ge=0)
    optimizer_bytes: float = Field(default=12.0, ge=0)
    fp8_weight_copies: Fp8WeightCopies = "transformer_engine"
    fp8_params: bool = False
    fp8_all_gather: bool = False
    fp32_sharded_params: bool = False
    master_param_remainders: bool = False
    fsdp_unsharded_under_pp: bool = False
    fsdp_reduce_bytes: float = Field(default=4.0, gt=0)
    sequence_parallel: bool = True
    flash_attention: bool = True
    dropout: bool = False
    moe_capacity_factor: float = Field(default=1.25, ge=1.0)
    moe_dispatcher: MoeDispatcher = "alltoall"
    nvlink_domain_gpus: int = Field(default=8, ge=1)
    logits_bytes: float = Field(default=6.0, ge=0)
    zero3_prefetch_layers: int = Field(default=1, ge=0)
    comm_bucket_bytes: float = Field(default=2 * 40e6 * 4, ge=0)
    cuda_context_gib: float = Field(default=1.0, ge=0)
    nccl_gib: float = Field(default=1.5, ge=0)
    fragmentation: float = Field(default=0.05, ge=0)
    include_mtp: bool = True
    selective_recompute: SelectiveRecompute = "attention_core"
    recompute_modules: tuple[RecomputeModule, ...] = ("core_attn",)
    optimizer_offload: bool = False
    activation_offload: bool = False
    cpu_offloading_num_layers: int = Field(default=0, ge=0)
    account_for_embedding_in_pipeline_split: bool = False
    keep_stage_outputs: bool = False
    pipeline_grad_buffers: bool = False
    fused_elementwise: bool = True
    rmsnorm_fp32_copy: bool = True
    loss_implementation: LossImplementation = "eager"
    logits_fp32_from_model: bool = False
    loss_chunks_compiled: bool = False
