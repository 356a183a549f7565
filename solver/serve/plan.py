"""ServePlan: one ranked serving configuration with its numbers, and the vLLM command line
that launches it (shell-quoted).

vLLM flags (vllm serve --help): --tensor-parallel-size, --pipeline-parallel-size,
--data-parallel-size, --enable-expert-parallel, --max-model-len, --gpu-memory-utilization,
--quantization fp8 (dynamic fp8 weights from a bf16 checkpoint), --kv-cache-dtype fp8. int4
weights come from an AWQ / GPTQ checkpoint, whose quantization vLLM reads from its config.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

from solver.cost.serving.memory import estimate_serving_views
from solver.serve.enumerate import RankedServe, load_is_active
from solver.serve.job import ServeProblem, scheduler_limits
from solver.serve.load import ServeLoad, estimate_max_num_seqs
from solver.spec.model_ref import render_model_reference, render_model_tokens


@dataclass(frozen=True)
class ServePlan:
    """A serving configuration (degrees) and what the model predicts for it; bytes per GPU
    of the worst stage, seconds, tokens per second of the whole deployment. `memory_bytes`
    holds the items and their total; `views_bytes` the same memory in the three views
    (solver.spec.plan.MEMORY_VIEWS, solver.cost.serving.memory): device is the total."""

    tp: int
    pp: int
    dp: int
    ep: int
    replicas: int
    num_gpus: int
    fits: bool
    memory_bytes: dict[str, float]
    views_bytes: dict[str, float]
    kv_bytes_per_token: float
    kv_tokens: int
    max_sequences: int
    batch: int
    ttft_s: float
    tpot_s: float
    tpot_idle_s: float
    latency_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    decode_step_s: dict[str, float]
    command: str
    notes: tuple[str, ...]
    load: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, int] = field(default_factory=dict)


def build_load_report(load: ServeLoad, i: int) -> dict[str, Any]:
    """Plan i's load numbers (seconds, requests/s, tokens/s): idle latency, the operating
    point, and the most load within the SLO; inf (not carried) becomes None."""
    def number(value: Any) -> float | None:
        value = float(value)
        return value if value == value and abs(value) != float("inf") else None

    point = load.point
    return {
        "idle": {"ttft_s": number(load.ttft_idle_s[i]), "tpot_s": number(load.tpot_idle_s[i])},
        "at_load": {
            "request_rate": number(point.rate_per_s[i]),
            "concurrency": number(point.concurrency[i]), "stable": bool(point.stable[i]),
            "meets_slo": bool(load.meets_slo[i]),
            "decoding_per_engine": number(point.decoding[i]),
            "ttft_s": number(point.ttft_s[i]), "tpot_s": number(point.tpot_s[i]),
            "ttft_mean_s": number(point.ttft_mean_s[i]),
            "tpot_mean_s": number(point.tpot_mean_s[i]),
            "tokens_per_s": number(point.tokens_per_s[i]),
            "tokens_per_s_per_gpu": number(point.tokens_per_s_per_gpu[i]),
            "tokens_per_s_per_user": number(point.tokens_per_s_per_user[i])},
        "within_slo": {"max_request_rate": number(load.max_rate_per_s[i]),
                       "max_concurrency": number(load.max_concurrency[i])},
    }


def build_plans(problem: ServeProblem, ranked: RankedServe) -> tuple[ServePlan, ...]:
    """Every ranked candidate as a ServePlan."""
    c, e = ranked.candidates, ranked.estimate
    tokens, _ = scheduler_limits(problem)
    max_seqs = estimate_max_num_seqs(problem, ranked.load)
    views = estimate_serving_views(e.memory)
    plans = []
    for i in range(len(c)):
        row = c.row(i)
        scheduler = {"max_num_seqs": int(max_seqs[i]), "max_num_batched_tokens": tokens}
        memory = e.memory
        items = {"weights": memory.weights_bytes[i], "kv_cache": memory.kv_cache_bytes[i],
                 "activations": memory.activations_bytes[i], "other": memory.other_bytes[i]}
        items = {k: float(v) for k, v in items.items()}
        items["total"] = sum(items.values())
        plan_views = {view: float(values[i]) for view, values in views.items()}
        # Our invariant (solver.cost.serving.memory): the device view is the total.
        assert abs(plan_views["device"] - items["total"]) <= 1e-9 * items["total"], plan_views
        plans.append(ServePlan(
            **row, num_gpus=int(e.num_gpus[i]), fits=bool(memory.fits[i]),
            memory_bytes=items, views_bytes=plan_views, kv_bytes_per_token=float(memory.kv_bytes_per_token[i]),
            kv_tokens=int(memory.kv_tokens[i]), max_sequences=int(memory.max_sequences[i]),
            batch=int(e.batch[i]), ttft_s=float(e.ttft_s[i]), tpot_s=float(e.tpot_s[i]),
            tpot_idle_s=float(e.tpot_idle_s[i]), latency_s=float(e.latency_s[i]),
            tokens_per_s=float(e.tokens_per_s[i]),
            tokens_per_s_per_gpu=float(e.tokens_per_s_per_gpu[i]),
            decode_step_s={k: v * 1e-3 for k, v in e.decode.parts_ms(i).items()},
            command=build_vllm_command(problem, row, scheduler),
            notes=tuple(vllm_notes(problem, row)), load=build_load_report(ranked.load, i),
            scheduler=scheduler))
    return tuple(plans)


def model_id(problem: ServeProblem) -> str:
    """The Hugging Face repository of the model's source, the folder of an imported
    config.json (served by its path), else its name (solver.spec.model_ref)."""
    return render_model_reference(problem.model_spec)


def build_vllm_command(problem: ServeProblem, row: dict[str, int],
                       scheduler: dict[str, int] | None = None) -> str:
    """`vllm serve MODEL --tensor-parallel-size .. --pipeline-parallel-size ..
    --data-parallel-size .. [--enable-expert-parallel] --max-model-len ..
    --gpu-memory-utilization .. [--quantization fp8] [--kv-cache-dtype fp8]`, shell-quoted;
    with a load or scheduler limits of the job, the scheduler's --max-num-seqs,
    --max-num-batched-tokens and --enable-chunked-prefill the load model assumed.
    vLLM's share is of the whole GPU: a memory headroom lowers it (0.9 of 90% is 0.81)."""
    job = problem.job
    cluster = problem.cluster
    share = job.gpu_memory_utilization * cluster.usable_memory_bytes / cluster.gpu_memory_bytes
    args = ["vllm", "serve", *render_model_tokens(model_id(problem), "--model", positional=True),
            "--tensor-parallel-size", str(row["tp"]),
            "--pipeline-parallel-size", str(row["pp"]),
            "--data-parallel-size", str(row["dp"])]
    if row["ep"] > 1:
        args.append("--enable-expert-parallel")
    args += ["--max-model-len", str(job.context),
             "--gpu-memory-utilization", f"{round(share, 4):g}"]
    if job.precision == "fp8":
        args += ["--quantization", "fp8"]
    if job.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", {"fp8": "fp8", "fp4": "nvfp4"}[job.kv_cache_dtype]]
    explicit = job.max_num_seqs is not None or job.max_num_batched_tokens is not None
    if scheduler is not None and (load_is_active(problem) or explicit):
        args += ["--max-num-seqs", str(scheduler["max_num_seqs"]),
                 "--max-num-batched-tokens", str(scheduler["max_num_batched_tokens"]),
                 "--enable-chunked-prefill"]
    return " ".join(shlex.quote(arg) for arg in args)


