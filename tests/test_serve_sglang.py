"""SGLang launch lines (solver.emit.sglang): vLLM's degrees in SGLang's server arguments
(python/sglang/srt/server_args.py), aggregated and as a disaggregated pair."""

from __future__ import annotations

import shlex

from solver.emit.sglang import SglangEngine, build_sglang_args, render_sglang_pair


def flags(args: list[str]) -> dict[str, str]:
    out = {}
    for i, word in enumerate(args):
        if word.startswith("--"):
            nxt = args[i + 1] if i + 1 < len(args) else ""
            out[word] = "" if nxt.startswith("--") else nxt
    return out


def test_dense_copies_are_dp_times_tp() -> None:
    engine = SglangEngine("meta-llama/Llama-3.1-70B", tp=4, pp=1, dp=2, ep=1, context=8192,
                          memory_share=0.9, kv_cache_dtype="fp8", max_running_requests=128,
                          chunked_prefill_size=8192)
    f = flags(build_sglang_args(engine))
    assert (f["--tp-size"], f["--dp-size"]) == ("4", "2")
    assert "--enable-dp-attention" not in f and "--pp-size" not in f
    assert f["--kv-cache-dtype"] == "fp8_e4m3" and f["--max-running-requests"] == "128"
    assert f["--chunked-prefill-size"] == "8192" and f["--mem-fraction-static"] == "0.9"


def test_moe_dp_with_ep_is_dp_attention_over_every_gpu() -> None:
    """vLLM --data-parallel-size 8 --enable-expert-parallel at tp 1 (8 GPUs, ep 8) is one
    SGLang engine of 8 GPUs with 8 attention DP ranks and experts over all 8."""
    engine = SglangEngine("deepseek-ai/DeepSeek-V3", tp=1, pp=1, dp=8, ep=8, context=8192,
                          memory_share=0.9, precision="fp8")
    f = flags(build_sglang_args(engine))
    assert (f["--tp-size"], f["--dp-size"], f["--ep-size"]) == ("8", "8", "8")
    assert "--enable-dp-attention" in f and f["--quantization"] == "fp8"


def test_pair_has_modes_and_router() -> None:
    engine = SglangEngine("m", tp=2, pp=1, dp=1, ep=1, context=4096, memory_share=0.9)
    prefill, decode, router = (shlex.split(line) for line in render_sglang_pair(engine, engine))
    assert flags(prefill)["--disaggregation-mode"] == "prefill"
    assert flags(decode)["--disaggregation-mode"] == "decode"
    assert flags(decode)["--disaggregation-transfer-backend"] == "nixl"
    assert router[:3] == ["python", "-m", "sglang_router.launch_router"]
    assert "--pd-disaggregation" in router
