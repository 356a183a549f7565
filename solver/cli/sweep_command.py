"""`parplan sweep`: every combination of models, clusters, GPU counts and jobs, solved in
parallel into a JSON Lines file that a rerun resumes."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import click

from solver.cli.help_groups import GroupedCommand
from solver.cli.limit_options import solve_limit_options
from solver.cli.options import framework_option
from solver.cli.params import (
    MAX_JOBS,
    MAX_PROBLEMS,
    MAX_TOP,
    BoundedInt,
    PinSpec,
)
from solver.cli.shared_flags import (
    exit_if_infeasible,
    fail_on_infeasible_option,
    interval_level_option,
    memory_headroom_option,
    check_fit_flags,
    min_fit_probability_option,
)
from solver.spec.job import PRECISIONS, JobSpec
from solver.spec.strict import MAX_BATCH, MAX_SEQ_LEN

ENGINES = ("layout", "even")  # solver.optimize.ENGINES (imported lazily: --help stays fast)
# An hour or two of a 2-core machine at the zoo's measured 1.5-2.9 problems/s
# (docs/sweeps_and_reports.md, benchmarks/sweep.py), far more on larger problems; a typo in a
# range is more.
DEFAULT_MAX_PROBLEMS = 10_000


def _default(field: str) -> str:
    return str(JobSpec.model_fields[field].default)


@click.command(cls=GroupedCommand)
@click.option("--models", required=True, metavar="all|NAMES|GLOB",
              help="Comma-separated zoo names, globs (llama3*), model files, or all.")
@click.option("--clusters", required=True, metavar="all|NAMES|GLOB",
              help="Comma-separated preset names, globs, cluster files, or all.")
@click.option("--gpus", "gpu_counts", required=True, type=PinSpec(), metavar="N,N,...",
              help="GPU counts, e.g. 8,64,512,4096.")
@click.option("--seq-len", "seq_lens", type=PinSpec(1, MAX_SEQ_LEN),
              default=_default("seq_len"), show_default=True, metavar="N,N,...",
              help="Tokens per sequence (a list).")
@click.option("--global-batch", "global_batches", type=PinSpec(1, MAX_BATCH),
              metavar="N,N,...", default=_default("global_batch"), show_default=True,
              help="Sequences per optimizer step (a list).")
@click.option("--precision", "precisions", default="bf16", show_default=True,
              metavar="P,P,...", help=f"Training precision recipes (a list of "
                                      f"{'|'.join(PRECISIONS)}).")
@framework_option("Whose rules the plans obey and whose timing they assume.")
@click.option("--objective", type=click.Choice(["time", "memory", "cost", "energy"]),
              default="time", show_default=True,
              help="What each problem's plans are ranked by (optimize --objective; at one GPU "
                   "count cost and energy rank as time); cost needs a price for every cluster.")
@click.option("--price-per-gpu-hour", "prices", multiple=True, metavar="PRICE|NAME=PRICE",
              help="$ per GPU-hour (one cluster: PRICE; several: NAME=PRICE each): each line "
                   "and the report's fronts gain $ (kWh come from the GPUs' board power).")
@click.option("--top", type=BoundedInt(1, MAX_TOP), default=5, show_default=True,
              help="Plans kept per problem.")
@click.option("--engine", type=click.Choice(ENGINES), default="layout", show_default=True,
              help="The optimize engine (see parplan optimize --help).")
@solve_limit_options
@click.option("--jobs", "-j", type=BoundedInt(1, MAX_JOBS), default=None,
              help="Worker processes (default: the usable cores; 1 solves in this process).")
@click.option("--max-problems", type=BoundedInt(1, MAX_PROBLEMS), default=DEFAULT_MAX_PROBLEMS,
              show_default=True,
              help="Refuse a sweep of more problems than this (counted before any is built).")
@click.option("--executor", type=click.Choice(["process", "ray"]), default="process",
              show_default=True, help="Local worker processes, or Ray (parplan[ray]).")
@click.option("--address", default=None, metavar="HOST:PORT",
              help="With --executor ray: the Ray cluster to run on, as `ray start --head` "
                   "printed it (default: RAY_ADDRESS, else a local Ray instance of --jobs "
                   "CPUs). Every node needs parplan installed.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Results file (JSON Lines); an existing one is resumed.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary.")
@memory_headroom_option
@fail_on_infeasible_option
@interval_level_option
@min_fit_probability_option
def sweep(models: str, clusters: str, gpu_counts: tuple[int, ...], seq_lens: tuple[int, ...],
          global_batches: tuple[int, ...], precisions: str, framework: str, objective: str,
          prices: tuple[str, ...], top: int,
          engine: str, time_limit: float | None, work_limit: float | None, jobs: int | None,
          max_problems: int, executor: str, address: str | None, output: str, quiet: bool,
          memory_headroom: Any, fail_on_infeasible: bool, interval_level: float,
          min_fit_probability: float | None) -> None:
    """Solve every combination in parallel; one JSON line per problem, resumable.

    Each line is the JSON of `optimize --json` plus the problem's key and the solve settings.
    Infeasible problems are answers; a problem the input makes impossible (e.g. fp8 on a GPU
    without it) is recorded with status "error" and its message. Rerun the same command to
    resume after an interruption: problems already in the file are skipped.
    """
    from solver.catalog import (
        list_preset_names,
        list_zoo_names,
        load_cluster_spec,
        load_model_spec,
    )
    from solver.errors import InputError, ParplanError
    from solver.sweep.problems import (
        build_sweep_problems,
        check_jobs,
        check_problem_count,
        expand_names,
        key_of_line,
        order_longest_first,
    )
    from solver.sweep.results import ResultsFile

    if address is not None and executor != "ray":
        raise InputError(f"--address {address}: only --executor ray runs on a cluster")
    if executor == "ray":
        from solver.sweep.ray_run import import_ray

        import_ray()
    if min(gpu_counts) < 1:
        raise InputError(f"--gpus: GPU counts must be positive, got {min(gpu_counts)}")
    precision_list = [p.strip() for p in precisions.split(",") if p.strip()]
    if not precision_list:
        raise InputError(f"--precision {precisions!r}: give at least one of "
                         f"{', '.join(PRECISIONS)}")
    model_names = expand_names("--models", models.split(","), list_zoo_names(), load_model_spec)
    cluster_names = expand_names("--clusters", clusters.split(","), list_preset_names(),
                                 load_cluster_spec)
    check_problem_count([model_names, cluster_names, gpu_counts, seq_lens, global_batches,
                         precision_list], max_problems)
    check_jobs(seq_lens, global_batches, precision_list)
    from solver.cli.serve_command import parse_prices

    price_of = parse_prices(prices, tuple(cluster_names))
    unpriced = [name for name in cluster_names if name not in price_of]
    if objective == "cost" and unpriced:
        raise InputError(f"--objective cost needs --price-per-gpu-hour for every cluster "
                         f"(none for {', '.join(unpriced)})")
    problems = build_sweep_problems(model_names, cluster_names, gpu_counts, seq_lens,
                                    global_batches, precision_list, framework, objective)
    # The solver's imports (half a second) come after the checks, so bad input answers fast.
    from solver.sweep.execute import default_jobs, start_run
    from solver.sweep.outcome import ABSENT_LINE_FIELDS, SolveSettings

    # --memory-headroom; None: the memory model's error margin at --min-fit-probability
    # (solve_sweep_problem).
    check_fit_flags(memory_headroom, min_fit_probability)
    settings = SolveSettings(top=top, engine=engine, time_limit_s=time_limit,
                             work_limit_s=work_limit,
                             memory_headroom=memory_headroom, interval_level=interval_level,
                             min_fit_probability=min_fit_probability,
                             prices=tuple(sorted(price_of.items())))
    start = time.perf_counter()
    with ResultsFile(output) as results:
        results.check_settings(settings.as_line_fields(), ABSENT_LINE_FIELDS)
        if results.num_torn_bytes and not quiet:
            click.echo(f"{output}: a torn last line ({results.num_torn_bytes} bytes) is cut off "
                       "before the first new line; its problem is solved again", err=True)
        done = results.done_keys
        wanted = {p.key for p in problems}
        # Problems of this sweep answered by an earlier run count for --fail-on-infeasible too.
        earlier_infeasible = sum(1 for line in results.lines if line["status"] == "infeasible"
                                 and key_of_line(line) in wanted)
        pending = order_longest_first(p for p in problems if p.key not in done)
        run = start_run(pending, settings, jobs or default_jobs(), executor, address)
        try:
            statuses, failures = _record(run, results, len(pending), quiet)
        finally:
            run.close()
    if not quiet:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(statuses.items())) or "none"
        solved = sum(statuses.values())
        click.echo(f"{output}: {solved} problem{'' if solved == 1 else 's'} solved ({counts}), "
                   f"{len(problems) - len(pending)} already there, in "
                   f"{time.perf_counter() - start:.1f} s")
    if failures:
        raise ParplanError(f"{len(failures)} problem(s) failed unexpectedly and were not "
                           f"written (first: {failures[0]}); rerun the command to retry them")
    exit_if_infeasible(earlier_infeasible + statuses["infeasible"] > 0, fail_on_infeasible)


def _record(run: Any, results: Any, total: int, quiet: bool) -> tuple[Counter[str], list[str]]:
    """Append each outcome's line as it comes; count the statuses, collect the failures."""
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    with ProgressBar(total, quiet) as advance:
        for outcome in run:
            if outcome.line is None:
                failures.append(f"{outcome.problem.label}: {outcome.failure}")
            else:
                results.append(outcome.line)
                statuses[outcome.line["status"]] += 1
            advance()
    return statuses, failures


class ProgressBar:
    """A rich progress bar with ETA on stderr when it is a terminal; otherwise nothing."""

    def __init__(self, total: int, quiet: bool) -> None:
        import sys

        self._bar = None
        if not quiet and sys.stderr.isatty() and total:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 console=Console(stderr=True), transient=False)
            self._task = self._bar.add_task("sweep", total=total)

    def __enter__(self):
        if self._bar is not None:
            self._bar.start()
        return self.advance

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def __exit__(self, *exc_info: object) -> None:
        if self._bar is not None:
            self._bar.stop()
