"""`launch --format vllm`: `vllm serve` command lines (vLLM 0.33) for a plan's degrees.

Argument names are vLLM's engine arguments (vllm/config/parallel.py ParallelConfig,
vllm/engine/arg_utils.py): --tensor-parallel-size, --pipeline-parallel-size,
--data-parallel-size, --enable-expert-parallel ("use expert parallelism instead of tensor
parallelism for MoE layers"; the expert-parallel group is then the tp x dp ranks of a
pipeline stage). Serving plans proper come from `parplan serve`; this renders degrees only.
When the data-parallel ranks span nodes, each node runs its share (solver.emit.nodes): the
first `--data-parallel-size-local Dl --data-parallel-address HOST --data-parallel-rpc-port P`,
node k the same with `--headless --data-parallel-start-rank k x Dl`; an engine (tp x pp) larger
than a node runs on a Ray cluster instead.
"""

from __future__ import annotations

import shlex

from solver.emit.nodes import HOST, VLLM_RPC_PORT, count_nodes
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.torchtitan import render_header
from solver.spec.model_ref import render_model_tokens

VERSION = "0.33"


def build_vllm_args(target: LaunchTarget) -> tuple[list[str], list[str]]:
    """The command as tokens, and warnings for what vLLM lays out differently."""
    c = target.config
    args = ["vllm", "serve", *render_model_tokens(target.model_id, "--model", positional=True),
            "--tensor-parallel-size", str(c.tp),
            "--pipeline-parallel-size", str(c.pp),
            "--data-parallel-size", str(c.dp)]
    warnings = []
    if target.model_spec.is_moe and c.ep > 1:
        args.append("--enable-expert-parallel")
        if c.ep != c.tp * c.dp or c.etp != 1:
            warnings.append(f"vLLM's expert parallelism spans tp x dp = {c.tp * c.dp} ranks "
                            f"with no expert tensor parallelism, not ep {c.ep} x etp {c.etp}")
    if c.cp > 1:
        warnings.append(f"cp {c.cp} is not rendered: vLLM's context parallelism is a decode/"
                        "prefill option of its own; plan serving with `parplan serve`")
    return args, warnings


def build_node_commands(target: LaunchTarget, args: list[str]) -> tuple[list[list[str]],
                                                                           list[str]]:
    """The command of every node (one entry when one node holds the plan), and notes."""
    c, node_gpus = target.config, target.cluster.gpus_per_node
    engine = c.tp * c.pp
    num_nodes = count_nodes(target)
    if num_nodes == 1:
        return [args], []
    if engine > node_gpus or node_gpus % engine or c.dp % (node_gpus // engine):
        return [args], [f"one engine of tp x pp = {engine} GPUs does not split into whole "
                        f"nodes of {node_gpus}: start a Ray cluster on the {num_nodes} nodes "
                        "and run the command on its head node (vLLM multi-node serving)"]
    local = node_gpus // engine
    shared = ["--data-parallel-size-local", str(local), "--data-parallel-address", HOST,
              "--data-parallel-rpc-port", str(VLLM_RPC_PORT)]
    commands = [args + shared]
    for node in range(1, c.dp // local):
        commands.append(args + shared + ["--headless", "--data-parallel-start-rank",
                                         str(node * local)])
    return commands, [f"{len(commands)} nodes, {local} data-parallel rank(s) each: each node "
                      f"runs its line ({HOST}: the first node's address)"]


def render_vllm(target: LaunchTarget) -> Emitted:
    """The command line of each node, every token shell-quoted, under a header comment; the
    settings are the first node's tokens."""
    args, warnings = build_vllm_args(target)
    commands, notes = build_node_commands(target, args)
    lines = [" ".join(shlex.quote(arg) for arg in command) for command in commands]
    if len(lines) > 1:
        lines = [f"# node {node}\n{line}" for node, line in enumerate(lines)]
    header = render_header(target, f"vLLM {VERSION}: `vllm serve` (its engine arguments)")
    return Emitted(text=header + "\n".join(lines) + "\n", settings=commands[0],
                   warnings=tuple(warnings), notes=tuple(notes))
