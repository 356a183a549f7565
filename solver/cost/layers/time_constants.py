"""The constants and switches of the step-time model (solver.cost.step.steptime): which DP
collectives overlap compute, how often they run, in which dtype gradients are reduced, which
kernels the frameworks run and how many the host launches. What each training framework sets
them to is its profile (solver.cost.step.frameworks, `framework_time_constants`).

Every constant has a physical meaning and a source; the switches are framework behaviour read
from the frameworks' code or documentation, never fitted.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.comm.pipeline_sends import PipelineSends
from solver.cost.comm.ring_attention import ContextParallelRing
from solver.spec import ClusterSpec
from solver.spec.framework import (
    DpOverlap,
    Fp8WeightCopies,
    LossImplementation,
    MoeDispatcher,
    RecomputeModule,
    SelectiveRecompute,
    TrainingStates,
)


# What one Transformer Engine module call (te.Linear, LayerNormLinear, GroupedLinear,
# DotProductAttention, TENorm) costs the host, in eager PyTorch ops: a BF16 te.Linear forward
# took 99.66 us of CPU against torch.nn.Linear's 37.08 us on GB200, one GEMM kernel each
# (NVIDIA/TransformerEngine#2053, 2025-08; GH200 90.53 against 33.17: 2.73). The ratio is the
# Grace systems' [B: taken for x86 hosts too, whose TE row the issue's table does not give;
# TE#445 (2023, H100) timed te.Linear at 3.3x torch.nn.Linear per forward and backward].
TE_MODULE_OPS = 99.66 / 37.08
# Host time per eager PyTorch op where neither TimeConstants.host_op_s nor the cluster's file
# (ClusterSpec.host_op_us) gives one: 13.48 us CPU per torch.nn.Linear forward on an H100 DGX's
# Xeon Platinum 8480C (NVIDIA/TransformerEngine#2053), the x86 server reference [A on that
# CPU, B on other x86 hosts]. It replaces the 5 us driver launch floor used before: a training
# framework's op pays Python, PyTorch's dispatcher and the launch, 10-20 us on x86.
X86_HOST_OP_S = 13.48e-6


class KernelLaunches(BaseModel):
    """Ops the host issues for one layer's forward pass of one micro-batch, by block, in eager
    PyTorch ops (each costs the host estimate_host_op_s; solver.cost.step.frameworks counts them per
    framework, from the modules they come from, a Transformer Engine module as TE_MODULE_OPS).
    The backward issues `backward_ratio` times as many: each GEMM becomes an input- and a
    weight-gradient GEMM, each fused element-wise kernel one or two backward kernels.
    Collectives (TP/SP, CP ring steps) are counted where they are costed.

    The defaults are Megatron-Core's with Transformer Engine, as `launch` starts it (T =
    TE_MODULE_OPS; modules of megatron/core/transformer at the DeepSeek-V3 GB200 guide's
    commit):
      attention 4 + 3T       LayerNormLinear QKV, DotProductAttention, output Linear; the QKV
                             split, fused RoPE on q and k, bias-dropout-add
      mla_attention 9 + 7T   (multi_latent_attention.py) TENorm, q down Linear, q up
                             LayerNormLinear, kv down Linear, kv up LayerNormLinear,
                             DotProductAttention, output Linear; three splits, RoPE on q and
                             k, the k position embedding's expand copy, two concatenations,
                             bias-dropout-add
      mlp 2 + 2T             LayerNormLinear fc1, Linear fc2; SwiGLU, bias-dropout-add
      router T + 72          the pre-MLP TENorm and the router part's 72 kernels of NVIDIA's
                             DeepSeek-V3 GB200 guide (§2.1.4, Nsys; sigmoid scores, group-
                             limited top-k, expert bias, sequence aux loss; Megatron's default
                             --moe-router-fusion off), [B] for simpler routers, which launch
                             fewer
      router_fused T + 31    the same under --moe-router-fusion (TE PR 1883: "from 72 to 31");
                             TimeConstants.moe_router_fusion picks it
      shared_experts 1 + 2T  Linear fc1, activation, Linear fc2 (layers with shared experts)
      preprocess 10          MoEAlltoAllTokenDispatcher.preprocess: tokens per expert, the
                             splits' sums, their all-gather over TP x EP, and the copies to the
                             host [B: counted from token_dispatcher.py]
      dispatch 10            permute (2), all-to-all, sort by local expert; sort back,
                             all-to-all, unpermute (2), bias-dropout-add, the shared experts' add
      experts 1 + 2T         GroupedLinear fc1 and fc2 and the activation over all local tokens
      per_local_expert 2     TE GroupedLinear's multi-stream cuBLAS issues one GEMM per local
                             expert in fc1 and in fc2 [B: launched from C++, each with its
                             Python workspace lookup, counted as one op]
      quantized_splits_per_local_expert 2  below BF16, fc1's and fc2's input are quantized per
                             expert: the recipe's quantize_kernels_per_split each
                             (solver.cost.kernels.precision).
    The quantization of the other TE linears' inputs (one kernel each below BF16, a handful a
    layer) is left out [B: a lower bound]."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    attention: float = Field(default=4.0 + 3.0 * TE_MODULE_OPS, ge=0)
    mla_attention: float = Field(default=9.0 + 7.0 * TE_MODULE_OPS, ge=0)
    mlp: float = Field(default=2.0 + 2.0 * TE_MODULE_OPS, ge=0)
    router: float = Field(default=TE_MODULE_OPS + 72.0, ge=0)  # MoE: pre-MLP norm and router
    router_fused: float | None = Field(default=TE_MODULE_OPS + 31.0, ge=0)  # None: no fusion
    shared_experts: float = Field(default=1.0 + 2.0 * TE_MODULE_OPS, ge=0)
    preprocess: float = Field(default=10.0, ge=0)  # MoE: token counts and splits, pre-sync
    dispatch: float = Field(default=10.0, ge=0)  # MoE: permute, dispatch, combine, unpermute
    experts: float = Field(default=1.0 + 2.0 * TE_MODULE_OPS, ge=0)  # once per layer
    per_local_expert: float = Field(default=2.0, ge=0)  # MoE: ops per local expert
    quantized_splits_per_local_expert: float = Field(default=2.0, ge=0)
    backward_ratio: float = Field(default=2.0, ge=0)


