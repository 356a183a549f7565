"""Host op counts per framework layer (TimeConstants.launches, solver.cost.layers.host_time): what
each framework's layer code issues, one set per framework and mode; solver.cost.step.frameworks
puts them in the profiles. The counts are read off the frameworks' code [B: counted from the
module structure], save Megatron's router, counted in NVIDIA's DeepSeek-V3 GB200 profile."""

from __future__ import annotations

from solver.cost.layers.time_constants import KernelLaunches

# Megatron-Core with Transformer Engine: KernelLaunches' defaults, which say what each count
# holds (TE modules TE_MODULE_OPS ops each; the router's from NVIDIA's DeepSeek-V3 GB200 guide).
MEGATRON_LAUNCHES = KernelLaunches()
# torchtitan without torch.compile (its default: config Compile.enable = False; the llama3_8b
# and qwen3 train configs keep it off), torchtitan/models/llama3/model.py, deepseek_v3 and
# moe.py; every op an eager ATen op:
#   attention 20  RMSNorm run as ATen ops (5), wq, wk, wv (3), complex RoPE on q and k (cast,
#                 complex multiply, cast back: 6), transposes to SDPA's layout (2), SDPA, the
#                 output transpose copy, wo, residual add
#   mla_attention 35  RMSNorm (5), wq_a, q_norm (5), wq_b, RoPE on q (3), wkv_a, kv_norm (5),
#                 RoPE on k (3), wkv_b, two concatenations, transposes (2), SDPA, the output
#                 copy, wo, residual add [B]
#   mlp 11        RMSNorm (5), w1, w3, silu, mul, w2, residual add
#   router 10     RMSNorm (5), gate mm, score function, top-k, histc of counts, score gather
#   shared_experts 5  w1, w3, silu, mul, w2
#   preprocess 2  all-to-all of the counts, their D2H .tolist() (the sync)
#   dispatch 9    token all_to_all_single, permute indices, gather; unpermute,
#                 all_to_all_single, score multiply, scatter-add, shared add, residual add
#   experts 5     torch._grouped_mm for w1 and w3, silu, mul, grouped_mm for w2: one kernel
#                 for all local experts, none per expert (torchao's float8 and MX grouped GEMMs
#                 quantize the whole token tensor: no quantize per expert either); no fused
#                 router.
TORCHTITAN_EAGER_LAUNCHES = KernelLaunches(
    attention=20.0, mla_attention=35.0, mlp=11.0, router=10.0, router_fused=None,
    shared_experts=5.0, preprocess=2.0, dispatch=9.0, experts=5.0, per_local_expert=0.0,
    quantized_splits_per_local_expert=0.0)
# torchtitan with torch.compile: Inductor fuses each element-wise chain into one kernel, the
# norms into their neighbours; the GEMMs stay separate (wq, wk, wv; w1, w3; MLA's five
# projections) [B].
TORCHTITAN_COMPILED_LAUNCHES = KernelLaunches(
    attention=9.0, mla_attention=15.0, mlp=6.0, router=5.0, router_fused=None,
    shared_experts=4.0, preprocess=2.0, dispatch=9.0, experts=4.0, per_local_expert=0.0,
    quantized_splits_per_local_expert=0.0)
# Megatron-DeepSpeed (megatron/model/transformer.py ParallelTransformerLayer: apex fused layer
# norm, fused bias-GeLU, fused bias-dropout-add; plain torch modules, no TE) and DeepSpeed-MoE
# (deepspeed/moe/sharded_moe.py TopKGate + MOELayer, moe/experts.py Experts):
#   attention 8   layer norm, QKV GEMM, the split copy, RoPE on q and k (2), FlashAttention,
#                 output projection, bias-dropout-add; mla_attention 16 as Megatron's plain
#                 ops (9) and its seven modules one op each [B: no MLA in Megatron-DeepSpeed]
#   mlp 5         layer norm, fc1, fused bias-GeLU, fc2, bias-dropout-add
#   router 14     layer norm, gate GEMM, softmax, top-k, one-hot masks (2), capacity cumsum and
#                 locations (3), aux loss (3), combine weights (2); the expert counts' copy to
#                 the host (exp_counts .to('cpu')) is the sync; no fused router
#   shared_experts 3  fc1, activation, fc2 (plain modules)
#   preprocess 0  (counted in the router)
#   dispatch 8    dispatch einsum, all-to-all, reshape copy; all-to-all, reshape, combine
#                 einsum, residual add, one more copy
#   experts 1 + 4 per local expert: Experts.forward loops over its local experts in Python
#                 (chunk, fc1, GeLU, fc2), then concatenates; FP8 through TE wraps each
#                 expert's Linear, not a grouped split quantize (none counted).
DEEPSPEED_LAUNCHES = KernelLaunches(
    attention=8.0, mla_attention=16.0, mlp=5.0, router=14.0, router_fused=None,
    shared_experts=3.0, preprocess=0.0, dispatch=8.0, experts=1.0, per_local_expert=4.0,
    quantized_splits_per_local_expert=0.0)
