"""--kv-cache-dtype fp4: vLLM 0.33.0's nvfp4 KV cache (9/16 B per element: head / 2 B of fp4
data and head / 16 B of fp8 scales per head, vllm/utils/torch_utils.py
nvfp4_kv_cache_full_dim), its launch flags (vLLM nvfp4, SGLang fp4_e2m1) and the named rule
where vLLM keeps none (MLA backends; GPUs without FP4, below Blackwell)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cli import cli
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.serve.memory import estimate_kv_bytes_per_token
from solver.serve.timing import build_engine, estimate_tpot_s


def problem_of(model: str, dtype: str, cluster: str = "dgx-h100") -> ServeProblem:
    return ServeProblem(model_spec=load_model_spec(model),
                        cluster=load_calibrated_cluster(cluster, None, None), num_gpus=8,
                        job=ServeJob(context=8192, input_len=2048, output_len=512,
                                     kv_cache_dtype=dtype))


def test_nvfp4_kv_bytes_per_token() -> None:
    """Llama-3.1-8B at tp 1: 2 x 32 layers x 8 KV heads x (128 / 2 + 128 / 16) B = 36,864 B,
    9/32 of bf16's 131,072 B."""
    tp, pp = np.array([1]), np.array([1])
    fp4 = estimate_kv_bytes_per_token(problem_of("llama3.1-8b", "fp4"), tp, pp)
    bf16 = estimate_kv_bytes_per_token(problem_of("llama3.1-8b", "auto"), tp, pp)
    assert float(fp4[0]) == 2 * 32 * 8 * (128 // 2 + 128 // 16) == 36864
    assert float(fp4[0]) == pytest.approx(float(bf16[0]) * 9 / 32)


def test_fp4_kv_reads_less_at_a_large_batch() -> None:
    """Decode at 256 sequences of 2,304 tokens streams their KV cache: fp4 < fp8 < bf16."""
    c = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    tpot = {d: float(estimate_tpot_s(p, build_engine(p, c), np.array([256.0]))[0])
            for d in ("auto", "fp8", "fp4") for p in [problem_of("llama3.1-8b", d)]}
    assert tpot["fp4"] < tpot["fp8"] < tpot["auto"]


def serve(*args: str):
    return CliRunner().invoke(cli, ["serve", "--context", "8k", "--json", *args])


def test_launch_lines_carry_the_fp4_kv_cache() -> None:
    result = serve("--model", "llama3.1-8b", "--cluster", "dgx-b200", "--gpus", "1",
                   "--kv-cache-dtype", "fp4")
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plans"][0]
    assert "--kv-cache-dtype nvfp4" in plan["vllm_command"]
    assert "--kv-cache-dtype fp4_e2m1" in plan["sglang_command"]


@pytest.mark.parametrize(("model", "cluster", "words"), [
    ("deepseek-v3", "dgx-b200", "MLA"),
    ("llama3.1-8b", "mi300x", "NVIDIA GPUs only"),
    ("llama3.2-1b", "dgx-h100", "has no FP4"),
    ("llama3.1-8b", "dgx-h100", "has no FP4"),  # issue 37: accepted on Hopper before
])
def test_fp4_kv_is_refused_by_name_where_vllm_has_none(model: str, cluster: str,
                                                       words: str) -> None:
    result = serve("--model", model, "--cluster", cluster, "--gpus", "8",
                   "--kv-cache-dtype", "fp4")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "infeasible"
    assert "nvfp4_kv_cache_supported" in answer["conflicts"]
    assert words in json.dumps(answer)


def test_head_size_64_keeps_fp4_kv_on_blackwell() -> None:
    """TRT-LLM's attention kernels on SM 10x read nvfp4 at any head size."""
    result = serve("--model", "llama3.2-1b", "--cluster", "dgx-b200", "--gpus", "1",
                   "--kv-cache-dtype", "fp4")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["status"] == "optimal"


def test_a_refused_fp4_kv_cache_proposes_fp8() -> None:
    answer = json.loads(serve("--model", "deepseek-v2-lite", "--cluster", "dgx-b200", "--gpus",
                              "1", "--kv-cache-dtype", "fp4").stdout)
    assert answer["conflicts"] == ["nvfp4_kv_cache_supported"]
    assert "--kv-cache-dtype fp8" in answer["fixes"]
