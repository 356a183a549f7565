"""Solve time of the exhaustive oracle (issue 5, "Check it against").

    .venv/bin/python benchmarks/solve_time.py [--models M ...] [--presets P ...]
        [--gpus N ...] [--top K] [--repeat R] [--all-models]

For every model x preset x GPU count the oracle solves the problem (default job, objective
time, Megatron rules), timed `--repeat` times with the median kept. Printed: one row per
problem (time, the best step time or infeasible), the median per GPU count, and the issue's
targets on DeepSeek-V3 / 16,384 hgx-h800 GPUs (top-1 <= 1 s; top-10 <= 3 s). The default set
(6 models x 3 presets x 5 GPU counts) takes under half a minute on 2 cores; the full zoo
(--all-models) several times that.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from solver.catalog import list_zoo_names, load_cluster_spec, load_model_spec
from solver.search.enumerate import solve_by_enumeration
from solver.search.space import Problem
from solver.spec import JobSpec
from solver.runtime import tune_allocator

DEFAULT_MODELS = ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "mixtral-8x7b",
                  "qwen3-30b-a3b", "deepseek-v3"]
DEFAULT_PRESETS = ["dgx-h100", "hgx-h800", "dgx-a100-80gb"]
DEFAULT_GPUS = [8, 64, 512, 2048, 16384]


def time_oracle(problem: Problem, top: int, repeat: int) -> dict:
    """The median time of `repeat` solves and the best step time (None: infeasible)."""
    times, ranked = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        ranked = solve_by_enumeration(problem, top)
        times.append(time.perf_counter() - start)
    feasible = ranked is not None and len(ranked.candidates) > 0
    return {"oracle_s": statistics.median(times),
            "best_s": float(ranked.step_time.step_s[0]) if feasible else None}


def main() -> None:
    tune_allocator()  # as the parplan CLI does (solver.runtime)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--all-models", action="store_true", help="the whole zoo")
    parser.add_argument("--presets", nargs="*", default=DEFAULT_PRESETS)
    parser.add_argument("--gpus", nargs="*", type=int, default=DEFAULT_GPUS)
    parser.add_argument("--top", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    models = list_zoo_names() if args.all_models else args.models
    console = Console(width=120)

    table = Table(title=f"Solve time, top {args.top} (median of {args.repeat})")
    for column in ("model", "cluster", "GPUs", "oracle s", "best step s"):
        table.add_column(column, justify="right" if column not in ("model", "cluster") else "left")
    by_gpus: dict[int, list[float]] = defaultdict(list)
    for model in models:
        for preset in args.presets:
            for num_gpus in args.gpus:
                problem = Problem(model_spec=load_model_spec(model),
                                  cluster=load_cluster_spec(preset), job=JobSpec(),
                                  num_gpus=num_gpus)
                row = time_oracle(problem, args.top, args.repeat)
                by_gpus[num_gpus].append(row["oracle_s"])
                best = "infeasible" if row["best_s"] is None else f"{row['best_s']:.3f}"
                table.add_row(model, preset, str(num_gpus), f"{row['oracle_s']:.2f}", best)
    console.print(table)

    summary = Table(title="Median per GPU count")
    for column in ("GPUs", "problems", "oracle s"):
        summary.add_column(column, justify="right")
    for num_gpus in sorted(by_gpus):
        seconds = by_gpus[num_gpus]
        summary.add_row(str(num_gpus), str(len(seconds)), f"{statistics.median(seconds):.2f}")
    console.print(summary)

    targets = Table(title="Targets: DeepSeek-V3 on 16,384 hgx-h800 GPUs")
    for column in ("top", "oracle s", "target"):
        targets.add_column(column, justify="right")
    problem = Problem(model_spec=load_model_spec("deepseek-v3"),
                      cluster=load_cluster_spec("hgx-h800"), job=JobSpec(), num_gpus=16384)
    for top, goal in ((1, 1.0), (10, 3.0)):
        row = time_oracle(problem, top, args.repeat)
        met = row["best_s"] is not None and row["oracle_s"] <= goal
        targets.add_row(str(top), f"{row['oracle_s']:.2f}",
                        f"<= {goal:g} s: {'met' if met else 'NOT met'}")
    console.print(targets)


if __name__ == "__main__":
    main()
