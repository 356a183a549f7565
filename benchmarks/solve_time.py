"""Solve time of the CP-SAT engine against the exhaustive oracle (issue 5, "Check it against").

    .venv/bin/python benchmarks/solve_time.py [--models M ...] [--presets P ...]
        [--gpus N ...] [--top K] [--repeat R] [--time-limit S] [--all-models]

For every model x preset x GPU count, both engines solve the same problem (default job,
objective time, Megatron rules); each is timed `--repeat` times and the median kept. Printed:
one row per problem (times, CP-SAT status, whether the two top-K lists have equal objective
values), the median per GPU count, and the issue's targets on DeepSeek-V3 / 16,384 hgx-h800
GPUs (proved optimal <= 1 s; top-10 <= 3 s; CP-SAT faster than the oracle above 1,024 GPUs).
The default set (6 models x 3 presets x 5 GPU counts) takes about 3 minutes on 2 cores; the
full zoo (--all-models) several times that.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import numpy as np
from rich.console import Console
from rich.table import Table

from solver.catalog import list_zoo_names, load_cluster_spec, load_model_spec
from solver.search.cpsat import solve_cpsat
from solver.search.enumerate import solve_by_enumeration
from solver.search.space import Problem
from solver.spec import JobSpec
from solver.runtime import tune_allocator

DEFAULT_MODELS = ["llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "mixtral-8x7b",
                  "qwen3-30b-a3b", "deepseek-v3"]
DEFAULT_PRESETS = ["dgx-h100", "hgx-h800", "dgx-a100-80gb"]
DEFAULT_GPUS = [8, 64, 512, 2048, 16384]


def solve_oracle(problem: Problem, top: int):
    return solve_by_enumeration(problem, top)


def timed(function, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def compare(problem: Problem, top: int, repeat: int, time_limit_s: float) -> dict:
    oracle_s, oracle = timed(lambda: solve_oracle(problem, top), repeat)
    cpsat_s, result = timed(lambda: solve_cpsat(problem, top, time_limit_s), repeat)
    if oracle is None:
        agree = result.status == "infeasible"
    elif result.ranked is None:
        agree = False
    else:
        ours, theirs = result.ranked.step_time.step_s, oracle.step_time.step_s
        agree = len(ours) == len(theirs) and bool(np.allclose(ours, theirs, rtol=1e-9))
    return {"oracle_s": oracle_s, "cpsat_s": cpsat_s, "status": result.status, "agree": agree,
            "best_s": None if oracle is None else float(oracle.step_time.step_s[0])}


def main() -> None:
    tune_allocator()  # as the parplan CLI does (solver.runtime)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=DEFAULT_MODELS)
    parser.add_argument("--all-models", action="store_true", help="the whole zoo")
    parser.add_argument("--presets", nargs="*", default=DEFAULT_PRESETS)
    parser.add_argument("--gpus", nargs="*", type=int, default=DEFAULT_GPUS)
    parser.add_argument("--top", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--time-limit", type=float, default=30.0)
    args = parser.parse_args()
    models = list_zoo_names() if args.all_models else args.models
    console = Console(width=120)

    table = Table(title=f"Solve time, top {args.top} (median of {args.repeat})")
    for column in ("model", "cluster", "GPUs", "oracle s", "CP-SAT s", "speed-up", "status",
                   "same objective"):
        table.add_column(column, justify="right" if column not in ("model", "cluster") else "left")
    by_gpus: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for model in models:
        for preset in args.presets:
            for num_gpus in args.gpus:
                problem = Problem(model_spec=load_model_spec(model),
                                  cluster=load_cluster_spec(preset), job=JobSpec(),
                                  num_gpus=num_gpus)
                row = compare(problem, args.top, args.repeat, args.time_limit)
                by_gpus[num_gpus].append((row["oracle_s"], row["cpsat_s"]))
                table.add_row(model, preset, str(num_gpus), f"{row['oracle_s']:.2f}",
                              f"{row['cpsat_s']:.2f}",
                              f"{row['oracle_s'] / row['cpsat_s']:.1f}x", row["status"],
                              "yes" if row["agree"] else "NO")
    console.print(table)

    summary = Table(title="Median per GPU count")
    for column in ("GPUs", "problems", "oracle s", "CP-SAT s", "CP-SAT faster"):
        summary.add_column(column, justify="right")
    for num_gpus in sorted(by_gpus):
        rows = by_gpus[num_gpus]
        summary.add_row(str(num_gpus), str(len(rows)),
                        f"{statistics.median(r[0] for r in rows):.2f}",
                        f"{statistics.median(r[1] for r in rows):.2f}",
                        f"{sum(r[1] < r[0] for r in rows)}/{len(rows)}")
    console.print(summary)

    targets = Table(title="Targets: DeepSeek-V3 on 16,384 hgx-h800 GPUs")
    for column in ("top", "oracle s", "CP-SAT s", "status", "target"):
        targets.add_column(column, justify="right")
    problem = Problem(model_spec=load_model_spec("deepseek-v3"),
                      cluster=load_cluster_spec("hgx-h800"), job=JobSpec(), num_gpus=16384)
    for top, goal in ((1, 1.0), (10, 3.0)):
        row = compare(problem, top, args.repeat, args.time_limit)
        met = row["status"] == "optimal" and row["cpsat_s"] <= goal and row["agree"]
        targets.add_row(str(top), f"{row['oracle_s']:.2f}", f"{row['cpsat_s']:.2f}",
                        row["status"], f"<= {goal:g} s: {'met' if met else 'NOT met'}")
    console.print(targets)


if __name__ == "__main__":
    main()
