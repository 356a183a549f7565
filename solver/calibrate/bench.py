"""A torch.distributed micro-benchmark of the collectives, the source of a calibration profile
when nccl-tests is not at hand. Run it under torchrun on the cluster to plan for:

    torchrun --nnodes 2 --nproc-per-node 8 ... -m solver calibrate run --cluster C -o p.json

Every rank runs `run_benchmark`; rank 0 fits and writes the profile. The backend is NCCL on
GPUs and gloo on CPUs. Two scopes are timed:

- intra-node: each node's ranks form a group and all nodes time at once (as in training);
  skipped when nodes hold a single rank;
- inter-node: all ranks in one group (the nccl-tests layout), when there are several nodes.

Nodes are the distinct host names, or blocks of `ranks_per_node` consecutive ranks (to
emulate nodes on one machine). For each collective and message size: `warmup` untimed calls,
then `iters` calls between two synchronisations; the time per call is the slowest rank's. The
message size follows nccl-tests: the whole buffer (all-reduce, broadcast), the gathered output
(all-gather), the input (reduce-scatter), each rank's send buffer (all-to-all), the message
(send/recv, a ring: each rank sends to the next and receives from the previous).

torch is imported inside the functions: it is an optional extra (`parplan[calibrate]`).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from solver.calibrate.fit import Measurement
from solver.errors import InputError
from solver.spec.calibration import Collective

DEFAULT_COLLECTIVES: tuple[Collective, ...] = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"
)
FLOAT_BYTES = 4
# What torchrun sets on every rank, and torch.distributed's env:// initialisation reads.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class BenchResult:
    """What every rank ends with; `skipped` names collectives the backend cannot run."""

    rank: int
    world_size: int
    num_nodes: int
    backend: str
    measurements: tuple[Measurement, ...]
    skipped: tuple[str, ...]


def build_sizes(min_bytes: int, max_bytes: int, step_factor: int = 2) -> list[int]:
    """Message sizes min_bytes, min_bytes * step_factor, ... up to max_bytes."""
    if min_bytes <= 0 or max_bytes < min_bytes or step_factor < 2:
        raise InputError(f"message sizes: need 0 < --min-bytes ({min_bytes}) <= --max-bytes "
                         f"({max_bytes}) and --step-factor ({step_factor}) >= 2")
    sizes = [min_bytes]
    while sizes[-1] * step_factor <= max_bytes:
        sizes.append(sizes[-1] * step_factor)
    return sizes


def _import_torch() -> tuple[Any, Any]:
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise InputError("`parplan calibrate run` needs torch: pip install 'parplan[calibrate]'"
                         ) from None
    return torch, dist


def _node_blocks(dist: Any, world_size: int, ranks_per_node: int | None) -> list[list[int]]:
    if ranks_per_node is not None:
        if ranks_per_node <= 0 or world_size % ranks_per_node:
            raise InputError(f"--ranks-per-node ({ranks_per_node}) must divide the world size "
                             f"({world_size})")
        return [list(range(s, s + ranks_per_node)) for s in range(0, world_size, ranks_per_node)]
    hosts: list[Any] = [None] * world_size
    dist.all_gather_object(hosts, socket.gethostname())
    blocks: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        blocks.setdefault(host, []).append(rank)
    return list(blocks.values())


class _Collectives:
    """Buffers and one call of each collective on a group (members: global ranks)."""

    def __init__(self, torch: Any, dist: Any, device: Any, group: Any,
                 members: Sequence[int]) -> None:
        self.torch, self.dist, self.device = torch, dist, device
        self.group, self.members = group, list(members)
        self.n = len(members)
        me = self.members.index(dist.get_rank())
        self.next_rank = self.members[(me + 1) % self.n]
        self.prev_rank = self.members[(me - 1) % self.n]
        # torch 2.13 renamed the tensor forms; older releases only have the old names.
        self.all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self.reduce_scatter = (getattr(dist, "reduce_scatter_single", None)
                               or dist.reduce_scatter_tensor)

    def _empty(self, count: int) -> Any:
        return self.torch.ones(count, dtype=self.torch.float32, device=self.device)

    def prepare(self, op: Collective, size_bytes: int) -> tuple[int, Callable[[], None]]:
        """The exact size in bytes (rounded to whole elements per rank) and the call."""
        dist, group, n = self.dist, self.group, self.n
        count = max(1, size_bytes // FLOAT_BYTES)
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            count = max(n, count // n * n)
        whole, part = self._empty(count), self._empty(count // n if count >= n else 1)
        if op == "all_reduce":
            call = lambda: dist.all_reduce(whole, group=group)  # noqa: E731
        elif op == "all_gather":
            call = lambda: self.all_gather(whole, part, group=group)  # noqa: E731
        elif op == "reduce_scatter":
            call = lambda: self.reduce_scatter(part, whole, group=group)  # noqa: E731
        elif op == "all_to_all":
            received = self._empty(count)
            call = lambda: dist.all_to_all_single(received, whole, group=group)  # noqa: E731
        elif op == "broadcast":
            call = lambda: dist.broadcast(whole, src=self.members[0], group=group)  # noqa: E731
        else:
            received = self._empty(count)

            def call() -> None:
                ops = [dist.P2POp(dist.isend, whole, self.next_rank, group),
                       dist.P2POp(dist.irecv, received, self.prev_rank, group)]
                for request in dist.batch_isend_irecv(ops):
                    request.wait()
        return count * FLOAT_BYTES, call


def _time_call(torch: Any, dist: Any, device: Any, group: Any, call: Callable[[], None],
               iters: int, warmup: int) -> float:
    """Seconds per call on the slowest rank of the world."""
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        call()
    synchronize()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(iters):
        call()
    synchronize()
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64,
                           device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed.item())


def run_benchmark(collectives: Sequence[Collective], sizes: Sequence[int], *, iters: int = 20,
                  warmup: int = 5, ranks_per_node: int | None = None,
                  backend: str | None = None) -> BenchResult:
    """Time the collectives over the sizes on the intra- and inter-node groups (module
    docstring). Initialises torch.distributed from the environment (torchrun) unless it is."""
    torch, dist = _import_torch()
    owns = not dist.is_initialized()
    unset = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if owns and unset:
        raise InputError(f"`parplan calibrate run` runs on the ranks of a torchrun job, and "
                         f"{', '.join(unset)} {'is' if len(unset) == 1 else 'are'} not set: "
                         "start it as `torchrun --nproc-per-node N -m solver calibrate run ...`")
    if owns:
        chosen = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        dist.init_process_group(backend=chosen)
    try:
        return _run(torch, dist, collectives, sizes, iters, warmup, ranks_per_node)
    finally:
        if owns:
            dist.destroy_process_group()


def _run(torch: Any, dist: Any, collectives: Sequence[Collective], sizes: Sequence[int],
         iters: int, warmup: int, ranks_per_node: int | None) -> BenchResult:
    rank, world_size = dist.get_rank(), dist.get_world_size()
    backend = str(dist.get_backend())
    if backend == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    blocks = _node_blocks(dist, world_size, ranks_per_node)
    if len({len(b) for b in blocks}) > 1:
        raise InputError("nodes hold different numbers of ranks "
                         f"({sorted(len(b) for b in blocks)}); run the same count on each")
    scopes: list[tuple[str, Any, list[int], int]] = []
    if len(blocks[0]) >= 2:
        if len(blocks) > 1:
            group, _ = dist.new_subgroups_by_enumeration(blocks)
        else:
            group = None
        mine = next(b for b in blocks if rank in b)
        scopes.append(("intra-node", group, mine, 1))
    if len(blocks) >= 2:
        scopes.append(("inter-node", None, list(range(world_size)), len(blocks)))

    measurements, skipped = [], []
    for scope, group, members, num_nodes in scopes:
        ops = _Collectives(torch, dist, device, group, members)
        for op in collectives:
            exact, seconds = [], []
            try:
                for size in sizes:
                    size_bytes, call = ops.prepare(op, size)
                    seconds.append(_time_call(torch, dist, device, group, call, iters, warmup))
                    exact.append(size_bytes)
            except RuntimeError as exc:  # the backend lacks this collective
                skipped.append(f"{op} ({scope}): {str(exc).splitlines()[0][:120]}")
                continue
            size_arr, index = np.unique(np.array(exact, dtype=np.int64), return_index=True)
            measurements.append(Measurement(
                collective=op, num_ranks=len(members), num_nodes=num_nodes,
                size_bytes=size_arr, time_s=np.array(seconds)[index],
                source=f"torch.distributed {backend} {scope}",
            ))
    return BenchResult(rank=rank, world_size=world_size, num_nodes=len(blocks), backend=backend,
                       measurements=tuple(measurements), skipped=tuple(skipped))
