"""Fit the error model of solver.cost.uncertainty to the public runs (issue 36 item 1) and check
its intervals source by source.

    .venv/bin/python benchmarks/error_model.py [--write] [--check]

Inputs (the other accuracy scripts' own rows and predictions, imported, not copied):
  time    benchmarks/time_accuracy.py estimate_runs: every public training run, its measured
          tokens/s per GPU and the predicted step split into TIME_PARTS
  memory  benchmarks/memory_public.py summarize_public (torchtitan, torchao, torchtune, Trainy,
          dgxc rows, each in its counter's view) and benchmarks/memory_accuracy.py summarize
          (BLOOM-176B, nvidia-smi of stage 0 against the worst stage's total)
  serve   benchmarks/serve_accuracy.py evaluate: TTFT, TPOT, throughput of vLLM / SGLang runs

The error of a row is log(measured / predicted) (for tokens/s: log(predicted / measured), the
step time's). The fit (solver.cost.uncertainty's docstring gives the model):
  plan_sigma   the pooled within-sweep standard deviation of the time errors (time_accuracy's
               sweeps: one source, model and GPU; what plans of one problem do not share)
  group_sigma  non-negative least squares of (error^2 - plan_sigma^2) on each group's sum of
               squared step fractions (E[error^2] = sum_k F_k sigma_k^2 + plan_sigma^2, the
               delta method), every subset of the groups tried (the exact NNLS of 3 columns)
  scale        per category path (framework > arch > GPU generation > precision), the
               scaled-inverse-chi^2 update of its parent's scale^2 with PRIOR_ROWS degrees of
               freedom by the rows' squared standardised errors; memory (per framework
               profile) and serving (per metric) the same on their plain squared errors.
Errors are not re-centred: a bias of the cost model shows up as width, not as a shift.

--write stores the result in solver/catalog/error_model.json (deterministic: the same inputs
give the same file byte for byte) and the coverage table in the README (between
COVERAGE_MARKERS); --check fails when either differs. Printed: the fit, and per source family
the coverage of the 80% intervals and their median width with each source held out (one
publication's table, section, day or release: the fit of the other sources' rows) and with the
whole family held out; serving's by family; in-sample for reference.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_accuracy  # noqa: E402
import serve_accuracy  # noqa: E402
from memory_public import FRAMEWORK_PROFILE, MODERN_PATH, summarize_public  # noqa: E402
from published import DATA_PATH as RUNS_PATH  # noqa: E402
from published import load_published_runs  # noqa: E402
from time_accuracy import SOURCE_FRAMEWORKS, estimate_runs, sweep_keys  # noqa: E402

from solver.cost.uncertainty import (  # noqa: E402
    ERROR_MODEL_PATH,
    TIME_GROUPS,
    build_error_model,
    estimate_step_sigma,
    interval_z,
    lookup_scale,
    time_category,
)

ROOT = Path(__file__).resolve().parent.parent
# Prior degrees of freedom of a category's scale: a category of PRIOR_ROWS rows weighs as much
# as its parent (the threshold for a source family worth checking).
PRIOR_ROWS = 10
LEVEL = 0.8
MIN_FAMILY_ROWS = 10
# The README's table of the leave-one-out coverage lies between these lines (--write writes it,
# --check compares it).
README_PATH = Path(__file__).resolve().parent.parent / "README.md"
COVERAGE_MARKERS = ("<!-- benchmarks/error_model.py coverage: generated, do not edit -->",
                    "<!-- end of benchmarks/error_model.py coverage -->")
DIGITS = 4
# BLOOM's memory rows ran Megatron-DeepSpeed (memory_accuracy.py's docstring).
BLOOM_MEMORY_PROFILE = "deepspeed"
# Serving metrics -> the error kind whose sigma covers them (serve_accuracy's metrics): a
# benchmark_latency batch and the inter-token gap are decode steps (tpot), the largest stable
# rate and the gain over one request are throughput.
SERVE_KINDS = {"ttft": "ttft", "tpot": "tpot", "itl": "tpot", "batch": "tpot",
               "max": "throughput", "throughput": "throughput"}


# ---- rows -------------------------------------------------------------------------------------

def load_time_rows() -> list[dict[str, Any]]:
    """One dict per public run: family, sweep, category levels, error, TIME_PARTS seconds."""
    runs, _ = load_published_runs()
    rows = []
    for run, step in estimate_runs(runs):
        keys = sweep_keys(run)
        rows.append({
            "family": run.source_group, "source": run.source,
            "sweep": keys[0] if keys else None,
            "levels": time_category(SOURCE_FRAMEWORKS[run.source_group], run.arch_kind,
                                    run.gpu, run.precision),
            "error": math.log(step["tokens_per_s_per_gpu"] / run.tokens_per_sec_per_gpu),
            "parts": {name: step[name] for group in TIME_GROUPS.values() for name in group},
        })
    return rows


def load_memory_rows() -> list[dict[str, Any]]:
    """One dict per compared public memory row: family, source, framework profile, error."""
    public = summarize_public()["rows"]
    rows = [{"family": r["source"], "source": source,
             "levels": (FRAMEWORK_PROFILE[r["framework"]],),
             "error": math.log(r["measured_gb"] / r["predicted_gb"])}
            for r, source in zip(public, memory_sources(public))]
    bloom = memory_accuracy.summarize(memory_accuracy.load_memory_cases())["rows"]
    with memory_accuracy.DATA_PATH.open(encoding="utf-8") as lines:
        stated = {d["id"]: d["source"] for d in map(json.loads, filter(str.strip, lines))}
    rows += [{"family": "bloom", "source": stated[r["id"]], "levels": (BLOOM_MEMORY_PROFILE,),
              "error": math.log(r["measured_gb"] / r["predicted_gb"])}
             for r in bloom if r["measured_gb"] is not None]
    return rows


def memory_sources(public: Sequence[dict[str, Any]]) -> list[str]:
    """The source of each public memory row: its document and table ("Table 2" of
    "Table 2, row 'FSDP 2, CP 4' (...)"); a "same table" row is the one above it's."""
    sources: list[str] = []
    for r in public:
        table = r["source_locator"].split(",")[0].split(" (")[0]
        same = table.startswith("same table") and sources and sources[-1].startswith(
            r["source_url"] + "#")
        sources.append(sources[-1] if same else f"{r['source_url']}#{table}")
    return sources


