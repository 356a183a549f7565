"""Engine host overhead: the CPU time of a serving engine's step (scheduling, input
preparation, sampling bookkeeping, detokenisation, output objects) that the GPU waits for, by
engine generation. Each number is a profile published by the engine's authors or its
contributors; none is fitted to the accuracy rows (benchmarks/serve_accuracy.py).

Per scheduler round of d running sequences and GPU time t_gpu, the exposed host seconds are

    h(d, t_gpu) = (step_s + per_seq_s x d + gpu_fraction x t_gpu) / steps_per_schedule
                  (+ sync_step_s + sync_per_seq_s x d with pipeline parallelism)

  vllm-v1-sync      vLLM V1 before asynchronous scheduling (0.8 up to PR #27614): the gap
                    left between two decode steps under CUDA graphs, 150-170 us at batch 256
                    (vLLM PR #11133, its author's profile, December 2024, before async
                    scheduling existed): step_s = 160 us, no round built ahead.
  vllm              vLLM V1 with asynchronous scheduling (the scheduler runs one step ahead
                    of the GPU, the NanoFlow design: vLLM PR #19970; the default since
                    #27614): the same 160 us kept as what a step exposes (PR #11133's gap is
                    the synchronous one, an upper bound here; no profile of the asynchronous
                    gap is at hand), and a round built ahead (lag_rounds, below).
  vllm-v0           the V0 engine of vLLM 0.6-0.10 with the asynchronous output processor
                    (RFC #6913): the gap between two decodes is 5-6 ms at batch 256 on
                    Llama-2-7B / ShareGPT, the output processing of the batch contending for
                    the GIL (vLLM issue #10634): per_seq_s = 5.5 ms / 256 = 21.5 us.
                    With --num-scheduler-steps n (vLLM 0.6 multi-step scheduling, RFC #6854)
                    the scheduler and the output processing run once per n steps: the ~4 ms
                    GPU bubble of a decode step "only needs to be incurred once for every 8
                    decode" steps (RFC #6854's profile, Llama 3 8B): step_s = 4 ms, paid
                    once per n steps, and new prompts join only when the n steps end
                    (vllm/engine/llm_engine.py _has_remaining_steps: every scheduled group
                    runs the same remaining steps). With pipeline parallelism V0 turns the
                    asynchronous output processor off ("Async output processing can not be
                    enabled with pipeline parallel", vllm/config.py, 0.6-0.7), so the
                    output processing of the batch shows as well: 0.2 ms at batch 1, 3.4 ms
                    at batch 32 on Llama-3-70B, 4 x H100 (RFC #6913's profile of
                    _process_model_outputs): sync_step_s = 0.1 ms, sync_per_seq_s = 3.2 ms
                    / 31 = 103 us where pp > 1.
  sglang            SGLang 0.4+ with its overlap scheduler: Nsight shows no idle time between
                    decode batches (SGLang v0.4 blog, 2024-12-04, "Zero-Overhead Batch
                    Scheduler"): nothing exposed.
  sglang-v0.3       SGLang before the overlap scheduler: overlapping the CPU work raised
                    throughput 1.1x (the same blog), so the CPU work that showed was a tenth
                    of the GPU's: gpu_fraction = 0.1.

Per request, every engine's OpenAI-compatible frontend (FastAPI, the tokenizer and the IPC to
the scheduler; vLLM V1's API server process, V0's and SGLang's TokenizerManager) adds to the
time to first token, once, off the GPU's path:

    frontend_s(I) = request_s + prompt_token_s x I
    request_s       3.86 ms: one request through vLLM's API server on a Xeon Platinum 8575C
                    host, 8.30 ms in all less the 4.44 ms the engine took (_collect_batch):
                    create, check, validate, preprocess (its tokenizer), prepare, build the
                    response (vLLM PR #27407, its author's timestamps, October 2025). SGLang's
                    frontend has the same parts (HTTP server, TokenizerManager, ZMQ to the
                    scheduler); no profile of its own is at hand, so it takes vLLM's.
    prompt_token_s  1.34 us per prompt token: 100 prompts of 10,000 tokens tokenised one
                    after another in 1.338 s (vLLM PR #19334, before its micro-batching; the
                    server path of each request included, so an upper bound).
Detokenisation and streaming run in the frontend beside the next steps (V1's
OutputProcessor, SGLang's DetokenizerManager): they show only once the frontend saturates,
which is not modelled.

An overlapping scheduler (vllm, sglang) builds round k + 1 while the GPU runs round k, so a
prompt that arrives during round k joins round k + 2 at the earliest: one more round of wait
before its first chunk (lag_rounds = 1; vLLM PR #19970: "the scheduler operate[s] one step
ahead of the current execution"; TensorRT-LLM's overlap scheduler, the same design: "The
optimization introduces one extra decoding step").

Worked numbers: vLLM V0 at 64 sequences exposes 64 x 21.5 us = 1.38 ms a step; with
--num-scheduler-steps 10, 4 ms / 10 = 0.4 ms. A 1,024-token prompt's frontend:
3.86 ms + 1,024 x 1.34 us = 5.23 ms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np

EngineName = Literal["vllm", "vllm-v1-sync", "vllm-v0", "sglang", "sglang-v0.3"]
ENGINE_NAMES: tuple[str, ...] = get_args(EngineName)

VLLM_ASYNC_GAP_S = 160e-6  # vLLM PR #11133: 150-170 us between decodes, batch 256 (V1)
VLLM_V0_GAP_S = 5.5e-3  # vLLM issue #10634: 5-6 ms between decodes at batch 256
VLLM_V0_GAP_BATCH = 256
VLLM_V0_BUBBLE_S = 4e-3  # vLLM RFC #6854: ~4 ms GPU bubble per single-step decode
# vLLM RFC #6913: _process_model_outputs 0.2 ms at batch 1, 3.4 ms at batch 32
VLLM_V0_OUTPUT_S = ((1, 0.2e-3), (32, 3.4e-3))
SGLANG_OVERLAP_SPEEDUP = 1.1  # SGLang v0.4 blog: the overlap scheduler's throughput gain
FRONTEND_REQUEST_S = 8.2998e-3 - 4.4449e-3  # vLLM PR #27407: API server total less the engine
FRONTEND_PROMPT_TOKEN_S = 1.338 / (100 * 10_000)  # vLLM PR #19334: 100 x 10,000 tokens, 1.338 s


@dataclass(frozen=True)
class EngineOverhead:
    """Exposed host seconds of a scheduler round (module docstring)."""

    step_s: float = 0.0
    per_seq_s: float = 0.0
    gpu_fraction: float = 0.0
    steps_per_schedule: int = 1
    lag_rounds: int = 0
    sync_step_s: float = 0.0  # where pp > 1 (vLLM V0: no async output processing)
    sync_per_seq_s: float = 0.0
    request_s: float = 0.0  # the frontend's per-request time (docstring)
    prompt_token_s: float = 0.0

    def frontend_s(self, prompt_tokens) -> np.ndarray:
        """frontend_s(I): the frontend's seconds for a prompt of I tokens, once per request
        before its first chunk is scheduled."""
        return self.request_s + self.prompt_token_s * np.asarray(prompt_tokens, dtype=float)

    def exposed_s(self, running_seqs, gpu_s, pp=1) -> np.ndarray:
        """h(d, t_gpu): the host seconds the GPU waits for in one round of an engine of
        `pp` pipeline stages."""
        d = np.asarray(running_seqs, dtype=float)
        gpu = np.asarray(gpu_s, dtype=float)
        host = (self.step_s + self.per_seq_s * d) / self.steps_per_schedule
        sync = np.where(np.asarray(pp) > 1, self.sync_step_s + self.sync_per_seq_s * d, 0.0)
        return host + self.gpu_fraction * gpu + sync


def engine_overhead(engine: EngineName, num_scheduler_steps: int = 1) -> EngineOverhead:
    """The host overhead of `engine` (module docstring): its steps' and its frontend's;
    `num_scheduler_steps` is vLLM V0's --num-scheduler-steps (1: single-step scheduling)."""
    return replace(_step_overhead(engine, num_scheduler_steps), request_s=FRONTEND_REQUEST_S,
                   prompt_token_s=FRONTEND_PROMPT_TOKEN_S)


