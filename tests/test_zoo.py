"""The model zoo: every file loads, cites its source, and counts the parameters its makers
published.

A published figure is only as precise as its digits: "37B" says 36.5-37.5B if rounded and
37-38B if truncated (Qwen truncates: 14.77B is published as "14.7B"). So a computed count must
lie within 1% of the figure or within one unit of its last digit, whichever is wider; the
second only matters for two-digit figures such as "37B" or "3.3B".
"""

from __future__ import annotations

import re

import pytest

from solver.catalog.paths import data_dir
from solver.catalog.zoo import list_zoo_names, load_model_spec
from published_counts import Published, assert_matches_published, parse_published_count

MIN_NUM_ZOO_MODELS = 30


PUBLISHED: dict[str, Published] = {
    "llama2-7b": Published(
        "6.74B", None,
        "https://huggingface.co/meta-llama/Llama-2-7b-hf model.safetensors.index.json: "
        "total_size 13,476,839,424 bytes fp16 (the extra 4,096 are fp32 rotary inv_freq buffers)",
    ),
    "llama2-13b": Published(
        "13.0B", None, "https://huggingface.co/meta-llama/Llama-2-13b-hf safetensors count",
    ),
    "llama2-70b": Published(
        "68.98B", None,
        "https://huggingface.co/meta-llama/Llama-2-70b-hf model.safetensors.index.json: "
        "total_size 137,953,316,864 bytes fp16 (the paper rounds to 70B)",
    ),
    "llama3.1-8b": Published(
        "8.03B", None, "https://huggingface.co/meta-llama/Llama-3.1-8B model card",
    ),
    "llama3.1-70b": Published(
        "70.6B", None, "https://huggingface.co/meta-llama/Llama-3.1-70B model card",
    ),
    "llama3.1-405b": Published(
        "405.9B", None,
        "https://huggingface.co/meta-llama/Llama-3.1-405B safetensors count (card: 405B)",
    ),
    "llama3.2-1b": Published(
        "1.23B", None, "https://huggingface.co/meta-llama/Llama-3.2-1B model card",
    ),
    "llama3.2-3b": Published(
        "3.21B", None, "https://huggingface.co/meta-llama/Llama-3.2-3B model card",
    ),
    "mistral-7b": Published(
        "7.24B", None,
        "https://huggingface.co/mistralai/Mistral-7B-v0.1 safetensors count "
        "(the release post rounds to 7.3B)",
    ),
    "mixtral-8x7b": Published(
        "46.7B", "12.9B", "https://mistral.ai/news/mixtral-of-experts",
    ),
    "mixtral-8x22b": Published(
        "141B", "39B", "https://mistral.ai/news/mixtral-8x22b",
    ),
    "qwen2.5-7b": Published(
        "7.61B", None, "https://huggingface.co/Qwen/Qwen2.5-7B model card",
    ),
    "qwen2.5-14b": Published(
        "14.7B", None, "https://huggingface.co/Qwen/Qwen2.5-14B model card",
    ),
    # The card's 32.5B (31.0B non-embedding) sits 0.8% below what its own config.json gives
    # (32.76B, 31.21B non-embedding); the checkpoint's tensor shapes agree with config.json.
    "qwen2.5-32b": Published(
        "32.5B", None, "https://huggingface.co/Qwen/Qwen2.5-32B model card",
    ),
    "qwen2.5-72b": Published(
        "72.7B", None, "https://huggingface.co/Qwen/Qwen2.5-72B model card",
    ),
    "qwen2-57b-a14b": Published(
        # Active computes to 14.25B: "14B" is two digits (1.8% off, inside one unit).
        "57B", "14B",
        "https://huggingface.co/Qwen/Qwen2-57B-A14B model card; arXiv:2407.10671",
    ),
    "qwen3-8b": Published(
        "8.2B", None, "https://huggingface.co/Qwen/Qwen3-8B-Base model card",
    ),
    "qwen3-32b": Published(
        "32.8B", None, "https://huggingface.co/Qwen/Qwen3-32B model card",
    ),
    "qwen3-30b-a3b": Published(
        # Active computes to 3.353B: the card truncates to "3.3B" (1.6% off, inside one unit).
        "30.5B", "3.3B", "https://huggingface.co/Qwen/Qwen3-30B-A3B-Base model card",
    ),
    "qwen3-235b-a22b": Published(
        "235B", "22B", "https://huggingface.co/Qwen/Qwen3-235B-A22B model card",
    ),
    "deepseek-v3": Published(
        # Active without the embedding computes to 36.62B (with it, 37.55B, which would have
        # been published as 38B); the 14B MTP module is counted apart in both.
        "671B", "37B",
        "https://huggingface.co/deepseek-ai/DeepSeek-V3 model card; arXiv:2412.19437",
        active_without_embedding=True,
    ),
    "deepseek-v2": Published(
        "236B", "21B",
        "https://huggingface.co/deepseek-ai/DeepSeek-V2 model card; arXiv:2405.04434",
        active_without_embedding=True,
    ),
    "deepseek-v2-lite": Published(
        # Active without the embedding computes to 2.451B (with it, 2.66B): "2.4B" is two digits.
        "15.7B", "2.4B", "arXiv:2405.04434 (DeepSeek-V2), Appendix B",
        active_without_embedding=True,
    ),
    "gemma2-9b": Published(
        "9,241,705,984", None,
        "arXiv:2408.00118 (Gemma 2), Table 2: 917,504,000 embedding + 8,324,201,984 non-embedding",
    ),
    "gemma2-27b": Published(
        "27,227,128,320", None,
        "arXiv:2408.00118 (Gemma 2), Table 2: 1,179,648,000 embedding + 26,047,480,320 "
        "non-embedding",
    ),
    "gpt3-175b": Published(
        "175.0B", None, "Brown et al. 2020, arXiv:2005.14165, Table 2.1",
    ),
    "megatron-22b": Published(
        "22B", None, "Korthikanti et al. 2022, arXiv:2205.05198, Table 3",
    ),
    "megatron-530b": Published(
        "529.6B", None, "Narayanan et al. 2021, arXiv:2104.04473, Table 1",
    ),
    "megatron-1t": Published(
        "1008.0B", None, "Narayanan et al. 2021, arXiv:2104.04473, Table 1",
    ),
    "bloom-176b": Published(
        "176,247,271,424", None, "https://huggingface.co/bigscience/bloom model card",
    ),
    "falcon-180b": Published(
        # Computes to 178.56B with the LM head tied as in HF (untied would be 179.52B).
        "180B", None, "https://huggingface.co/tiiuae/falcon-180B model card",
    ),
    "nemotron4-340b": Published(
        "341.0B", None,
        "arXiv:2406.11704 (Nemotron-4 340B), section 2: 9.4B embedding + 331.6B non-embedding",
    ),
    "dbrx": Published(
        # Active computes to 36.47B: "36B" is two digits (1.3% off, inside one unit).
        "132B", "36B", "https://huggingface.co/databricks/dbrx-base model card",
    ),
    "gpt-oss-20b": Published(
        "20.91B", "3.61B", "arXiv:2508.10925 (gpt-oss-120b & gpt-oss-20b model card), Table 1",
        active_without_embedding=True,
    ),
    "gpt-oss-120b": Published(
        "116.83B", "5.13B", "arXiv:2508.10925 (gpt-oss-120b & gpt-oss-20b model card), Table 1",
        active_without_embedding=True,
    ),
    "mpt-7b": Published(
        "6.7B", None, "https://huggingface.co/mosaicml/mpt-7b model card",
    ),
    "mpt-30b": Published(
        "29.95B", None, "https://huggingface.co/mosaicml/mpt-30b model card",
    ),
    "phi3-mini": Published(
        "3.8B", None, "Abdin et al. 2024, arXiv:2404.14219 (Phi-3), abstract",
    ),
    # Block patterns (solver.spec.blocks); the sources are in tests/test_hf_import.py too.
    "nemotron-h-8b": Published(
        "8B", None, "https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K model card",
    ),
    "nemotron-h-56b": Published(
        "56B", None, "https://huggingface.co/nvidia/Nemotron-H-56B-Base-8K model card",
    ),
    "nemotron-h-47b": Published(
        "47B", None, "https://huggingface.co/nvidia/Nemotron-H-47B-Base-8K model card",
    ),
    "nemotron-nano-9b-v2": Published(
        "9B", None, "https://huggingface.co/nvidia/NVIDIA-Nemotron-Nano-9B-v2 model card",
    ),
    "nemotron-3-nano-30b-a3b": Published(
        "31.6B", "3.2B",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 model card",
        active_without_embedding=True,
    ),
    "nemotron-3-super-120b-a12b": Published(
        "120B", "12B",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-BF16 model card",
        active_without_embedding=True,
    ),
    "nemotron-3-ultra-550b-a55b": Published(
        "550B", "55B",
        "https://huggingface.co/nvidia/NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16 model card",
        active_without_embedding=True,
    ),
    "qwen3-next-80b-a3b": Published(
        "80B", "3B", "https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct model card",
        active_without_embedding=True,
    ),
    "gemma3-27b": Published(
        "27.016B", None,
        "arXiv:2503.19786 (Gemma 3), Table 1: 1,416M embedding + 25,600M non-embedding",
    ),
    "llama4-maverick": Published(
        "400B", "17B", "https://huggingface.co/meta-llama/Llama-4-Maverick-17B-128E model card",
    ),
    "glm-4.5": Published(
        "355B", "32B", "https://huggingface.co/zai-org/GLM-4.5 model card; arXiv:2508.06471",
        active_without_embedding=True,
    ),
    "llama4-scout": Published(
        # The text model: the card's 109B (and the checkpoint's 108,641,793,536) count the
        # vision encoder too; test_hybrid_zoo.py reproduces both from config.json.
        "107,769,861,120", "17B",
        "https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E safetensors count less the "
        "vision encoder; model card: 17B active",
    ),
    "kimi-k2": Published(
        "1026.5B", "32B",
        "https://huggingface.co/moonshotai/Kimi-K2-Instruct safetensors count (the card "
        "rounds to 1T total, 32B activated)",
        active_without_embedding=True,
    ),
    "deepseek-v3.2": Published(
        # 671.88B main model + 11.62B MTP layer + its 2 x 0.93B embedding and head copies
        # = 685.36B; active without the embedding 37.48B.
        "685B", "37B",
        "https://huggingface.co/deepseek-ai/DeepSeek-V3.2 model card (685B params); "
        "arXiv:2512.02556",
        active_without_embedding=True, total_with_mtp_checkpoint=True,
    ),
    "glm-5": Published(
        # Active without the embedding computes to 40.83B: the card truncates to "40B".
        "744B", "40B", "https://huggingface.co/zai-org/GLM-5 model card",
        active_without_embedding=True,
    ),
    "minimax-m2.5": Published(
        # Active without the embedding computes to 10.42B.
        "229B", "10B", "https://huggingface.co/MiniMaxAI/MiniMax-M2.5 model card",
        active_without_embedding=True,
    ),
    "qwen3.5-397b-a17b": Published(
        # The text model computes to 396.35B; the card's 397B adds the vision encoder.
        "397B", "17B", "https://huggingface.co/Qwen/Qwen3.5-397B-A17B model card",
    ),
    "longcat-flash": Published(
        # Active without the embedding, at k E / (E + Z) = 8 FFN experts, computes to 27.15B.
        "560B", "27B", "https://huggingface.co/meituan-longcat/LongCat-Flash-Chat model card; "
        "arXiv:2509.01322", active_without_embedding=True,
    ),
    "ernie-4.5-21b-a3b": Published(
        # 21.83B and 3.35B (embedding included) compute; Baidu's card truncates.
        "21B", "3B", "https://huggingface.co/baidu/ERNIE-4.5-21B-A3B-PT model card",
    ),
    "qwen3.5-27b": Published(
        # The text model computes to 26.90B; the card's 27B adds the vision encoder.
        "27B", None, "https://huggingface.co/Qwen/Qwen3.5-27B model card",
    ),
}

