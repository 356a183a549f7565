"""benchmarks/device_steps.py (the one-GPU step-time and memory harness) runs end to end on a
CPU with a tiny model, and the model it trains is the ModelSpec it predicts for."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

torch = pytest.importorskip("torch")

import device_steps  # noqa: E402


@pytest.mark.parametrize("shape", [device_steps.CPU_SHAPE, device_steps.GPU_SHAPE])
def test_the_harness_model_is_the_predicted_model(shape) -> None:
    with torch.device("meta"):  # shapes only, no memory
        model = device_steps.build_model(torch, shape, "none")
    assert sum(p.numel() for p in model.parameters()) == shape.spec().total_params


def test_the_harness_runs_on_a_cpu(tmp_path: Path, capsys) -> None:
    out = tmp_path / "steps.csv"
    device_steps.main(["--device", "cpu", "--micro-batches", "1", "2", "--seq-len", "32",
                       "--repeats", "2", "--steps", "1", "--warmup", "1", "--out", str(out)])
    rows = list(csv.DictReader(out.open()))
    assert [(r["micro_batch"], r["recompute"]) for r in rows] == [
        ("1", "none"), ("2", "none"), ("1", "full"), ("2", "full")]
    for row in rows:
        assert len(row["repeat_step_s"].split()) == 2
        assert float(row["predicted_step_s"]) > 0 and float(row["predicted_bytes"]) > 0
    assert "Spearman of time per token" in capsys.readouterr().out