def load_serve_rows() -> list[dict[str, Any]]:
    """One dict per serving row: family (the source's site and owner), metric kind, error."""
    rows = []
    for r in serve_accuracy.evaluate(serve_accuracy.load_rows()):
        site = r["source"].split("://")[1].split("/")
        family = "/".join(site[:2]) if site[0] == "github.com" else site[0]
        rows.append({"family": family, "source": r["source"],
                     "levels": (SERVE_KINDS[r["metric"].split("_")[0]],),
                     "error": math.log(r["measured"] / r["predicted"])})
    return rows


# ---- fit --------------------------------------------------------------------------------------

def fit_plan_sigma(rows: Sequence[dict[str, Any]]) -> float:
    """Pooled within-sweep standard deviation of the errors (sweeps of 2+ rows)."""
    sweeps: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        if row["sweep"] is not None:
            sweeps[row["sweep"]].append(row["error"])
    groups = [np.array(e) for e in sweeps.values() if len(e) > 1]
    squares = sum(float(((e - e.mean()) ** 2).sum()) for e in groups)
    return math.sqrt(squares / sum(len(e) - 1 for e in groups))


def group_squares(parts: dict[str, float]) -> np.ndarray:
    """Each TIME_GROUPS group's sum of squared step fractions (its weight in the variance)."""
    step = sum(parts.values())
    return np.array([sum((parts[p] / step) ** 2 for p in names)
                     for names in TIME_GROUPS.values()])


