"""benchmarks/known_to_run.py: every published run estimated under its framework's profile and
its stated configuration (issue 17's "known to run" table). The counts are a ratchet: a memory
feature may raise the share of runs that ran predicted to fit, never lower it, and the rows the
BLOOM chronicles-prequel reports out of memory stay predicted not to fit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from known_to_run import evaluate_known_run, load_known_runs, summarize  # noqa: E402

# The six BLOOM rows the chronicles-prequel marks OOM (02-25 and 02-28 tables).
NUM_OOM_ROWS = 6
# Runs that ran and that the table predicts to fit; raised as features land.
MIN_RAN_FIT = 288


@pytest.fixture(scope="module")
def summary() -> dict:
    runs, _ = load_known_runs()
    return summarize([evaluate_known_run(run, ran) for run, ran in runs])


def test_every_out_of_memory_row_is_mapped(summary: dict) -> None:
    assert summary["num_oom"] == NUM_OOM_ROWS
    assert summary["num_ran"] == 325


def test_known_to_run_share_never_falls(summary: dict) -> None:
    assert summary["num_ran_fit"] >= MIN_RAN_FIT
    # bloom-0228-206B-19 is predicted at 66.6 GB (memory_accuracy: the one OOM row it misses)
    assert summary["num_oom_predicted_oom"] >= NUM_OOM_ROWS - 1


def test_misses_name_their_largest_item(summary: dict) -> None:
    for miss in summary["misses"]:
        assert miss["largest_item_gb"] > 0 and miss["largest_item"]
