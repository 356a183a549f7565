"""`parplan calibrate`: fit the communication model to measured collective times.

`calibrate nccl-tests LOG...` fits nccl-tests logs; `calibrate run` times the collectives
itself with torch.distributed (under torchrun). Both write a profile (-o) that `--calibration`
loads, and print the fit: per curve, measured against fitted bus bandwidth at every size.
"""

from __future__ import annotations

from typing import Any

import click

from solver.cli.params import BoundedInt, FiniteFloat
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
    """Fit bandwidth curves to measured NCCL / torch.distributed collective times."""


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


def _echo_fit(fitted: list[Any], output: str, as_json: bool) -> None:
    from solver.cli.render_calibration import echo_fit_tables, render_fit_json
    from solver.cli.render import echo_json

    if as_json:
        echo_json({"profile": output, "curves": [render_fit_json(f) for f in fitted]})
        return
    echo_fit_tables(fitted)
    click.echo(f"wrote {output}")