def vllm_notes(problem: ServeProblem, row: dict[str, int]) -> list[str]:
    """What the command alone does not say: multi-node launch, replicas, int4 checkpoints."""
    node = problem.cluster.gpus_per_node
    notes = []
    engine = row["tp"] * row["pp"] * row["dp"]
    if engine > node:
        notes.append(f"one engine spans {-(-engine // node)} nodes: start a Ray cluster on them "
                     "and run the command on its head node (vLLM multi-node serving), or "
                     "split the data-parallel ranks with --data-parallel-size-local")
    if row["replicas"] > 1:
        notes.append(f"run {row['replicas']} copies of this engine ({engine} GPUs each) "
                     "behind a load balancer")
    if problem.job.precision == "fp4":
        fp4_cores = "nvfp4" in problem.cluster.gpu.block_scaled_formats
        notes.append("fp4: serve an NVFP4 checkpoint of the model (ModelOpt FP4; vLLM reads its "
                     "quantization from the checkpoint)" + ("" if fp4_cores else
                     "; this GPU has no FP4 tensor cores, so vLLM runs it weight-only "
                     "(Marlin), as the plan assumes"))
    if problem.job.precision == "int4":
        notes.append("int4: serve an AWQ or GPTQ 4-bit checkpoint of the model (vLLM reads "
                     "its quantization from the checkpoint)")
    return notes


NIXL_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def build_vllm_pair_commands(problem: ServeProblem, prefill: dict[str, int],
                             decode: dict[str, int], scheduler: dict[str, int] | None = None,
                             decode_problem: ServeProblem | None = None) -> list[str]:
    """The disaggregated pair under vLLM: a prefill and a decode `vllm serve` with the
    NixlConnector (--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":
    "kv_both"}' on both, each with its own VLLM_NIXL_SIDE_CHANNEL_PORT; vLLM docs
    "NixlConnector Usage Guide"), and the proxy that sends each request to both (vLLM's
    tests/v1/kv_connector/nixl_integration/toy_proxy_server.py, or llm-d / Dynamo's router).
    `decode_problem`: the decode pool's when it runs on another cluster (its GPU memory)."""
    lines = []
    decode_problem = problem if decode_problem is None else decode_problem
    for role, row, port, side, on in (("prefill", prefill, 8100, 5600, problem),
                                      ("decode", decode, 8200, 5601, decode_problem)):
        command = build_vllm_command(on, {**row, "replicas": 1},
                                     scheduler if role == "decode" else None)
        lines.append(f"VLLM_NIXL_SIDE_CHANNEL_PORT={side} {command} --port {port} "
                     f"--kv-transfer-config {shlex.quote(NIXL_CONFIG)}")
    lines.append("python toy_proxy_server.py --prefiller-hosts localhost --prefiller-ports 8100 "
                 "--decoder-hosts localhost --decoder-ports 8200")
    return lines