class TimeConstants(BaseModel):
    """Constants of the step-time model; each has a physical meaning and a source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: ComputeConstants = ComputeConstants()
    # Megatron keeps fp32 main gradients and reduces them in fp32 for bf16 training
    # (arguments.py forces accumulate_allreduce_grads_in_fp32 with --bf16); FSDP / ZeRO-3
    # recipes reduce in the parameter dtype (LLM Foundry "PURE" mixed precision).
    grad_reduce_bytes: float = Field(default=4.0, gt=0)
    zero3_grad_reduce_bytes: float = Field(default=2.0, gt=0)
    # Adam: read fp32 param, grad, m, v; write param, m, v (7 x 4 B) and the bf16 copy (2 B).
    optimizer_bytes_per_param: float = Field(default=30.0, gt=0)
    # Gradient accumulation outside the GEMMs, bytes per parameter per micro-batch. Megatron
    # accumulates into fp32 main_grad inside the weight-gradient GEMM
    # (--gradient-accumulation-fusion): 0. DeepSpeed's pipeline engine with its bf16 optimizer
    # (the one built for BLOOM) calls update_hp_grads after every micro-batch's backward,
    # `hp.grad.add_(lp.grad.to(float32))`: read bf16 (2), write and read an fp32 copy (4 + 4),
    # read and write the fp32 gradient (4 + 4) = 18 B (a framework switch, not fitted).
    grad_accumulation_bytes_per_param: float = Field(default=0.0, ge=0)
    # FlashAttention's backward recomputes QK^T: 2.5x the forward FLOPs (Dao 2023 §3.1.2).
    attention_backward_ratio: float = Field(default=2.5, gt=0)
    # Framework switches (not fitted). Sequence parallel splits norms, residual adds and the
    # pipeline hand-off over TP (Megatron since 2022, DESIGN.md: on whenever tp > 1); older
    # Megatron-DeepSpeed runs (BLOOM) replicate them on every TP rank. TP communication
    # overlap (Transformer Engine userbuffers, `--tp-comm-overlap`) hides the SP all-gathers
    # and reduce-scatters behind the layer's GEMMs (NeMo communication_overlap.rst).
    sequence_parallel: bool = True
    # FlashAttention (every framework today); Megatron-DeepSpeed's 2022 attention (BLOOM) was
    # unfused: batched GEMMs around a fused softmax, which lose the tensor cores when the head
    # dimension is not 16-byte aligned (solver.cost.kernels.efficiency.estimate_attention_core_s).
    flash_attention: bool = True
    # Dropout on the attention probabilities (Megatron's --attention-dropout, 0.1 by default;
    # BLOOM's runs inherited it, tr11-176B-ml README). Read by unfused attention only, which
    # materialises the dropped probabilities and their mask (solver.cost.layers.layer_compute
    # UNFUSED_DROPOUT_BYTES); fused kernels drop inside the kernel (not costed).
    attention_dropout: bool = False
    # Attention kernels written for the GPU's own tensor-core instructions (FlashAttention-3 or
    # cuDNN's fused attention on Hopper). 2023-era kernels (FlashAttention-1/2, Triton) use
    # Ampere's mma.sync and reach at most GpuSpec.legacy_mma_fraction of a Hopper peak.
    native_attention_kernels: bool = True
    # FlashAttention in Triton (2022, HazyResearch's flash_attn_triton; LLM Foundry's
    # attn_impl "triton" until 2024): FlashAttention-1's rates rather than the tables'
    # (solver.cost.kernels.kernels_attention.triton_attention_rates). Read with flash_attention on.
    triton_attention: bool = False
    tp_comm_overlap: bool = False
    # How the pipeline schedule exposes its sends (solver.cost.comm.pipeline_sends): "batched"
    # (Megatron's 1F1B: two transfers per micro-batch and chunk), "overlapped" (Megatron's
    # interleaved schedule with overlap_p2p_comm: only the warm-up and cool-down sends) or
    # "sequential" (DeepSpeed's pipeline engine: blocking sends and receives one after the
    # other, four per micro-batch on a stage between two others).
    pipeline_sends: PipelineSends = "batched"
    # Whether DP collectives overlap compute: "always" (Megatron --overlap-grad-reduce /
    # --overlap-param-gather, FSDP's prefetch, DeepSpeed ZeRO's overlap_comm), "never", or
    # "without_pipeline" (DeepSpeed: its pipeline engine schedules them itself, the ReduceGrads
    # instruction after the last backward and ZeRO-1's parameter all-gather after the
    # optimizer step; pipe/engine.py "We schedule the all-reduces", schedule.py
    # TrainSchedule): where they do not overlap, nothing hides.
    dp_overlap: DpOverlap = "always"
    # ZeRO-1 reduce-scatters the gradients (Megatron's distributed optimizer); DeepSpeed's
    # pipeline engine all-reduces the whole gradient (_exec_reduce_grads ->
    # buffered_allreduce_fallback) before each rank updates its shard: twice the traffic.
    zero1_grad_all_reduce: bool = False
    # ZeRO 1-2 gather the updated parameters after the optimizer step; Megatron hides the
    # gather behind the next forward (--overlap-param-gather), DeepSpeed does it inside the
    # step (stage_1_and_2.py: all_gather_dp_groups after the update): exposed.
    params_gather_overlap: bool = True
    # ZeRO-0 (plain DDP) buckets its gradient all-reduce into the backward (torch DDP,
    # Megatron --overlap-grad-reduce); DeepSpeed's engine all-reduces after the whole backward
    # (engine.py backward -> allreduce_gradients at the accumulation boundary): exposed.
    zero0_grad_overlap: bool = True
    # ZeRO-2 in DeepSpeed reduces gradients after every micro-batch's backward, not once per
    # step (stage_1_and_2.py, reduce_ready_partitions_and_remove_grads: "if
    # self.partition_gradients or self.is_gradient_accumulation_boundary").
    zero2_reduce_every_micro_batch: bool = False
    # EP all-to-all overlap (Megatron-Core `--overlap-moe-expert-parallel-comm`, "EP A2A
    # communication overlap with computation in both 1F1B pipelining and non-pipelined
    # training", Megatron-Bridge 0.1.0 changelog; notes §4.5) with --delay-wgrad-compute: one
    # micro-batch's dispatch and combine run while another's layer computes, so only what
    # exceeds the compute beside each is exposed (solver.cost.comm.comm_ep), plus the SM share
    # of the hidden part.
    ep_comm_overlap: bool = False
    # SMs that overlapped NCCL / userbuffer kernels occupy: NeMo's TP-overlap default is 16
    # (communication_overlap.rst; notes §4.5), NCCL's channel count is of the same order.
    comm_sms: int = Field(default=16, gt=0)
    # ---- framework features: solver.cost.step.frameworks sets them per framework, with sources ----
    # The MoE token dispatcher (solver.cost.layers.layer_time._estimate_ep_s): "alltoall" sends each
    # token's k routed copies (NCCL all-to-all), "allgather" gathers every token of the EP group
    # and reduce-scatters the outputs, "deepep" / "hybridep" send a token once to each NVLink
    # domain that holds one of its experts and forward it inside the domain (DeepEP README,
    # "asymmetric-domain bandwidth forwarding"; Megatron moe/README.md "removes redundant
    # tokens during cross-node communication").
    moe_dispatcher: MoeDispatcher = "alltoall"
    # What `--recompute selective` recomputes: "attention_core" (Megatron,
    # --recompute-granularity selective: the attention core, free under FlashAttention, whose
    # backward recomputes it anyway) or "op_level" (torchtitan's per-op SAC: every op but the
    # saved ones, i.e. all element-wise ops, every second matmul and the grouped expert
    # GEMMs; solver.cost.layers.layer_time._estimate_selective_s).
    selective_recompute: SelectiveRecompute = "attention_core"
    # The modules Megatron's selective recompute re-runs (--recompute-modules; its default
    # ["core_attn"], transformer_config.py): memory in solver.cost.memory.activations, time in
    # solver.cost.layers.layer_time._estimate_selective_s. Read under attention_core only.
    recompute_modules: tuple[RecomputeModule, ...] = ("core_attn",)
    # Low-precision weight copies kept across micro-batches (a memory feature the profile
    # chooses; MemoryOptions.fp8_weight_copies says what each value keeps).
    fp8_weight_copies: Fp8WeightCopies = "transformer_engine"
    # Megatron --use-precision-aware-optimizer with --exp-avg-dtype / --exp-avg-sq-dtype /
    # --main-grads-dtype bf16 (arguments.py; TE FusedAdam keeps the moments in bf16): the
    # optimizer step streams 2 B less of each moment, read and written (30 - 8 = 22 B per
    # parameter), and the optimizer state is 4 B per parameter smaller
    # (FrameworkProfile.memory_options). Off in Megatron's defaults.
    precision_aware_optimizer: bool = False
    # Megatron --grad-reduce-in-bf16: the gradient buffer is in the parameters' dtype and DP
    # reduces it in bf16 (distributed_data_parallel_config.py grad_reduce_in_fp32 = False;
    # param_and_grad_buffer.py grad_dtype): 2 B per parameter replace grad_reduce_bytes and
    # zero3_grad_reduce_bytes, and the buffer halves (memory_options). Off by default.
    grad_reduce_in_bf16: bool = False
    # How many collectives carry a DP sync's bytes (solver.cost.step.data_parallel): each call pays
    # NCCL's latency for its group (solver.cost.comm.nccl_latency). None: one per FSDP unit, a
    # decoder layer plus the root unit with the embedding and head (PyTorch FSDP / FSDP2 as
    # LLM Foundry and torchtitan wrap each block); ZeRO-0 then all-reduces in torch DDP's
    # buckets of ddp_bucket_bytes (DistributedDataParallel bucket_cap_mb = 25 MiB). A number:
    # parameters per bucket, at least dp_bucket_params_per_rank x the DP group's ranks
    # (Megatron: max(40,000,000, 1,000,000 x dp_cp size), distributed_data_parallel.py;
    # DeepSpeed: reduce_bucket_size / allgather_bucket_size 5e8). ZeRO-3 gathers and
    # reduce-scatters each layer's parameters when the layer runs, in every framework.
    dp_bucket_params: float | None = Field(default=None, gt=0)
    dp_bucket_params_per_rank: float = Field(default=0.0, ge=0)
    ddp_bucket_bytes: float = Field(default=25.0 * 2**20, gt=0)
    # Megatron --fp8-param-gather (arguments.py, store_true): below bf16 the GEMM weights are
    # Transformer Engine quantised tensors, with no bf16 copy beside them (memory only,
    # MemoryOptions.fp8_params; the fp8 parameter all-gather's smaller traffic is not costed,
    # so the step time is an upper bound). Off by default; Megatron-Bridge's fp8 current-
    # scaling and MXFP8 mixed-precision recipes turn it on.
    fp8_param_gather: bool = False
    # Offload to the host (MemoryOptions.optimizer_offload / activation_offload say what
    # moves; solver.cost.step.offload what it costs). Off by default; the search turns them on where
    # they fit a plan faster than recompute.
    optimizer_offload: bool = False
    activation_offload: bool = False
    # torchao float8's FSDP all-gather in float8 (MemoryOptions.fp8_all_gather): the layers'
    # weights are gathered in 1 B (solver.cost.step.data_parallel).
    fp8_all_gather: bool = False
    # Context parallelism's ring attention (solver.cost.comm.ring_attention, which says what each
    # overlaps): "transformer_engine", Megatron-Core's default --cp-comm-type p2p (Transformer
    # Engine's AttnFuncWithCPAndKVP2P: each KV transfer behind one step), or "torch_allgather",
    # PyTorch's experimental context_parallel with its default all-gather rotater (torchtitan:
    # the gathered KV behind the first step only, eager fp32 merges and dKV).
    context_parallel_ring: ContextParallelRing = "transformer_engine"
    # Megatron --cpu-offloading-num-layers N: the first N decoder layers' activations go to
    # the host during the forward and come back for the backward (Transformer Engine's
    # get_cpu_offload_context; MemoryOptions.cpu_offloading_num_layers, solver.cost.step.offload
    # estimate_layer_offload_s). 0: off, Megatron's default (model_parallel_config.py).
    cpu_offloading_num_layers: int = Field(default=0, ge=0)
    # Weights, gradients and optimizer state below mixed precision (issue 43): pure bf16 and/or
    # 8-bit Adam moments (solver.cost.step.training_states: the bytes each keeps, the bytes its
    # optimizer step streams). "mixed", the framework's own, by default.
    training_states: TrainingStates = "mixed"
    # Pure bf16 keeps a bf16 master copy of the rank's partition beside the weights (DeepSpeed
    # bf16_master_weights_and_grads; solver.cost.step.training_states): a framework switch.
    bf16_master_copy: bool = False
    # Bytes the host's optimizer step streams through host memory per parameter
    # (solver.cost.step.offload.estimate_optimizer_offload_s): one fused pass that reads the fp32
    # parameter, gradient and both moments and writes the parameter and the moments, 7 x 4 B.
    # Megatron's CPU optimizer is torch.optim.AdamW(fused=True) (megatron/core/optimizer/
    # __init__.py), torch's fused CPU Adam kernel; DeepSpeed's DeepSpeedCPUAdam is one SIMD
    # pass as well.
    host_optimizer_bytes_per_param: float = Field(default=7 * 4.0, gt=0)
    # Whether the optimizer's device-to-host gradient copies run during the backward
    # (DeepSpeed ZeRO-Offload) rather than pipelined with the CPU step and the parameter copies
    # back (Megatron --overlap-cpu-optimizer-d2h-h2d).
    offload_grads_during_backward: bool = False
    # Element-wise ops fused into one kernel each (Transformer Engine / apex fused norms, RoPE,
    # SwiGLU; torch.compile) or run eagerly, one ATen kernel per op: the eager element-wise
    # traffic is `eager_elementwise_traffic` times the fused one. 2.0 [B]: per token, eager
    # RMSNorm (pow, mean, rsqrt-mul, weight-mul) moves 7h against 2h fused, SwiGLU (silu, mul)
    # 5F against 3F, complex RoPE (cast, mul, cast back) 3x, residual adds 1x; on Llama-3-8B's
    # element-wise budget (norms 4h, adds 6h, RoPE 2(q + kv), SwiGLU 3F) that is
    # 190,464 / 96,256 B = 1.98x.
    fused_elementwise: bool = True
    eager_elementwise_traffic: float = Field(default=2.0, ge=1.0)
    # A YaRN attention factor other than 1 (ModelSpec.rope_attention_factor) sends the RoPE to
    # eager ops: Megatron-Core's fused RoPE takes no mscale (rope_utils.apply_rotary_pos_emb
    # falls back to _apply_rotary_pos_emb_bshd; solver.cost.layers.rope_eager). Off: the framework's
    # RoPE costs what the model's would without the factor.
    scaled_rope_eager: bool = False
    # CUDA graphs (Megatron --cuda-graph-impl transformer_engine; docs/user-guide/features/
    # cuda_graph.md): a captured block replays from one graph launch (TE make_graphed_callables,
    # one TE_MODULE_OPS call). Dense layers capture attention and MLP (--cuda-graph-modules attn
    # mlp); dropless MoE layers only their static part, attention, pre-MLP norm, router, shared
    # experts and the dispatcher's preprocess (attn moe_router moe_preprocess; "moe ...
    # drop-and-pad only"), so dispatch, experts and combine stay eager. A full-iteration graph
    # (--cuda-graph-impl full_iteration) would remove the host's work altogether, but takes MoE
    # layers only with static expert shapes (token drop and pad, or the dev branch's paged
    # stash, --moe-paged-stash): not a dropless plan, and not modelled.
    cuda_graphs: bool = False
    # Megatron --moe-router-fusion (TE PR 1883; off by default, transformer_config.py, and not
    # asked for by `launch`): the router launches KernelLaunches.router_fused ops, not router.
    moe_router_fusion: bool = False
    # Megatron --moe-permute-fusion (TE's fused permute / unpermute kernels, TE >= 2.1; off by
    # default, transformer_config.py): the MoE layer's token permutation streams 2k + 2 token
    # widths a token, not 4k (solver.cost.layers.moe_eager.estimate_permuted_elements_per_token).
    moe_permute_fusion: bool = False
    # Per-tensor FP8 with current scaling (TE Float8CurrentScaling; Megatron --fp8-recipe
    # tensorwise, Megatron-Bridge's "fp8_cs"): each quantization computes its tensor's amax
    # first (solver.cost.layers.fp8_scaling). Off: delayed scaling, TE's default and what `launch`
    # asks for. Only the `fp8` precision reads it.
    fp8_current_scaling: bool = False
    # The experts pad each local expert's rows to the quantized GEMM's alignment with a copy of
    # their input and output, forward and backward (Megatron-Core TEGroupedMLP with fp8 or fp4:
    # TE Fp8Padding / Fp8Unpadding; solver.cost.layers.quantization_padding). Off: no such copies
    # (BF16 reads nothing of it; a run with --moe-router-padding-for-quantization turns it off).
    moe_quantization_padding: bool = False
    # CUDA_LAUNCH_BLOCKING=1 (a run's environment, not a framework's): every kernel launch
    # returns only when the kernel has run ("Disables asynchronous kernel launches", CUDA
    # Programming Guide, CUDA Environment Variables), so the host never runs ahead and each
    # pass costs its GPU work plus its host ops (solver.cost.layers.layer_time), not the larger.
    cuda_launch_blocking: bool = False
    # How the framework computes the loss (solver.spec.framework.LossImplementation): memory
    # only, what the last stage holds for the logits (MemoryOptions.loss_implementation,
    # solver.cost.memory.loss.estimate_logits_bytes). The step time is not changed by
    # it: the LM head's GEMMs do the same FLOPs in every implementation (Liger's fused linear
    # cross-entropy runs the head's two backward GEMMs chunk by chunk inside its forward,
    # fused_linear_cross_entropy_forward, and recomputes nothing), and the loss's streaming
    # time (layer_compute.estimate_head_compute_s) is not modelled per implementation.
    # "eager": Megatron's, DeepSpeed's and the generic profile's default; torchtitan's
    # without torch.compile ("compiled" with it); solver.cost.step.frameworks says why.
    loss_implementation: LossImplementation = "eager"
    # Host seconds per eager PyTorch op the framework issues (KernelLaunches counts them).
    # None: the cluster's CPU (ClusterSpec.host_op_us), X86_HOST_OP_S where its file gives none.
    host_op_s: float | None = Field(default=None, ge=0)
    launches: KernelLaunches = KernelLaunches()


def estimate_host_op_s(constants: TimeConstants, cluster: ClusterSpec) -> float:
    """Host seconds per eager op: TimeConstants.host_op_s where set, else the cluster's
    measured host_op_us, else X86_HOST_OP_S (GB200: 37.08 us; a DGX H100: 13.48 us)."""
    if constants.host_op_s is not None:
        return constants.host_op_s
    if cluster.host_op_us is not None:
        return cluster.host_op_us * 1e-6
    return X86_HOST_OP_S


def dp_syncs_per_step(constants: TimeConstants, zero: np.ndarray, num_micro: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """How many times per step the backward-side and the forward-side DP collectives run:
    ZeRO-3 every micro-batch (both); DeepSpeed's ZeRO-2 reduces gradients every micro-batch
    (TimeConstants.zero2_reduce_every_micro_batch); the rest once per step."""
    zero = np.asarray(zero)
    backward = (zero == 3) | ((zero == 2) & constants.zero2_reduce_every_micro_batch)
    return np.where(backward, num_micro, 1.0), np.where(zero == 3, num_micro, 1.0)


def dp_part_overlaps(constants: TimeConstants, zero: np.ndarray, pp: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Whether the backward-side and the forward-side DP collectives overlap compute: both as
    TimeConstants.dp_overlap says, ZeRO-0's all-reduce only if zero0_grad_overlap too, the
    ZeRO 1-2 parameter gather only if params_gather_overlap too."""
    overlap = dp_overlaps(constants, pp)
    zero = np.asarray(zero)
    gather = constants.params_gather_overlap | (zero == 3)
    gradients = constants.zero0_grad_overlap | (zero != 0)
    return overlap & gradients, overlap & gather


def dp_overlaps(constants: TimeConstants, pp: np.ndarray) -> np.ndarray:
    """Per candidate, whether its DP collectives overlap compute (TimeConstants.dp_overlap)."""
    pp = np.asarray(pp)
    if constants.dp_overlap == "without_pipeline":
        return pp == 1
    return np.full(pp.shape, constants.dp_overlap == "always")
