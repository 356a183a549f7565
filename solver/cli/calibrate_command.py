"""`parplan calibrate`: fit the communication model to measured collective times.

`calibrate nccl-tests LOG...` fits nccl-tests logs; `calibrate run` times the collectives
itself with torch.distributed (under torchrun). Both write a profile (-o) that `--calibration`
loads, and print the fit: per curve, measured against fitted bus bandwidth at every size.
`calibrate training-log LOG...` updates the error model's scales of a cluster and framework by
a real run's step time and memory (solver.calibrate.scales) and writes them into a profile.
"""

from __future__ import annotations

from typing import Any

import click

from solver.cli.options import (
    degree_options,
    framework_feature_options,
    framework_option,
    make_planning_options,
)
from solver.cli.params import BoundedInt, FiniteFloat
from solver.cli.plan_option import plan_file_options
from solver.cli.shared_flags import memory_headroom_option
from solver.spec.strict import MAX_GPUS, MAX_MESSAGE_BYTES

COLLECTIVE_CHOICES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv",
                      "broadcast")


class ByteSize(click.ParamType):
    """A size in bytes: an integer or a number with a binary suffix (K, M, G: 2^10, 2^20, 2^30)."""

    name = "BYTES"
    _suffixes = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
        scale = self._suffixes.get(text[-1:], 1)
        number = text[:-1] if text[-1:] in self._suffixes else text
        try:
            size = int(float(number) * scale)
        except (ValueError, OverflowError):  # also nan and inf
            self.fail(f"{value!r} is not a size in bytes (e.g. 1024, 64K, 1G)", param, ctx)
        if size <= 0:
            self.fail(f"{value!r} must be positive", param, ctx)
        problem = MAX_MESSAGE_BYTES.check(size)
        if problem is not None:
            self.fail(problem, param, ctx)
        return size


@click.group()
def calibrate() -> None:
    """Fit bandwidth curves to measured NCCL / torch.distributed collective times, or the
    error model's scales to a real run's training log."""


def _common(command: Any) -> Any:
    for decorator in reversed([
        click.option("--cluster", required=True, metavar="NAME|PATH",
                     help="Cluster preset or file whose tiers the curves belong to."),
        click.option("--gpus-per-node", type=BoundedInt(1, MAX_GPUS), default=None,
                     help="GPUs per node (overrides the preset)."),
        click.option("-o", "--output", required=True, metavar="FILE",
                     help="Profile to write (JSON), for --calibration."),
        click.option("--tolerance", type=FiniteFloat(0.001, 0.5), default=0.03,
                     show_default=True,
                     help="Relative time error at which the fit stops adding knots."),
        click.option("--json", "as_json", is_flag=True, help="Print the fit as JSON."),
    ]):
        command = decorator(command)
    return command


@calibrate.command("nccl-tests")
@click.argument("logs", nargs=-1, required=True, metavar="LOG...")
@_common
@click.option("--tier", default=None, metavar="NAME",
              help="Tier the logs measure (default: from the ranks and nodes of each log).")
@click.option("--collective", type=click.Choice(COLLECTIVE_CHOICES), default=None,
              help="Collective of the logs (default: from the log or its file name).")
@click.option("--ranks", "num_ranks", type=BoundedInt(2, MAX_GPUS), default=None,
              help="Ranks of the runs whose log lacks a 'Using devices' block.")
@click.option("--nodes", "num_nodes", type=BoundedInt(1, MAX_GPUS), default=None,
              help="Nodes of the runs whose log lacks a 'Using devices' block.")
