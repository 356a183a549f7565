"""`launch --format vllm`: a `vllm serve` command line for a plan's degrees.

Argument names are vLLM's engine arguments (vllm/config/parallel.py ParallelConfig,
vllm/engine/arg_utils.py): --tensor-parallel-size, --pipeline-parallel-size,
--data-parallel-size, --enable-expert-parallel ("use expert parallelism instead of tensor
parallelism for MoE layers"; the expert-parallel group is then the tp x dp ranks of a
pipeline stage). Serving plans proper come from `parplan serve`; this renders degrees only.
"""

from __future__ import annotations

import shlex

from solver.emit.target import Emitted, LaunchTarget


def build_vllm_args(target: LaunchTarget) -> tuple[list[str], list[str]]:
    """The command as tokens, and warnings for what vLLM lays out differently."""
    c = target.config
    args = ["vllm", "serve", target.model_id,
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


def render_vllm(target: LaunchTarget) -> Emitted:
    """The command line, every token shell-quoted."""
    args, warnings = build_vllm_args(target)
    return Emitted(text=" ".join(shlex.quote(arg) for arg in args) + "\n", settings=args,
                   warnings=tuple(warnings))
