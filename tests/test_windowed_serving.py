"""Issue 18's property on the serving side (the training side: test_blocks.py): a model whose
block pattern is all full attention serves exactly as the plain model does, and windowing
attention layers (sliding or chunked, vLLM's SlidingWindowSpec and ChunkedLocalAttentionSpec:
solver.cost.serving.block_cache) never raises the KV cache a token needs, never shrinks what the cache
holds, and never slows a request or the deployment."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.serve.estimate import estimate_serving
from solver.spec import ModelSpec

PLAIN = ["llama3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b", "qwen2.5-7b", "deepseek-v2-lite"]
FIELDS = ("batch", "ttft_s", "tpot_idle_s", "tpot_s", "tokens_per_s", "latency_s")
MEMORY = ("weights_bytes", "activations_bytes", "kv_bytes_per_token", "kv_tokens",
          "max_sequences")


@lru_cache(maxsize=None)
def cluster(name: str):
    return load_cluster_spec(name)


def with_pattern(model_spec: ModelSpec, **update: object) -> ModelSpec:
    data = {**model_spec.model_dump(), "layer_types": model_spec.layer_mixers,
            "mlp_layer_types": model_spec.layer_mlps, **update}
    return ModelSpec.model_validate(data)


def serve(model_spec: ModelSpec, context: int, tpot_ms: float | None = None):
    problem = ServeProblem(model_spec=model_spec, cluster=cluster("dgx-h100"), num_gpus=8,
                           job=ServeJob(context=context, input_len=context // 2,
                                        output_len=context // 4, max_tpot_ms=tpot_ms))
    tp = np.array([1, 2, 4, 8])
    dp = 8 // tp
    ep = np.where(model_spec.is_moe, 8, 1) if model_spec.is_moe else np.ones(4, dtype=int)
    candidates = ServeCandidates(tp=tp, pp=1, dp=dp, ep=ep, replicas=1)
    return estimate_serving(problem, candidates)


@pytest.mark.parametrize("name", PLAIN)
def test_an_all_attention_pattern_serves_exactly_as_today(name: str) -> None:
    plain = load_model_spec(name)
    stated, today = serve(with_pattern(plain), 32768), serve(plain, 32768)
    for field in FIELDS:
        assert np.array_equal(getattr(stated, field), getattr(today, field)), field
    for field in MEMORY:
        assert np.array_equal(getattr(stated.memory, field), getattr(today.memory, field)), field


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["llama3.1-8b", "qwen3-30b-a3b", "mixtral-8x7b",
                              "nemotron-3-nano-30b-a3b", "qwen3-next-80b-a3b"]),
       window=st.integers(min_value=64, max_value=1 << 16),
       chunked=st.booleans(),
       layers=st.sets(st.integers(min_value=0, max_value=63), min_size=1),
       context=st.sampled_from([4096, 32768]),
       tpot_ms=st.sampled_from([None, 50.0]))
def test_windows_never_cost_more_to_serve(name: str, window: int, chunked: bool,
                                          layers: set[int], context: int,
                                          tpot_ms: float | None) -> None:
    plain = load_model_spec(name)
    mixer = "chunked_attention" if chunked else "sliding_attention"
    types = tuple(mixer if i in layers and own == "full_attention" else own
                  for i, own in enumerate(plain.layer_mixers))
    windowed = with_pattern(plain, layer_types=types, sliding_window=window,
                            attention_chunk_size=window)
    a, b = serve(windowed, context, tpot_ms), serve(plain, context, tpot_ms)
    assert np.array_equal(a.memory.weights_bytes, b.memory.weights_bytes)
    assert np.all(a.memory.kv_bytes_per_token <= b.memory.kv_bytes_per_token * (1 + 1e-12))
    assert np.all(a.memory.kv_tokens >= b.memory.kv_tokens)
    assert np.all(a.ttft_s <= b.ttft_s * (1 + 1e-12))
    assert np.all(a.tpot_idle_s <= b.tpot_idle_s * (1 + 1e-12))
    assert np.all(a.tokens_per_s >= b.tokens_per_s * (1 - 1e-12))


def test_prefill_attention_follows_the_pattern() -> None:
    """solver.cost.serving.block_cache.estimate_prefill_core_share: Gemma 3 27B (10 full, 52 sliding
    layers of 1024) at 8192 tokens: (10 + 52 x 960.06 / 4096) / 62 = 0.358; at 1024 every
    window covers the prompt: 1. Nemotron-H-8B: its 4 attention layers of 52, whatever the
    prompt; its 24 Mamba-2 layers scan instead (6,553,600 FLOPs a token each)."""
    from solver.cost.serving.block_cache import (
        estimate_prefill_core_share,
        estimate_prefill_scan_flops,
    )

    gemma, nemotron = load_model_spec("gemma3-27b"), load_model_spec("nemotron-h-8b")
    share = estimate_prefill_core_share(gemma, np.array([8192.0, 1024.0]))
    assert share[0] == pytest.approx((10 + 52 * (1024 - 1024 * 1023 / 16384) / 4096) / 62)
    assert share[1] == pytest.approx(1.0)
    assert estimate_prefill_core_share(nemotron, np.array([4096.0, 65536.0])) == (
        pytest.approx(4 / 52))
    assert estimate_prefill_scan_flops(nemotron) == pytest.approx(24 * 6_553_600 / 52)


def test_windows_shorten_time_to_first_token() -> None:
    """Llama 3.1 8B with every other layer sliding over 4096 tokens, 16,384-token prompts:
    half the layers attend over a quarter of the average context, so prefill is faster."""
    plain = load_model_spec("llama3.1-8b")
    types = tuple("sliding_attention" if i % 2 else mixer
                  for i, mixer in enumerate(plain.layer_mixers))
    windowed = with_pattern(plain, layer_types=types, sliding_window=4096)
    assert np.all(serve(windowed, 32768).ttft_s < serve(plain, 32768).ttft_s)
