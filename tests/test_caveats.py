"""What the step time leaves out (solver.cost.step.caveats): declared once, shown by every output
(estimate and optimize, text and JSON), and true of the public runs it quotes: the predicted
over measured tokens/s of Megatron-Bridge's five gpt-oss-120b H100 BF16 rows
(benchmarks/data/published_runs.jsonl, NeMo 25.11-26.04.01) lie in the range its note states."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.step.caveats import CAVEATS, SINK_RUNS_PREDICTED_OVER_MEASURED, list_time_caveats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from published import load_published_runs  # noqa: E402
from time_accuracy import evaluate  # noqa: E402

SINKS_NOTE = next(caveat.note for caveat in CAVEATS if caveat.name == "attention_sinks")
GPT_OSS_20B = ["--model", "gpt-oss-20b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len",
               "4096", "--global-batch", "64", "--tp", "1", "--pp", "1"]


def test_models_with_sinks_get_the_note_others_none() -> None:
    assert [caveat.name for caveat in CAVEATS] == ["attention_sinks"]
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        assert list_time_caveats(load_model_spec(name)) == (SINKS_NOTE,)
    for name in ("qwen3-30b-a3b", "deepseek-v3", "llama3.1-8b", "gemma3-27b"):
        assert list_time_caveats(load_model_spec(name)) == ()
    low, high = SINK_RUNS_PREDICTED_OVER_MEASURED
    assert f"{low:.2f}-{high:.2f}x the measured" in SINKS_NOTE


def test_the_note_holds_on_the_public_runs_it_quotes() -> None:
    """Every public gpt-oss-120b row, run with the switches its release's recipe sets
    (benchmarks/time_accuracy.py), predicts within the note's range."""
    runs = [run for run in load_published_runs()[0] if run.model_spec.name == "gpt-oss-120b"]
    assert len(runs) == 5
    assert {(run.gpu, run.precision, run.num_gpus) for run in runs} == {("H100-80GB", "bf16", 64)}
    low, high = SINK_RUNS_PREDICTED_OVER_MEASURED
    for run, predicted in evaluate(runs):
        assert low <= predicted / run.tokens_per_sec_per_gpu <= high, run.id


def test_estimate_shows_it_as_text_and_json() -> None:
    runner = CliRunner()
    text = runner.invoke(cli, ["estimate", *GPT_OSS_20B, "--ep", "8"])
    assert text.exit_code == 0, text.output
    assert f"note: {SINKS_NOTE}" in text.output.splitlines()
    answer = runner.invoke(cli, ["estimate", *GPT_OSS_20B, "--ep", "8", "--json"])
    assert answer.exit_code == 0, answer.output
    assert json.loads(answer.output)["notes"] == [SINKS_NOTE]
    plain = runner.invoke(cli, ["estimate", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                "--gpus", "8", "--json"])
    assert json.loads(plain.output)["notes"] == []


@pytest.mark.parametrize("as_json", [False, True])
def test_optimize_shows_it(as_json: bool) -> None:
    args = ["optimize", *GPT_OSS_20B, "--top", "1", "--time-limit", "2"]
    result = CliRunner().invoke(cli, args + (["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    if as_json:
        assert json.loads(result.output)["notes"] == [SINKS_NOTE]
    else:
        assert f"note: {SINKS_NOTE}" in result.output.splitlines()
