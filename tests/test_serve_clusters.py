"""`parplan serve --objective gpus` across several --cluster, --price-per-gpu-hour, and
--disaggregated across two clusters (solver.serve.across, solver.serve.disagg_across,
solver.cost.comm.kv_transfer.estimate_between_clusters_link), end to end through the CLI."""

from __future__ import annotations

import argparse
import json
import shlex

import pytest
from click.testing import CliRunner

from solver.calibrate.profile import load_calibrated_cluster
from solver.cli import cli
from solver.cli.render_serve import render_serve_json
from solver.cost.comm.kv_transfer import estimate_between_clusters_link, estimate_kv_transfer_s
from solver.serve import solve_serving
from tests.test_adversarial_injection import VLLM_VALUE_OPTIONS

# Llama-3.1-70B at 5 requests/s of 2,048 + 512 tokens, TTFT <= 2 s and TPOT <= 60 ms at p90.
LOAD = ["--model", "llama3.1-70b", "--gpus", "16", "--context", "8k", "--request-rate", "5",
        "--max-ttft-ms", "2000", "--max-tpot-ms", "60", "--objective", "gpus"]


def serve_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["serve", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_fewest_gpus_come_from_the_second_cluster() -> None:
    """A100 80GB first, H200 second: the H200's 141 GB hold the 141 GB of bf16 weights on
    fewer GPUs, so the second cluster is chosen, and the first's need is listed."""
    answer = serve_json(*LOAD, "--cluster", "dgx-a100-80gb", "--cluster", "dgx-h200")
    across = answer["across_clusters"]
    assert (across["chosen"], across["by"]) == ("dgx-h200", "gpus")
    a100, h200 = across["clusters"]
    assert (a100["gpu"], h200["gpu"]) == ("a100-80gb", "h200")
    assert h200["fewest_gpus"] < a100["fewest_gpus"]
    assert answer["cluster"] == "dgx-h200" and answer["plans"][0]["gpus"] == h200["fewest_gpus"]
    assert "cost" not in h200 and "cost" not in answer["plans"][0]
    # The answer shown is the second cluster's own, as `--cluster dgx-h200` alone gives it.
    alone = serve_json(*LOAD, "--cluster", "dgx-h200")
    shown = {k: v for k, v in answer.items() if k not in ("across_clusters", "solve_seconds")}
    assert shown == {k: v for k, v in alone.items() if k != "solve_seconds"}


def test_prices_choose_the_cheaper_cluster_and_price_each_plan() -> None:
    """Priced, the lowest $/h wins even on more GPUs: A100 at $0.50 against H200 at $3.50.
    Each plan's $ per million output tokens is its $/h over the tokens/s it makes at the offered
    load (5 requests/s x 512 = 2,560 tokens/s): solver.cost.serving.price."""
    answer = serve_json(*LOAD, "--cluster", "dgx-a100-80gb", "--cluster", "dgx-h200",
                        "--price-per-gpu-hour", "dgx-a100-80gb=0.5",
                        "--price-per-gpu-hour", "dgx-h200=3.5")
    across = answer["across_clusters"]
    a100, h200 = across["clusters"]
    assert a100["cost"]["dollars_per_hour"] == pytest.approx(0.5 * a100["fewest_gpus"])
    assert h200["cost"]["dollars_per_hour"] == pytest.approx(3.5 * h200["fewest_gpus"])
    cheaper = min((a100, h200), key=lambda row: row["cost"]["dollars_per_hour"])
    assert (across["chosen"], across["by"]) == (cheaper["cluster"], "dollars_per_hour")
    plan = answer["plans"][0]
    tokens = plan["load"]["at_load"]["tokens_per_second"]
    assert tokens == pytest.approx(5 * 512, rel=1e-3)
    cost = plan["cost"]
    assert cost["dollars_per_million_output_tokens"] == pytest.approx(
        cost["dollars_per_hour"] / 3600 * 1e6 / tokens, abs=1e-4)
    assert cost["dollars_per_million_input_tokens"] == pytest.approx(
        cost["dollars_per_hour"] / 3600 * 1e6 / (tokens * 2048 / 512), abs=1e-4)
    watts = {"a100-80gb": 400.0, "h200": 700.0}[answer["gpu"]]  # the datasheets' max TDP
    assert cost["output_tokens_per_joule"] == pytest.approx(tokens / (plan["gpus"] * watts),
                                                            abs=1e-4)


@pytest.mark.parametrize("args", [
    ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8", "--context", "8k"],
    ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--context", "8k",
     "--request-rate", "10", "--max-ttft-ms", "1000", "--max-tpot-ms", "50", "--objective",
     "gpus"],
])
def test_one_cluster_answers_as_before(args: list[str]) -> None:
    """One --cluster and no price: the JSON is solve_serving's answer rendered as before
    (the same bytes but the solve time: checked against the commit before this change on
    these two problems), with no cost and no comparison."""
    answer = serve_json(*args)
    cluster = args[args.index("--cluster") + 1]
    from solver.catalog import load_model_spec
    from solver.serve import ServeJob, ServeProblem
    from solver.serve.workload import ServeLoadSpec

    rate = float(args[args.index("--request-rate") + 1]) if "--request-rate" in args else None
    limits = {"max_ttft_ms": 1000.0, "max_tpot_ms": 50.0, "objective": "gpus"} if rate else {}
    job = ServeJob(context=8192, input_len=2048, output_len=512,
                   load=ServeLoadSpec(request_rate=rate), **limits)
    problem = ServeProblem(model_spec=load_model_spec(args[1]),
                           cluster=load_calibrated_cluster(cluster, None, None),
                           num_gpus=int(args[args.index("--gpus") + 1]), job=job)
    from solver.catalog import list_gpu_names, load_gpu_spec

    direct = json.loads(json.dumps(render_serve_json(solve_serving(
        problem, other_gpus=[load_gpu_spec(n) for n in list_gpu_names()]))))
    answer.pop("solve_seconds")
    direct.pop("solve_seconds")
    assert answer == direct
    assert "across_clusters" not in answer and all("cost" not in p for p in answer["plans"])


