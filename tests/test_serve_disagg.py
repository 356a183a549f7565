"""Disaggregated prefill and decode (solver.serve.disagg): the aggregated plan is one of the
search's candidates, more GPUs or a looser SLO never lower the winner, the KV transfer pinned
to its bytes and the tier (also between engines of different TP), the prefill pool's KV
cache, the pairs on the Pareto front, launch lines."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.cost.comm.kv_transfer import estimate_kv_transfer_bytes, estimate_prefill_kv_tokens
from solver.cost.serving.load import estimate_prefill_queue
from solver.serve.disagg import _largest_prefill_rate, estimate_transfer_s, search_disaggregated
from solver.serve.enumerate import enumerate_serving
from solver.serve.load import estimate_load_curves, estimate_serving_load
from solver.serve.pareto import build_pareto_front
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
    solver.cost.comm.comm's send_recv over NVLink (both pools in one node) or the network."""
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


def test_kv_transfer_with_mismatched_tp_worked_numbers() -> None:
    """solver.cost.comm.kv_transfer: NixlConnector's decode ranks each pull their heads from one
    prefill rank, so prefill tp 4 feeding decode tp 8 sends 2 x 83.9 MB per prefill GPU for
    Llama-3.1-70B's 2,048 tokens (40,960 B per token per decode GPU); equal tp: 83.9 MB."""
    same = estimate_kv_transfer_bytes(2048.0, 40960.0, 8, 1, 8, 1)
    wider = estimate_kv_transfer_bytes(2048.0, 40960.0, 4, 1, 8, 1)
    assert float(same) == pytest.approx(83.886e6, rel=1e-4)
    assert float(wider) == pytest.approx(2 * 83.886e6, rel=1e-4)
    assert float(estimate_prefill_kv_tokens(10.0, 2000.0, 0.3, 0.002)) == pytest.approx(6040.0)


def test_transfer_between_mismatched_engines_goes_through_cost_comm() -> None:
    """A tp 2 prefill engine feeding a tp 8 decode engine: the busier side is the prefill
    GPU's egress, 4 x the decode GPU's share of Llama-3.1-70B's KV, one send/recv."""
    problem = problem_of("llama3.1-70b", 16, None, None)
    prefill = ServeCandidates(tp=2, pp=1, dp=1, ep=1, replicas=1)
    decode = ServeCandidates(tp=8, pp=1, dp=1, ep=1, replicas=1)
    link = estimate_group_link(problem.cluster, np.array([1]), np.array([2]))
    expected = estimate_collective_s("send_recv", 4 * 2048 * 40960.0, np.array([2]), link)
    got = estimate_transfer_s(problem, prefill, True, 2048.0, decode)
    assert got == pytest.approx(expected)


def test_nixl_pairs_follow_vllm_0_33() -> None:
    """vLLM 0.33.0's NixlConnector (kv_connector/utils.py tp_ratio, v1/nixl/base_worker.py):
    the larger TP a multiple of the smaller; prefill TP above decode TP refused where the
    prefill engine replicates KV heads (Llama-3.1-8B has 8: tp 16 replicates), allowed for
    MLA; a decode engine of one stage."""
    from solver.serve.disagg import nixl_pairs

    llama = load_model_spec("llama3.1-8b")
    engines = ServeCandidates(tp=np.array([1, 2, 4, 8, 16, 3]), pp=1, dp=1, ep=1, replicas=1)
    ok = nixl_pairs(engines, engines, llama)
    assert ok[0, 3] and ok[3, 0] and ok[1, 2] and ok[2, 1]  # 1 -> 8, 8 -> 1, 2 <-> 4
    assert not ok[1, 5] and not ok[5, 2]  # 2 and 3, 3 and 4 do not divide
    assert ok[3, 4] and not ok[4, 3]  # 8 -> 16 reads split heads; 16 -> 8 replicated
    assert nixl_pairs(engines, engines, load_model_spec("deepseek-v3"))[4, 3]  # MLA
    staged = ServeCandidates(tp=np.array([4, 4]), pp=np.array([1, 2]), dp=1, ep=1, replicas=1)
    pairs = nixl_pairs(staged, staged, llama)
    assert pairs[1, 0] and not pairs[0, 1]  # prefill pp 2 feeds decode pp 1, not the reverse


