"""Per-GPU serving memory under vLLM, vectorised over candidate engines (tp, pp, dp arrays);
solver.serve.memory hands it a serving problem.

vLLM gives the KV cache whatever is left of `gpu_memory_utilization` x HBM once the weights,
the peak activations of its profiling run and the non-torch memory are placed
(vllm/v1/worker/gpu_worker.py determine_available_memory):

    kv_cache = util x HBM - weights - activations - (CUDA context + NCCL + CUDA graphs)

Weights per GPU (vLLM's layers): attention, dense MLP, shared experts, embedding and LM head
split over tp (KV projections replicated when tp > KV heads; MLA's down-projections are
replicated); routed experts split over tp x dp (whole experts per GPU with expert parallel,
tensor parallel flattened over DP without it, vllm/model_executor/layers/fused_moe/config.py
FusedMoEParallelConfig); the worst pipeline stage holds ceil(L / pp) layers. Linear layers take
the serving precision (fp8, or int4 weight-only); embeddings, LM head, norms and routers stay
bf16, as vLLM's quantization methods leave them.

KV cache per token per GPU of a stage: 2 (K and V) x layers x KV heads per GPU x head dim x
bytes, KV heads per GPU = max(kv_heads / tp, 1) (vLLM QKVParallelLinear: "tp_size >=
total_num_kv_heads" replicates); MLA caches the compressed latent (kv_lora_rank) and the rope
key (qk_rope_head_dim) once per layer, on every TP rank (not split by heads). With a block
pattern (solver.cost.layers.blocks.estimate_layer_cache_bytes) windowed layers keep at most their
window and Mamba-2 / DeltaNet layers a constant state per sequence, as vLLM's hybrid KV-cache
manager allocates them; the bytes per token are then those of a `context`-token sequence.

The three views of an engine's memory (issue 43; the views and what reports each are
solver.spec.plan.MEMORY_VIEWS, as for training plans: solver.cost.memory.views), split as vLLM
splits it (vllm/utils/mem_utils.py memory_profiling and MemorySnapshot.measure:
non_torch_memory = cuda_memory (mem_get_info) - torch.cuda.memory_reserved(); the worker's
determine_available_memory gives the KV cache the rest):

    allocated  torch.cuda.max_memory_allocated(): the weights, the KV cache (torch tensors:
               vllm/v1/worker/gpu_model_runner.py _allocate_kv_cache_tensors, one
               torch.zeros(size, dtype=torch.int8) per KV-cache tensor) and the
               activation peak of a max_num_batched_tokens batch (the profile run's
               torch_peak_increase, "PyTorch activation peak memory").
    reserved   torch.cuda.max_memory_reserved(): allocated plus the CUDA graphs' memory pool,
               which is torch's (vllm/compilation/cuda_graph.py CUDAGraphWrapper captures with
               torch.cuda.graph(pool=current_platform.get_global_graph_pool()) and keeps only
               weak references to the outputs, so the pool stays reserved, not allocated);
               inside the budget, as vLLM counts it since 0.21 ("CUDA graph memory profiling
               is enabled (default since v0.21.0)", gpu_worker.py's log line). No
               fragmentation is counted: vLLM empties the cache after profiling and allocates
               the KV cache in whole tensors.
    device     nvidia-smi: reserved plus what torch never sees: the CUDA context and NCCL's
               communicators ("non_torch_memory"); the total, what --gpu-memory-utilization
               bounds and what every fit is judged on.
Worked number (estimate_serving_memory's): Llama-3.1-8B, one H100, bf16, util 0.9: allocated
16.06 + 1.36 + 57.40 = 74.82 GB, reserved + 1 GiB of graphs = 75.90 GB, device + 1 GiB of
CUDA context = 76.97 GB (the budget); vLLM's profile log of Llama-3-8B on one H100 (vllm PR
#10511): 14.96 + 1.26 + 53.29 = 69.51 GiB = 74.64 GB allocated, 71.29 GiB = 76.55 GB requested.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.cost.layers.sparse_attention import estimate_indexer_cache_bytes_per_token
from solver.cost.serving.block_cache import (
    estimate_cache_bytes_per_token,
    estimate_mixer_params_per_gpu,
)
from solver.cost.serving.round import ACTIVATION_BYTES
from solver.cost.serving.step import attention_params_per_gpu
from solver.spec import ModelSpec
from solver.spec.plan import MEMORY_VIEWS

GIB = 2**30


@dataclass(frozen=True)
class StageWeights:
    """Bytes per GPU of the worst pipeline stage: what decode streams every step
    (`dense_bytes`: every non-expert weight of the stage's layers; `expert_bytes`: the routed
    experts, of which a step reads those its tokens pick), the LM head it reads on the last
    stage, and the embedding-or-head bytes the stage stores."""

    dense_bytes: np.ndarray
    expert_bytes: np.ndarray
    head_bytes: np.ndarray
    ends_bytes: np.ndarray
    layers: np.ndarray
    moe_layers: np.ndarray

    @property
    def total_bytes(self) -> np.ndarray:
        return self.dense_bytes + self.expert_bytes + self.ends_bytes


def estimate_stage_weights(model_spec: ModelSpec, weight_bytes_per_element: float, tp, pp, dp
                           ) -> StageWeights:
    """Weights per GPU on the worst stage (see the module docstring).

    Worked number: Llama-3.1-70B in bf16 at tp 8, pp 1: 80 layers x 0.856e9 / 8 parameters
    x 2 B = 17.1 GB of layers, plus embedding and LM head 2 x 128256 x 8192 / 8 x 2 B =
    0.53 GB: 17.64 GB per GPU (141.1 GB / 8). At tp = pp = dp = 1 the total is every
    parameter of the model at its precision (bf16: 2 x total_params)."""
    m = model_spec
    quant = weight_bytes_per_element
    tp, pp, dp = (np.asarray(x).astype(float) for x in (tp, pp, dp))
    layers = np.ceil(m.num_hidden_layers / pp)
    moe_layers = np.minimum(layers, m.num_moe_layers)
    dense_layers = layers - moe_layers
    attention = estimate_attention_params_per_gpu(m, tp)
    norms = m.norm_params_per_layer
    dense_linear = attention + m.dense_mlp_params_per_layer / tp
    latent = m.latent_projection_params_per_layer  # replicated over TP (vLLM ReplicatedLinear)
    moe_linear = attention + m.shared_expert_params_per_layer / tp + latent
    dense = (quant * (dense_layers * dense_linear + moe_layers * moe_linear)
             + 2.0 * (layers * norms + moe_layers * m.router_params_per_layer))
    if m.has_block_kinds:  # the average layer of the block pattern (cost.block_cache)
        linear = sum(estimate_mixer_params_per_gpu(m, mixer, tp, attention)
                     + {"dense": m.dense_mlp_params_per_layer,
                        "moe": m.shared_expert_params_per_layer}.get(mlp, 0) / tp
                     + (latent if mlp == "moe" else 0)
                     for mixer, mlp in zip(m.layer_mixers, m.layer_mlps))
        dense = (quant * layers * linear / m.num_hidden_layers
                 + 2.0 * (layers * norms + moe_layers * m.router_params_per_layer))
    experts = quant * moe_layers * m.num_experts * m.expert_params / (tp * dp)
    head_params = m.vocab_size * m.hidden_size  # read on the last stage even when tied
    ends = np.where(pp == 1, m.embedding_params + m.lm_head_params,
                    np.maximum(m.embedding_params, head_params)) / tp + m.final_norm_params
    return StageWeights(dense_bytes=dense, expert_bytes=experts,
                        head_bytes=2.0 * head_params / tp, ends_bytes=2.0 * ends,
                        layers=layers, moe_layers=moe_layers)


def estimate_attention_params_per_gpu(model_spec: ModelSpec, tp: np.ndarray) -> np.ndarray:
    """Attention parameters of one layer on one TP rank (solver.cost.serving.step, where the
    step time reads them too).

    MHA/GQA: Q and O split over tp, K and V keep max(kv_heads / tp, 1) heads per rank.
    MLA: the down-projections (q_a, kv_a with the rope key, their norms) are replicated, the
    up-projections and O split over tp. Llama-3.1-70B at tp 8: (2 x 8192 x 8192 / 8
    + 2 x 8192 x 1024 / 8) = 18.9M."""
    return attention_params_per_gpu(model_spec, np.asarray(tp, dtype=float))


def estimate_kv_bytes_per_token(model_spec: ModelSpec, context: int,
                                kv_bytes_per_element: float, tp, pp) -> np.ndarray:
    """KV-cache bytes one token takes on one GPU of the worst stage (ceil(L / pp) layers).

    Worked numbers (bf16): Llama-3.1-8B at tp 1: 2 x 32 x 8 x 128 x 2 B = 131,072 B (128 KiB);
    Llama-3.1-70B at tp 8: 2 x 80 x 1 x 128 x 2 B = 40,960 B; DeepSeek-V3 (MLA) at any tp:
    61 x (512 + 64) x 2 B = 70,272 B; DeepSeek-V3.2 adds its indexer keys
    (solver.cost.layers.sparse_attention): 61 x (1,152 + 132) = 78,324 B."""
    m = model_spec
    layers = np.ceil(m.num_hidden_layers / np.asarray(pp, dtype=float))
    element = kv_bytes_per_element
    if m.has_block_kinds:  # windows cap, Mamba / DeltaNet keep a constant state (cost.layers.blocks)
        return layers * estimate_cache_bytes_per_token(m, context, tp, element)
    if m.is_mla:
        per_layer = (m.kv_lora_rank + m.qk_rope_head_dim) * element  # type: ignore[operator]
        per_layer += estimate_indexer_cache_bytes_per_token(m)  # DSA's indexer keys
        return layers * per_layer * np.ones_like(np.asarray(tp, dtype=float))
    kv_per_rank = np.maximum(m.kv_heads / np.asarray(tp, dtype=float), 1.0)
    return layers * kv_per_rank * (m.qk_head_dim + m.value_head_dim) * element


@dataclass(frozen=True)
class ServeMemory:
    """Bytes per GPU (worst stage) and what the KV cache holds, one entry per candidate;
    `graph_bytes` is the part of `other_bytes` in torch's CUDA-graph pool (the rest, the CUDA
    context and NCCL, torch never sees)."""

    budget_bytes: np.ndarray
    weights_bytes: np.ndarray
    activations_bytes: np.ndarray
    other_bytes: np.ndarray
    kv_cache_bytes: np.ndarray
    kv_bytes_per_token: np.ndarray
    kv_tokens: np.ndarray
    max_sequences: np.ndarray
    graph_bytes: np.ndarray

    @property
    def fits(self) -> np.ndarray:
        """vLLM starts only if one --max-model-len sequence fits its KV cache."""
        return self.max_sequences >= 1


def estimate_activation_bytes(model_spec: ModelSpec, tokens: int, sequences: int,
                              logits_bytes: float, tp) -> np.ndarray:
    """Peak activations of vLLM's profiling run: max_num_batched_tokens T through the widest
    layer, bf16 (the gated MLP's gate-up output 2F/tp plus its activation F/tp plus two
    residual-stream copies; a MoE layer's fused-experts caches T x k x (3 F_e + h) / tp), and
    the sampler's fp32 logits of max_num_seqs sequences on the last stage.
    Llama-3.1-70B on H100 at tp 8 (T 8192, 1024 sequences): 8192 x (3 x 28672 / 8 + 2 x 8192)
    x 2 B + 1024 x 128256 x 4 B = 0.445 + 0.525 = 0.97 GB."""
    m = model_spec
    tp = np.asarray(tp).astype(float)
    width = np.zeros(len(tp))
    if m.num_dense_layers:
        width = 3.0 * m.intermediate_size / tp + 2.0 * m.hidden_size
    if m.is_moe:
        experts = (m.experts_per_token * (3.0 * m.moe_intermediate_size + m.moe_token_width)
                   / tp)
        width = np.maximum(width, experts)
    logits = sequences * m.vocab_size * logits_bytes
    return tokens * width * ACTIVATION_BYTES + logits


@dataclass(frozen=True)
class ServeReserves:
    """Memory vLLM sets aside besides weights, activations and KV cache (GiB): the CUDA context,
    its captured CUDA graphs (torch's graph pool: reserved, not allocated) and,
    for an engine of more than one GPU, NCCL's communicators (solver.serve.job.ServeConstants
    gives the sources)."""

    cuda_context_gib: float
    cuda_graph_gib: float
    nccl_gib: float


def estimate_serving_memory(model_spec: ModelSpec, budget_bytes: float, context: int,
                            weight_bytes_per_element: float, kv_bytes_per_element: float,
                            profile_tokens: int, profile_sequences: int, logits_bytes: float,
                            reserves: ServeReserves, tp, pp, dp) -> ServeMemory:
    """The per-GPU budget (vLLM's share of the usable HBM), its items and the KV capacity of
    each engine; the activations are those of vLLM's profiling run at `profile_tokens` and
    `profile_sequences`.

    Worked number: Llama-3.1-8B on one H100 (79.65 GiB), bf16, util 0.9: budget 76.97 GB;
    weights 16.06 GB; activations 8192 x (3 x 14336 + 2 x 4096) x 2 + 1024 x 128256 x 4 =
    0.839 + 0.525 = 1.36 GB; context + graphs 2 GiB = 2.15 GB; KV cache 57.40 GB / 131,072 B
    = 437,919 tokens: 53 sequences of 8,192, 3 of 131,072."""
    tp, pp, dp = (np.atleast_1d(np.asarray(x)) for x in (tp, pp, dp))
    weights = estimate_stage_weights(model_spec, weight_bytes_per_element, tp, pp, dp
                                     ).total_bytes
    activations = estimate_activation_bytes(model_spec, profile_tokens, profile_sequences,
                                            logits_bytes, tp)
    multi_gpu = (tp * pp > 1) | (model_spec.is_moe & (dp > 1))
    other = (reserves.cuda_context_gib + reserves.cuda_graph_gib
             + np.where(multi_gpu, reserves.nccl_gib, 0.0)) * GIB
    graphs = np.full(len(tp), reserves.cuda_graph_gib * GIB)
    budget = np.full(len(tp), float(budget_bytes))
    kv_cache = np.maximum(budget - weights - activations - other, 0.0)
    per_token = estimate_kv_bytes_per_token(model_spec, context, kv_bytes_per_element, tp, pp)
    kv_tokens = np.floor(kv_cache / per_token)
    return ServeMemory(budget_bytes=budget, weights_bytes=weights,
                       activations_bytes=activations, other_bytes=other,
                       kv_cache_bytes=kv_cache, kv_bytes_per_token=per_token,
                       kv_tokens=kv_tokens, max_sequences=np.floor(kv_tokens / context),
                       graph_bytes=graphs)


def estimate_serving_views(memory: ServeMemory) -> dict[str, np.ndarray]:
    """Bytes per GPU in each view (MEMORY_VIEWS) of each engine (see the module docstring):

        allocated = weights + KV cache + activations
        reserved  = allocated + CUDA-graph pool
        device    = reserved + CUDA context + NCCL = weights + KV + activations + other
    device is the plan's total. Worked number in the module docstring."""
    allocated = memory.weights_bytes + memory.kv_cache_bytes + memory.activations_bytes
    reserved = allocated + memory.graph_bytes
    device = allocated + memory.other_bytes
    views = {"allocated": allocated, "reserved": reserved, "device": device}
    return {view: views[view] for view in MEMORY_VIEWS}


def estimate_min_tp(weight_bytes: float, usable_bytes_per_gpu: float) -> int:
    """The smallest power-of-two TP whose weight shard fits `usable_bytes_per_gpu` (the
    seed's min_tp). Seed 002 (24 GB card, 6 GB kept for KV and activations, GiB units):
    7.6B -> 14.2 GiB: 1; 70B -> 130.4 GiB: 8; 405B -> 754.4 GiB: 64."""
    if usable_bytes_per_gpu <= 0:
        raise ValueError("usable_bytes_per_gpu must be positive")
    return 2 ** max(0, math.ceil(math.log2(weight_bytes / usable_bytes_per_gpu)))
