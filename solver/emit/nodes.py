"""Per-node launch lines: how many nodes a plan spans and the command each node runs.

torchrun (torch.distributed.run): `--nnodes N --nproc-per-node G --rdzv-backend c10d
--rdzv-endpoint HOST:PORT` is the same line on every node (the c10d rendezvous numbers the
nodes). DeepSpeed's launcher runs once, on the first node, and starts the others over ssh from
a hostfile of "HOSTNAME slots=G" lines (deepspeed.ai "Getting Started": Resource Configuration
(multi-node)). vLLM's multi-node data parallelism (docs "Data Parallel Deployment"): the first
node runs `--data-parallel-size D --data-parallel-size-local Dl --data-parallel-address HOST
--data-parallel-rpc-port PORT`, node k the same with `--headless --data-parallel-start-rank
k x Dl`. HOST stands for the first node's address.
"""

from __future__ import annotations

import math

from solver.emit.target import LaunchTarget

HOST = "HOST"  # the first node's address, filled in by the user
TORCHRUN_PORT = 29500
VLLM_RPC_PORT = 13345


def count_nodes(target: LaunchTarget) -> int:
    """Nodes of the cluster the plan's GPUs fill (the last one possibly in part)."""
    return math.ceil(target.config.num_gpus / target.cluster.gpus_per_node)


def render_torchrun_prefix(target: LaunchTarget) -> list[str]:
    """`torchrun` and its arguments for the plan's nodes (one line for all of them)."""
    num_nodes = count_nodes(target)
    per_node = min(target.cluster.gpus_per_node, target.config.num_gpus)
    args = ["torchrun", "--nnodes", str(num_nodes), "--nproc-per-node", str(per_node)]
    if num_nodes > 1:
        args += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{HOST}:{TORCHRUN_PORT}"]
    return args


def render_hostfile(target: LaunchTarget) -> str:
    """A DeepSpeed hostfile for the plan: one "node-i slots=G" line per node (rename them)."""
    left, node_gpus = target.config.num_gpus, target.cluster.gpus_per_node
    lines = []
    for node in range(count_nodes(target)):
        lines.append(f"node-{node} slots={min(node_gpus, left)}")
        left -= node_gpus
    return "\n".join(lines) + "\n"