def nccl_tests(logs: tuple[str, ...], cluster: str, gpus_per_node: int | None, output: str,
               tolerance: float, as_json: bool, tier: str | None, collective: str | None,
               num_ranks: int | None, num_nodes: int | None) -> None:
    """Fit nccl-tests logs (all_reduce_perf, all_gather_perf, reduce_scatter_perf,
    alltoall_perf, sendrecv_perf, broadcast_perf) and write a calibration profile."""
    from solver.calibrate.fit import build_measurement
    from solver.calibrate.nccl_tests import check_bus_bandwidth, load_nccl_tests
    from solver.calibrate.profile import build_profile, write_profile
    from solver.catalog import load_cluster_spec

    cluster_spec = load_cluster_spec(cluster, gpus_per_node)
    measurements = []
    for log in logs:
        for table in load_nccl_tests(log, collective=collective,  # type: ignore[arg-type]
                                     num_ranks=num_ranks, num_nodes=num_nodes):
            check_bus_bandwidth(table, cluster_spec)
            measurements.append(build_measurement(table))
    profile, fitted = build_profile(cluster_spec, measurements, method="nccl-tests", tier=tier,
                                    tolerance=tolerance)
    write_profile(profile, output)
    _echo_fit(fitted, output, as_json)


@calibrate.command("run")
@_common
@click.option("--collective", "collectives", type=click.Choice(COLLECTIVE_CHOICES),
              multiple=True, help="Collectives to time (repeatable; default: all but broadcast).")
@click.option("--min-bytes", type=ByteSize(), default="1K", show_default=True,
              help="Smallest message.")
@click.option("--max-bytes", type=ByteSize(), default="1G", show_default=True,
              help="Largest message.")
@click.option("--step-factor", type=BoundedInt(2), default=2, show_default=True,
              help="Ratio of consecutive message sizes.")
@click.option("--iters", type=BoundedInt(1), default=20, show_default=True,
              help="Timed calls per size.")
@click.option("--warmup", type=BoundedInt(0), default=5, show_default=True,
              help="Untimed calls per size.")
@click.option("--ranks-per-node", type=BoundedInt(1, MAX_GPUS), default=None,
              help="Treat blocks of this many consecutive ranks as nodes (default: host names).")
@click.option("--backend", type=click.Choice(["auto", "nccl", "gloo"]), default="auto",
              show_default=True, help="torch.distributed backend (auto: nccl on GPUs).")
def run(cluster: str, gpus_per_node: int | None, output: str, tolerance: float, as_json: bool,
        collectives: tuple[str, ...], min_bytes: int, max_bytes: int, step_factor: int,
        iters: int, warmup: int, ranks_per_node: int | None, backend: str) -> None:
    """Time the collectives with torch.distributed on this job's ranks and write a profile.
    Launch under torchrun on every node; rank 0 writes the profile and prints the fit."""
    from solver.calibrate.bench import DEFAULT_COLLECTIVES, build_sizes, run_benchmark
    from solver.calibrate.profile import build_profile, write_profile
    from solver.catalog import load_cluster_spec
    from solver.errors import InputError

    cluster_spec = load_cluster_spec(cluster, gpus_per_node)
    sizes = build_sizes(min_bytes, max_bytes, step_factor)
    if len(sizes) < 2:
        raise InputError(f"--min-bytes ({min_bytes}) to --max-bytes ({max_bytes}) gives one "
                         "message size; a fit needs at least 2")
    result = run_benchmark(collectives or DEFAULT_COLLECTIVES,  # type: ignore[arg-type]
                           sizes, iters=iters, warmup=warmup, ranks_per_node=ranks_per_node,
                           backend=None if backend == "auto" else backend)
    if result.rank != 0:
        return
    if not result.measurements:
        raise InputError(f"nothing to fit: {result.world_size} rank(s) on {result.num_nodes} "
                         "node(s) form no group of 2 or more ranks")
    profile, fitted = build_profile(cluster_spec, result.measurements,
                                    method=f"torch.distributed {result.backend}",
                                    tolerance=tolerance)
    write_profile(profile, output)
    _echo_fit(fitted, output, as_json)
    for line in result.skipped:
        click.echo(f"skipped {line}", err=True)


