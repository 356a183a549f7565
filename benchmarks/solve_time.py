"""Solve time of `optimize` with layouts, and what layouts gain over the even split (issue 15).

    .venv/bin/python benchmarks/solve_time.py [--repeat R] [--problems all|issue]
        [--models M ...] [--presets P ...] [--gpus N ...]

For every problem (default job: seq 4096, global batch 1024; Megatron rules), built as
`parplan optimize` builds it (its recompute module sets and host offloads searched beside it;
`--bare`: the problem alone, none of them), both engines solve it (`even`: every mesh and schedule with the even split of layers; `layout`: the same
and the layout program where a layout can still beat the incumbents), top-1 and top-10, timed
`--repeat` times with the median kept. Printed per problem: the seconds of each, whether the
layout answer is proven, the best step time of each engine and the layout's gain, the number
of layout programs run. The issue's targets (default engine, 2 cores): top-1 in at most 1 s
and top-10 in at most 2 s on its six problems (--problems issue, the default).
"""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

import solver.search.layout_search as layout_search
from solver.catalog import load_cluster_spec, load_model_spec
from solver.optimize import build_problem, solve
from solver.runtime import tune_allocator
from solver.search.space import Problem
from solver.spec import JobSpec

ISSUE_PROBLEMS = [("llama3.1-405b", "dgx-h100", 256), ("llama3.1-405b", "dgx-h100", 16384),
                  ("deepseek-v3", "hgx-h800", 2048), ("deepseek-v3", "hgx-h800", 16384),
                  ("qwen3-235b-a22b", "dgx-b200", 256), ("mixtral-8x22b", "dgx-h100", 64)]


class ProgramCounter:
    """Counts the layout programs solve_with_layouts runs (wraps its solve_program)."""

    def __init__(self) -> None:
        self.count = 0
        self.original = layout_search.solve_program

    def __enter__(self) -> ProgramCounter:
        def counted(*args, **kwargs):
            self.count += 1
            return self.original(*args, **kwargs)
        layout_search.solve_program = counted
        return self

    def __exit__(self, *exc) -> None:
        layout_search.solve_program = self.original


def time_solve(problem: Problem, top: int, engine: str, repeat: int) -> dict:
    times, result, programs = [], None, 0
    for _ in range(repeat):
        with ProgramCounter() as counter:
            start = time.perf_counter()
            result = solve(problem, top=top, engine=engine)
            times.append(time.perf_counter() - start)
        programs = counter.count
    best = result.plans[0].time.step_seconds if result.plans else None
    return {"s": statistics.median(times), "status": result.status, "best_s": best,
            "programs": programs}


def main() -> None:
    tune_allocator()  # as the parplan CLI does (solver.runtime)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", choices=["issue", "grid"], default="issue",
                        help="the issue's six problems, or models x presets x GPU counts")
    parser.add_argument("--models", nargs="*", default=["llama3.1-8b", "llama3.1-70b",
                                                         "mixtral-8x7b", "qwen3-30b-a3b"])
    parser.add_argument("--presets", nargs="*", default=["dgx-h100"])
    parser.add_argument("--gpus", nargs="*", type=int, default=[8, 64, 512])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bare", action="store_true",
                        help="the problem alone: no module sets, offloads or memory savers")
    args = parser.parse_args()
    problems = ISSUE_PROBLEMS if args.problems == "issue" else [
        (m, p, n) for m in args.models for p in args.presets for n in args.gpus]
    console = Console(width=160)
    table = Table(title=f"optimize solve time, median of {args.repeat} (seconds)")
    for column in ("model", "cluster", "GPUs", "even top-1", "layout top-1", "layout top-10",
                   "status", "programs", "even step s", "layout step s", "gain"):
        table.add_column(column, justify="left" if column in ("model", "cluster", "status")
                         else "right")
    top1, top10 = [], []
    for model, preset, num_gpus in problems:
        problem = Problem(model_spec=load_model_spec(model), cluster=load_cluster_spec(preset),
                          job=JobSpec(), num_gpus=num_gpus) if args.bare else build_problem(
            model, preset, num_gpus, seq_len=JobSpec().seq_len,
            global_batch=JobSpec().global_batch)
        even = time_solve(problem, 1, "even", args.repeat)
        first = time_solve(problem, 1, "layout", args.repeat)
        ten = time_solve(problem, 10, "layout", args.repeat)
        top1.append(first["s"])
        top10.append(ten["s"])
        if first["best_s"] is None:
            gain = "infeasible"
        elif even["best_s"] is None:
            gain = "fits only uneven"
        else:
            gain = f"{100 * (even['best_s'] / first['best_s'] - 1):.1f}%"
        fmt = "{:.3f}".format
        table.add_row(model, preset, str(num_gpus), fmt(even["s"]), fmt(first["s"]),
                      fmt(ten["s"]), f"{first['status']}/{ten['status']}",
                      f"{first['programs']}/{ten['programs']}",
                      "-" if even["best_s"] is None else fmt(even["best_s"]),
                      "-" if first["best_s"] is None else fmt(first["best_s"]), gain)
    console.print(table)
    console.print(f"layout engine: top-1 median {statistics.median(top1):.2f} s, max "
                  f"{max(top1):.2f} s (target <= 1 s); top-10 median "
                  f"{statistics.median(top10):.2f} s, max {max(top10):.2f} s (target <= 2 s)")


if __name__ == "__main__":
    main()
