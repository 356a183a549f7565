"""vLLM's rules and the serving targets as named constraints (solver.search.constraints'
Constraint: a name, the degrees it reads, a one-line rule, a vectorised check).

Rules, each from vLLM's code:
  tp_divides_heads            ModelConfig.verify_with_parallel_config: "Total number of
                              attention heads (..) must be divisible by tensor parallel size".
  tp_kv_heads_compatible      QKVParallelLinear (vllm/model_executor/layers/linear.py, e.g.
                              commit 8c94938c, lines 1027-1045): tp >= KV heads replicates them
                              (num_kv_head_replicas = divide(tp, kv_heads)), else splits them
                              (divide(kv_heads, tp)); `divide` asserts exact division either
                              way. MLA models cache one latent per token: no KV-head rule.
  pp_at_most_layers           get_pp_indices gives every stage at least one layer.
  ep_is_tp_x_dp               FusedMoEParallelConfig.make (vllm/model_executor/layers/
                              fused_moe/config.py, commit 002d6073): with
                              --enable-expert-parallel the expert group is every tp x dp GPU
                              (ep = tp x dp), else ep = 1 and TP is flattened over tp x dp.
  ep_divides_experts          whole experts per GPU (vLLM's determine_expert_map gives the
                              remainder to some ranks; parplan keeps the expert layers
                              balanced, as the issue asks).
  moe_tp_divides_expert_width without expert parallel, FusedMoEConfig asserts that the
                              flattened tp x dp divides moe_intermediate_size.
  dense_model_has_no_ep       --enable-expert-parallel needs experts.
  nvfp4_kv_cache_supported    --kv-cache-dtype fp4 (nvfp4) only where vLLM's attention keeps
                              it (_kv_cache_rules).
Placement (seed 002 and vLLM's distributed-serving guide, "tensor parallel size = GPUs per
node, pipeline parallel size = nodes"):
  tp_within_nvlink            TP's per-token all-reduces stay inside the NVLink domain (inside a
                              node when its GPUs meet over PCIe only).
  pp_across_nodes             an engine larger than a node takes whole nodes (tp x pp a
                              multiple of the node), so only pipeline hand-offs cross nodes.
Pins: pin_tp, pin_pp, pin_dp, pin_ep, pin_replicas (--tp 8, --pp 1-4, as optimize's).
Targets: memory_fits_hbm (one --context sequence fits the KV cache; vLLM refuses to start
otherwise), ttft_within_slo, tpot_within_slo, throughput_meets_target, gpus_at_most
(objective gpus). Every rule reads tp, pp, dp and ep only, never the GPU count: adding whole
engines (dp for a dense model, replicas for a MoE) keeps a plan legal.
"""

from __future__ import annotations

import numpy as np

from solver.search.constraints import MEMORY_CONSTRAINT, Constraint, model_shape_constraints
from solver.serve.candidates import SERVE_VARIABLES, ServeCandidates
from solver.serve.estimate import estimate_serving
from solver.serve.job import ServeProblem
from solver.serve.load import estimate_serving_load

HARD = ("tp_divides_heads", "tp_kv_heads_compatible", "pp_at_most_layers", "ep_is_tp_x_dp",
        "nvfp4_kv_cache_supported",
        "ep_divides_experts", "moe_tp_divides_expert_width", "dense_model_has_no_ep")


def tp_domain(problem: ServeProblem) -> tuple[int, str]:
    """The GPUs a TP group may span and how to call them."""
    cluster = problem.cluster
    if cluster.scale_up_gpus > 1:
        return cluster.scale_up_gpus, f"the NVLink domain ({cluster.scale_up_gpus} GPUs)"
    return cluster.gpus_per_node, f"a node ({cluster.gpus_per_node} GPUs over PCIe)"


