"""benchmarks/data/serve_published.jsonl: every row names its source, engine and quote, and the
load model evaluates it to a finite positive number (benchmarks/serve_accuracy.py prints the
errors; no test pins them, so the data cannot be tuned to)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from serve_accuracy import load_rows, predict  # noqa: E402


def test_rows_are_sourced_and_predictable() -> None:
    rows = load_rows()
    assert len(rows) >= 4 and len({r["id"] for r in rows}) == len(rows)
    for row in rows:
        assert row["source"].startswith("https://") and row["quote"] and row["engine"]
        value = predict(row)
        assert math.isfinite(value) and value > 0
