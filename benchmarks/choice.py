"""Choice, measured (issue 34, item 6): does the planner choose among configurations as the
public runs measured them?

    .venv/bin/python benchmarks/choice.py [--top K] [--time-limit S] [--pairs-only]
        [--sources megatron-bridge,megatron-lm,llm-foundry,bloom]

1. Pairwise order. Where a source measured several configurations of one job, each pair whose
   measured tokens/s per GPU differ by more than MIN_GAP (5%) is ordered by the step-time
   model (time_accuracy.evaluate: each source's framework profile and switches) and counted
   right where the prediction puts the faster one first (a predicted tie is wrong). Two rows are
   one job when the work and the machine are the same and only the parallel configuration
   (degrees, ZeRO stage, micro-batch, recompute) differs: the same model (every architecture
   number: BLOOM's 02-20 rows change the layer count with pp, so they are different jobs), the
   same cluster (GPU, memory, node size, fabric), number of GPUs, sequence length, global batch
   in tokens and precision (with LLM Foundry's FSDP mixed-precision mode), and the same
   software: the same table of the same source (`source`: one Megatron-Bridge release, one
   BLOOM benchmarking day). A second section drops the last condition and pairs rows of one
   source group from different tables (Megatron-Bridge's releases, BLOOM's days): there the
   software changed too, so the measured ratio mixes the configuration with the release; the
   same configuration measured in two tables shows how much (the "repeat max/min" column).
   LLM Foundry, the Megatron-LM table and each Megatron-Bridge release have no two
   configurations of one job (every row changes the GPU count, the model or the global batch).

2. Published configuration's rank. Each published job of the chosen source groups (default
   Megatron-Bridge and Megatron-LM; LLM Foundry and BLOOM with --sources, slower) goes to
   the optimizer (solver.optimize.solve, the layout engine, `--top` plans) as its own problem:
   the row's model, cluster, GPU count, sequence length, global batch and precision, under its
   source's framework profile and switches (time_accuracy.SOURCE_FRAMEWORKS and
   framework_switches: the constants the time benchmark checks against the measurements) and
   memory options (known_to_run.run_memory_options: the ones the fit benchmark checks). The
   software settings are the source's and stay fixed: the search chooses the degrees, virtual
   stages, ZeRO stage, micro-batch, recompute level and pipeline layout, not recompute modules,
   memory savers or offloads. Rows whose problem and configuration are the same (one recipe
   in several releases) are one job. Printed per job:
     plan rank   where the first plan with the published (tp, pp, cp, ep) stands among ours
                 (">K": not among the K listed)
     mesh rank   the same among the distinct (tp, pp, cp, ep) listed, each at its best plan
     fits        whether the published configuration fits our memory model (where it does
                 not, the optimizer cannot list it)
     claimed     our step time of the published configuration (its even split of layers, as
                 the time benchmark predicts it) over our top plan's, minus 1
     mesh        our best plan at the published mesh (the first listed, else the best of a
                 solve with tp, pp, cp and ep pinned) over our top plan, minus 1: the part of
                 the claim that needs another mesh; the rest is virtual stages, micro-batch,
                 recompute and layout at the published mesh
     pred/meas   our tokens/s per GPU of the published configuration over the measured (the
                 fastest of the job's rows)
     vs meas     the published run's measured step time over our top plan's, minus 1: the
                 claim against the measurement ((1 + claimed) x pred/meas - 1)
     parts       the `time_seconds` parts that differ most, our top plan minus published (s)
   The work budget (CP-SAT's deterministic seconds, 0.35 per second of `--time-limit`, 20 s)
   binds before the wall clock on this project's 2-core machine, so the lists repeat.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from known_to_run import run_memory_options  # noqa: E402
from published import PublishedRun, load_published_runs  # noqa: E402
from time_accuracy import (  # noqa: E402
    SOURCE_FRAMEWORKS,
    evaluate,
    framework_switches,
    render_config,
)

from solver.api import estimate_plans  # noqa: E402
from solver.cost.step.frameworks import framework_time_constants  # noqa: E402
from solver.optimize import OptimizeResult, solve  # noqa: E402
from solver.search.space import Problem  # noqa: E402
from solver.spec import ParallelConfig  # noqa: E402
from solver.spec.plan import Plan  # noqa: E402

# Two measurements closer than this are not ordered (the sources repeat a configuration to
# within a few percent; benchmarks/time_accuracy.py's noise columns).
MIN_GAP = 0.05
MESH = ("tp", "pp", "cp", "ep")
TOP = 50
# Seconds per solve; the work budget (0.35 deterministic s per s) binds first on 2 cores.
TIME_LIMIT_S = 20.0
# The sources ranked by default (24 jobs, under a minute). --sources adds llm-foundry (216 jobs,
# about 1.5 minutes; the generic profile offers tp, pp and cp, which Composer's FSDP did not)
# and bloom (63 jobs on 384 GPUs, about 10 minutes).
RANK_SOURCES = ("megatron-bridge", "megatron-lm")
NUM_PARTS_SHOWN = 3

Mesh = tuple[int, int, int, int]
Result = tuple[PublishedRun, float]  # a run and its predicted tokens/s per GPU


# ---- the runs as problems ---------------------------------------------------------------------

def build_run_problem(run: PublishedRun) -> Problem:
    """The run's job as an optimizer problem under its source's profile, switches and memory
    options: the constants the time benchmark (time_accuracy.evaluate) predicts with and the
    memory options the fit benchmark (known_to_run) checks (module docstring)."""
    framework = SOURCE_FRAMEWORKS[run.source_group]
    constants = framework_time_constants(framework).model_copy(update=framework_switches(run))
    return Problem(model_spec=run.model_spec, cluster=run.cluster, job=run.job,
                   num_gpus=run.num_gpus, framework=framework, time_constants=constants,
                   memory_options=run_memory_options(run))


def estimate_published(run: PublishedRun, problem: Problem | None = None) -> Plan:
    """The run's own configuration as a plan of its problem (the even split of layers, as
    time_accuracy.evaluate predicts it): its memory, step time and `time_seconds` parts."""
    problem = problem or build_run_problem(run)
    return estimate_plans(run.model_spec, run.cluster, run.job, [run.parallel],
                          problem.memory_options, problem.time_constants)[0]


def part_differences(ours: dict[str, float], theirs: dict[str, float],
                     count: int = NUM_PARTS_SHOWN) -> list[tuple[str, float]]:
    """The `count` step-time parts that differ most, ours minus theirs, largest first (the
    first of equal ones in `theirs`' order)."""
    deltas = [(name, ours[name] - theirs[name]) for name in theirs]
    return sorted(deltas, key=lambda item: -abs(item[1]))[:count]


def _parts_text(parts: Sequence[tuple[str, float]]) -> str:
    return ", ".join(f"{name} {delta:+.2f}" for name, delta in parts)


# ---- 1. pairwise order ------------------------------------------------------------------------

def job_key(run: PublishedRun, across_tables: bool = False) -> tuple:
    """What two rows of one job share (module docstring): all but the parallel configuration.
    `across_tables`: the source group instead of the table (the software may differ)."""
    job = run.job
    return (run.source_group if across_tables else run.source, run.model_spec, run.cluster,
            run.num_gpus, job.seq_len, job.global_batch * job.seq_len, job.precision,
            run.mixed_precision_mode)


@dataclass(frozen=True)
class Pair:
    """Two configurations of one job, the one measured faster first."""

    faster: PublishedRun
    slower: PublishedRun
    measured_ratio: float  # faster / slower, measured tokens/s per GPU (> 1)
    predicted_ratio: float  # the same two, predicted

    @property
    def ordered_right(self) -> bool:
        return self.predicted_ratio > 1.0


@dataclass(frozen=True)
class PairCheck:
    """What find_pairs finds among some runs."""

    pairs: tuple[Pair, ...]  # measured more than the gap apart
    repeats: tuple[float, ...]  # measured max/min of each pair that repeats a configuration
    num_jobs: int  # jobs with two configurations to compare

    @property
    def num_right(self) -> int:
        return sum(pair.ordered_right for pair in self.pairs)


def find_pairs(results: Sequence[Result], across_tables: bool = False,
               min_gap: float = MIN_GAP) -> PairCheck:
    """The pairs of one job (job_key) whose configurations differ and whose measurements
    differ by more than `min_gap`; `across_tables`: only pairs of rows from different tables
    of one source group."""
    groups: dict[tuple, list[Result]] = defaultdict(list)
    for run, predicted in results:
        groups[job_key(run, across_tables)].append((run, predicted))
    pairs: list[Pair] = []
    repeats: list[float] = []
    jobs: set[tuple] = set()
    for key, items in groups.items():
        for (a, predicted_a), (b, predicted_b) in combinations(items, 2):
            if across_tables and a.source == b.source:
                continue
            if b.tokens_per_sec_per_gpu > a.tokens_per_sec_per_gpu:
                (a, predicted_a), (b, predicted_b) = (b, predicted_b), (a, predicted_a)
            measured = a.tokens_per_sec_per_gpu / b.tokens_per_sec_per_gpu
            if a.parallel == b.parallel:
                repeats.append(measured)
                continue
            jobs.add(key)
            if measured > 1.0 + min_gap:
                pairs.append(Pair(a, b, measured, predicted_a / predicted_b))
    return PairCheck(pairs=tuple(pairs), repeats=tuple(repeats), num_jobs=len(jobs))


def render_pairs(console: Console, results: Sequence[Result]) -> None:
    """Per source group and section: the jobs, the pairs, the share ordered right and the
    repeats; then every pair ordered wrongly, with the predicted parts that differ most."""
    summary = Table(title=f"Pairs of one job measured more than {MIN_GAP:.0%} apart: does the "
                          "model order them as measured? (repeats: one configuration measured "
                          "twice, and the largest max/min between them)")
    for name in ("source", "tables", "jobs", "pairs", "ordered right", "share", "repeats",
                 "repeat max/min"):
        summary.add_column(name, justify="left" if name in ("source", "tables") else "right")
    by_source: dict[str, list[Result]] = defaultdict(list)
    for item in results:
        by_source[item[0].source_group].append(item)
    wrong: list[tuple[str, Pair]] = []
    for across, label in ((False, "same table"), (True, "across tables")):
        for source in sorted(by_source):
            check = find_pairs(by_source[source], across)
            if not check.num_jobs:
                continue
            count = len(check.pairs)
            summary.add_row(source, label, str(check.num_jobs), str(count),
                            str(check.num_right),
                            f"{check.num_right / count:.0%}" if count else "-",
                            str(len(check.repeats)),
                            f"{max(check.repeats):.2f}" if check.repeats else "-")
            wrong += [(label, pair) for pair in check.pairs if not pair.ordered_right]
    console.print(summary)
    table = Table(title="Pairs ordered wrongly (measured faster first; ratios of tokens/s per "
                        "GPU; parts: our step-time parts of the faster minus the slower, s)")
    for name in ("tables", "model", "GPUs", "faster (measured)", "slower", "measured",
                 "predicted", "parts: faster - slower (s)"):
        table.add_column(name, overflow="fold",
                         justify="right" if name in ("GPUs", "measured", "predicted") else "left")
    for label, pair in sorted(wrong, key=lambda item: -item[1].measured_ratio):
        faster, slower = (estimate_published(run).time for run in (pair.faster, pair.slower))
        assert faster is not None and slower is not None
        table.add_row(label, pair.faster.model_spec.name, str(pair.faster.num_gpus),
                      f"{render_config(pair.faster)} [{pair.faster.id}]",
                      f"{render_config(pair.slower)} [{pair.slower.id}]",
                      f"{pair.measured_ratio:.2f}", f"{pair.predicted_ratio:.2f}",
                      _parts_text(part_differences(faster.time_seconds, slower.time_seconds)))
    console.print(table)


# ---- 2. the published configuration's rank ---------------------------------------------------

def mesh_of(config: ParallelConfig) -> Mesh:
    return (config.tp, config.pp, config.cp, config.ep)


def plan_rank(plans: Sequence[Plan], mesh: Mesh) -> int | None:
    """1-based position of the first plan with `mesh`; None where none has it."""
    return next((i + 1 for i, plan in enumerate(plans) if mesh_of(plan.config) == mesh), None)


def mesh_rank(plans: Sequence[Plan], mesh: Mesh) -> int | None:
    """1-based position of `mesh` among the distinct meshes of `plans` (best first, so each
    mesh stands at its best listed plan); None where absent."""
    meshes = list(dict.fromkeys(mesh_of(plan.config) for plan in plans))
    return meshes.index(mesh) + 1 if mesh in meshes else None


@dataclass(frozen=True)
class RankedJob:
    """One published job: its rows, our plans for it, the published configuration's plan and
    our best plan at the published mesh (None: none fits)."""

    runs: tuple[PublishedRun, ...]
    result: OptimizeResult
    published: Plan
    mesh_best: Plan | None

    @property
    def run(self) -> PublishedRun:
        return self.runs[0]

    @property
    def mesh(self) -> Mesh:
        return mesh_of(self.run.parallel)

    @property
    def best(self) -> Plan | None:
        return self.result.plans[0] if self.result.plans else None

    def claimed_gain(self, against: Plan | float | None) -> float | None:
        """`against`'s step time (a plan's, or seconds) over our top plan's, minus 1."""
        if self.best is None or against is None:
            return None
        assert self.best.time is not None
        if isinstance(against, Plan):
            assert against.time is not None
            against = against.time.step_seconds
        return against / self.best.time.step_seconds - 1.0

    @property
    def measured_tokens_per_s_per_gpu(self) -> float:
        """The fastest of its rows: the configuration runs at least that fast, and a slower
        repeat ran older or regressed software (Qwen3-30B-A3B at pp 2 x ep 8: 5,113 tokens/s
        in Megatron-Bridge 26.02, 9,058 in 26.02.01)."""
        return max(run.tokens_per_sec_per_gpu for run in self.runs)

    @property
    def measured_step_s(self) -> float:
        job = self.run.job
        return job.global_batch * job.seq_len / (
            self.measured_tokens_per_s_per_gpu * self.run.num_gpus)


def rank_job(runs: Sequence[PublishedRun], top: int, time_limit_s: float) -> RankedJob:
    """Our `top` plans for the runs' job, and the best at the published mesh: the first listed
    with it, else the best of a second solve with tp, pp, cp and ep pinned to it."""
    run = runs[0]
    problem = build_run_problem(run)
    result = solve(problem, top=top, time_limit_s=time_limit_s, compare=False)
    mesh = mesh_of(run.parallel)
    mesh_best = next((p for p in result.plans if mesh_of(p.config) == mesh), None)
    if mesh_best is None:
        pins = {name: (degree,) for name, degree in zip(MESH, mesh)}
        pinned = solve(problem.model_copy(update={"pins": pins}), top=1,
                       time_limit_s=time_limit_s, compare=False)
        mesh_best = pinned.plans[0] if pinned.plans else None
    return RankedJob(runs=tuple(runs), result=result,
                     published=estimate_published(run, problem), mesh_best=mesh_best)


def group_published_jobs(runs: Sequence[PublishedRun]) -> list[list[PublishedRun]]:
    """Rows whose problem and published configuration are the same (one recipe in several
    releases), in file order."""
    jobs: dict[tuple, list[PublishedRun]] = {}
    for run in runs:
        key = (job_key(run, across_tables=True), run.parallel,
               tuple(sorted(framework_switches(run).items())), run_memory_options(run))
        jobs.setdefault(key, []).append(run)
    return list(jobs.values())


def _rank_text(rank: int | None, listed: int) -> str:
    return f">{listed}" if rank is None else str(rank)


def _gain_text(gain: float | None) -> str:
    return "-" if gain is None else f"{gain:+.0%}"


def render_ranks(console: Console, ranked: Sequence[RankedJob]) -> None:
    table = Table(title="The published configuration among our plans (plan rank: the first "
                        "plan with its tp, pp, cp, ep; mesh rank: among distinct meshes; "
                        "claimed: published over our top plan; mesh: our best at the "
                        "published mesh over our top plan; vs meas: the measured step over "
                        "our top plan)")
    for name in ("job (rows)", "arch", "published", "plan rank", "mesh rank", "fits",
                 "our top plan", "status", "claimed", "mesh", "pred/meas", "vs meas",
                 "parts: top - published (s)"):
        table.add_column(name, overflow="fold", justify="right" if name in (
            "plan rank", "mesh rank", "claimed", "mesh", "pred/meas", "vs meas") else "left")
    for job in ranked:
        run, best, published = job.run, job.best, job.published
        assert published.time is not None
        parts = "" if best is None or best.time is None else _parts_text(
            part_differences(best.time.time_seconds, published.time.time_seconds))
        more = f" +{len(job.runs) - 1}" if len(job.runs) > 1 else ""
        plans = job.result.plans
        accuracy = published.time.tokens_per_second_per_gpu / job.measured_tokens_per_s_per_gpu
        table.add_row(
            f"{run.id}{more}", run.arch_kind, render_config(run),
            _rank_text(plan_rank(plans, job.mesh), len(plans)),
            _rank_text(mesh_rank(plans, job.mesh), len({mesh_of(p.config) for p in plans})),
            "yes" if published.fits else "no",
            "none fits" if best is None else render_config(replace(run, parallel=best.config)),
            job.result.status, _gain_text(job.claimed_gain(published)),
            _gain_text(job.claimed_gain(job.mesh_best)),
            f"{accuracy:.2f}",
            _gain_text(job.claimed_gain(job.measured_step_s)), parts)
    console.print(table)


@dataclass(frozen=True)
class RankSummary:
    """Counts over some ranked jobs."""

    jobs: int
    top5: int  # published mesh's first plan among our first 5
    top20: int
    mesh_top5: int  # published mesh among our first 5 distinct meshes
    fits: int  # published configuration fits our memory model
    median_claimed: float | None  # published over our top plan, minus 1
    median_mesh: float | None  # our best at the published mesh over our top plan, minus 1
    median_vs_measured: float | None  # the measured step over our top plan's, minus 1


def summarize_ranks(ranked: Sequence[RankedJob]) -> RankSummary:
    def within(rank: int | None, bound: int) -> bool:
        return rank is not None and rank <= bound

    def median(values: list[float | None]) -> float | None:
        known = [value for value in values if value is not None]
        return statistics.median(known) if known else None

    return RankSummary(
        jobs=len(ranked),
        top5=sum(within(plan_rank(j.result.plans, j.mesh), 5) for j in ranked),
        top20=sum(within(plan_rank(j.result.plans, j.mesh), 20) for j in ranked),
        mesh_top5=sum(within(mesh_rank(j.result.plans, j.mesh), 5) for j in ranked),
        fits=sum(j.published.fits for j in ranked),
        median_claimed=median([j.claimed_gain(j.published) for j in ranked]),
        median_mesh=median([j.claimed_gain(j.mesh_best) for j in ranked]),
        median_vs_measured=median([j.claimed_gain(j.measured_step_s) for j in ranked]))


def render_rank_summary(console: Console, ranked: Sequence[RankedJob]) -> None:
    table = Table(title="Published configurations among our plans, by source and architecture")
    for name in ("source", "arch", "jobs", "plan in top 5", "plan in top 20",
                 "mesh in top 5", "fits", "median claimed", "median mesh",
                 "median vs meas"):
        table.add_column(name, justify="left" if name in ("source", "arch") else "right")
    groups: dict[tuple[str, str], list[RankedJob]] = defaultdict(list)
    for job in ranked:
        groups[(job.run.source_group, job.run.arch_kind)].append(job)
        groups[("all", job.run.arch_kind)].append(job)
    for (source, kind), jobs in sorted(groups.items(), key=lambda kv: (kv[0][0] == "all", kv[0])):
        s = summarize_ranks(jobs)
        table.add_row(source, kind, str(s.jobs), str(s.top5), str(s.top20), str(s.mesh_top5),
                      str(s.fits), _gain_text(s.median_claimed), _gain_text(s.median_mesh),
                      _gain_text(s.median_vs_measured))
    console.print(table)
    kinds = sorted({job.run.arch_kind for job in ranked}, key=lambda kind: kind != "moe")
    counts = [(kind, summarize_ranks([j for j in ranked if j.run.arch_kind == kind]))
              for kind in kinds]
    console.print("The published (tp, pp, cp, ep) is in our top 5 plans for " + ", ".join(
        f"{s.top5} of {s.jobs} {kind} jobs (top 20: {s.top20})" for kind, s in counts) + ".")


# ---- main -------------------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=TOP, help="plans the optimizer lists")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S,
                        help="seconds per solve (its work budget is 0.35 x this)")
    parser.add_argument("--sources", default=",".join(RANK_SOURCES),
                        help="source groups whose jobs are ranked (comma-separated)")
    parser.add_argument("--pairs-only", action="store_true", help="skip the ranking")
    args = parser.parse_args(argv)
    console = Console() if Console().is_terminal else Console(width=200)

    runs, _ = load_published_runs()
    render_pairs(console, evaluate(runs))
    if args.pairs_only:
        return
    sources = args.sources.split(",")
    chosen = [run for run in runs if run.source_group in sources]
    ranked = [rank_job(rows, args.top, args.time_limit) for rows in group_published_jobs(chosen)]
    ranked.sort(key=lambda j: (sources.index(j.run.source_group), j.run.arch_kind != "moe"))
    render_ranks(console, ranked)
    render_rank_summary(console, ranked)


if __name__ == "__main__":
    main()
