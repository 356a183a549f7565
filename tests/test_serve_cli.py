"""`parplan serve` through click's CliRunner: the JSON of DESIGN.md ("Interfaces"), the vLLM
command line, the objectives, bad input (one stderr line, exit 2) and an infeasible problem (an
answer with its conflicts and fixes, exit 0)."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from solver.cli import cli

PLAN_KEYS = {"tp", "pp", "dp", "ep", "replicas", "gpus", "expert_parallel", "fits",
             "memory_gb", "allocated_gb", "reserved_gb", "device_gb", "reserved_gb_observed",
             "device_gb_observed", "kv_bytes_per_token", "kv_cache_tokens",
             "max_concurrent_sequences",
             "batch", "ttft_ms", "tpot_ms", "tpot_idle_ms", "request_latency_s",
             "tokens_per_second", "tokens_per_second_per_gpu", "decode_step_ms",
             "vllm_command", "sglang_command", "notes", "load", "scheduler",
             # issue 36: intervals from the serving error model
             "ttft_ms_interval", "tpot_ms_interval", "tokens_per_second_interval",
             "tokens_per_second_per_gpu_interval"}


def serve(*args: str):
    return CliRunner().invoke(cli, ["serve", *args])


def serve_json(*args: str) -> dict:
    result = serve(*args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_of_a_dense_model() -> None:
    answer = serve_json("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--context", "32k")
    assert answer["status"] == "optimal" and answer["solve_seconds"] >= 0
    assert answer["context"] == 32768
    assert (answer["input_len"], answer["output_len"]) == (2048, 512)
    assert 1 <= len(answer["plans"]) <= 5
    for plan in answer["plans"]:
        assert set(plan) == PLAN_KEYS
        assert plan["tp"] * plan["pp"] * plan["dp"] * plan["replicas"] == 8
        assert set(plan["memory_gb"]) == {"weights", "kv_cache", "activations", "other",
                                          "total"}
        assert plan["memory_gb"]["total"] <= 0.9 * 79.65 * 2**30 / 1e9 + 1e-3
    best = answer["plans"][0]
    assert answer["vllm_command"] == best["vllm_command"]
    words = shlex.split(best["vllm_command"])
    assert words[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B"]
    assert words[words.index("--tensor-parallel-size") + 1] == str(best["tp"])
    assert words[words.index("--pipeline-parallel-size") + 1] == str(best["pp"])
    assert words[words.index("--data-parallel-size") + 1] == str(best["dp"])
    assert words[words.index("--max-model-len") + 1] == "32768"
    assert words[words.index("--gpu-memory-utilization") + 1] == "0.9"
    assert "--enable-expert-parallel" not in words
    assert any(line.startswith("rule of thumb (one GPU per copy") for line in answer["why"])


def test_moe_plan_enables_expert_parallel_with_fp8() -> None:
    answer = serve_json("--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "32",
                        "--context", "32k", "--precision", "fp8", "--kv-cache-dtype", "fp8")
    best = answer["plans"][0]
    assert best["ep"] == best["tp"] * best["dp"] > 1 and best["expert_parallel"]
    words = shlex.split(best["vllm_command"])
    assert "--enable-expert-parallel" in words
    assert words[words.index("--quantization") + 1] == "fp8"
    assert words[words.index("--kv-cache-dtype") + 1] == "fp8"
    assert any("spans 4 nodes" in note for note in best["notes"])
    assert any(line.startswith("experts: --enable-expert-parallel") for line in answer["why"])


def test_objectives_differ() -> None:
    common = ("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "16",
              "--context", "8k")
    most_tokens = serve_json(*common)
    fastest = serve_json(*common, "--objective", "latency")["plans"][0]
    assert fastest["request_latency_s"] <= most_tokens["plans"][0]["request_latency_s"]
    fewest = serve_json(*common, "--objective", "gpus")["plans"][0]
    assert fewest["gpus"] == 2  # 141 GB of weights need two 80 GB GPUs


def test_slo_limits_the_batch() -> None:
    common = ("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1",
              "--context", "8k")
    free = serve_json(*common)["plans"][0]
    bound = serve_json(*common, "--max-tpot-ms", "20")["plans"][0]
    assert bound["tpot_ms"] <= 20 < free["tpot_ms"]
    assert bound["batch"] < free["batch"]
    assert bound["tokens_per_second"] < free["tokens_per_second"]


def test_table_output() -> None:
    result = serve("--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "8",
                   "--context", "32k")
    assert result.exit_code == 0, result.output
    assert "seqs @32,768" in result.stdout and "why:" in result.stdout
    assert "vllm serve mistralai/Mixtral-8x7B" in result.stdout


def test_infeasible_is_an_answer() -> None:
    answer = serve_json("--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--context", "128k")
    assert answer["status"] == "infeasible" and answer["plans"] == []
    assert answer["conflicts"] == ["memory_fits_hbm"]
    assert "memory_fits_hbm" in answer["rules"]
    assert "--precision fp8" in answer["fixes"] and "--gpus 16" in answer["fixes"]
    assert any(fix.startswith("a GPU with more memory") for fix in answer["fixes"])
    text = serve("--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8",
                 "--context", "128k")
    assert text.exit_code == 0 and "infeasible" in text.stdout and "fixes:" in text.stdout


def test_impossible_slo_names_the_slo_and_the_reachable_value() -> None:
    answer = serve_json("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--context", "8k", "--max-tpot-ms", "2")
    assert answer["status"] == "infeasible"
    assert answer["conflicts"] == ["tpot_within_slo"]
    assert any(fix.startswith("--max-tpot-ms ") for fix in answer["fixes"])


@pytest.mark.parametrize("args, message", [
    (("--context", "32q"), "--context"),
    (("--context", "0"), "--context"),
    (("--context", "8k", "--input-len", "8000", "--output-len", "500"), "--input-len"),
    (("--context", "8k", "--input-len", "9000"), "--input-len"),
    (("--context", "8k", "--gpu-memory-utilization", "1.5"), "--gpu-memory-utilization"),
    (("--context", "8k", "--precision", "fp2"), "--precision"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = serve("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_unknown_model_and_cluster() -> None:
    for args in (("--model", "no-such-model", "--cluster", "dgx-h100"),
                 ("--model", "llama3.1-8b", "--cluster", "no-such-cluster")):
        result = serve(*args, "--gpus", "8", "--context", "8k")
        assert result.exit_code == 2
        assert len(result.stderr.strip().splitlines()) == 1


def test_request_rate_reports_idle_and_loaded_latency_apart() -> None:
    answer = serve_json("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--context", "8k", "--request-rate", "20", "--max-ttft-ms", "1000",
                        "--max-tpot-ms", "30", "--input-len", "1000-3000")
    assert answer["workload"]["input"] == {"kind": "uniform", "low": 1000, "high": 3000,
                                           "mean": 2000.0}
    assert answer["workload"]["request_rate"] == 20 and answer["workload"]["slo_percentile"] == 90
    rates = [plan["load"]["within_slo"]["max_request_rate"] for plan in answer["plans"]]
    assert rates == sorted(rates, reverse=True) and rates[-1] >= 20  # every plan carries it
    for plan in answer["plans"]:
        load = plan["load"]
        assert load["at_load"]["request_rate"] == pytest.approx(20)
        assert load["at_load"]["meets_slo"] and load["at_load"]["ttft_ms"] <= 1000
        assert load["at_load"]["ttft_ms"] >= load["idle"]["ttft_ms"]
        assert load["at_load"]["tpot_ms"] >= load["idle"]["tpot_ms"]
        words = shlex.split(plan["vllm_command"])
        assert words[words.index("--max-num-seqs") + 1] == str(plan["scheduler"]["max_num_seqs"])
        assert "--enable-chunked-prefill" in words and "--max-num-batched-tokens" in words


def test_too_much_load_is_infeasible_and_named() -> None:
    answer = serve_json("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--context", "8k", "--request-rate", "1000")
    assert answer["status"] == "infeasible" and answer["conflicts"] == ["carries_load"]


def test_pareto_front_is_non_dominated_and_marks_the_slo() -> None:
    answer = serve_json("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "4",
                        "--context", "8k", "--max-tpot-ms", "8", "--request-rate", "2",
                        "--pareto")
    front = answer["pareto"]
    assert len(front) >= 3
    users = [p["tokens_per_second_per_user"] for p in front]
    gpus = [p["tokens_per_second_per_gpu"] for p in front]
    assert users == sorted(users, reverse=True) and gpus == sorted(gpus)
    assert any(p["meets_slo"] for p in front) and not all(p["meets_slo"] for p in front)
    for p in front:
        assert p["meets_slo"] == (p["tpot_ms"] <= 8)
    text = serve("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "4",
                 "--context", "8k", "--pareto")
    assert text.exit_code == 0 and "pareto front" in text.output


def test_objective_gpus_takes_the_fewest_gpus_that_carry_the_rate() -> None:
    """With --request-rate, objective gpus scales each engine out to the copies that carry the
    rate within the SLO; the answer carries it, and every plan of fewer GPUs would not."""
    args = ("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16", "--context",
            "8k", "--objective", "gpus", "--request-rate", "40", "--max-tpot-ms", "20",
            "--max-ttft-ms", "500")
    answer = serve_json(*args)
    best = answer["plans"][0]
    assert best["load"]["at_load"]["meets_slo"]
    assert best["load"]["within_slo"]["max_request_rate"] >= 40
    gpus = best["gpus"]
    fewer = serve("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", str(gpus - 1),
                  "--context", "8k", "--request-rate", "40", "--max-tpot-ms", "20",
                  "--max-ttft-ms", "500", "--json")
    assert json.loads(fewer.stdout)["status"] == "infeasible"


def test_a_higher_percentile_is_no_faster() -> None:
    def at(percentile: str) -> dict:
        answer = serve_json("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1",
                            "--context", "8k", "--request-rate", "8", "--input-len", "500-3500",
                            "--slo-percentile", percentile)
        return answer["plans"][0]["load"]["at_load"]

    p50, p90, p99 = at("p50"), at("p90"), at("p99")
    assert p90["ttft_ms"] > p50["ttft_ms"] and p90["tpot_ms"] >= p50["tpot_ms"]
    assert p99["ttft_ms"] > p90["ttft_ms"] and p99["tpot_ms"] >= p90["tpot_ms"]
    assert p90["ttft_mean_ms"] == pytest.approx(p50["ttft_mean_ms"], rel=0.05)


def test_engine_sets_the_host_time_of_a_step() -> None:
    """--engine picks the host overhead (solver.cost.serving.overhead): vLLM V1's 160 us a step
    shows in the decode step's parts, SGLang's overlap scheduler shows none."""
    args = ("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1", "--context", "8k")
    vllm, sglang = (serve_json(*args, "--engine", engine)["plans"][0]
                    for engine in ("vllm", "sglang"))
    assert vllm["decode_step_ms"]["host"] == pytest.approx(0.16)
    assert sglang["decode_step_ms"]["host"] == 0.0
    assert sglang["tpot_idle_ms"] < vllm["tpot_idle_ms"]
    result = serve(*args, "--engine", "trtllm")
    assert result.exit_code == 2 and "engine 'trtllm' is not one of vllm, sglang" in result.output