def _model_rules(problem: ServeProblem) -> list[Constraint]:
    m = problem.model_spec
    kv = m.kv_heads
    rules = model_shape_constraints(m)
    if not m.is_mla:
        rules.insert(1, Constraint(
            "tp_kv_heads_compatible", ("tp",),
            f"tp must divide num_key_value_heads ({kv}) or be a multiple of it (vLLM then "
            "replicates each KV head)",
            lambda v: (kv % v["tp"] == 0) | (v["tp"] % kv == 0)))
    if not m.is_moe:
        rules.append(Constraint("dense_model_has_no_ep", ("ep",),
                                f"{m.name} has no experts: no expert parallel (ep = 1)",
                                lambda v: v["ep"] == 1))
        return rules
    experts, width = m.num_experts, m.moe_intermediate_size
    rules += [
        Constraint("ep_is_tp_x_dp", ("tp", "dp", "ep"),
                   "with --enable-expert-parallel ep = tp x dp, without it ep = 1",
                   lambda v: (v["ep"] == 1) | (v["ep"] == v["tp"] * v["dp"])),
        Constraint("ep_divides_experts", ("ep",),
                   f"ep must divide num_experts ({experts})",
                   lambda v: experts % v["ep"] == 0),
        Constraint("moe_tp_divides_expert_width", ("tp", "dp", "ep"),
                   f"without expert parallel, tp x dp must divide moe_intermediate_size "
                   f"({width})",
                   lambda v: (v["ep"] > 1) | (width % (v["tp"] * v["dp"]) == 0)),
    ]
    return rules


def _pin_rules(problem: ServeProblem) -> list[Constraint]:
    """pin_<degree>: --tp / --pp / --dp / --ep / --replicas, as optimize's pins
    (solver.search.constraints): the degree takes one of the pinned values. Each reads the
    copies too, so it is checked once a dense model's dp holds them (solver.serve.enumerate
    binds both when it scales out)."""
    def pin(name: str, allowed: tuple[int, ...]) -> Constraint:
        values = np.array(sorted(allowed))
        shown = ", ".join(str(x) for x in values)
        reads = (name,) if name == "replicas" else (name, "replicas")
        return Constraint(f"pin_{name}", reads, f"{name} pinned to {{{shown}}}",
                          lambda v: np.isin(v[name], values))

    return [pin(name, allowed) for name, allowed in sorted(problem.pins.items())]


def _kv_cache_rules(problem: ServeProblem) -> list[Constraint]:
    """nvfp4_kv_cache_supported: vLLM 0.33.0 keeps an nvfp4 KV cache only in FlashInfer's
    GQA/MHA attention on NVIDIA GPUs with FP4 hardware, Blackwell (GpuSpec
    block_scaled_formats holds "nvfp4"): its MLA backends take no nvfp4 (nvfp4_ds_mla is
    DeepSeek-V3.2's sparse MLA on SM 100 only); the TRT-LLM attention backend admits nvfp4
    only on the SM 100 family (supports_kv_cache_dtype: is_device_capability_family(100));
    the cache write (reshape_and_cache_nvfp4, whose e2m1 conversion, PTX cvt .e2m1x2, exists
    on sm_100a and later only) is tested only from compute capability 10.0 (vLLM's cache
    kernel test: "NVFP4 requires compute capability >= 10.0 (Blackwell)"), and Hopper has no
    FP4 format at all (NVIDIA H100 datasheet: FP8 is its narrowest Tensor Core type). So no
    nvfp4 KV cache on H100/H200/A100 (issue 37: it was accepted there). The rule reads no
    degree: it refuses every plan, naming why."""
    if problem.job.kv_cache_dtype != "fp4":
        return []
    m, gpu = problem.model_spec, problem.cluster.gpu
    blackwell = "nvfp4" in gpu.block_scaled_formats and gpu.vendor == "nvidia"
    why = None
    if m.is_mla:
        why = f"{m.name} uses MLA, whose vLLM attention backends keep no nvfp4 KV cache"
    elif gpu.vendor != "nvidia":
        why = f"vLLM's nvfp4 KV cache runs on NVIDIA GPUs only, not {gpu.name}"
    elif not blackwell:
        why = (f"{gpu.name} has no FP4 (Blackwell and later): vLLM writes an nvfp4 KV cache "
               "from compute capability 10.0 only")
    ok = why is None
    return [Constraint("nvfp4_kv_cache_supported", ("tp",),
                       why or "--kv-cache-dtype fp4 (vLLM's nvfp4): GQA/MHA attention on an "
                              "NVIDIA GPU", lambda v: np.full(np.shape(v["tp"]), ok))]


def _placement_rules(problem: ServeProblem) -> list[Constraint]:
    domain, where = tp_domain(problem)
    node = problem.cluster.gpus_per_node
    return [
        Constraint("tp_within_nvlink", ("tp",), f"tp must divide {where}",
                   lambda v: domain % v["tp"] == 0),
        Constraint("pp_across_nodes", ("tp", "pp"),
                   f"an engine larger than a node ({node} GPUs) takes whole nodes: tp x pp "
                   f"at most {node} or a multiple of it",
                   lambda v: (v["tp"] * v["pp"] <= node) | (v["tp"] * v["pp"] % node == 0)),
    ]


