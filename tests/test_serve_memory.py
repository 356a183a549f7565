"""Serving memory checked by hand: KV bytes per token (GQA, KV heads replicated when tp > KV
heads, MLA's compressed cache) and the KV capacity in tokens and in sequences of 8K and 128K
for Llama-3.1-8B, Llama-3.1-70B, DeepSeek-V3 and Qwen2.5-72B. Every number below is written out
from the models' config.json values and vLLM's accounting (solver.serve.memory):

    KV cache = 0.9 x HBM - weights - activations - (CUDA context 1 GiB + CUDA graphs 1 GiB
               + NCCL 0.4 GiB when the engine has more than one GPU)
    activations = max_num_batched_tokens x widest layer x 2 B + max_num_seqs x vocab x 4 B
                  (8,192 tokens and 1,024 sequences on H100 / H200)
"""

from __future__ import annotations

import pytest

from solver.catalog import load_cluster_spec, load_model_spec
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.serve.memory import estimate_kv_bytes_per_token, estimate_serving_memory

GIB = 2**30
H100 = 0.9 * 79.65 * GIB   # 76,971,182,653 B: nvidia-smi's 81,559 MiB x 0.9
H200 = 0.9 * 140.40 * GIB  # 135,678,016,881 B
LOGITS_H100 = 1024 * 4     # x vocab: the sampler's fp32 logits of 1,024 sequences
OTHER_ONE_GPU = 2 * GIB
OTHER_MULTI_GPU = 2.4 * GIB


def memory(model: str, cluster: str, tp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
           precision: str = "bf16", kv_cache_dtype: str = "auto"):
    problem = ServeProblem(
        model_spec=load_model_spec(model), cluster=load_cluster_spec(cluster),
        num_gpus=tp * pp * dp,
        job=ServeJob(context=8192, input_len=2048, output_len=512, precision=precision,
                     kv_cache_dtype=kv_cache_dtype))
    candidates = ServeCandidates(tp=tp, pp=pp, dp=dp, ep=ep, replicas=1)
    return problem, estimate_serving_memory(problem, candidates)


