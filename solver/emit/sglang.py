"""SGLang's `launch_server` for a serving plan, and the prefill / decode pair of a
disaggregated one with its router.

Arguments are SGLang's server arguments (python/sglang/srt/server_args.py): --model-path,
--tp-size, --pp-size, --dp-size (independent copies of the tp x pp engine, or with
--enable-dp-attention the attention data-parallel ranks of one engine whose MoE layers span
--ep-size GPUs: what vLLM's --data-parallel-size with --enable-expert-parallel does, so there
--tp-size counts every GPU of the engine), --context-length, --mem-fraction-static (SGLang's
share of the GPU for weights and KV cache; given vLLM's --gpu-memory-utilization share),
--quantization fp8, --kv-cache-dtype fp8_e4m3, --max-running-requests (vLLM's
--max-num-seqs), --chunked-prefill-size (vLLM's --max-num-batched-tokens).
Disaggregation: --disaggregation-mode prefill|decode, --disaggregation-transfer-backend
(nixl or mooncake), and `python -m sglang_router.launch_router --pd-disaggregation --prefill
URL --decode URL` in front (SGLang docs, "PD Disaggregation").
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from solver.spec.model_ref import render_model_tokens


@dataclass(frozen=True)
class SglangEngine:
    """What one launch_server needs: the model, the engine's degrees and the job's settings."""

    model_id: str
    tp: int
    pp: int
    dp: int
    ep: int
    context: int
    memory_share: float
    precision: str = "bf16"
    kv_cache_dtype: str = "auto"
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None


def build_sglang_args(engine: SglangEngine, mode: str | None = None,
                      transfer_backend: str = "nixl", port: int | None = None) -> list[str]:
    """`python -m sglang.launch_server ...` as tokens; `mode` prefill or decode for a
    disaggregated pool."""
    e = engine
    args = ["python", "-m", "sglang.launch_server",
            *render_model_tokens(e.model_id, "--model-path")]
    if e.ep > 1:  # vLLM's DP + EP: one engine of tp x dp GPUs, attention data parallel
        args += ["--tp-size", str(e.tp * e.dp)]
        if e.dp > 1:
            args += ["--dp-size", str(e.dp), "--enable-dp-attention"]
        args += ["--ep-size", str(e.ep)]
    else:
        args += ["--tp-size", str(e.tp)]
        if e.dp > 1:
            args += ["--dp-size", str(e.dp)]
    if e.pp > 1:
        args += ["--pp-size", str(e.pp)]
    args += ["--context-length", str(e.context),
             "--mem-fraction-static", f"{round(e.memory_share, 4):g}"]
    if e.precision == "fp8":
        args += ["--quantization", "fp8"]
    if e.kv_cache_dtype in ("fp8", "fp4"):  # server_args.py --kv-cache-dtype choices
        args += ["--kv-cache-dtype", {"fp8": "fp8_e4m3", "fp4": "fp4_e2m1"}[e.kv_cache_dtype]]
    if e.max_running_requests is not None:
        args += ["--max-running-requests", str(e.max_running_requests)]
    if e.chunked_prefill_size is not None:
        args += ["--chunked-prefill-size", str(e.chunked_prefill_size)]
    if mode is not None:
        args += ["--disaggregation-mode", mode, "--disaggregation-transfer-backend",
                 transfer_backend]
    if port is not None:
        args += ["--port", str(port)]
    return args


def render_sglang(engine: SglangEngine) -> str:
    return " ".join(shlex.quote(a) for a in build_sglang_args(engine))


def render_sglang_pair(prefill: SglangEngine, decode: SglangEngine,
                       transfer_backend: str = "nixl") -> list[str]:
    """The prefill server, the decode server and the router, one shell line each (ports
    30000 / 30001 on one host; put the real hosts in the router's URLs)."""
    lines = [build_sglang_args(prefill, "prefill", transfer_backend, 30000),
             build_sglang_args(decode, "decode", transfer_backend, 30001),
             ["python", "-m", "sglang_router.launch_router", "--pd-disaggregation",
              "--prefill", "http://127.0.0.1:30000", "--decode", "http://127.0.0.1:30001",
              "--port", "8000"]]
    return [" ".join(shlex.quote(a) for a in line) for line in lines]