def _step_overhead(engine: EngineName, num_scheduler_steps: int = 1) -> EngineOverhead:
    """The per-step part of engine_overhead."""
    if engine == "vllm":
        return EngineOverhead(step_s=VLLM_ASYNC_GAP_S, lag_rounds=1)
    if engine == "vllm-v1-sync":
        return EngineOverhead(step_s=VLLM_ASYNC_GAP_S)
    if engine == "vllm-v0":
        (batch_1, output_1), (batch_2, output_2) = VLLM_V0_OUTPUT_S
        per_seq = (output_2 - output_1) / (batch_2 - batch_1)
        sync = {"sync_step_s": output_1 - per_seq * batch_1, "sync_per_seq_s": per_seq}
        if num_scheduler_steps > 1:
            return EngineOverhead(step_s=VLLM_V0_BUBBLE_S,
                                  steps_per_schedule=num_scheduler_steps, **sync)
        return EngineOverhead(per_seq_s=VLLM_V0_GAP_S / VLLM_V0_GAP_BATCH, **sync)
    if engine == "sglang":
        return EngineOverhead(lag_rounds=1)
    if engine == "sglang-v0.3":
        return EngineOverhead(gpu_fraction=SGLANG_OVERLAP_SPEEDUP - 1.0)
    raise ValueError(f"unknown engine {engine!r}")