def check_capacity(result, weights: float, activations: float, other: float,
                   per_token: float, budget: float, at_8k: int, at_128k: int) -> None:
    kv_cache = budget - weights - activations - other
    assert float(result.weights_bytes[0]) == pytest.approx(weights, rel=1e-12)
    assert float(result.activations_bytes[0]) == pytest.approx(activations, rel=1e-12)
    assert float(result.kv_bytes_per_token[0]) == per_token
    tokens = int(kv_cache // per_token)
    assert int(result.kv_tokens[0]) == tokens
    assert (tokens // 8192, tokens // 131072) == (at_8k, at_128k)


def test_llama31_8b_on_one_h100() -> None:
    """Llama-3.1-8B, bf16, one H100 (tp 1):
    weights 8,030,261,248 x 2 = 16,060,522,496 B;
    activations 8192 x (3 x 14336 + 2 x 4096) x 2 + 1024 x 128256 x 4
                = 838,860,800 + 525,336,576 = 1,364,197,376 B;
    other 2 GiB (one GPU: no NCCL);
    KV cache 76,971,182,653 - 16,060,522,496 - 1,364,197,376 - 2,147,483,648
             = 57,398,979,133 B;
    per token 2 (K, V) x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B (128 KiB);
    57,398,979,133 / 131,072 = 437,919 tokens: 53 sequences of 8K (1 GiB each), 3 of 128K."""
    _, result = memory("llama3.1-8b", "dgx-h100")
    check_capacity(result, weights=16_060_522_496, activations=1_364_197_376,
                   other=OTHER_ONE_GPU, per_token=131_072, budget=H100, at_8k=53, at_128k=3)
    assert int(result.kv_tokens[0]) == 437_919


def test_llama31_70b_on_eight_h100_at_tp8() -> None:
    """Llama-3.1-70B, bf16, tp 8 on a DGX H100:
    per layer per GPU: Q and O 2 x 8192 x 8192 / 8 = 16,777,216; K and V one KV head each
    2 x 8192 x 128 = 2,097,152; MLP 3 x 8192 x 28672 / 8 = 88,080,384; 2 norms 16,384
    -> 106,971,136 x 80 layers = 8,557,690,880; embedding and LM head 2 x 128256 x 8192 / 8
    = 262,668,288; final norm 8,192 -> 8,820,367,360 parameters = 17,640,734,720 B;
    activations 8192 x (3 x 28672 / 8 + 2 x 8192) x 2 + 1024 x 128256 x 4 = 969,932,800 B;
    other 2.4 GiB; KV cache 55,783,534,756 B;
    per token 2 x 80 x (8 / 8 = 1) x 128 x 2 = 40,960 B -> 1,361,902 tokens: 166 sequences
    of 8K, 10 of 128K."""
    _, result = memory("llama3.1-70b", "dgx-h100", tp=8)
    weights = 2 * (80 * (2 * 8192 * 8192 // 8 + 2 * 8192 * 128 + 3 * 8192 * 28672 // 8
                         + 2 * 8192) + 2 * 128256 * 8192 // 8 + 8192)
    assert weights == 17_640_734_720
    activations = 8192 * (3 * 28672 // 8 + 2 * 8192) * 2 + LOGITS_H100 * 128256
    check_capacity(result, weights, activations, OTHER_MULTI_GPU, 40_960, H100, 166, 10)
    assert int(result.kv_tokens[0]) == 1_361_902


def test_deepseek_v3_mla_on_eight_h200_with_expert_parallel() -> None:
    """DeepSeek-V3 (MLA), fp8 weights, 8 H200 as DP 8 x EP 8 (tp 1: every GPU holds all the
    attention, an eighth of the experts):
    attention per layer: q_a 7168 x 1536 + q_b 1536 x 128 x 192 + kv_a 7168 x 576
    + kv_b 512 x 128 x 256 + o 128 x 128 x 7168 = 187,105,280 (+ norms 1,536 + 512);
    dense MLP 3 x 7168 x 18432 = 396,361,728; expert 3 x 7168 x 2048 = 44,040,192;
    fp8 (1 B): 3 x (attention + dense MLP) + 58 x (attention + shared expert)
               + 58 x 256 x expert / 8 = 96,895,559,680 B;
    bf16 (2 B): 61 x 2 x 7168 norms + 58 x 256 x 7169 routers + 2 x 129280 x 7168
                embedding and head + 7168 = 1,960,685,056 -> 3,921,370,112 B;
    weights 100,816,929,792 B; activations 8192 x 8 x (3 x 2048 + 7168) x 2
    + 1024 x 129280 x 4 = 2,274,361,344 B; other 2.4 GiB; KV cache 30,009,745,367 B;
    per token (MLA latent 512 + rope key 64) x 61 layers x 2 B = 70,272 B, on every GPU
    whatever the tp -> 427,051 tokens: 52 sequences of 8K, 3 of 128K."""
    _, result = memory("deepseek-v3", "dgx-h200", dp=8, ep=8, precision="fp8")
    attention = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512
                 + 512 * 128 * 256 + 128 * 128 * 7168)
    expert = 3 * 7168 * 2048
    fp8 = 3 * (attention + 3 * 7168 * 18432) + 58 * (attention + expert) + 58 * 256 * expert // 8
    bf16 = 61 * 2 * 7168 + 58 * 256 * 7169 + 2 * 129280 * 7168 + 7168
    assert (fp8, 2 * bf16) == (96_895_559_680, 3_921_370_112)
    activations = 8192 * 8 * (3 * 2048 + 7168) * 2 + LOGITS_H100 * 129280
    check_capacity(result, fp8 + 2 * bf16, activations, OTHER_MULTI_GPU, 61 * 576 * 2, H200,
                   52, 3)
    assert int(result.kv_tokens[0]) == 427_051


def test_qwen25_72b_gqa_at_tp8() -> None:
    """Qwen2.5-72B (GQA 64 / 8 heads, q/k/v biases), bf16, tp 8 on a DGX H100:
    per layer per GPU: attention (8192 x (8192 + 2 x 1024) + 8192 x 8192 + 8192 + 2 x 1024)
    / 8 = 18,875,648; MLP 3 x 8192 x 29568 / 8 = 90,832,896; norms 16,384 -> x 80 =
    8,777,994,240; embedding and head 2 x 152064 x 8192 / 8 = 311,427,072; final norm 8,192
    -> 9,089,429,504 parameters = 18,178,859,008 B; activations 8192 x (3 x 29568 / 8
    + 2 x 8192) x 2 + 1024 x 152064 x 4 = 1,072,955,392 B; per token 40,960 B as Llama 70B
    -> 164 sequences of 8K, 10 of 128K."""
    _, result = memory("qwen2.5-72b", "dgx-h100", tp=8)
    attention = (8192 * (8192 + 2 * 1024) + 8192 * 8192 + 8192 + 2 * 1024) // 8
    weights = 2 * (80 * (attention + 3 * 8192 * 29568 // 8 + 2 * 8192)
                   + 2 * 152064 * 8192 // 8 + 8192)
    activations = 8192 * (3 * 29568 // 8 + 2 * 8192) * 2 + LOGITS_H100 * 152064
    assert weights == 18_178_859_008
    check_capacity(result, weights, activations, OTHER_MULTI_GPU, 40_960, H100, 164, 10)


def test_kv_heads_are_replicated_when_tp_exceeds_them() -> None:
    """Qwen3-30B-A3B has 4 KV heads: at tp 8 vLLM keeps one KV head per GPU (each replicated
    on 2 GPUs), so a token takes 2 x 48 x 1 x 128 x 2 = 24,576 B per GPU, not half of that;
    at tp 2: 2 x 48 x 2 x 128 x 2 = 49,152 B. An fp8 KV cache halves both."""
    problem, _ = memory("qwen3-30b-a3b", "dgx-h100", tp=8)
    per_token = estimate_kv_bytes_per_token(problem, [1, 2, 4, 8], [1, 1, 1, 1])
    assert per_token.tolist() == [98_304, 49_152, 24_576, 24_576]
    fp8, _ = memory("qwen3-30b-a3b", "dgx-h100", tp=8, kv_cache_dtype="fp8")
    assert estimate_kv_bytes_per_token(fp8, [2, 8], [1, 1]).tolist() == [24_576, 12_288]


def test_mla_cache_does_not_shrink_with_tp_and_pp_splits_layers() -> None:
    """MLA caches one 576-wide latent per layer on every TP rank: 70,272 B at any tp; pp 2
    puts ceil(61 / 2) = 31 layers on the worst stage: 31 x 576 x 2 = 35,712 B."""
    problem, _ = memory("deepseek-v3", "dgx-h200", tp=8, precision="fp8")
    per_token = estimate_kv_bytes_per_token(problem, [1, 8, 8], [1, 1, 2])
    assert per_token.tolist() == [70_272, 70_272, 35_712]


def test_fp8_and_int4_weights() -> None:
    """Llama-3.1-70B at tp 8: the linear layers take 1 B (fp8) or 0.5 + 2.5 / 128 B (int4,
    AWQ / GPTQ groups of 128 with an fp16 scale and a 4-bit zero point); embedding, LM head
    and norms stay bf16: 8,557,690,880 - 80 x 16,384 = 8,556,380,160 linear parameters,
    264,988,672 bf16 ones per GPU."""
    linear, other = 8_556_380_160, 80 * 16_384 + 262_668_288 + 8192
    for precision, per_weight in (("bf16", 2.0), ("fp8", 1.0), ("int4", 0.5 + 2.5 / 128)):
        _, result = memory("llama3.1-70b", "dgx-h100", tp=8, precision=precision)
        assert float(result.weights_bytes[0]) == pytest.approx(linear * per_weight + 2 * other,
                                                               rel=1e-12)