def fit_group_sigma(rows: Sequence[dict[str, Any]], plan_sigma: float) -> dict[str, float]:
    """Non-negative least squares of error^2 - plan_sigma^2 on the group weights: every subset
    of the groups by least squares, the best one whose coefficients are all >= 0."""
    weights = np.array([group_squares(r["parts"]) for r in rows])
    target = np.array([r["error"] ** 2 for r in rows]) - plan_sigma ** 2
    best: tuple[float, np.ndarray] = (math.inf, np.zeros(len(TIME_GROUPS)))
    for size in range(1, len(TIME_GROUPS) + 1):
        for subset in itertools.combinations(range(len(TIME_GROUPS)), size):
            coef, *_ = np.linalg.lstsq(weights[:, subset], target, rcond=None)
            if (coef < 0).any():
                continue
            full = np.zeros(len(TIME_GROUPS))
            full[list(subset)] = coef
            residual = float(((weights @ full - target) ** 2).sum())
            if residual < best[0]:
                best = (residual, full)
    return {group: float(math.sqrt(v)) for group, v in zip(TIME_GROUPS, best[1])}


def fit_scales(rows: Sequence[dict[str, Any]], squares: Sequence[float]) -> dict[str, float]:
    """Per category path, the shrunk root mean of `squares` (module docstring): "" is every
    row, then each prefix of the rows' levels with its parent as prior."""
    paths: dict[str, list[float]] = defaultdict(list)
    for row, square in zip(rows, squares):
        for depth in range(len(row["levels"]) + 1):
            paths["/".join(row["levels"][:depth])].append(square)
    scale2 = {"": float(np.mean(paths[""]))}
    for path in sorted(paths, key=lambda p: (p.count("/"), p)):
        if path == "":
            continue
        parent = scale2[path.rsplit("/", 1)[0] if "/" in path else ""]
        values = paths[path]
        scale2[path] = (PRIOR_ROWS * parent + sum(values)) / (PRIOR_ROWS + len(values))
    # A category none of the rows has takes the root mean square of its siblings' (each
    # category one draw of the categories' spread, however many rows it has): "parent/*".
    children: dict[str, list[float]] = defaultdict(list)
    for path, value in scale2.items():
        if path:
            children[path.rsplit("/", 1)[0] if "/" in path else ""].append(value)
    unseen = {f"{parent}/*" if parent else "*": float(np.mean(values)) for parent, values in children.items()}
    return {path: math.sqrt(v) for path, v in sorted({**scale2, **unseen}.items())}


