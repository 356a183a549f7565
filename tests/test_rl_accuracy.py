"""benchmarks/rl_accuracy.py and its rows (issue 41 item 6): every published row parses, cites
its page at a fixed commit and quotes the numbers it is compared with; the script costs a row's
own configuration (its pins) and prints the table and medians."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import rl_accuracy  # noqa: E402

PUBLISHED = rl_accuracy.load_published()
PAGE_AT_COMMIT = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+\.md$")


def quoted_numbers(text: str) -> set[float]:
    """Every number written in `text` (thousands separators dropped)."""
    return {float(n) for n in re.findall(r"\d+(?:\.\d+)?", text.replace(",", ""))}


def test_published_rows_parse_with_every_field() -> None:
    assert len(PUBLISHED) >= 10
    assert len({row["framework"] for row in PUBLISHED}) >= 2
    assert len({row["id"] for row in PUBLISHED}) == len(PUBLISHED)
    for row in PUBLISHED:
        assert set(row) == set(rl_accuracy.PUBLISHED_FIELDS), row["id"]


def test_a_row_with_a_missing_field_is_refused_naming_its_line(tmp_path, monkeypatch) -> None:
    row = dict(PUBLISHED[0])
    del row["quote"]
    broken = tmp_path / "rl_published.jsonl"
    broken.write_text(json.dumps(PUBLISHED[1]) + "\n" + json.dumps(row) + "\n", encoding="utf-8")
    monkeypatch.setattr(rl_accuracy, "PUBLISHED", broken)
    with pytest.raises(ValueError, match=r"rl_published\.jsonl:2: fields missing \['quote'\]"):
        rl_accuracy.load_published()


@pytest.mark.parametrize("row", PUBLISHED, ids=[row["id"] for row in PUBLISHED])
def test_every_row_cites_its_page_and_quotes_what_it_is_compared_with(row) -> None:
    """The measured step and each measured phase are numbers of the quoted table row (the
    Qwen3-30B row's log-prob phase is the sum of its old_log_prob and ref cells, as its
    `assumed` says); the GPU count is in the quote or the quoted setup; the lengths and batch
    are in range; whatever the page does not give is listed under `assumed`."""
    assert PAGE_AT_COMMIT.match(row["source_url"]), row["source_url"]
    assert row["quote"] and row["setup_quote"]
    numbers = quoted_numbers(row["quote"])
    assert row["measured_step_s"] in numbers
    for phase, seconds in row["measured_phases_s"].items():
        assert phase in ("generation", "log_probs", "training", "weight_sync")
        if seconds not in numbers:
            assert phase == "log_probs" and any(
                "old_log_prob" in note and "ref" in note for note in row["assumed"])
            assert any(a + b == pytest.approx(seconds) for a in numbers for b in numbers)
    assert row["gpus"] in quoted_numbers(row["quote"] + row["setup_quote"])
    assert row["assumed"] and all(isinstance(note, str) and note for note in row["assumed"])
    assert row["prompt_len_mean"] <= row["prompt_len_max"]
    assert row["response_len_mean"] is None or row["response_len_mean"] < row["response_len_max"]
    assert row["prompts_per_step"] % row["optimizer_steps_per_rollout"] == 0
    assert row["placement"] in ("colocated", "split")
    assert (row["training_gpus"] is None) == (row["placement"] == "colocated")
    assert row["async_steps"] == 0 or row["placement"] == "split"


def test_verl_one_step_off_rows_match_the_page() -> None:
    """verl docs/advance/one_step_off.md at b178a3cd: "colocate sync | VLLM+Megatron | 699 |
    207 | - | 162 | 119 | 344", 16 H20s (4 generating, 12 training), max response 8,192
    (Megatron) and 20,480 (FSDP2)."""
    rows = {row["id"]: row for row in PUBLISHED}
    megatron = rows["verl-oso-megatron-colocate"]
    assert (megatron["measured_step_s"], megatron["gpus"], megatron["response_len_max"]) == (
        699.0, 16, 8192)
    assert megatron["measured_phases_s"] == {"generation": 207, "log_probs": 119,
                                             "training": 344}
    split = rows["verl-oso-fsdp2-split-async"]
    assert (split["training_gpus"], split["async_steps"], split["response_len_max"]) == (
        12, 1, 20480)


def test_script_costs_a_rows_own_pinned_configuration() -> None:
    """verl's Megatron colocated row pins training tp 2 pp 2 (dapo_7b_math_megatron_colocate.sh)
    and vLLM TP 2 at gpu_memory_utilization 0.8: the costed plan has them, and with no published
    mean every shape is the same uniform 1..max lengths."""
    row = next(row for row in PUBLISHED if row["id"] == "verl-oso-megatron-colocate")
    plan = rl_accuracy.predict_published(row, "fixed")
    assert plan is not None and plan.placement == "colocated"
    assert (plan.training.config.tp, plan.training.config.pp) == (2, 2)
    assert plan.rollout["tp"] == 2
    assert plan.rollout_gpu_memory_utilization == pytest.approx(0.8)
    assert rl_accuracy.predict_published(row, "exponential").step_seconds == plan.step_seconds


def test_script_runs_on_a_couple_of_rows(capsys) -> None:
    rl_accuracy.main(["--rows", "verl-oso-megatron-split-async",
                      "grpo-llama3.1-8b-instruct-2n8g-async-1off"])
    out = capsys.readouterr().out
    assert "verl-oso-megatron-split-async" in out and "llama3.1-8b" in out
    assert "fixed (lengths published): median |error|" in out and "over 1 rows" in out
    assert "mean response not published (uniform 1..max): median |error|" in out
