"""Disaggregated prefill and decode (solver.serve.disagg): the aggregated plan is one of the
search's candidates, the KV transfer pinned to its bytes and the tier, launch lines."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.comm import estimate_collective_s, estimate_group_link
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.serve.disagg import estimate_transfer_s, search_disaggregated
from solver.serve.enumerate import enumerate_serving
from solver.serve.load import estimate_serving_load
from solver.serve.workload import ServeLoadSpec


def problem_of(model: str, gpus: int, ttft: float | None, tpot: float | None,
               input_len: int = 4096) -> ServeProblem:
    job = ServeJob(context=8192, input_len=input_len, output_len=512, max_ttft_ms=ttft,
                   max_tpot_ms=tpot, load=ServeLoadSpec())
    return ServeProblem(model_spec=load_model_spec(model),
                        cluster=load_calibrated_cluster("dgx-h100", None, None), num_gpus=gpus,
                        job=job)


@settings(max_examples=8, deadline=None)
@given(st.sampled_from(["llama3.1-8b", "qwen2.5-7b"]), st.sampled_from([2, 4, 8]),
       st.sampled_from([None, 300.0, 2000.0]), st.sampled_from([None, 8.0, 30.0]))
def test_the_aggregated_plan_is_a_candidate(model: str, gpus: int, ttft: float | None,
                                            tpot: float | None) -> None:
    """The search's winner carries at least what the best aggregated plan of `parplan serve`
    carries on the same GPUs, and that plan is the search's aggregated candidate."""
    problem = problem_of(model, gpus, ttft, tpot)
    result = search_disaggregated(problem)
    lifted = problem.model_copy(update={"job": problem.job.model_copy(
        update={"max_ttft_ms": None, "max_tpot_ms": None})})
    candidates = enumerate_serving(lifted)
    best = float(estimate_serving_load(problem, candidates).max_rate_per_s.max())
    assert result.best_aggregated is not None
    assert result.best_aggregated.max_rate_per_s == pytest.approx(best, rel=1e-9)
    assert result.winner.max_rate_per_s >= best * (1 - 1e-9)
    for plan in result.plans:
        assert plan.num_gpus <= gpus


def test_kv_transfer_is_the_prompts_kv_over_the_tier() -> None:
    """Llama-3.1-70B at tp 8, 2,048 tokens: 2,048 x 40,960 B = 83.9 MB per GPU, sent with
    solver.cost.comm's send_recv over NVLink (both pools in one node) or the network."""
    problem = problem_of("llama3.1-70b", 16, None, None)
    engine = ServeCandidates(tp=8, pp=1, dp=1, ep=1, replicas=1)
    cluster = problem.cluster
    for same, stride in ((True, 1), (False, cluster.gpus_per_node)):
        link = estimate_group_link(cluster, np.array([stride]), np.array([2]))
        expected = estimate_collective_s("send_recv", 2048 * 40960.0, np.array([2]), link)
        assert estimate_transfer_s(problem, engine, same, 2048.0) == pytest.approx(expected)
    network = float(estimate_transfer_s(problem, engine, False, 2048.0)[0])
    nvlink = float(estimate_transfer_s(problem, engine, True, 2048.0)[0])
    assert network > 5 * nvlink
    assert network == pytest.approx(2048 * 40960 / 40e9, rel=0.15)  # dgx-h100: 40 GB/s


def test_cli_disaggregated_answer_and_launch_lines() -> None:
    result = CliRunner().invoke(cli, [
        "serve", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16",
        "--context", "8k", "--input-len", "4096", "--max-ttft-ms", "1000", "--max-tpot-ms",
        "20", "--request-rate", "30", "--disaggregated", "--json"])
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)["disaggregated"]
    assert d["winner"] in ("aggregated", "disaggregated") and d["why"].startswith(d["winner"])
    split = d["best_disaggregated"]
    assert split["prefill"]["gpus"] + split["decode"]["gpus"] <= 16
    prefill, decode, proxy = d["vllm_commands"]
    for line in (prefill, decode):
        words = shlex.split(line)
        config = json.loads(words[words.index("--kv-transfer-config") + 1])
        assert config == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    assert "--max-num-seqs" in decode and "toy_proxy_server.py" in proxy
    p, dd, router = d["sglang_commands"]
    assert "--disaggregation-mode prefill" in p and "--disaggregation-mode decode" in dd
    assert "--pd-disaggregation" in router
