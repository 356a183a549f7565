"""Sweep throughput (issue 8, "Check it against"): the zoo x 4 presets x 6 GPU counts, solved
one by one in this process and then by `parplan sweep`'s runner on every core.

    .venv/bin/python benchmarks/sweep.py [--models M ...] [--presets P ...] [--gpus N ...]
        [--top K] [--jobs J] [--every K] [--profile N]

Printed: problems per second of the serial run and of the parallel sweep (with the results
file written and fsync'd as `parplan sweep` does), the ratio between them, the per-problem
median / mean / p90 solve time by status, by GPU count, and the slowest problems; how far
from the optimum the unproven answers' best plans may be (their optimality gaps); with
`--profile N`, where the time of N problems (every K-th) goes: spec loading, constraint
enumeration with its memory check, ranking, plans, the infeasibility explanation. Issue 15's
target is >= 50 problems/s on this 2-core machine. The full zoo takes several minutes.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from solver.catalog import list_zoo_names
from solver.sweep.execute import default_jobs, start_run
from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import SweepProblem, build_sweep_problems, order_longest_first
from solver.sweep.results import ResultsFile
from solver.runtime import tune_allocator

PRESETS = ["dgx-h100", "dgx-a100-80gb", "gb200-nvl72", "mi300x"]
GPUS = [8, 64, 256, 512, 1024, 4096]
# Where a problem's time goes: (label, file suffix, function name) read from the profile.
PHASES = [
    ("load specs + build problem", "solver/optimize.py", "build_problem"),
    ("solve (all of it)", "solver/optimize.py", "solve"),
    ("  searches (own, module sets, offloads)", "solver/search/module_variants.py",
     "search_module_sets"),
    ("    opened (numpy phases)", "solver/search/layout_search.py", "__init__"),
    ("    enumerate the rules", "solver/search/enumerate.py", "enumerate_feasible"),
    ("    first pass (layer-term bounds)", "solver/search/enumerate.py", "may_enter_top"),
    ("    even splits that fit (every call)", "solver/search/enumerate.py",
     "fastest_that_fit"),
    ("    memory-aware layout bounds", "solver/search/layout_bounds.py",
     "estimate_memory_bounds"),
    ("    layout programs (CP-SAT)", "solver/search/layout_program.py", "solve_layout"),
    ("  plans of the merged top K", "solver/ranked_plans.py", "build_ranked_plans"),
    ("  explain the winner", "solver/search/explain.py", "explain_choice"),
    ("  explain infeasible: conflicts", "solver/search/explain.py", "find_conflicts"),
    ("  explain infeasible: fixes (re-solves)", "solver/fixes.py", "suggest_fixes"),
    ("JSON line", "solver/optimize_json.py", "render_result_json"),
]


def run_serial(problems: list[SweepProblem], settings: SolveSettings
               ) -> tuple[float, dict[SweepProblem, tuple[str, float]],
                          dict[SweepProblem, float]]:
    """The serial run: its wall time, each problem's status and seconds, and the optimality
    gap of each unproven answer (how far from the optimum its best plan may be)."""
    times, gaps = {}, {}
    start = time.perf_counter()
    for problem in problems:
        begin = time.perf_counter()
        line = solve_sweep_problem(problem, settings)
        times[problem] = (line["status"], time.perf_counter() - begin)
        if line["status"] == "feasible" and line.get("optimality_gap") is not None:
            gaps[problem] = line["optimality_gap"]
    return time.perf_counter() - start, times, gaps


def run_parallel(problems: list[SweepProblem], settings: SolveSettings, jobs: int) -> float:
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        with ResultsFile(Path(folder) / "results.jsonl") as results:
            run = start_run(order_longest_first(problems), settings, jobs)
            try:
                for outcome in run:
                    assert outcome.line is not None, outcome.failure
                    results.append(outcome.line)
            finally:
                run.close()
        return time.perf_counter() - start


def profile(problems: list[SweepProblem], settings: SolveSettings) -> dict[str, float]:
    profiler = cProfile.Profile()
    profiler.enable()
    for problem in problems:
        solve_sweep_problem(problem, settings)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    seconds = {}
    for label, suffix, name in PHASES:
        seconds[label] = sum(entry[3] for (path, _, function), entry in stats.items()
                             if function == name and path.endswith(suffix))
    return seconds


def summarize(values: list[float]) -> tuple[str, str, str]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"{statistics.median(values):.3f}", f"{statistics.mean(values):.3f}", f"{p90:.3f}")


def print_tables(console: Console, times: dict[SweepProblem, tuple[str, float]],
                 serial_s: float, parallel_s: float | None, jobs: int) -> None:
    n = len(times)
    table = Table(title=f"Sweep throughput: {n} problems")
    for column in ("run", "workers", "wall s", "problems/s", "vs serial"):
        table.add_column(column, justify="right")
    table.add_row("one by one, in process", "1", f"{serial_s:.1f}", f"{n / serial_s:.2f}",
                  "1.00x")
    if parallel_s is not None:
        table.add_row("parplan sweep runner", str(jobs), f"{parallel_s:.1f}",
                      f"{n / parallel_s:.2f}", f"{serial_s / parallel_s:.2f}x")
    table.add_row("target (issue 15)", "", "", ">= 50", "")
    console.print(table)

    per = Table(title="Per-problem solve time, seconds (serial run)")
    for column in ("group", "problems", "median", "mean", "p90", "share of total"):
        per.add_column(column, justify="right" if column != "group" else "left")
    groups: dict[str, list[float]] = defaultdict(list)
    for problem, (status, seconds) in times.items():
        groups["all"].append(seconds)
        groups[f"status {status}"].append(seconds)
        groups[f"{problem.gpus} GPUs"].append(seconds)
    for name in sorted(groups, key=lambda g: (g != "all", not g.startswith("status"),
                                              int(g.split()[0]) if g[0].isdigit() else 0, g)):
        values = groups[name]
        per.add_row(name, str(len(values)), *summarize(values),
                    f"{100 * sum(values) / serial_s:.0f}%")
    console.print(per)

    slow = Table(title="Slowest problems (serial run)")
    for column in ("model", "cluster", "GPUs", "status", "seconds"):
        slow.add_column(column, justify="right" if column in ("GPUs", "seconds") else "left")
    for problem, (status, seconds) in sorted(times.items(), key=lambda x: -x[1][1])[:10]:
        slow.add_row(problem.model, problem.cluster, str(problem.gpus), status,
                     f"{seconds:.2f}")
    console.print(slow)


def print_gaps(console: Console, gaps: dict[SweepProblem, float]) -> None:
    """How far from the optimum the unproven answers' best plans may be (serial run)."""
    if not gaps:
        return
    values = sorted(gaps.values())
    table = Table(title=f"Unproven answers ({len(values)}): the best plan's optimality gap")
    for column in ("median", "p90", "worst", "within 1%", "within 5%"):
        table.add_column(column, justify="right")
    table.add_row(f"{100 * statistics.median(values):.1f}%",
                  f"{100 * values[min(len(values) - 1, int(0.9 * len(values)))]:.1f}%",
                  f"{100 * values[-1]:.1f}%", str(sum(v <= 0.01 for v in values)),
                  str(sum(v <= 0.05 for v in values)))
    console.print(table)
    worst = Table(title="Widest gaps")
    for column in ("model", "cluster", "GPUs", "gap"):
        worst.add_column(column, justify="right" if column in ("GPUs", "gap") else "left")
    for problem, gap in sorted(gaps.items(), key=lambda x: -x[1])[:5]:
        worst.add_row(problem.model, problem.cluster, str(problem.gpus), f"{100 * gap:.1f}%")
    console.print(worst)


