"""Predicted serving latency and throughput under load against published vLLM and SGLang
measurements.

    .venv/bin/python benchmarks/serve_accuracy.py [--json | --markdown]

Data: benchmarks/data/serve_published.jsonl, one measured number per row with its source
(URL), the engine and version, the quote it comes from, the weights' precision where not bf16 (`precision`, `precision_why`), the stated load and request lengths
(fixed at `input_len` / `output_len`, or `input_lengths` / `output_lengths` as `LO-HI`;
`lengths_assumed` says what the source leaves out and what stands in), and the engine's
scheduler limits where its version's defaults differ from today's vLLM (`settings` cites
them), and the engine generation whose host overhead times its steps (`engine_profile`, one
of solver.cost.serving.overhead's, `engine_profile_why` saying why; `num_scheduler_steps` for
vLLM 0.6's multi-step runs). Each row becomes a `parplan serve` problem on one engine of the
row's degrees (tp, pp; the other GPUs are data-parallel ranks), evaluated by the load model of
solver/cost/serving (round, curves, load, overhead) at the row's load; no
constant is fitted to the rows.
Left out: runs that were offered more than they served (datacrunch's 8 and 16 requests/s of
1,024 + 1,024 tokens delivered 3,515 and 4,288 of about 4,270 and 8,540 output tokens/s), whose
numbers are those of a growing queue, not of a load.

Loads: `request_rate`, `concurrency`, `burst` (N prompts sent at once) and `batch`
(benchmark_latency.py: one prefill of the batch's prompts, then output - 1 decode steps). Each
row names the benchmark client that sent its load (`client`, `client_why`), and is predicted
with that client (solver/serve/workload.py CLIENTS): `poisson` for a request rate
(sglang.bench_serving and benchmark_serving.py draw Poisson gaps by default), `closed` for a
concurrency (synchronised waves, solver/cost/serving/closed.py). A burst row is the finite
batch of its N prompts sent at once (solver.cost.serving.burst: the engine's rounds until the
last request ends; max_request_rate N / that duration, ttft_mean_ms and tpot_mean_ms the
benchmark's means over the N); its `client` names the closed loop that older versions of this
script read it as. Without a client a burst row is read as the largest stable Poisson rate.

Metrics: ttft_/tpot_ mean_ms or pXX_ms (the model at that SLO percentile), itl_p50_ms (the
median gap between tokens: the round of the decodes alone at the mean population, since a
prompt's chunk rides in few of the steps at these loads),
throughput_gain_over_c1 (output tokens/s at the row's concurrency over concurrency 1),
max_request_rate (requests/s) and batch_latency_ms. Printed: every row, the error per source,
the median and p90 of |error| and the worst rows; per kind (TTFT; TPOT with the inter-token
gap; output throughput: the largest request rate at the row's output length and the gain
over one user) against issue 38's targets; `--markdown` the README's table, split by load
(light, heavy: load_class), engine, dense/MoE and GPU.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cost.serving.load import interpolate_curve, largest_stable_rate
from solver.cost.serving.round import estimate_round_s
from solver.serve import ServeJob, ServeProblem
from solver.serve.burst import estimate_burst
from solver.serve.candidates import ServeCandidates
from solver.serve.load import estimate_load_curves, estimate_serving_load
from solver.serve.timing import build_engine
from solver.serve.workload import ServeLoadSpec, parse_length_distribution

DATA = Path(__file__).resolve().parent / "data" / "serve_published.jsonl"
WORST = 6
HEAVY_USERS = 32  # concurrent users or batched prompts from which a row counts as heavy load
# Metric -> the kind issue 38's targets name: a largest request rate (at the row's output
# length) and a gain over concurrency 1 are output throughput; a batch's latency its own kind.
KINDS = {"ttft": "ttft", "tpot": "tpot", "itl": "tpot", "max": "throughput",
         "throughput": "throughput", "batch": "latency"}
TARGETS = {"ttft": 0.25, "tpot": 0.12, "throughput": 0.15}  # issue 38's done-when (median)
SPLITS = ("load", "engine_family", "model_family", "gpu")


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _percentile(metric: str) -> int:
    kind = metric.split("_")[1]
    return int(kind[1:]) if kind.startswith("p") else 50


def build_problem(row: dict[str, Any], load: dict[str, Any] | None = None
                  ) -> tuple[ServeProblem, ServeCandidates]:
    """The row's serving problem and its one engine (tp x pp GPUs per DP rank)."""
    load = row["load"] if load is None else load
    client = row.get("client") if load else None
    concurrency = load.get("concurrency", load.get("burst") if client == "closed" else None)
    spec = ServeLoadSpec(request_rate=load.get("request_rate"), concurrency=concurrency,
                         slo_percentile=_percentile(row["metric"]), client=client,
                         burstiness=row.get("burstiness"))
    lengths = {f"{side}_lengths": parse_length_distribution(row[f"{side}_lengths"], side)
               for side in ("input", "output") if f"{side}_lengths" in row}
    job = ServeJob(context=row["context"], input_len=row["input_len"],
                   output_len=row["output_len"], load=spec, **lengths,
                   precision=row.get("precision", "bf16"),
                   max_num_seqs=row.get("max_num_seqs"),
                   max_num_batched_tokens=row.get("max_num_batched_tokens"),
                   engine=row["engine_profile"],
                   num_scheduler_steps=row.get("num_scheduler_steps", 1))
    problem = ServeProblem(model_spec=load_model_spec(row["model"]),
                           cluster=load_calibrated_cluster(row["cluster"], None, None),
                           num_gpus=row["gpus"], job=job)
    tp, pp = row["tp"], row.get("pp", 1)
    engine = ServeCandidates(tp=tp, pp=pp, dp=row["gpus"] // (tp * pp), ep=1, replicas=1)
    return problem, engine


def _batch_latency_s(row: dict[str, Any]) -> float:
    """benchmark_latency.py: the batch's prompts in one prefill step, then output - 1 decode
    steps of the whole batch at the mean context of the decode."""
    problem, candidates = build_problem(row, {})
    engine = build_engine(problem, candidates)
    batch, prompt, output = row["load"]["batch"], row["input_len"], row["output_len"]
    prefill = estimate_round_s(engine, 0.0, 0.0, batch * prompt, prompt)
    decode = estimate_round_s(engine, float(batch), prompt + output / 2.0, 0.0, prompt)
    return float(prefill[0] + (output - 1) * decode[0])


def predict(row: dict[str, Any]) -> float:
    """The model's number for the row's metric (module docstring)."""
    metric, load = row["metric"], row["load"]
    if metric == "batch_latency_ms":
        return _batch_latency_s(row) * 1e3
    if "burst" in load:  # the finite batch (solver.cost.serving.burst)
        problem, engine = build_problem(row, {})
        result = estimate_burst(problem, engine, load["burst"])[0]
        burst = {"max_request_rate": result.request_rate_per_s,
                 "ttft_mean_ms": result.ttft_mean_s * 1e3,
                 "tpot_mean_ms": result.tpot_mean_s * 1e3}
        if metric not in burst:
            raise ValueError(f"{row['id']}: a burst gives {sorted(burst)}, not {metric!r}")
        return burst[metric]
    if metric == "max_request_rate" and row.get("client") == "closed":
        problem, engine = build_problem(row)
        return float(estimate_serving_load(problem, engine).point.rate_per_s[0])
    if metric == "max_request_rate":
        problem, engine = build_problem(row, {})
        curves = estimate_load_curves(problem, engine)
        return float(largest_stable_rate(curves)[0] * curves.engines[0])
    problem, engine = build_problem(row)
    load_model = estimate_serving_load(problem, engine)
    point = load_model.point
    if metric == "itl_p50_ms":  # the typical step: a round of the decodes alone
        curves = load_model.curves
        step = interpolate_curve(curves, curves.decode_round_s, point.decoding + 1.0)
        return float(step[0]) * 1e3
    if metric == "throughput_gain_over_c1":
        alone, _ = build_problem(row, {"concurrency": 1})
        single = estimate_serving_load(alone, engine).point
        return float(point.tokens_per_s[0] / single.tokens_per_s[0])
    what, kind = metric.split("_")[:2]
    if what not in ("ttft", "tpot") or not (kind == "mean" or kind.startswith("p")):
        raise ValueError(f"{row['id']}: unknown metric {metric!r} (load {load})")
    name = f"{what}_mean_s" if kind == "mean" else f"{what}_s"
    return float(getattr(point, name)[0]) * 1e3


def load_class(row: dict[str, Any]) -> str:
    """"heavy" where the engine runs full: a burst (all prompts at once), a largest-rate row,
    or HEAVY_USERS or more concurrent users or batched prompts; "light" otherwise (request-rate
    rows and small concurrencies)."""
    load = row["load"]
    users = max(load.get("concurrency", 0), load.get("batch", 0))
    if "burst" in load or row["metric"] == "max_request_rate" or users >= HEAVY_USERS:
        return "heavy"
    return "light"


def evaluate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    results = []
    for row in rows:
        predicted = predict(row)
        engine = "SGLang" if row["engine_profile"].startswith("sglang") else "vLLM"
        family = "MoE" if load_model_spec(row["model"]).is_moe else "dense"
        results.append({"id": row["id"], "source": row["source"], "engine": row["engine"],
                        "client": row.get("client", "-"),
                        "metric": row["metric"], "measured": row["measured"],
                        "predicted": round(predicted, 3),
                        "error": round(predicted / row["measured"] - 1.0, 4),
                        "kind": KINDS[row["metric"].split("_")[0]], "load": load_class(row),
                        "engine_family": engine, "model_family": family,
                        "gpu": row["cluster"]})
    return results


def _stats(rs: list[dict[str, Any]]) -> dict[str, float]:
    errors = np.array([r["error"] for r in rs])
    return {"rows": len(rs), "median_abs": float(np.median(np.abs(errors))),
            "p90_abs": float(np.quantile(np.abs(errors), 0.9)),
            "median_signed": float(np.median(errors))}


def _groups(results: list[dict[str, Any]], key: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list] = {}
    for r in results:
        name = r[key].split("_")[0] if key == "metric" else r.get(key, "-")
        groups.setdefault(name, []).append(r)
    return dict(sorted(groups.items()))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and p90 of |error| overall, per source, metric, client, kind, and per split
    (load, engine, dense/MoE, GPU) and kind; the worst rows."""
    by = {key: {name: _stats(rs) for name, rs in _groups(results, key).items()}
          for key in ("source", "metric", "client", "kind")}
    splits = {}
    for key in SPLITS:
        for name, rs in _groups(results, key).items():
            splits[name] = {"rows": len(rs), **{
                kind: _stats(ks)["median_abs"] for kind, ks in _groups(rs, "kind").items()}}
    worst = sorted(results, key=lambda r: -abs(r["error"]))[:WORST]
    return {"all": _stats(results), "by_source": by["source"], "by_metric": by["metric"],
            "by_client": by["client"], "by_kind": by["kind"], "splits": splits,
            "worst": [r["id"] for r in worst]}


def render_markdown(results: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    """The README's table: median |error| per split and kind, the targets, the worst rows."""
    kinds = ("ttft", "tpot", "throughput")
    lines = ["| rows | n | " + " | ".join(k.upper() if k != "throughput" else "throughput"
                                        for k in kinds) + " | all |",
             "|---|---:|" + "---:|" * (len(kinds) + 1)]

    def cell(split: dict[str, Any], kind: str) -> str:
        return f"{100 * split[kind]:.0f}%" if kind in split else "-"

    overall = {"rows": summary["all"]["rows"],
               **{k: v["median_abs"] for k, v in summary["by_kind"].items()}}
    for name, split in [("all", overall), *summary["splits"].items()]:
        everything = (summary["all"]["median_abs"] if name == "all" else
                      float(np.median([abs(r["error"]) for r in results
                                       if name in (r["load"], r["engine_family"],
                                                   r["model_family"], r["gpu"])])))
        lines.append(f"| {name} | {split['rows']} | "
                     + " | ".join(cell(split, k) for k in kinds) + f" | {100 * everything:.0f}% |")
    lines.append("| target | | " + " | ".join(f"{100 * TARGETS[k]:.0f}%" for k in kinds) + " | |")
    worst = ", ".join(f"{r['id']} {100 * r['error']:+.0f}%"
                      for r in sorted(results, key=lambda r: -abs(r["error"]))[:WORST])
    return "\n".join(lines) + f"\n\nWorst rows: {worst}."


def main() -> None:
    results = evaluate(load_rows())
    summary = summarize(results)
    if "--json" in sys.argv:
        print(json.dumps({"rows": results, "summary": summary}, indent=1))
        return
    if "--markdown" in sys.argv:
        print(render_markdown(results, summary))
        return
    print(f"{'row':44} {'metric':24} {'client':8} {'measured':>9} {'predicted':>9} "
          f"{'error':>7}")
    for r in results:
        print(f"{r['id']:44} {r['metric']:24} {r['client']:8} {r['measured']:9.2f} "
              f"{r['predicted']:9.2f} {100 * r['error']:+6.1f}%")

    def line(name: str, s: dict[str, float]) -> str:
        return (f"  {name:72} {s['rows']:3d} rows  median |error| "
                f"{100 * s['median_abs']:5.1f}%  p90 {100 * s['p90_abs']:5.1f}%  "
                f"median signed {100 * s['median_signed']:+6.1f}%")

    print("\nby source:")
    for name, s in summary["by_source"].items():
        print(line(name, s))
    print("by metric:")
    for name, s in summary["by_metric"].items():
        print(line(name, s))
    print("by client:")
    for name, s in summary["by_client"].items():
        print(line(name, s))
    print("by kind (issue 38's targets: median |error| TTFT <= 25%, TPOT <= 12%, output "
          "throughput <= 15%):")
    for name, s in summary["by_kind"].items():
        print(line(name, s))
    print(line("all", summary["all"]))
    print("worst rows: " + ", ".join(summary["worst"]))


if __name__ == "__main__":
    main()