@calibrate.command("training-log")
@click.argument("logs", nargs=-1, required=True, metavar="LOG...")
@click.option("-o", "--output", required=True, metavar="FILE",
              help="Profile to write (JSON), for --calibration: the --calibration profile's "
                   "curves and scales with this run's scales updated.")
@click.option("--warmup-steps", type=BoundedInt(0), default=10, show_default=True,
              help="Iteration lines of iterations 1..N are skipped (initialisation, compile, "
                   "the allocator's growth).")
@make_planning_options(gpus_required=False, model_required=False)
@degree_options
@plan_file_options("The run's plan: a plan of this `optimize --json` / `estimate --json` output "
                   "(--rank N), a single plan object, or line N of a `sweep -o` file (--line "
                   "N); or give the run's configuration with the same flags as `estimate`.")
@framework_option("The framework the run used (its timing profile).")
@framework_feature_options
@memory_headroom_option
def training_log(logs: tuple[str, ...], output: str, warmup_steps: int, model: str | None,
                 cluster: str | None, num_gpus: int | None, gpus_per_node: int | None,
                 segment_gpus: int | None, seq_len: int, global_batch: int, precision: str,
                 token_budget: int | None, calibration: str | None, as_json: bool,
                 plan_path: str | None, plan_rank: int, plan_line: int | None, framework: str,
                 memory_headroom: Any, **degrees: Any) -> None:
    """Calibrate the error model's scales of this cluster and framework by a training log
    (Megatron-LM / Megatron-Bridge iteration and memory lines, torchtitan's metrics lines,
    DeepSpeed's throughput lines) of the run of a plan: the median step after the warm-up and
    the peak memory against the plan's prediction, a Bayesian update of the priors."""
    from solver.calibrate.profile import load_profile, replace_profile_scales, write_profile
    from solver.calibrate.scales import (
        build_calibration_plan,
        build_prior_scales,
        calibrate_from_logs,
    )
    from solver.calibrate.training_log import load_training_log
    from solver.cli.estimate_command import estimate_options
    from solver.cli.render_calibration import render_scales_json, render_scales_lines
    from solver.cli.render import echo_json
    from solver.cost.uncertainty import load_error_model

    parsed = [load_training_log(path) for path in logs]
    job_values: dict[str, Any] = {"seq_len": seq_len, "global_batch": global_batch,
                                  "precision": precision}
    result, _, _, _ = estimate_options(
        model, cluster, num_gpus, gpus_per_node=gpus_per_node, segment_gpus=segment_gpus,
        job_values=job_values, token_budget=token_budget, calibration=calibration,
        plan_path=plan_path, plan_rank=plan_rank, plan_line=plan_line, layout=None,
        recompute_num_layers=None, framework=framework, memory_headroom=memory_headroom,
        degrees=degrees)
    plan = build_calibration_plan(result.plan, result.model_spec, result.cluster.gpu.name,
                                  result.job, result.num_gpus, result.profile.name)
    profile = load_profile(calibration) if calibration is not None else None
    prior = (profile.find_scales(plan.framework, plan.category, plan.model) if profile
             else None) or build_prior_scales(load_error_model(), plan.framework,
                                              plan.category.split("/"), plan.model)
    posterior = calibrate_from_logs(parsed, plan, prior, warmup_steps)
    write_profile(replace_profile_scales(profile, result.cluster.name, posterior), output)
    if as_json:
        echo_json({"profile": output, "scales": render_scales_json(prior, posterior, plan)})
        return
    for line in render_scales_lines(prior, posterior, plan, warmup_steps):
        click.echo(line)
    click.echo(f"wrote {output}")


def _echo_fit(fitted: list[Any], output: str, as_json: bool) -> None:
    from solver.cli.render_calibration import echo_fit_tables, render_fit_json
    from solver.cli.render import echo_json

    if as_json:
        echo_json({"profile": output, "curves": [render_fit_json(f) for f in fitted]})
        return
    echo_fit_tables(fitted)
    click.echo(f"wrote {output}")