def main() -> None:
    tune_allocator()  # as the parplan CLI does (solver.runtime)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help="default: the whole zoo")
    parser.add_argument("--presets", nargs="*", default=PRESETS)
    parser.add_argument("--gpus", nargs="*", type=int, default=GPUS)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--engine", choices=["layout", "even"], default="layout")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--every", type=int, default=1, help="keep every K-th problem")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="also profile N problems spread over the set")
    parser.add_argument("--no-parallel", action="store_true")
    args = parser.parse_args()
    console = Console(width=120)
    problems = build_sweep_problems(args.models or list_zoo_names(), args.presets, args.gpus,
                                    [4096], [1024], ["bf16"])[::args.every]
    settings = SolveSettings(top=args.top, engine=args.engine)
    console.print(f"{len(problems)} problems, top {args.top}, {args.jobs} workers")
    serial_s, times, gaps = run_serial(problems, settings)
    parallel_s = None if args.no_parallel else run_parallel(problems, settings, args.jobs)
    print_tables(console, times, serial_s, parallel_s, args.jobs)
    print_gaps(console, gaps)
    if args.profile:
        sample = problems[::max(1, len(problems) // args.profile)][:args.profile]
        seconds = profile(sample, settings)
        table = Table(title=f"Where the time goes: {len(sample)} problems, profiled "
                            "(cumulative; nested rows are parts of the row above)")
        for column in ("phase", "seconds", "share of solve"):
            table.add_column(column, justify="left" if column == "phase" else "right")
        whole = seconds["solve (all of it)"] or 1.0
        for label, value in seconds.items():
            table.add_row(label, f"{value:.2f}", f"{100 * value / whole:.0f}%")
        console.print(table)


if __name__ == "__main__":
    main()