def test_pairs_follow_nixl_and_mismatched_tp_can_win_a_split() -> None:
    """Every disaggregated plan is a pair NixlConnector accepts (nixl_pairs), and long
    prompts on Llama-3.1-8B make a split whose pools differ in TP."""
    job = ServeJob(context=8192, input_len=4096, output_len=256, max_ttft_ms=1000,
                   max_tpot_ms=30, load=ServeLoadSpec(request_rate=20))
    problem = ServeProblem(model_spec=load_model_spec("llama3.1-8b"),
                           cluster=load_calibrated_cluster("dgx-h100", None, None), num_gpus=8,
                           job=job)
    result = search_disaggregated(problem)
    assert result.candidates
    for plan in result.candidates:
        tps = sorted((plan.decode.degrees["tp"], plan.prefill.degrees["tp"]))
        assert tps[1] % tps[0] == 0 and plan.decode.degrees["pp"] == 1
    assert any(p.decode.degrees["tp"] != p.prefill.degrees["tp"] for p in result.candidates)
    front = build_pareto_front(problem, result)
    kinds = {p.kind for p in front}
    assert kinds == {"aggregated", "disaggregated"}
    user = np.array([p.tokens_per_s_per_user for p in front])
    gpu = np.array([p.tokens_per_s_per_gpu for p in front])
    assert np.all(np.diff(user) <= 0) and np.all(np.diff(gpu) > 0)  # a front: no point dominated
    # Prefill ranks whose KV cache holds nothing keep no point on the front.
    starved = replace(result, kv_tokens=np.zeros_like(result.kv_tokens))
    assert {p.kind for p in build_pareto_front(problem, starved)} == {"aggregated"}


def test_prefill_pool_kv_cache_bounds_its_rate() -> None:
    """A prefill rank holds lam E[I] (time in the engine + transfer) KV tokens (Little's law):
    with a cache of a few prompts its rate falls to what those prompts allow."""
    problem = problem_of("llama3.1-8b", 8, None, None)
    engines = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    curves = estimate_load_curves(problem, engines, "prefill")
    transfer = np.array([0.001])
    free = _largest_prefill_rate(problem, curves, transfer, np.array([1e12]))
    tight = _largest_prefill_rate(problem, curves, transfer, np.array([3 * 4096.0]))
    assert 0 < tight[0] < free[0]
    _, ttft_mean, _ = estimate_prefill_queue(curves, tight)
    held = estimate_prefill_kv_tokens(tight, 4096.0, ttft_mean, transfer)
    assert held[0] == pytest.approx(3 * 4096.0, rel=1e-3)


@settings(max_examples=6, deadline=None)
@given(st.sampled_from([2, 4]), st.sampled_from([300.0, 2000.0]), st.sampled_from([8.0, 30.0]))
def test_more_gpus_or_a_looser_slo_never_lower_the_winner(gpus: int, ttft: float,
                                                          tpot: float) -> None:
    """The disaggregated search over more GPUs, or under a looser SLO, carries at least as
    many requests/s: every plan of the smaller problem is still a candidate."""
    base = search_disaggregated(problem_of("llama3.1-8b", gpus, ttft, tpot)).winner
    more = search_disaggregated(problem_of("llama3.1-8b", 2 * gpus, ttft, tpot)).winner
    looser = search_disaggregated(problem_of("llama3.1-8b", gpus, 2 * ttft, 2 * tpot)).winner
    assert more.max_rate_per_s >= base.max_rate_per_s * (1 - 1e-6)
    assert looser.max_rate_per_s >= base.max_rate_per_s * (1 - 1e-6)
