"""Hugging Face config.json import (solver.catalog.hf): real configs of the 14 supported
`model_type`s count the parameters their makers published; bad files give one InputError line
naming the file and the key; no input raises anything else.

A published figure is only as precise as its digits (as in test_zoo.py): a computed count must
lie within 1% of it or within one unit of its last digit, whichever is wider; the second only
matters for two-digit figures such as "37B" or "3.3B". Where the exact count is published
(safetensors metadata, papers) it is pinned exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.hf import SUPPORTED_MODEL_TYPES, model_spec_from_hf_config
from solver.catalog.zoo import list_zoo_names, load_model_spec
from solver.cli import cli
from solver.errors import InputError
from solver.spec import ModelSpec
from published_counts import Published, assert_matches_published

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "hf_configs"


PUBLISHED: dict[str, Published] = {
    "llama3.1-8b": Published(
        "8.03B", None,
        "https://huggingface.co/meta-llama/Llama-3.1-8B model card; "
        "model.safetensors.index.json total_size 16,060,522,496 bytes bf16",
        exact_total=16_060_522_496 // 2,
    ),
    "mistral-7b-v0.1": Published(
        "7.24B", None,
        "https://huggingface.co/mistralai/Mistral-7B-v0.1 "
        "model.safetensors.index.json total_size 14,483,464,192 bytes bf16",
        exact_total=14_483_464_192 // 2,
    ),
    "mixtral-8x7b-v0.1": Published(
        "46.7B", "12.9B",
        "https://mistral.ai/news/mixtral-of-experts; https://huggingface.co/mistralai/"
        "Mixtral-8x7B-v0.1 model.safetensors.index.json total_size 93,405,585,408 bytes bf16",
        exact_total=93_405_585_408 // 2,
    ),
    "qwen2.5-7b": Published(
        "7.61B", None,
        "https://huggingface.co/Qwen/Qwen2.5-7B model card; "
        "model.safetensors.index.json total_size 15,231,233,024 bytes bf16",
        exact_total=15_231_233_024 // 2,
    ),
    "qwen1.5-moe-a2.7b": Published(
        "14.3B", "2.7B",
        "https://qwenlm.github.io/blog/qwen-moe/ (14.3B total, 2.7B activated); "
        "https://huggingface.co/Qwen/Qwen1.5-MoE-A2.7B safetensors count 14,315,784,192",
        exact_total=14_315_784_192,
    ),
    "qwen3-8b": Published(
        "8.2B", None,
        "https://huggingface.co/Qwen/Qwen3-8B model card; "
        "model.safetensors.index.json total_size 16,381,470,720 bytes bf16",
        exact_total=16_381_470_720 // 2,
    ),
    "qwen3-30b-a3b": Published(
        # Active computes to 3.353B: the card truncates to "3.3B" (1.6% off, inside one unit).
        "30.5B", "3.3B",
        "https://huggingface.co/Qwen/Qwen3-30B-A3B model card; "
        "model.safetensors.index.json total_size 61,064,245,248 bytes bf16",
        exact_total=61_064_245_248 // 2,
    ),
    "deepseek-v2-lite": Published(
        # Active without the embedding computes to 2.451B (with it, 2.66B): "2.4B" is two
        # digits.
        "15.7B", "2.4B",
        "arXiv:2405.04434 (DeepSeek-V2), Appendix B; https://huggingface.co/deepseek-ai/"
        "DeepSeek-V2-Lite safetensors count 15,706,484,224",
        exact_total=15_706_484_224,
        active_without_embedding=True,
    ),
    "deepseek-v3": Published(
        # Active without the embedding computes to 36.63B (with it 37.55B, which would have been
        # published as 38B); the 14B MTP module is counted apart.
        "671B", "37B",
        "https://huggingface.co/deepseek-ai/DeepSeek-V3 model card; arXiv:2412.19437",
        active_without_embedding=True,
    ),
    "gemma-2-9b": Published(
        "9,241,705,984", None,
        "arXiv:2408.00118 (Gemma 2), Table 2: 917,504,000 embedding + 8,324,201,984 "
        "non-embedding",
        exact_total=9_241_705_984,
    ),
    "gpt2": Published(
        "124,439,808", None,
        "https://huggingface.co/openai-community/gpt2 (124M; sum of GPT2LMHeadModel "
        "parameters with the tied head counted once)",
        exact_total=124_439_808,
    ),
    "pythia-6.9b": Published(
        "6,857,302,016", None,
        "https://github.com/EleutherAI/pythia README, Models table (6,857,302,016 total, "
        "6,444,163,072 non-embedding)",
        exact_total=6_857_302_016,
    ),
    "falcon-7b": Published(
        # Tied as HF builds it: 6.92B; the checkpoint also stores the head (see below).
        "7B", None, "https://huggingface.co/tiiuae/falcon-7b model card",
    ),
    "falcon-180b": Published(
        "180B", None, "https://huggingface.co/tiiuae/falcon-180B model card",
    ),
    "gpt-oss-20b": Published(
        "20.91B", "3.61B",
        "arXiv:2508.10925 (gpt-oss-120b & gpt-oss-20b model card), Table 1",
        active_without_embedding=True,
    ),
    # Block patterns (solver.spec.blocks): hybrid Mamba, linear attention, windows, MTP.
    "phi-3-mini-4k": Published(
        "3.8B", None, "arXiv:2404.14219 (Phi-3 report) abstract: phi-3-mini, 3.8 billion "
        "parameters; https://huggingface.co/microsoft/Phi-3-mini-4k-instruct config.json",
    ),
    "olmoe-1b-7b": Published(
        "7B", "1B", "arXiv:2409.02060 (OLMoE) abstract: 7 billion parameters, 1B per input "
        "token; https://huggingface.co/allenai/OLMoE-1B-7B-0924 config.json",
    ),
    "nemotron-h-8b": Published(
        "8B", None, "https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K model card "
        "(config.json transcribed from Megatron-Bridge's NemotronH bridge test fixture)",
    ),
    "nemotron-h-56b": Published(
        "56B", None, "https://huggingface.co/nvidia/Nemotron-H-56B-Base-8K model card; "
        "shapes from Megatron-Bridge NemotronHModel56BProvider (hybrid_override_pattern, 118 "
        "layers)",
    ),
    "nemotron-h-47b": Published(
        "47B", None, "https://huggingface.co/nvidia/Nemotron-H-47B-Base-8K model card; "
        "shapes from Megatron-Bridge NemotronHModel47BProvider (98 layers)",
    ),
    "nemotron-nano-9b-v2": Published(
        "9B", None, "https://huggingface.co/nvidia/NVIDIA-Nemotron-Nano-9B-v2 model card; "
        "shapes from Megatron-Bridge NemotronNano9Bv2Provider (56 layers)",
    ),
    "nemotron-3-nano-30b-a3b": Published(
        "31.6B", "3.2B",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 model card "
        "(31.6B total, about 3.2B active without the embeddings)",
        active_without_embedding=True,
    ),
    "nemotron-3-super-120b-a12b": Published(
        "120B", "12B",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 model card "
        "(120B total, 12B active); config.json as quoted by TensorRT-LLM's kSuperConfig and "
        "Megatron-Bridge's NemotronHBridge tests",
        active_without_embedding=True,
    ),
    "nemotron-3-ultra-550b-a55b": Published(
        "550B", "55B",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16 model card "
        "(550B total, 55B active); the layer pattern as in Megatron-LM's Ultra pretraining "
        "script (--hybrid-layer-pattern, 48 M, 48 E, 12 *)",
        active_without_embedding=True,
    ),
    "qwen3-next-80b-a3b": Published(
        "80B", "3B", "https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct model card "
        "(80B total, 3B activated; Qwen truncates)",
        active_without_embedding=True,
    ),
    "gemma-3-27b": Published(
        "27.016B", None,
        "arXiv:2503.19786 (Gemma 3), Table 1: 1,416M embedding + 25,600M non-embedding "
        "= 27,016M parameters of the language model (the 417M vision encoder is not planned)",
    ),
    "gemma-3-1b": Published(
        "1.000B", None,
        "arXiv:2503.19786 (Gemma 3), Table 1: 302M embedding + 698M non-embedding = 1,000M; "
        "https://huggingface.co/google/gemma-3-1b-pt config.json",
    ),
    "llama-4-maverick-17b-128e-text": Published(
        "400B", "17B",
        "the text_config of https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E "
        "config.json as a llama4_text config (model card: 17B active, 400B total)",
    ),
    "llama-4-maverick-17b-128e": Published(
        "400B", "17B",
        "https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E model card "
        "(17B active, 400B total)",
    ),
    "glm-4.5": Published(
        "355B", "32B", "https://huggingface.co/zai-org/GLM-4.5 model card (355B total, 32B "
        "active); arXiv:2508.06471 Table 1",
        active_without_embedding=True,
    ),
    "llama-4-scout-17b-16e": Published(
        # The text model only: the checkpoint's 108,641,793,536 less the vision encoder
        # (test_hybrid_zoo.py counts both from this config.json); the card's 109B is both.
        "107,769,861,120", "17B",
        "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E config.json (shape keys "
        "transcribed) and safetensors count 108,641,793,536; model card: 17B active",
        exact_total=107_769_861_120,
    ),
    "kimi-k2-instruct": Published(
        "1026.5B", "32B",
        "https://huggingface.co/moonshotai/Kimi-K2-Instruct config.json (transcribed) and "
        "safetensors count 1026.5B (with the FP8 scales, test_hybrid_zoo.py); model card: 1T "
        "total, 32B activated",
        active_without_embedding=True,
    ),
    # 2025-26 families, config.json as ai-dynamo/aiconfigurator copies them
    # (aic-core/src/aiconfigurator_core/model_configs/<org>--<name>_config.json @095f58a).
    "deepseek-v3.2": Published(
        # The checkpoint with its MTP module (its own embedding and head copies): 685.36B.
        "685B", "37B", "https://huggingface.co/deepseek-ai/DeepSeek-V3.2 model card (685B)",
        active_without_embedding=True, total_with_mtp_checkpoint=True,
    ),
    "glm-5": Published(
        "744B", "40B", "https://huggingface.co/zai-org/GLM-5 model card (744B, 40B active)",
        active_without_embedding=True,
    ),
    "minimax-m2.5": Published(
        "229B", "10B", "https://huggingface.co/MiniMaxAI/MiniMax-M2.5 model card",
        active_without_embedding=True,
    ),
    "qwen3.5-397b-a17b": Published(
        "397B", "17B", "https://huggingface.co/Qwen/Qwen3.5-397B-A17B model card (with the "
        "vision encoder, not planned)",
    ),
    "longcat-flash-chat": Published(
        # Transcribed from transformers' LongcatFlashConfig, whose defaults are this
        # checkpoint's (models/longcat_flash/configuration_longcat_flash.py,
        # auto_docstring(checkpoint="meituan-longcat/LongCat-Flash-Chat")).
        "560B", "27B", "https://huggingface.co/meituan-longcat/LongCat-Flash-Chat model card "
        "(560B total, 27B activated on average)", active_without_embedding=True,
    ),
    "ernie-4.5-21b-a3b": Published(
        "21B", "3B", "https://huggingface.co/baidu/ERNIE-4.5-21B-A3B-PT model card (21B total, "
        "3B activated); config.json as MindIE's ErniemoeConfig test quotes it",
    ),
    "qwen3.5-27b": Published(
        "27B", None, "https://huggingface.co/Qwen/Qwen3.5-27B model card (with the vision "
        "encoder, not planned)",
    ),
}

CONFIG_NAMES = sorted(PUBLISHED)


def load_config(name: str) -> dict[str, Any]:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text(encoding="utf-8"))


def import_config(name: str) -> ModelSpec:
    return model_spec_from_hf_config(load_config(name), source=str(CONFIG_DIR / f"{name}.json"))


# ---- published counts -------------------------------------------------------------------------


def test_every_supported_model_type_has_a_real_config() -> None:
    types = {load_config(name)["model_type"] for name in CONFIG_NAMES}
    assert types == set(SUPPORTED_MODEL_TYPES)
    assert len(SUPPORTED_MODEL_TYPES) == 31
    assert sorted(p.stem for p in CONFIG_DIR.glob("*.json")) == CONFIG_NAMES


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_real_config_counts_the_published_parameters(name: str) -> None:
    published = PUBLISHED[name]
    spec = import_config(name)
    total = spec.total_params
    if published.total_with_mtp_checkpoint:
        total += spec.mtp_params + 2 * spec.vocab_size * spec.hidden_size
    assert_matches_published(total, published.total, f"{name} total")
    if published.exact_total is not None:
        assert spec.total_params == published.exact_total
    if published.active is None:
        assert not spec.is_moe
        return
    active = spec.active_params
    if published.active_without_embedding:
        active -= spec.embedding_params
    assert_matches_published(active, published.active, f"{name} active")


@pytest.mark.parametrize(("name", "stored"), [
    # Hugging Face model API `safetensors.total`: the checkpoints store lm_head.weight although
    # FalconForCausalLM ties it to the embedding, so the stored count is ours plus one
    # vocab x hidden matrix. Exact agreement checks every other matrix shape.
    ("falcon-7b", 7_217_189_760),   # https://huggingface.co/tiiuae/falcon-7b (7.22B params)
    ("falcon-180b", 179_522_565_120),  # https://huggingface.co/tiiuae/falcon-180B (180B params)
])
def test_falcon_checkpoint_stores_the_tied_head_once_more(name: str, stored: int) -> None:
    spec = import_config(name)
    assert spec.tie_word_embeddings
    assert spec.total_params + spec.vocab_size * spec.hidden_size == stored


def test_gpt_oss_counts_match_the_model_card_table_to_the_last_digit() -> None:
    # arXiv:2508.10925 Table 1 gives 20.91B total and 3.61B active (embedding excluded).
    spec = import_config("gpt-oss-20b")
    assert round(spec.total_params / 1e7) == 2091
    assert round((spec.active_params - spec.embedding_params) / 1e7) == 361


def test_deepseek_v3_multi_token_prediction_is_counted_apart() -> None:
    spec = import_config("deepseek-v3")
    # One MTP module: a full MoE layer plus eh_proj (2h x h) and three norms, ~11.6B; the
    # model card's "14B of MTP" also counts the module's own copies of embedding and head.
    assert spec.num_nextn_predict_layers == 1
    assert spec.mtp_params + 2 * spec.vocab_size * spec.hidden_size == pytest.approx(13.46e9,
                                                                                        rel=1e-3)


# ---- architecture HF leaves implicit ----------------------------------------------------------

IMPLICIT_FLAGS: dict[str, dict[str, Any]] = {
    "llama3.1-8b": {"qkv_bias": False, "mlp_type": "gated", "norm_type": "rmsnorm",
                    "num_key_value_heads": 8, "tie_word_embeddings": False},
    "mistral-7b-v0.1": {"qkv_bias": False, "num_key_value_heads": 8, "head_dim": None},
    "mixtral-8x7b-v0.1": {"num_experts": 8, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 14336, "router_bias": False,
                          "first_k_dense_layers": 0},
    "qwen2.5-7b": {"qkv_bias": True, "o_bias": False, "qk_norm": False},
    "qwen1.5-moe-a2.7b": {"qkv_bias": True, "num_experts": 60, "num_shared_experts": 1,
                          "shared_expert_intermediate_size": 5632, "shared_expert_gate": True,
                          "first_k_dense_layers": 0, "moe_layer_freq": 1},
    "qwen3-8b": {"qk_norm": True, "head_dim": 128, "qkv_bias": False},
    "qwen3-30b-a3b": {"qk_norm": True, "head_dim": 128, "num_shared_experts": 0,
                      "num_experts": 128, "num_experts_per_tok": 8},
    "deepseek-v2-lite": {"q_lora_rank": None, "kv_lora_rank": 512, "num_shared_experts": 2,
                         "first_k_dense_layers": 1, "router_bias": False,
                         "num_nextn_predict_layers": 0},
    "deepseek-v3": {"q_lora_rank": 1536, "num_shared_experts": 1, "first_k_dense_layers": 3,
                    "router_bias": True, "num_nextn_predict_layers": 1},
    "gemma-2-9b": {"norms_per_layer": 4, "tie_word_embeddings": True, "head_dim": 256},
    "gpt2": {"position_embedding_type": "learned", "norm_type": "layernorm",
             "mlp_type": "plain", "intermediate_size": 3072, "max_position_embeddings": 1024,
             "qkv_bias": True, "o_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    "pythia-6.9b": {"norm_type": "layernorm", "mlp_type": "plain", "qkv_bias": True,
                    "o_bias": True, "mlp_bias": True, "tie_word_embeddings": False,
                    "norms_per_layer": 2},
    "falcon-7b": {"num_key_value_heads": 1, "norms_per_layer": 1, "tie_word_embeddings": True,
                  "intermediate_size": 4 * 4544, "mlp_type": "plain", "qkv_bias": False},
    "falcon-180b": {"num_key_value_heads": 8, "norms_per_layer": 2,
                    "intermediate_size": 4 * 14848, "position_embedding_type": "rope"},
    "gpt-oss-20b": {"attention_sinks": True, "router_bias": True, "mlp_bias": True,
                    "swiglu_limit": 7.0, "qkv_bias": True, "o_bias": True, "num_experts": 32,
                    "num_experts_per_tok": 4, "head_dim": 64, "sliding_window": 128,
                    "layer_types": ("sliding_attention", "full_attention") * 12},
    "phi-3-mini-4k": {"qkv_bias": False, "mlp_bias": False, "num_key_value_heads": 32,
                      "sliding_window": 2047, "layer_types": ("sliding_attention",) * 32},
    "olmoe-1b-7b": {"qk_norm": True, "qk_norm_over": "projection", "num_experts": 64,
                    "num_experts_per_tok": 8, "num_shared_experts": 0, "num_moe_layers": 16},
    "nemotron-h-8b": {"norms_per_layer": 1, "mlp_type": "plain", "head_dim": 128,
                      "mamba_num_heads": 128, "n_groups": 8, "ssm_state_size": 128,
                      "use_conv_bias": True, "mamba_proj_bias": False,
                      "num_attention_layers": 4, "num_experts": 0},
    "nemotron-h-56b": {"num_attention_layers": 10, "ssm_state_size": 256,
                       "mamba_num_heads": 256},
    "nemotron-h-47b": {"num_attention_layers": 5, "intermediate_size": 30720},
    "nemotron-nano-9b-v2": {"num_attention_layers": 4, "mamba_head_dim": 80},
    "nemotron-3-nano-30b-a3b": {"num_experts": 128, "num_experts_per_tok": 6,
                                "shared_expert_intermediate_size": 3712, "router_bias": True,
                                "num_moe_layers": 23, "num_attention_layers": 6},
    "nemotron-3-super-120b-a12b": {"moe_latent_size": 1024, "moe_token_width": 1024,
                                   "num_moe_layers": 40, "num_attention_layers": 8,
                                   "num_nextn_predict_layers": 1},
    "nemotron-3-ultra-550b-a55b": {"moe_latent_size": 2048, "num_hidden_layers": 108,
                                   "num_moe_layers": 48, "num_attention_layers": 12,
                                   "mamba_num_heads": 256},
    "qwen3-next-80b-a3b": {"attention_output_gate": True, "qk_norm": True, "head_dim": 256,
                           "num_attention_layers": 12, "shared_expert_gate": True,
                           "num_moe_layers": 48, "linear_num_value_heads": 32},
    "gemma-3-27b": {"qk_norm": True, "norms_per_layer": 4, "tie_word_embeddings": True,
                    "sliding_window": 1024, "num_attention_layers": 62},
    "gemma-3-1b": {"qk_norm": True, "sliding_window": 512, "head_dim": 256,
                   "num_attention_layers": 26},
    "llama-4-maverick-17b-128e-text": {"num_moe_layers": 24, "num_shared_experts": 1},
    "llama-4-maverick-17b-128e": {"num_moe_layers": 24, "intermediate_size": 16384,
                                  "moe_intermediate_size": 8192, "num_shared_experts": 1,
                                  "attention_chunk_size": 8192, "qk_norm": False},
    "glm-4.5": {"qkv_bias": True, "o_bias": False, "qk_norm": True, "first_k_dense_layers": 3,
                "router_bias": True, "num_nextn_predict_layers": 1,
                "shared_expert_intermediate_size": 1536},
    "llama-4-scout-17b-16e": {"num_moe_layers": 48, "num_experts": 16, "num_shared_experts": 1,
                              "intermediate_size": 16384, "moe_intermediate_size": 8192,
                              "attention_chunk_size": 8192, "num_attention_layers": 48},
    "kimi-k2-instruct": {"model_type": "kimi_k2", "q_lora_rank": 1536, "num_experts": 384,
                         "num_shared_experts": 1, "first_k_dense_layers": 1,
                         "router_bias": True, "num_nextn_predict_layers": 0,
                         "num_key_value_heads": 64},
    # DSA: vLLM deepseek_v2.py builds an Indexer when the config has index_topk.
    "deepseek-v3.2": {"model_type": "deepseek_v32", "index_n_heads": 64, "index_head_dim": 128,
                      "index_topk": 2048, "router_bias": True, "first_k_dense_layers": 3},
    "glm-5": {"model_type": "glm_moe_dsa", "index_n_heads": 32, "index_topk": 2048,
              "qk_nope_head_dim": 192, "v_head_dim": 256, "n_group": 1},
    # MiniMaxM2Attention: q_norm over heads x head_dim, k_norm over kv heads x head_dim.
    "minimax-m2.5": {"qk_norm": True, "qk_norm_over": "projection", "router_bias": True,
                     "num_shared_experts": 0, "moe_intermediate_size": 1536,
                     "num_nextn_predict_layers": 0},
    "qwen3.5-397b-a17b": {"attention_output_gate": True, "shared_expert_gate": True,
                          "linear_num_value_heads": 64, "num_nextn_predict_layers": 1},
    "longcat-flash-chat": {"num_hidden_layers": 56, "num_zero_experts": 256,
                           "num_experts_per_tok": 12, "moe_layer_freq": 2,
                           "shared_expert_intermediate_size": 12288},
    "ernie-4.5-21b-a3b": {"first_k_dense_layers": 1, "num_shared_experts": 1,
                          "shared_expert_intermediate_size": 3072, "router_bias": True,
                          "tie_word_embeddings": True, "qkv_bias": False},
    "qwen3.5-27b": {"attention_output_gate": True, "num_experts": 0,
                    "intermediate_size": 17408, "num_nextn_predict_layers": 1},
}


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_real_config_gets_the_architecture_the_modeling_code_builds(name: str) -> None:
    spec = import_config(name)
    assert spec.model_type == load_config(name)["model_type"]
    assert spec.name == name
    for field, expected in IMPLICIT_FLAGS[name].items():
        assert getattr(spec, field) == expected, field


# The zoo TOMLs are written by hand from the same configs: both roads must count the same.
ZOO_TWINS = {
    "llama3.1-8b": "llama3.1-8b", "mistral-7b-v0.1": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b", "qwen2.5-7b": "qwen2.5-7b", "qwen3-8b": "qwen3-8b",
    "qwen3-30b-a3b": "qwen3-30b-a3b", "deepseek-v2-lite": "deepseek-v2-lite",
    "deepseek-v3": "deepseek-v3", "gemma-2-9b": "gemma2-9b", "falcon-180b": "falcon-180b",
    "gpt-oss-20b": "gpt-oss-20b", "phi-3-mini-4k": "phi3-mini",
    "nemotron-h-8b": "nemotron-h-8b", "nemotron-h-47b": "nemotron-h-47b",
    "nemotron-h-56b": "nemotron-h-56b", "nemotron-nano-9b-v2": "nemotron-nano-9b-v2",
    "nemotron-3-nano-30b-a3b": "nemotron-3-nano-30b-a3b",
    "nemotron-3-super-120b-a12b": "nemotron-3-super-120b-a12b",
    "nemotron-3-ultra-550b-a55b": "nemotron-3-ultra-550b-a55b",
    "qwen3-next-80b-a3b": "qwen3-next-80b-a3b", "gemma-3-27b": "gemma3-27b",
    "llama-4-maverick-17b-128e": "llama4-maverick", "llama-4-scout-17b-16e": "llama4-scout",
    "glm-4.5": "glm-4.5", "kimi-k2-instruct": "kimi-k2",
    "deepseek-v3.2": "deepseek-v3.2", "glm-5": "glm-5", "minimax-m2.5": "minimax-m2.5",
    "qwen3.5-397b-a17b": "qwen3.5-397b-a17b", "qwen3.5-27b": "qwen3.5-27b",
    "longcat-flash-chat": "longcat-flash", "ernie-4.5-21b-a3b": "ernie-4.5-21b-a3b",
}


@pytest.mark.parametrize("name", sorted(ZOO_TWINS))
def test_import_agrees_with_the_hand_written_zoo_file(name: str) -> None:
    if ZOO_TWINS[name] not in list_zoo_names():
        pytest.skip(f"zoo has no {ZOO_TWINS[name]}")
    imported, zoo = import_config(name), load_model_spec(ZOO_TWINS[name])
    assert imported.breakdown() == zoo.breakdown()
    assert imported.active_params == zoo.active_params
    assert imported.mtp_params == zoo.mtp_params
    # The block pattern too: every layer's mixer and MLP, and the windows they attend within.
    assert (imported.layer_mixers, imported.layer_mlps) == (zoo.layer_mixers, zoo.layer_mlps)
    assert (imported.sliding_window, imported.attention_chunk_size) == (
        zoo.sliding_window, zoo.attention_chunk_size)


# ---- HF defaults and layouts that still map exactly ---------------------------------------------


def test_absent_optional_keys_take_the_hf_defaults() -> None:
    gpt2 = {k: v for k, v in load_config("gpt2").items()
            if k not in {"n_positions", "n_inner", "tie_word_embeddings"}}
    assert model_spec_from_hf_config(gpt2, "gpt2.json").total_params == 124_439_808
    llama = {k: v for k, v in load_config("llama3.1-8b").items()
             if k not in {"attention_bias", "mlp_bias", "tie_word_embeddings"}}
    assert model_spec_from_hf_config(llama, "x.json").total_params == 8_030_261_248
    # GemmaConfig defaults: 4 kv heads, head_dim 256, tied embeddings.
    gemma = {k: v for k, v in load_config("gemma-2-9b").items() if k != "num_key_value_heads"}
    assert model_spec_from_hf_config(gemma, "g.json").kv_heads == 4
    # LlamaConfig: num_key_value_heads null (or absent) means as many as attention heads.
    null_kv = model_spec_from_hf_config({**load_config("llama3.1-8b"),
                                         "num_key_value_heads": None}, "x.json")
    assert null_kv.kv_heads == 32


def test_qwen_moe_dense_prefix_maps_to_first_k_dense_layers() -> None:
    base = load_config("qwen3-30b-a3b")
    spec = model_spec_from_hf_config({**base, "mlp_only_layers": [1, 0, 2]}, "q.json")
    assert (spec.first_k_dense_layers, spec.num_moe_layers) == (3, 45)
    all_dense = model_spec_from_hf_config({**base, "mlp_only_layers": list(range(48))}, "q.json")
    assert not all_dense.is_moe and all_dense.intermediate_size == 6144
    no_experts = model_spec_from_hf_config({**base, "num_experts": 0}, "q.json")
    assert not no_experts.is_moe


def test_deepseek_layer_rule_is_modelspecs_own() -> None:
    # MoE on i >= 1 with i % 2 == 0 is layers 2, 4, ...: the same set, written canonically.
    spec = model_spec_from_hf_config({**load_config("deepseek-v3"), "first_k_dense_replace": 1,
                                      "moe_layer_freq": 2}, "d.json")
    assert (spec.first_k_dense_layers, spec.moe_layer_freq, spec.num_moe_layers) == (2, 2, 30)


def test_deepseek_with_every_layer_dense_is_a_dense_model() -> None:
    spec = model_spec_from_hf_config({**load_config("deepseek-v2-lite"),
                                      "first_k_dense_replace": 27}, "d.json")
    assert not spec.is_moe and spec.is_mla


def test_falcon_variants_follow_falcon_attention_and_decoder_layer() -> None:
    old = load_config("falcon-7b")
    multi_head = model_spec_from_hf_config({**old, "multi_query": False}, "f.json")
    assert multi_head.kv_heads == 71
    sequential = model_spec_from_hf_config({**old, "parallel_attn": False}, "f.json")
    assert sequential.norms_per_layer == 2
    alibi = model_spec_from_hf_config({**old, "alibi": True, "bias": True}, "f.json")
    assert alibi.position_embedding_type == "alibi" and alibi.mlp_bias
    one_norm = model_spec_from_hf_config({**load_config("falcon-180b"),
                                          "num_ln_in_parallel_attn": 1}, "f.json")
    assert one_norm.norms_per_layer == 1


def test_gpt_oss_reads_openais_own_top_k_key() -> None:
    config = {k: v for k, v in load_config("gpt-oss-20b").items() if k != "num_experts_per_tok"}
    assert model_spec_from_hf_config(config, "o.json").num_experts_per_tok == 4


def test_name_comes_from_the_directory_of_a_config_json(tmp_path: Path) -> None:
    path = tmp_path / "Llama-3.1-8B" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(load_config("llama3.1-8b")), encoding="utf-8")
    assert load_model_spec(str(path)).name == "Llama-3.1-8B"


# ---- bad input ---------------------------------------------------------------------------------

LLAMA = load_config("llama3.1-8b")


def without(config: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != key}


BAD_CONFIGS: dict[str, tuple[object, str]] = {
    "not a dict": ([LLAMA], "model_type"),
    "missing model_type": (without(LLAMA, "model_type"), "model_type"),
    "unknown model_type": ({**LLAMA, "model_type": "llama99"}, "model_type"),
    "model_type not a string": ({**LLAMA, "model_type": ["llama"]}, "model_type"),
    "missing hidden_size": (without(LLAMA, "hidden_size"), "hidden_size"),
    "string hidden_size": ({**LLAMA, "hidden_size": "4096"}, "hidden_size"),
    "null hidden_size": ({**LLAMA, "hidden_size": None}, "hidden_size"),
    "float hidden_size": ({**LLAMA, "hidden_size": 4096.0}, "hidden_size"),
    "negative layers": ({**LLAMA, "num_hidden_layers": -32}, "num_hidden_layers"),
    "zero heads": ({**LLAMA, "num_attention_heads": 0}, "num_attention_heads"),
    "bool where int": ({**LLAMA, "num_hidden_layers": True}, "num_hidden_layers"),
    "absurd vocabulary": ({**LLAMA, "vocab_size": 10**40}, "vocab_size"),
    "string where bool": ({**LLAMA, "tie_word_embeddings": "false"}, "tie_word_embeddings"),
    "kv heads do not divide heads": ({**LLAMA, "num_key_value_heads": 5}, "num_key_value_heads"),
    "heads do not divide hidden": ({**LLAMA, "num_attention_heads": 30}, "num_attention_heads"),
    "top-k above experts": ({**load_config("mixtral-8x7b-v0.1"), "num_experts_per_tok": 9},
                            "num_experts_per_tok"),
    "mlp_only_layers not a prefix": ({**load_config("qwen1.5-moe-a2.7b"),
                                      "mlp_only_layers": [0, 5]}, "mlp_only_layers"),
    "mlp_only_layers out of range": ({**load_config("qwen3-30b-a3b"), "mlp_only_layers": [48]},
                                     "mlp_only_layers"),
    "mlp_only_layers not a list": ({**load_config("qwen3-30b-a3b"), "mlp_only_layers": 3},
                                   "mlp_only_layers"),
    "sparse step 2": ({**load_config("qwen1.5-moe-a2.7b"), "decoder_sparse_step": 2},
                      "decoder_sparse_step"),
    "mla with biases": ({**load_config("deepseek-v3"), "attention_bias": True},
                        "attention_bias"),
    "missing q_lora_rank": (without(load_config("deepseek-v2-lite"), "q_lora_rank"),
                            "q_lora_rank"),
    "gpt2 cross-attention": ({**load_config("gpt2"), "add_cross_attention": True},
                             "add_cross_attention"),
    "gpt2 missing n_embd": (without(load_config("gpt2"), "n_embd"), "n_embd"),
    "falcon kv heads": ({**load_config("falcon-180b"), "num_kv_heads": 7}, "num_kv_heads"),
    "falcon three norms": ({**load_config("falcon-180b"), "num_ln_in_parallel_attn": 3},
                           "num_ln_in_parallel_attn"),
    "gpt-oss top-k keys disagree": ({**load_config("gpt-oss-20b"), "experts_per_token": 2},
                                    "experts_per_token"),
    "gpt-oss negative swiglu limit": ({**load_config("gpt-oss-20b"), "swiglu_limit": -7.0},
                                      "swiglu_limit"),
    "gpt-oss swiglu limit as text": ({**load_config("gpt-oss-20b"), "swiglu_limit": "7"},
                                     "swiglu_limit"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_is_one_input_error_line_naming_file_and_key(case: str) -> None:
    data, key = BAD_CONFIGS[case]
    with pytest.raises(InputError) as info:
        model_spec_from_hf_config(data, source="models/bad/config.json")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("models/bad/config.json: ")
    assert key in message


def test_unsupported_model_type_lists_the_supported_ones() -> None:
    with pytest.raises(InputError, match="supported: deepseek_v2, deepseek_v3, deepseek_v32, ernie4_5_moe, falcon"):
        model_spec_from_hf_config({"model_type": "bert"}, "bert.json")


def test_refusals_say_why() -> None:
    with pytest.raises(InputError, match=r"layers 1, 3, 5, 7, 9, 11, \.\.\.; .*dense prefix"):
        model_spec_from_hf_config(BAD_CONFIGS["sparse step 2"][0], "q.json")
    with pytest.raises(InputError, match="kv_a_proj_with_mqa"):
        model_spec_from_hf_config(BAD_CONFIGS["mla with biases"][0], "d.json")


# ---- properties: nothing but InputError ----------------------------------------------------------

REAL_CONFIGS = {name: load_config(name) for name in CONFIG_NAMES}
REAL_KEYS = sorted({key for config in REAL_CONFIGS.values() for key in config})

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=8,
)
# Values that get past the type checks often enough to reach the cross-field rules.
plausible_values = (st.integers(min_value=-2, max_value=70) | st.booleans() | st.none()
                    | st.lists(st.integers(min_value=-1, max_value=60), max_size=5))


def assert_spec_or_input_error(data: object) -> None:
    try:
        spec = model_spec_from_hf_config(data, source="fuzz/config.json")
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith("fuzz/config.json: ")
        return
    # A spec that was accepted must also be usable by everything downstream.
    assert sum(spec.breakdown().values()) == spec.total_params
    assert 0 < spec.active_params <= spec.total_params
    assert spec.mtp_params >= 0
    assert spec.flops_per_token(4096) > 0


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(REAL_KEYS) | st.text(max_size=8),
                       json_values | plausible_values, max_size=30),
       st.sampled_from(SUPPORTED_MODEL_TYPES) | json_values)
def test_arbitrary_dicts_give_a_spec_or_an_input_error(data: dict[str, Any],
                                                       model_type: Any) -> None:
    assert_spec_or_input_error({**data, "model_type": model_type})


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CONFIG_NAMES), st.data())
def test_mutating_one_key_of_a_real_config_gives_a_spec_or_an_input_error(name: str,
                                                                           data: Any) -> None:
    config = dict(REAL_CONFIGS[name])
    key = data.draw(st.sampled_from(sorted(config)), label="key")
    config[key] = data.draw(json_values | plausible_values, label="value")
    assert_spec_or_input_error(config)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CONFIG_NAMES), st.data())
def test_reshaping_a_real_config_gives_a_spec_or_an_input_error(name: str, data: Any) -> None:
    config = dict(REAL_CONFIGS[name])
    changes = data.draw(st.dictionaries(st.sampled_from(REAL_KEYS), plausible_values,
                                        min_size=1, max_size=6), label="changes")
    dropped = data.draw(st.sets(st.sampled_from(sorted(config)), max_size=3), label="dropped")
    config.update(changes)
    assert_spec_or_input_error({k: v for k, v in config.items() if k not in dropped})


@settings(max_examples=100, deadline=None)
@given(json_values)
def test_any_json_document_gives_a_spec_or_an_input_error(document: Any) -> None:
    assert_spec_or_input_error(document)


# ---- the command line ----------------------------------------------------------------------------


def test_cli_shows_an_hf_config() -> None:
    path = CONFIG_DIR / "qwen3-30b-a3b.json"
    result = CliRunner().invoke(cli, ["models", "show", str(path), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert shown["total_params"] == 30_532_122_624
    assert shown["model_type"] == "qwen3_moe"
    assert sum(shown["breakdown"].values()) == shown["total_params"]


def test_cli_names_the_file_of_malformed_json(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "llama", "hidden_size": 4096,,}', encoding="utf-8")
    result = CliRunner().invoke(cli, ["models", "show", str(path), "--json"])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "not valid JSON" in lines[0]


def test_cli_names_the_file_and_key_of_a_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**LLAMA, "num_hidden_layers": "32"}), encoding="utf-8")
    result = CliRunner().invoke(cli, ["models", "show", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(path) in lines[0] and "num_hidden_layers" in lines[0]