ZOO_NAMES = list_zoo_names()
SOURCE_REFERENCE = re.compile(r"https?://\S+|arXiv:\d{4}\.\d{4,5}|et al\. \d{4}")


def test_parse_published_count() -> None:
    assert parse_published_count("37B") == (37e9, 1e9)
    assert parse_published_count("8.03B") == pytest.approx((8.03e9, 1e7))
    assert parse_published_count("176,247,271,424") == (176247271424.0, 1.0)


def test_zoo_is_large_enough_and_matches_the_published_table() -> None:
    assert len(ZOO_NAMES) >= MIN_NUM_ZOO_MODELS
    assert set(ZOO_NAMES) == set(PUBLISHED), "every zoo model needs a published count, and back"


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_file_loads_under_its_own_name(name: str) -> None:
    spec = load_model_spec(name)
    assert spec.name == name
    assert name == name.lower()
    assert spec.source


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_zoo_file_opens_with_a_cited_source(name: str) -> None:
    text = (data_dir("models") / f"{name}.toml").read_text(encoding="utf-8")
    header = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert header and all(line.startswith("# ") for line in header), "no leading comment block"
    header_text = "\n".join(header)
    assert SOURCE_REFERENCE.search(header_text), "the header cites no URL or paper"
    assert "Published size:" in header_text


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_counts_are_consistent(name: str) -> None:
    spec = load_model_spec(name)
    assert sum(spec.breakdown().values()) == spec.total_params
    assert 0 < spec.active_params <= spec.total_params
    if not spec.is_moe:
        assert spec.active_params == spec.total_params


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_total_params_match_published(name: str) -> None:
    spec, published = load_model_spec(name), PUBLISHED[name]
    total = spec.total_params
    if published.total_with_mtp_checkpoint:
        total += spec.mtp_params + 2 * spec.vocab_size * spec.hidden_size
    assert_matches_published(total, published.total, f"{name} total")


@pytest.mark.parametrize("name", ZOO_NAMES)
def test_active_params_match_published(name: str) -> None:
    spec, published = load_model_spec(name), PUBLISHED[name]
    assert (published.active is not None) == spec.is_moe, "MoE models need an active count"
    if published.active is None:
        return
    active = spec.active_params
    if published.active_without_embedding:
        active -= spec.embedding_params
    assert_matches_published(active, published.active, f"{name} active")
