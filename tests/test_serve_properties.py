"""Properties of `parplan serve` (hypothesis): every plan obeys vLLM's rules, checked here by an
independent checker (not the solver's constraint code); more GPUs never lower the best
throughput for N -> k x N (and never raise the best latency), while N -> N + 1 can.

Why N -> k x N: the best plan on N GPUs, with k times the independent copies (dense: k x dp,
MoE: k x replicas), is legal on k x N GPUs (every rule reads tp, pp, dp and ep only) and
serves k times the tokens. N -> N + 1 gives no such plan: 17 GPUs only split as 1 x 17.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.serve import ServeJob, ServeProblem, solve_serving
from solver.serve.enumerate import solve_serving_by_enumeration

MODELS = ["llama3.1-8b", "llama3.1-70b", "qwen2.5-7b", "qwen3-30b-a3b", "mixtral-8x7b",
          "deepseek-v2-lite", "deepseek-v3", "gemma2-9b", "qwen3-235b-a22b", "llama2-13b"]
CLUSTERS = ["dgx-h100", "dgx-a100-40gb", "dgx-h200", "l40s-pcie", "mi300x", "gb200-nvl72"]
GPU_COUNTS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64]
SETTINGS = settings(max_examples=30, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=None)
def model(name: str):
    return load_model_spec(name)


@lru_cache(maxsize=None)
def cluster(name: str):
    return load_cluster_spec(name)


problems = st.builds(
    lambda m, c, n, context, precision, objective, tpot: ServeProblem(
        model_spec=model(m), cluster=cluster(c), num_gpus=n,
        job=ServeJob(context=context, input_len=min(2048, context // 2),
                     output_len=min(512, context // 4), precision=precision,
                     objective=objective, max_tpot_ms=tpot)),
    st.sampled_from(MODELS), st.sampled_from(CLUSTERS), st.sampled_from(GPU_COUNTS),
    st.sampled_from([4096, 32768, 131072]), st.sampled_from(["bf16", "fp8", "int4"]),
    st.sampled_from(["throughput", "latency", "gpus"]),
    st.sampled_from([None, None, 30.0, 80.0]))


def vllm_rule_violations(problem: ServeProblem, plan) -> list[str]:
    """vLLM's rules and the planner's placement rules, written again, one plan at a time."""
    m, job, c = problem.model_spec, problem.job, problem.cluster
    bad = []
    gpus = plan.tp * plan.pp * plan.dp * plan.replicas
    if job.objective == "gpus" and gpus > problem.num_gpus or (
            job.objective != "gpus" and gpus != problem.num_gpus):
        bad.append("gpu count")
    if m.num_attention_heads % plan.tp:
        bad.append("attention heads (vLLM ModelConfig)")
    if not m.is_mla and m.kv_heads % plan.tp and plan.tp % m.kv_heads:
        bad.append("KV heads neither split nor replicated (QKVParallelLinear)")
    if plan.pp > m.num_hidden_layers:
        bad.append("a stage without layers")
    domain = c.scale_up_gpus if c.scale_up_gpus > 1 else c.gpus_per_node
    if domain % plan.tp:
        bad.append("TP leaves the NVLink domain")
    engine, node = plan.tp * plan.pp, c.gpus_per_node
    if engine > node and engine % node:
        bad.append("a pipeline engine straddles part of a node")
    if not m.is_moe and (plan.ep != 1 or plan.replicas != 1):
        bad.append("EP or replicas on a dense model")
    if m.is_moe:
        if plan.ep not in (1, plan.tp * plan.dp) or m.num_experts % plan.ep:
            bad.append("EP is not tp x dp dividing the experts")
        if plan.ep == 1 and m.moe_intermediate_size % (plan.tp * plan.dp):
            bad.append("flattened TP does not divide the expert width")
    if not plan.fits or plan.kv_tokens < job.context or plan.max_sequences < 1:
        bad.append("one full-context sequence does not fit")
    if job.max_tpot_ms is not None and plan.tpot_idle_s * 1e3 > job.max_tpot_ms * (1 + 1e-9):
        bad.append("TPOT SLO")
    if job.max_tpot_ms is not None and plan.tpot_s * 1e3 > job.max_tpot_ms * (1 + 1e-9):
        bad.append("TPOT under load over the SLO")
    if not 1 <= plan.batch <= plan.kv_tokens // (job.input_len + job.output_len):
        bad.append("batch outside what the KV cache holds")
    return bad


@SETTINGS
@given(problems)
def test_every_plan_obeys_vllm_rules(problem: ServeProblem) -> None:
    result = solve_serving(problem, top=10)
    for plan in result.plans:
        assert vllm_rule_violations(problem, plan) == [], plan
    if result.status == "infeasible":
        assert result.conflicts and not result.plans


def best_throughput(problem: ServeProblem) -> float:
    ranked = solve_serving_by_enumeration(problem, top=1)
    return float(ranked.estimate.tokens_per_s[0]) if len(ranked.candidates) else 0.0


def best_latency(problem: ServeProblem) -> float:
    ranked = solve_serving_by_enumeration(problem, top=1)
    return float(ranked.estimate.latency_s[0]) if len(ranked.candidates) else float("inf")


@SETTINGS
@given(problems, st.sampled_from([2, 3, 4]))
def test_more_gpus_never_lower_the_best_throughput(problem: ServeProblem, k: int) -> None:
    """N -> k x N: at least k times the tokens/s, never a worse latency."""
    job = problem.job.model_copy(update={"objective": "throughput"})
    small = problem.model_copy(update={"job": job})
    large = small.model_copy(update={"num_gpus": k * problem.num_gpus})
    assert best_throughput(large) >= k * best_throughput(small) * (1 - 1e-9)
    latency = problem.job.model_copy(update={"objective": "latency"})
    small, large = (p.model_copy(update={"job": latency}) for p in (small, large))
    assert best_latency(large) <= best_latency(small) * (1 + 1e-9)


def test_one_more_gpu_can_lower_the_best_throughput() -> None:
    """Llama-3.1-70B on DGX H100: 16 GPUs serve it; 17 (prime) only split as tp 1 x pp 17
    (an engine straddling nodes, pp_across_nodes) or one GPU (141 GB of weights on 80 GB):
    infeasible."""
    base = ServeProblem(model_spec=model("llama3.1-70b"), cluster=cluster("dgx-h100"),
                        num_gpus=16, job=ServeJob(context=8192, input_len=2048, output_len=512))
    assert best_throughput(base) > 0
    seventeen = solve_serving(base.model_copy(update={"num_gpus": 17}))
    assert seventeen.status == "infeasible"
    assert set(seventeen.conflicts) == {"memory_fits_hbm", "pp_across_nodes"}
    assert "--gpus 48" in seventeen.fixes or any(f.startswith("--gpus") for f in seventeen.fixes)

