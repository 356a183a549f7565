"""The three views of a serving plan's memory (issue 43: allocated, reserved, device, the same
MEMORY_VIEWS as training plans), pinned to vLLM's own profile log, and their order.

Source: vLLM PR #10511 ("[core] overhaul memory profiling and fix backward compatibility",
youkaichao, 2024-12-13, https://github.com/vllm-project/vllm/pull/10511), its sanity check
`vllm serve meta-llama/Meta-Llama-3-8B` on one H100:

    total_gpu_memory 79.22GiB, gpu_memory_utilization 0.90,
    the current vLLM instance can use 71.29GiB
    model weights take 14.96GiB; non_torch_memory 1.79GiB;
    PyTorch activation peak memory 1.26GiB; available_kv_cache_memory 53.29GiB

vLLM splits the instance's memory as the views do (vllm/utils/mem_utils.py memory_profiling,
MemorySnapshot.measure: non_torch_memory = used (mem_get_info) - torch.cuda.memory_reserved()):
weights, activation peak and KV cache are torch tensors (allocated: 14.96 + 1.26 + 53.29 =
69.51 GiB), the non-torch memory is what nvidia-smi sees beyond torch's reserved segments
(reserved: 71.29 - 1.79 = 69.50 GiB at the end of the profile run, before CUDA graphs are
captured into torch's pool), and the instance's share is what --gpu-memory-utilization bounds
(device: 71.29 GiB). Llama-3-8B and Llama-3.1-8B have the same shapes (32 layers, hidden 4096,
8 KV heads, vocabulary 128,256), so llama3.1-8b stands in.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cli import cli
from solver.cost.serving.memory import estimate_serving_views
from solver.serve import ServeJob, ServeProblem, solve_serving
from solver.serve.candidates import ServeCandidates
from solver.serve.memory import estimate_serving_memory
from solver.spec.plan import MEMORY_VIEWS, OBSERVED_VIEWS

GIB = 2**30
# vLLM PR #10511, Meta-Llama-3-8B on one H100 (module docstring), GiB.
LOG_REQUESTED = 71.29
LOG_WEIGHTS, LOG_NON_TORCH, LOG_ACTIVATIONS, LOG_KV = 14.96, 1.79, 1.26, 53.29


def llama_8b_on_one_h100():
    problem = ServeProblem(
        model_spec=load_model_spec("llama3.1-8b"), cluster=load_cluster_spec("dgx-h100"),
        num_gpus=1, job=ServeJob(context=8192, input_len=2048, output_len=512))
    memory = estimate_serving_memory(problem, ServeCandidates(tp=1, pp=1, dp=1, ep=1,
                                                              replicas=1))
    return memory, {view: float(v[0]) / GIB for view, v in
                    estimate_serving_views(memory).items()}


def test_the_log_adds_up_as_the_views_split_it() -> None:
    """vLLM's own accounting: weights + non-torch + activation peak + KV = the instance's
    share (71.30 against 71.29 GiB, rounding), so allocated + non-torch = device."""
    assert LOG_WEIGHTS + LOG_NON_TORCH + LOG_ACTIVATIONS + LOG_KV == pytest.approx(
        LOG_REQUESTED, abs=0.02)


def test_allocated_view_against_vllms_profile_log() -> None:
    """allocated = weights 14.96 + activations 1.27 + KV cache 53.46 = 69.69 GiB predicted
    against 14.96 + 1.26 + 53.29 = 69.51 GiB logged (+0.3%)."""
    memory, views = llama_8b_on_one_h100()
    assert float(memory.weights_bytes[0]) / GIB == pytest.approx(LOG_WEIGHTS, abs=0.01)
    assert float(memory.activations_bytes[0]) / GIB == pytest.approx(LOG_ACTIVATIONS, abs=0.02)
    assert views["allocated"] == pytest.approx(LOG_WEIGHTS + LOG_ACTIVATIONS + LOG_KV,
                                               rel=0.01)


def test_reserved_view_against_vllms_profile_log() -> None:
    """reserved = device - non-torch: 71.69 - 1 GiB of CUDA context = 70.69 GiB predicted
    (the 1 GiB CUDA-graph pool inside, as vLLM counts it in the budget since 0.21: "CUDA graph
    memory profiling is enabled (default since v0.21.0)", gpu_worker.py's log in
    https://github.com/gpustack/runner/pull/251) against
    71.29 - 1.79 = 69.50 GiB logged before any graph was captured (+1.7%: our 1 GiB of
    context against the log's 1.79 GiB of non-torch memory)."""
    _, views = llama_8b_on_one_h100()
    assert views["reserved"] == pytest.approx(LOG_REQUESTED - LOG_NON_TORCH, rel=0.025)
    assert views["allocated"] < views["reserved"] < views["device"]


def test_device_view_is_vllms_share_of_the_gpu() -> None:
    """device = 0.9 x 79.65 GiB (nvidia-smi's 81,559 MiB) = 71.69 GiB predicted against
    0.9 x 79.22 = 71.29 GiB logged (torch's total of that H100): +0.6%."""
    _, views = llama_8b_on_one_h100()
    assert views["device"] == pytest.approx(LOG_REQUESTED, rel=0.01)
    assert views["device"] == pytest.approx(0.9 * 79.65, rel=1e-12)


def test_serve_json_carries_the_views_and_names_them() -> None:
    result = CliRunner().invoke(cli, ["serve", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "1", "--context", "8k", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["memory_views"] == {
        **{f"{view}_gb": source for view, source in MEMORY_VIEWS.items()},
        **{f"{view}_gb_observed": source for view, source in OBSERVED_VIEWS.items()}}
    plan = answer["plans"][0]
    assert plan["device_gb"] == plan["memory_gb"]["total"]
    assert plan["allocated_gb"] == pytest.approx(
        plan["memory_gb"]["weights"] + plan["memory_gb"]["kv_cache"]
        + plan["memory_gb"]["activations"], abs=2e-3)
    assert plan["allocated_gb"] / 1.073741824 == pytest.approx(
        LOG_WEIGHTS + LOG_ACTIVATIONS + LOG_KV, rel=0.01)


def test_serve_table_shows_the_views_and_which_to_compare() -> None:
    result = CliRunner().invoke(cli, ["serve", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "1", "--context", "8k"])
    assert result.exit_code == 0, result.output
    assert "device GB" in result.stdout
    assert "alloc GB" not in result.stdout  # the table keeps one memory view, as optimize's
    line = next(s for s in result.stdout.splitlines() if s.startswith("memory per GPU of plan"))
    for view, source in MEMORY_VIEWS.items():
        assert f"{source} with {view} (" in line


MODELS = ["llama3.1-8b", "llama3.1-70b", "qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3",
          "gemma2-9b"]
CLUSTERS = ["dgx-h100", "dgx-a100-40gb", "dgx-h200", "l40s-pcie"]


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.sampled_from(CLUSTERS), st.sampled_from([1, 2, 4, 8, 16]),
       st.sampled_from([4096, 32768]), st.sampled_from(["bf16", "fp8"]),
       st.floats(0.5, 0.95))
def test_views_are_ordered_and_device_is_the_total(model: str, cluster: str, gpus: int,
                                                   context: int, precision: str,
                                                   utilization: float) -> None:
    """allocated <= reserved <= device for every serving plan, device the plan's total."""
    problem = ServeProblem(
        model_spec=load_model_spec(model), cluster=load_cluster_spec(cluster), num_gpus=gpus,
        job=ServeJob(context=context, input_len=min(2048, context // 2), output_len=512,
                     precision=precision, gpu_memory_utilization=utilization))
    for plan in solve_serving(problem).plans:
        views = plan.views_bytes
        assert 0 < views["allocated"] <= views["reserved"] <= views["device"]
        assert views["device"] == pytest.approx(plan.memory_bytes["total"], rel=1e-12)