def _evaluated(problem: ServeProblem, values) -> object:
    return estimate_serving(problem, ServeCandidates.from_values(dict(values)))


def _target_rules(problem: ServeProblem) -> list[Constraint]:
    job = problem.job
    context = job.context
    rules = [Constraint(
        MEMORY_CONSTRAINT, SERVE_VARIABLES,
        f"weights, activations, reserves and the KV cache of one {context:,}-token sequence "
        f"must fit {job.gpu_memory_utilization:g} x the GPU's "
        f"{problem.cluster.memory_headroom.describe(problem.cluster.gpu_memory_bytes)}",
        lambda v: _evaluated(problem, v).memory.fits)]
    if job.load.kind != "none":
        rules += _load_rules(problem)
    else:
        rules += _idle_rules(problem)
    if job.min_tokens_per_s is not None and job.objective != "gpus":
        target = job.min_tokens_per_s
        rules.append(Constraint(
            "throughput_meets_target", SERVE_VARIABLES,
            f"the deployment must generate at least {target:,.0f} output tokens/s",
            lambda v: _evaluated(problem, v).tokens_per_s >= target * (1 - 1e-12)))
    if job.objective == "gpus":
        n = problem.num_gpus
        rules.append(Constraint(
            "gpus_at_most", SERVE_VARIABLES,
            f"tp x pp x dp x replicas must be at most --gpus ({n})",
            lambda v: np.asarray(v["tp"] * v["pp"] * v["dp"] * v["replicas"]) <= n))
    return rules


def _idle_rules(problem: ServeProblem) -> list[Constraint]:
    """Without a load: the SLOs of one request on an idle engine."""
    job = problem.job
    rules = []
    if job.max_ttft_ms is not None:
        limit_ttft = job.max_ttft_ms * 1e-3
        rules.append(Constraint(
            "ttft_within_slo", SERVE_VARIABLES,
            f"time to first token of a {job.input_len:,}-token prompt must be at most "
            f"{job.max_ttft_ms:g} ms",
            lambda v: _evaluated(problem, v).ttft_s <= limit_ttft))
    if job.max_tpot_ms is not None:
        limit_tpot = job.max_tpot_ms * 1e-3
        rules.append(Constraint(
            "tpot_within_slo", SERVE_VARIABLES,
            f"time per output token must be at most {job.max_tpot_ms:g} ms (at batch 1)",
            lambda v: _evaluated(problem, v).tpot_idle_s <= limit_tpot))
    return rules


def _load_rules(problem: ServeProblem) -> list[Constraint]:
    """With --request-rate or --concurrency: the load model's latency at that load, at the SLO
    percentile (solver.cost.serving.load)."""
    job = problem.job
    load = job.load
    offered = (f"{load.request_rate:g} requests/s" if load.request_rate is not None
               else f"{load.concurrency:,} concurrent users")
    where = f"at p{load.slo_percentile} under {offered}"

    def point(v):
        return estimate_serving_load(problem, ServeCandidates.from_values(dict(v))).point

    rules = [Constraint("carries_load", SERVE_VARIABLES,
                        f"the deployment must carry {offered} without its queues growing "
                        "without bound (KV cache, max_num_seqs, token budget)",
                        lambda v: point(v).stable)]
    if job.max_ttft_ms is not None:
        limit_ttft = job.max_ttft_ms * 1e-3
        rules.append(Constraint(
            "ttft_within_slo", SERVE_VARIABLES,
            f"time to first token {where} must be at most {job.max_ttft_ms:g} ms",
            lambda v: point(v).ttft_s <= limit_ttft))
    if job.max_tpot_ms is not None:
        limit_tpot = job.max_tpot_ms * 1e-3
        rules.append(Constraint(
            "tpot_within_slo", SERVE_VARIABLES,
            f"time per output token {where} must be at most {job.max_tpot_ms:g} ms",
            lambda v: point(v).tpot_s <= limit_tpot))
    return rules


def build_serve_constraints(problem: ServeProblem) -> tuple[Constraint, ...]:
    """Every constraint: the model's rules, placement, then the targets (costly, last)."""
    return tuple(_model_rules(problem) + _pin_rules(problem) + _kv_cache_rules(problem)
                 + _placement_rules(problem) + _target_rules(problem))


def is_hard(constraint: Constraint) -> bool:
    """A rule of the model's shape that no option lifts."""
    return constraint.name in HARD
