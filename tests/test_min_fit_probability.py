"""Issue 36 item 4: `--min-fit-probability` on sweep and serve as on optimize (default 0.5:
the predicted total within the usable memory, today's rule, stated in the output)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.cli import cli
from solver.cost.uncertainty import load_error_model, memory_sigma, usable_share_for_fit_probability

SWEEP = ["sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8",
         "--seq-len", "2048", "--global-batch", "64", "--top", "3", "--jobs", "1", "-q"]
SERVE = ["serve", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1",
         "--context", "8k", "--top", "1"]


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_sweep_keeps_plans_that_fit_with_the_chance_asked(tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    result = invoke(*SWEEP, "--min-fit-probability", "0.95", "-o", str(output))
    assert result.exit_code == 0, result.output
    line = json.loads(output.read_text(encoding="utf-8").splitlines()[0])
    assert line["min_fit_probability"] == 0.95
    assert line["uncertainty"]["min_fit_probability"] == 0.95
    assert line["plans"] and all(p["fit_probability"] >= 0.95 - 1e-4 for p in line["plans"])
    # A line solved under another rule is not resumed into the file.
    again = invoke(*SWEEP, "-o", str(output))
    assert again.exit_code == 2 and "min_fit_probability 0.95" in again.output


def test_sweep_default_is_todays_rule_and_old_lines_resume(tmp_path: Path) -> None:
    output = tmp_path / "results.jsonl"
    assert invoke(*SWEEP, "-o", str(output)).exit_code == 0
    line = json.loads(output.read_text(encoding="utf-8").splitlines()[0])
    assert line["min_fit_probability"] == 0.5
    assert line["uncertainty"]["min_fit_probability"] == 0.5
    assert all(p["fits"] == (p["fit_probability"] >= 0.5) for p in line["plans"])
    # A line of an earlier sweep (no such field) was solved under 0.5: it resumes at the
    # default and is refused under another value.
    del line["min_fit_probability"]
    output.write_text(json.dumps(line) + "\n", encoding="utf-8")
    assert invoke(*SWEEP, "-o", str(output)).exit_code == 0
    refused = invoke(*SWEEP, "--min-fit-probability", "0.9", "-o", str(output))
    assert refused.exit_code == 2 and "min_fit_probability 0.5" in refused.output


def _utilization(answer: dict) -> float:
    return float(re.search(r"--gpu-memory-utilization ([0-9.]+)",
                           answer["plans"][0]["vllm_command"]).group(1))


def test_serve_cuts_the_memory_it_plans_to_the_chance_asked() -> None:
    """vLLM's KV cache takes what the profiled peak leaves of util x HBM (serve/plan.py), so a
    plan fits with chance P when the memory it is given is cut by exp(-sigma Phi^-1(P))
    (usable_share_for_fit_probability), sigma the serving engine's memory error: at the
    default util 0.9 and P 0.9, vLLM is told 0.9 x that share."""
    default = json.loads(invoke(*SERVE, "--json").output)
    risky = invoke(*SERVE, "--json", "--min-fit-probability", "0.9")
    assert risky.exit_code == 0, risky.output
    answer = json.loads(risky.output)
    assert default["min_fit_probability"] == 0.5 and answer["min_fit_probability"] == 0.9
    share = usable_share_for_fit_probability(0.9, memory_sigma(load_error_model(), "vllm"))
    assert share < 1.0
    assert _utilization(default) == 0.9
    assert _utilization(answer) == pytest.approx(0.9 * share, abs=1e-4)
    assert answer["plans"][0]["kv_cache_tokens"] < default["plans"][0]["kv_cache_tokens"]


def test_serve_states_the_rule() -> None:
    text = invoke(*SERVE).output
    assert ("plans listed fit by the predicted total within the usable memory, today's rule "
            "(--min-fit-probability 0.5)") in text
    text = invoke(*SERVE, "--min-fit-probability", "0.9").output
    assert "a chance of at least 90% under the memory error model" in text
    bad = invoke(*SERVE, "--min-fit-probability", "0.3")
    assert bad.exit_code == 2 and "--min-fit-probability" in bad.output
