"""Predicted serving latency and throughput under load against published vLLM measurements.

    .venv/bin/python benchmarks/serve_accuracy.py [--json]

Data: benchmarks/data/serve_published.jsonl, one measured number per row with its source
(URL), the engine version, the quote it comes from and the stated load (concurrency, request
lengths). Each row becomes a `parplan serve` problem on one engine of the row's degrees and is
evaluated by the load model (solver/serve/load.py) at the stated closed-loop concurrency; no
constant is fitted to these rows. Metrics:

  tpot_mean_ms / tpot_p50_ms   the model's mean / median TPOT at the load;
  throughput_gain_over_c1      output tokens/s at the row's concurrency over concurrency 1.

Rows with `lengths_assumed` give no request lengths in their source (a chat profile): they
use 256 + 256 tokens, and only TPOT at concurrency 4 or less is taken from them, where a
decode step streams the weights and barely depends on the lengths.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.serve import ServeJob, ServeProblem
from solver.serve.candidates import ServeCandidates
from solver.serve.load import estimate_serving_load
from solver.serve.workload import ServeLoadSpec

DATA = Path(__file__).resolve().parent / "data" / "serve_published.jsonl"


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def predict_point(row: dict[str, Any], concurrency: int) -> Any:
    """The load model's operating point of the row's engine at `concurrency` users."""
    percentile = 50
    job = ServeJob(context=row["context"], input_len=row["input_len"],
                   output_len=row["output_len"],
                   load=ServeLoadSpec(concurrency=concurrency, slo_percentile=percentile))
    problem = ServeProblem(model_spec=load_model_spec(row["model"]),
                           cluster=load_calibrated_cluster(row["cluster"], None, None),
                           num_gpus=row["gpus"], job=job)
    engine = ServeCandidates(tp=row["tp"], pp=1, dp=row["gpus"] // row["tp"], ep=1, replicas=1)
    return estimate_serving_load(problem, engine).point


def predict(row: dict[str, Any]) -> float:
    point = predict_point(row, row["concurrency"])
    metric = row["metric"]
    if metric == "tpot_mean_ms":
        return float(point.tpot_mean_s[0]) * 1e3
    if metric == "tpot_p50_ms":
        return float(point.tpot_s[0]) * 1e3
    if metric == "throughput_gain_over_c1":
        alone = predict_point(row, 1)
        return float(point.tokens_per_s[0] / alone.tokens_per_s[0])
    raise ValueError(f"{row['id']}: unknown metric {metric!r}")


def main() -> None:
    rows = load_rows()
    results = []
    for row in rows:
        predicted = predict(row)
        error = predicted / row["measured"] - 1.0
        results.append({"id": row["id"], "source": row["source"], "engine": row["engine"],
                        "metric": row["metric"], "measured": row["measured"],
                        "predicted": round(predicted, 3), "error": round(error, 4)})
    if "--json" in sys.argv:
        print(json.dumps(results, indent=1))
        return
    print(f"{'row':32} {'engine':13} {'metric':24} {'measured':>9} {'predicted':>9} {'error':>7}")
    for r in results:
        print(f"{r['id']:32} {r['engine']:13} {r['metric']:24} {r['measured']:9.2f} "
              f"{r['predicted']:9.2f} {100 * r['error']:+6.1f}%")
    errors = np.abs([r["error"] for r in results])
    print(f"\n{len(results)} rows: median |error| {100 * np.median(errors):.1f}%, "
          f"max {100 * errors.max():.1f}%")
    print("sources:")
    for source in sorted({r["source"] for r in results}):
        print(f"  {source}")


if __name__ == "__main__":
    main()