def fit_time(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    plan_sigma = fit_plan_sigma(rows)
    group_sigma = fit_group_sigma(rows, plan_sigma)
    unit = build_error_model({"time": {"group_sigma": group_sigma, "plan_sigma": plan_sigma,
                                       "scale": {"": 1.0}},
                              "memory": {"sigma": {"": 1.0}}, "serve": {"sigma": {"": 1.0}}})
    variance = [float(estimate_step_sigma(unit, (), _as_arrays(r["parts"]))[0]) ** 2 for r in rows]
    standardised = [r["error"] ** 2 / v for r, v in zip(rows, variance)]
    return {"group_sigma": group_sigma, "plan_sigma": plan_sigma,
            "scale": fit_scales(rows, standardised)}


def fit_plain(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per category (and "" for all), the shrunk root mean square error: a sigma."""
    return fit_scales(rows, [r["error"] ** 2 for r in rows])


def fit_all(time_rows, memory_rows, serve_rows) -> dict[str, Any]:
    return {"time": fit_time(time_rows), "memory": {"sigma": fit_plain(memory_rows)},
            "serve": {"sigma": fit_plain(serve_rows)}}


def _as_arrays(parts: dict[str, float]) -> dict[str, np.ndarray]:
    return {name: np.array([value]) for name, value in parts.items()}


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


# ---- leave one source out ---------------------------------------------------------------------

def time_sigma(fit: dict[str, Any], row: dict[str, Any]) -> float:
    model = build_error_model({"time": fit, "memory": {"sigma": {"": 1.0}},
                               "serve": {"sigma": {"": 1.0}}})
    return float(estimate_step_sigma(model, row["levels"], _as_arrays(row["parts"]))[0])


def held_out_sigmas(rows: Sequence[dict[str, Any]],
                    fit: Callable[[list[dict[str, Any]]], Any],
                    sigma: Callable[[Any, dict[str, Any]], float], unit: str) -> np.ndarray:
    """Each row's sigma under the fit of the rows of the other values of `unit` ("source": one
    publication's table, section, day or release; "family": every source of a group)."""
    sigmas = np.zeros(len(rows))
    for held in sorted({r[unit] for r in rows}):
        fitted = fit([r for r in rows if r[unit] != held])
        for i, row in enumerate(rows):
            if row[unit] == held:
                sigmas[i] = sigma(fitted, row)
    return sigmas


def coverage_by_family(rows: Sequence[dict[str, Any]], sigmas: np.ndarray
                       ) -> list[dict[str, Any]]:
    """Per source family: its rows, its sources, the share inside their LEVEL intervals and
    the median relative width of those intervals ((high - low) / point = 2 sinh(z sigma))."""
    z = interval_z(LEVEL)
    table = []
    for family in sorted({r["family"] for r in rows}):
        inside = [i for i, r in enumerate(rows) if r["family"] == family]
        errors = np.array([rows[i]["error"] for i in inside])
        table.append({"family": family, "rows": len(inside),
                      "sources": len({rows[i]["source"] for i in inside}),
                      "coverage": float(np.mean(np.abs(errors) <= z * sigmas[inside])),
                      "median_width": float(np.median(2 * np.sinh(z * sigmas[inside])))})
    return table


def leave_one_out(rows: Sequence[dict[str, Any]],
                  fit: Callable[[list[dict[str, Any]]], Any],
                  sigma: Callable[[Any, dict[str, Any]], float],
                  unit: str = "source") -> list[dict[str, Any]]:
    """Per source family, the coverage of its rows each held out by `unit` (held_out_sigmas)."""
    return coverage_by_family(rows, held_out_sigmas(rows, fit, sigma, unit))


def in_sample(rows: Sequence[dict[str, Any]], fitted: Any,
              sigma: Callable[[Any, dict[str, Any]], float]) -> list[dict[str, Any]]:
    """Per source family, the coverage under the fit of every row (its own category seen)."""
    return coverage_by_family(rows, np.array([sigma(fitted, r) for r in rows]))


def render_coverage(title: str, table: Sequence[dict[str, Any]],
                    how: str = "leave-one-source-out") -> None:
    print(f"\n{title}: {how} coverage of the {LEVEL:.0%} intervals")
    print(f"| {'source family':40} | rows | coverage | median width |")
    print(f"|{'-' * 42}|------|----------|--------------|")
    for t in table:
        mark = "" if t["rows"] >= MIN_FAMILY_ROWS else " (< 10 rows)"
        print(f"| {t['family'] + mark:40} | {t['rows']:4d} | {t['coverage']:8.0%} | "
              f"{t['median_width']:12.0%} |")


def render_coverage_markdown(kind: str, rows: Sequence[dict[str, Any]],
                             fit: Callable[[list[dict[str, Any]]], Any],
                             sigma: Callable[[Any, dict[str, Any]], float]) -> list[str]:
    """The README's table of one kind of prediction: per family, coverage and median width of
    the LEVEL intervals with each source held out, then with the whole family held out."""
    by_source = leave_one_out(rows, fit, sigma, "source")
    by_family = leave_one_out(rows, fit, sigma, "family")
    lines = [f"| {kind}: source family | rows | sources | source held out: coverage | width "
             "| family held out: coverage | width |",
             "|---|--:|--:|--:|--:|--:|--:|"]
    for s, f in zip(by_source, by_family):
        name = s["family"] if s["rows"] >= MIN_FAMILY_ROWS else f"{s['family']} (< 10 rows)"
        lines.append(f"| {name} | {s['rows']} | {s['sources']} | {s['coverage']:.0%} | "
                     f"{s['median_width']:.0%} | {f['coverage']:.0%} | {f['median_width']:.0%} |")
    return lines


def render_coverage_block(time_rows, memory_rows) -> str:
    """The generated block of the README (between COVERAGE_MARKERS)."""
    plain = lambda f, r: lookup_scale(f, r["levels"])  # noqa: E731
    lines = [COVERAGE_MARKERS[0], *render_coverage_markdown("time", time_rows, fit_time,
                                                              time_sigma),
             "", *render_coverage_markdown("memory", memory_rows, fit_plain, plain),
             COVERAGE_MARKERS[1]]
    return "\n".join(lines)


def replace_block(text: str, block: str) -> str:
    """`text` with its COVERAGE_MARKERS block replaced by `block`."""
    start, end = text.index(COVERAGE_MARKERS[0]), text.index(COVERAGE_MARKERS[1])
    return text[:start] + block + text[end + len(COVERAGE_MARKERS[1]):]


def provenance(time_rows, memory_rows, serve_rows) -> dict[str, Any]:
    inputs = [RUNS_PATH, MODERN_PATH, memory_accuracy.DATA_PATH, serve_accuracy.DATA]
    commit = subprocess.run(
        ["git", "log", "-1", "--format=%H", "--", *map(str, inputs)], cwd=ROOT,
        capture_output=True, text=True, check=False).stdout.strip() or None
    return {
        "script": "benchmarks/error_model.py",
        "inputs": {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()
                   for p in inputs},
        "inputs_commit": commit,
        "rows": {"time": len(time_rows), "memory": len(memory_rows), "serve": len(serve_rows)},
        "prior_rows": PRIOR_ROWS,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true",
                        help="store the fit and the README's coverage table")
    parser.add_argument("--check", action="store_true",
                        help="fail if the stored fit or the README's table differs")
    args = parser.parse_args(argv)
    time_rows, memory_rows, serve_rows = load_time_rows(), load_memory_rows(), load_serve_rows()
    fitted = rounded(fit_all(time_rows, memory_rows, serve_rows))
    stored = {"provenance": provenance(time_rows, memory_rows, serve_rows), **fitted}
    text = json.dumps(stored, indent=1, sort_keys=True) + "\n"
    print(text)
    block = render_coverage_block(time_rows, memory_rows)
    print(block)
    plain = lambda f, r: lookup_scale(f, r["levels"])  # noqa: E731
    render_coverage("Serving", leave_one_out(serve_rows, fit_plain, plain, "family"),
                    "leave-one-family-out")
    render_coverage("Step time", in_sample(time_rows, fit_time(time_rows), time_sigma),
                    "in-sample (fitted on every family)")
    render_coverage("Memory", in_sample(memory_rows, fit_plain(memory_rows), plain),
                    "in-sample (fitted on every family)")
    readme = README_PATH.read_text(encoding="utf-8")
    if args.write:
        ERROR_MODEL_PATH.write_text(text, encoding="utf-8")
        README_PATH.write_text(replace_block(readme, block), encoding="utf-8")
    if args.check and ERROR_MODEL_PATH.read_text(encoding="utf-8") != text:
        sys.exit(f"{ERROR_MODEL_PATH} differs from the fit: run with --write")
    if args.check and replace_block(readme, block) != readme:
        sys.exit(f"{README_PATH}: the coverage table differs from the fit's: run with --write")


if __name__ == "__main__":
    main()