def test_a_price_reaches_the_pareto_front() -> None:
    answer = serve_json("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
                        "--context", "8k", "--pareto", "--price-per-gpu-hour", "2.5")
    for point in answer["pareto"]:
        tokens = point["tokens_per_second_per_gpu"] * point["gpus"]
        assert point["cost"]["dollars_per_million_output_tokens"] == pytest.approx(
            2.5 * point["gpus"] / 3600 * 1e6 / tokens, rel=1e-3)
        assert point["cost"]["output_tokens_per_joule"] == pytest.approx(
            tokens / (700 * point["gpus"]), rel=1e-3)


def test_kv_link_between_clusters_is_the_slower_network() -> None:
    """dgx-h100's network between nodes is 40 GB/s a GPU, dgx-a100-80gb's 20 GB/s (the
    presets' fabric): 2,048 tokens of Llama-3.1-70B at tp 8 (40,960 B a token a GPU, 83.9 MB)
    go at 20 GB/s plus the send latency: 4.23 ms, either way round."""
    h100 = load_calibrated_cluster("dgx-h100", None, None)
    a100 = load_calibrated_cluster("dgx-a100-80gb", None, None)
    for first, second in ((h100, a100), (a100, h100)):
        link, name = estimate_between_clusters_link(first, second)
        assert name == "dgx-a100-80gb" and float(link.bandwidth_bytes_per_s[0]) == 20e9
        seconds = float(estimate_kv_transfer_s(2048, 40960, 8, 1, 8, 1, link)[0])
        assert seconds == pytest.approx(2048 * 40960 / 20e9 + float(link.latency_s[0]),
                                        rel=1e-6)
        assert seconds == pytest.approx(4.23e-3, abs=5e-6)


def vllm_pool_parser() -> argparse.ArgumentParser:
    """`vllm serve`'s arguments a pool's line uses (vllm/engine/arg_utils.py, and
    --kv-transfer-config, vllm/config/kv_transfer.py KVTransferConfig; --port,
    vllm/entrypoints/openai/cli_args.py)."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    parser.add_argument("model_tag")
    for option in (*VLLM_VALUE_OPTIONS, "--port", "--kv-transfer-config"):
        parser.add_argument(option)
    parser.add_argument("--enable-expert-parallel", action="store_true")
    parser.add_argument("--enable-chunked-prefill", action="store_true")
    return parser


def sglang_pool_parser() -> argparse.ArgumentParser:
    """The launch_server arguments a pool's line uses, with the choices of
    sglang/srt/server_args.py (--disaggregation-mode null|prefill|decode;
    --disaggregation-transfer-backend mooncake|nixl|...)."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    parser.add_argument("--model-path", required=True)
    for option in ("--tp-size", "--dp-size", "--pp-size", "--ep-size", "--context-length",
                   "--max-running-requests", "--chunked-prefill-size", "--port"):
        parser.add_argument(option, type=int)
    parser.add_argument("--mem-fraction-static", type=float)
    parser.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"])
    parser.add_argument("--disaggregation-transfer-backend",
                        choices=["mooncake", "nixl", "ascend", "fake"])
    parser.add_argument("--enable-dp-attention", action="store_true")
    return parser


