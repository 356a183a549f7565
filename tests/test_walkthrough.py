"""docs/walkthrough.md and the README's worked example are what their commands print today:
both are regenerated here (benchmarks/walkthrough.py) and compared line by line, so a change to
any output they show fails until `python benchmarks/walkthrough.py --write` is rerun and the
diff reviewed."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import walkthrough  # noqa: E402


def test_the_walkthrough_page_is_what_its_commands_print() -> None:
    page = walkthrough.render_page()
    stored = walkthrough.PAGE.read_text(encoding="utf-8")
    diff = list(difflib.unified_diff(walkthrough.comparable(stored), walkthrough.comparable(page),
                                     "docs/walkthrough.md", "regenerated", lineterm="", n=1))
    assert diff == [], "\n".join(diff[:60]) + "\nrerun: python benchmarks/walkthrough.py --write"


def test_the_readme_worked_example_is_what_its_command_prints() -> None:
    readme = walkthrough.README.read_text(encoding="utf-8")
    fresh = walkthrough.readme_with_example(readme, walkthrough.render_readme_example())
    assert fresh == readme, "rerun: python benchmarks/walkthrough.py --write"
    assert f"$ {walkthrough.README_EXAMPLE}" in readme


def test_the_page_runs_the_eight_tasks_of_the_issue() -> None:
    """Issue 39's list: a 70B pretraining, DeepSeek-V3 on NVL72, an HF config.json, a config that
    does not fit, validated launch files, serving under an SLO, a sweep with its report,
    calibration from nccl-tests."""
    commands = [" ".join(task.commands) for task in walkthrough.TASKS]
    assert len(commands) == 8
    expected = ("--model llama3.1-70b", "--model deepseek-v3 --cluster gb200-nvl72",
                "--model tests/data/hf_configs/", "parplan estimate", "launch --plan plans.json",
                "--max-ttft-ms", "parplan report", "calibrate nccl-tests tests/data/nccl/")
    assert all(part in command for part, command in zip(expected, commands)), commands


def test_solve_times_and_long_outputs_are_normalised() -> None:
    """The three wall-clock formats become `T s`; the same text elsewhere is left alone; an
    output over MAX_LINES keeps its head and tail and says how many lines it left out."""
    text = ("top 5 of 17,454 plans meeting every rule but memory (optimal, layout, 0.12 s)\n"
            "infeasible (0.07 s): these constraints cannot hold together:\n"
            "results.jsonl: 8 problems solved (8 optimal), 0 already there, in 1.8 s\n"
            "it adds 3.40 s)")
    assert walkthrough.normalise_output(text).splitlines() == [
        "top 5 of 17,454 plans meeting every rule but memory (optimal, layout, T s)",
        "infeasible (T s): these constraints cannot hold together:",
        "results.jsonl: 8 problems solved (8 optimal), 0 already there, in T s",
        "it adds 3.40 s)"]
    long = "\n".join(str(number) for number in range(100))
    lines = walkthrough.normalise_output(long).splitlines()
    assert lines[:2] == ["0", "1"] and lines[-1] == "99"
    assert lines[walkthrough.HEAD_LINES] == (
        f"[... {100 - walkthrough.HEAD_LINES - walkthrough.TAIL_LINES} lines left out of the "
        "walk-through ...]")
    assert len(lines) == walkthrough.HEAD_LINES + 1 + walkthrough.TAIL_LINES


def test_only_the_validation_lines_are_left_out_of_the_comparison() -> None:
    page = "a\nvalidation: megatron@core_v0.16: not checked\nb"
    assert walkthrough.comparable(page) == ["a", "b"]
