"""`parplan serve`'s issue 38 flags through click's CliRunner: the at_load rates in tokens per
second (they were tokens/s x 1000 under a `_ms` name), --client and --burstiness, the pins
as in optimize, and --context defaulting to the model's length capped by what fits."""

from __future__ import annotations

import pytest

from bad_input import assert_one_line_error
from test_serve_cli import serve, serve_json

BASE = ("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8")


def test_at_load_rates_are_tokens_per_second() -> None:
    """Issue 38: at_load.tokens_per_ms held tokens/s x 1000 (a `_s` key turned into `_ms`).
    Tokens/s at the load is requests/s x output tokens (Little's law's rate), and the plan's
    own keys say tokens_per_second."""
    answer = serve_json(*BASE, "--context", "8k", "--request-rate", "4", "--output-len", "256")
    at = answer["plans"][0]["load"]["at_load"]
    assert not any("per_ms" in key for key in at)
    assert at["tokens_per_second"] == round(at["request_rate"] * 256, 4)
    assert at["tokens_per_second_per_gpu"] == round(at["request_rate"] * 256 / 8, 4)
    assert at["tokens_per_second_per_user"] == pytest.approx(1000.0 / at["tpot_mean_ms"],
                                                             rel=1e-4)


def test_the_client_is_named_in_the_answer() -> None:
    closed = serve_json(*BASE, "--context", "8k", "--concurrency", "16")
    assert closed["workload"]["client"] == "closed" and closed["workload"]["burstiness"] is None
    gamma = serve_json(*BASE, "--context", "8k", "--request-rate", "4", "--client", "gamma",
                       "--burstiness", "0.5")
    assert gamma["workload"]["client"] == "gamma" and gamma["workload"]["burstiness"] == 0.5
    text = serve(*BASE, "--context", "8k", "--request-rate", "4").output
    assert "Poisson arrivals (vllm bench serve --request-rate)" in text


def test_client_and_load_must_agree() -> None:
    assert_one_line_error(serve(*BASE, "--context", "8k", "--request-rate", "2", "--client",
                                "closed"), "--client", "--concurrency")
    assert_one_line_error(serve(*BASE, "--context", "8k", "--concurrency", "2", "--client",
                                "gamma"), "--client", "--request-rate")
    assert_one_line_error(serve(*BASE, "--context", "8k", "--request-rate", "2",
                                "--burstiness", "2"), "--burstiness", "gamma")


def test_pins_hold_and_name_themselves_when_they_leave_nothing() -> None:
    """--tp 2 (and a range, 1-2) as optimize's pins; --tp 3 leaves no plan (32 heads):
    the answer is infeasible, exit 0, and its conflict is the pin."""
    answer = serve_json(*BASE, "--context", "8k", "--tp", "2")
    assert answer["plans"] and all(p["tp"] == 2 for p in answer["plans"])
    ranged = serve_json(*BASE, "--context", "8k", "--tp", "1-2", "--top", "10")
    assert {p["tp"] for p in ranged["plans"]} <= {1, 2}
    none = serve_json(*BASE, "--context", "8k", "--tp", "3")
    assert none["status"] == "infeasible" and "pin_tp" in none["conflicts"]
    moe = serve_json("--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "4",
                     "--context", "8k", "--ep", "4", "--replicas", "1")
    assert all(p["ep"] == 4 and p["replicas"] == 1 for p in moe["plans"])


def test_context_defaults_to_the_model_length_capped_by_what_fits() -> None:
    """vLLM's --max-model-len defaults to max_position_embeddings (131,072 for Llama 3.1):
    8 H100s hold it for the 8B model; one H100 holds a 70B model's weights nowhere, and 2
    hold less than 131,072 tokens of its KV cache, so the default is the longest that fits,
    and the answer says so."""
    answer = serve_json(*BASE)
    assert answer["context"] == 131072 and answer["context_source"] == "model"
    capped = serve_json("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "2")
    assert capped["context_source"] == "fits" and 1024 < capped["context"] < 131072
    assert capped["status"] == "optimal"
    assert all(p["kv_cache_tokens"] >= capped["context"] for p in capped["plans"])
    longer = serve_json("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "2",
                        "--context", str(capped["context"] + 1))
    assert longer["status"] == "infeasible"
    text = serve("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "2").output
    assert "the model's 131,072 does not fit; no --context given" in text


def test_pool_pins_hold_each_pool_of_a_disaggregated_plan() -> None:
    """--prefill-tp 4 --decode-tp 2: every split keeps them; --prefill-tp 3 leaves the prefill
    pool nothing (64 heads), and the answer names the pin; a pool pin needs --disaggregated."""
    args = ("--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8", "--context",
            "8k", "--request-rate", "2", "--disaggregated")
    answer = serve_json(*args, "--prefill-tp", "4", "--decode-tp", "2")
    splits = [p for p in answer["disaggregated"]["plans"] if p["kind"] == "disaggregated"]
    assert splits and all(p["prefill"]["tp"] == 4 and p["decode"]["tp"] == 2 for p in splits)
    none = serve_json(*args, "--prefill-tp", "3")
    assert "pin_prefill_tp" in none["disaggregated"]["why"]
    assert_one_line_error(serve(*BASE, "--context", "8k", "--decode-tp", "2"),
                          "--decode-tp", "--disaggregated")