def test_prefill_on_one_cluster_decode_on_another() -> None:
    """H100 prefill, H200 decode at 5 requests/s: both pools sized for the rate, the KV
    transfer over dgx-h100's 40 GB/s network (the slower side), both launch lines parsed."""
    answer = serve_json(*LOAD, "--cluster", "dgx-h100", "--cluster", "dgx-h200",
                        "--disaggregated", "--price-per-gpu-hour", "dgx-h100=2.5",
                        "--price-per-gpu-hour", "dgx-h200=3.5")
    two = answer["disaggregated_across_clusters"]
    assert (two["prefill_gpu"], two["decode_gpu"]) == ("h100-sxm", "h200")
    assert two["kv_transfer_link"] == {"gb_per_s": 40.0, "network_of": "dgx-h100"}
    best = two["plans"][0]
    assert best["prefill"]["gpus"] <= 16 and best["decode"]["gpus"] <= 16
    assert best["max_request_rate"] >= 5 and best["ttft_ms"] <= 2000 and best["tpot_ms"] <= 60
    assert best["cost"]["dollars_per_hour"] == pytest.approx(
        2.5 * best["prefill"]["gpus"] + 3.5 * best["decode"]["gpus"])
    assert best["cost"]["output_tokens_per_joule"] == pytest.approx(
        5 * 512 / (700 * best["gpus"]), abs=1e-4)
    assert [p["cost"]["dollars_per_hour"] for p in two["plans"]] == sorted(
        p["cost"]["dollars_per_hour"] for p in two["plans"])
    prefill, decode, proxy = two["vllm_commands"]
    for line, pool in ((prefill, best["prefill"]), (decode, best["decode"])):
        words = shlex.split(line)
        assert words[0].startswith("VLLM_NIXL_SIDE_CHANNEL_PORT=") and words[1:3] == [
            "vllm", "serve"]
        args = vllm_pool_parser().parse_args(words[3:])
        assert json.loads(args.kv_transfer_config) == {"kv_connector": "NixlConnector",
                                                       "kv_role": "kv_both"}
        assert int(args.tensor_parallel_size) == pool["tp"]
    assert "toy_proxy_server.py" in proxy
    p_line, d_line, router = two["sglang_commands"]
    for line, mode, pool in ((p_line, "prefill", best["prefill"]),
                             (d_line, "decode", best["decode"])):
        args = sglang_pool_parser().parse_args(shlex.split(line)[3:])
        assert (args.disaggregation_mode, args.disaggregation_transfer_backend) == (mode, "nixl")
        assert args.tp_size == pool["tp"]
    assert "--pd-disaggregation" in router


def test_two_cluster_lines_pass_vllms_own_parser() -> None:
    """Where CI installs vLLM 0.33 (pip install -e '.[frameworks]'): each pool's line through
    `vllm serve`'s parser and configs (solver.emit.check_vllm)."""
    from tests.test_launch_frameworks import need

    need("vllm", "0.33")
    from solver.emit.check_vllm import _check_line

    two = serve_json(*LOAD, "--cluster", "dgx-h100", "--cluster", "dgx-h200",
                     "--disaggregated")["disaggregated_across_clusters"]
    for line in two["vllm_commands"][:2]:
        _check_line(shlex.split(line)[3:])


@pytest.mark.parametrize(("extra", "message"), [
    (["--cluster", "dgx-h100", "--cluster", "dgx-h200", "--price-per-gpu-hour", "2.5"],
     "--price-per-gpu-hour 2.5: with several clusters give NAME=PRICE for each --cluster"),
    (["--cluster", "dgx-h100", "--price-per-gpu-hour", "dgx-h200=2.5"],
     "--price-per-gpu-hour dgx-h200=2.5: 'dgx-h200' is not a --cluster given (dgx-h100)"),
    (["--cluster", "dgx-h100", "--price-per-gpu-hour", "-1"],
     "--price-per-gpu-hour -1: the price must be a positive number of dollars"),
    (["--cluster", "dgx-h100", "--cluster", "dgx-h100"], "--cluster: each cluster once"),
])
def test_bad_cluster_and_price_flags_are_one_line(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["serve", *LOAD, *extra])
    assert result.exit_code == 2 and message in result.output, result.output
    assert "Traceback" not in result.output


def test_several_clusters_need_objective_gpus_and_a_split_needs_a_rate() -> None:
    base = ["serve", "--model", "llama3.1-70b", "--gpus", "16", "--context", "8k",
            "--cluster", "dgx-h100", "--cluster", "dgx-h200"]
    result = CliRunner().invoke(cli, base)
    assert result.exit_code == 2 and "compared with --objective gpus" in result.output
    result = CliRunner().invoke(cli, [*base, "--objective", "gpus", "--disaggregated"])
    assert result.exit_code == 2 and "add --request-rate" in result.output
