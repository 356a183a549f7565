"""Optional dry run: hand the emitted settings to the framework's own checks, where installed.

None of the frameworks is a dependency: each is imported here, lazily, and a missing one is
reported as skipped. What each check runs:
  megatron    Megatron-LM's own argument parser (megatron.training.arguments
              add_megatron_arguments) must know every emitted flag, and Megatron-Core's
              ModelParallelConfig must accept the degrees (its __post_init__ checks);
  torchtitan  torchtitan.distributed.ParallelDims must accept the degrees and the world size;
  deepspeed   deepspeed.runtime.zero.config.DeepSpeedZeroConfig must accept zero_optimization;
  vllm        vllm.config.ParallelConfig must accept the parallel sizes;
  torch       the module must compile (always available).
"""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable

from solver.emit.target import Emitted, LaunchTarget


def _check_megatron(target: LaunchTarget, emitted: Emitted) -> str:
    from megatron.training.arguments import add_megatron_arguments

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(parser)
    _, unknown = parser.parse_known_args(emitted.settings)
    unknown_flags = [token for token in unknown if token.startswith("--")]
    if unknown_flags:
        return f"rejected: Megatron-LM's parser does not know {', '.join(unknown_flags)}"
    import torch
    from megatron.core import ModelParallelConfig

    c = target.config
    ModelParallelConfig(
        tensor_model_parallel_size=c.tp, pipeline_model_parallel_size=c.pp,
        virtual_pipeline_model_parallel_size=c.vpp if c.vpp > 1 else None,
        sequence_parallel=c.sequence_parallel, context_parallel_size=c.cp,
        expert_model_parallel_size=c.ep, expert_tensor_parallel_size=c.etp,
        pipeline_dtype=torch.bfloat16)
    return ("accepted: Megatron-LM's parser knows every flag and ModelParallelConfig takes the "
            "degrees")


def _check_torchtitan(target: LaunchTarget, emitted: Emitted) -> str:
    from torchtitan.distributed import ParallelDims

    p = emitted.settings["parallelism"]
    values = {"dp_replicate": p["data_parallel_replicate_degree"],
              "dp_shard": p["data_parallel_shard_degree"], "cp": p["context_parallel_degree"],
              "tp": p["tensor_parallel_degree"], "pp": p["pipeline_parallel_degree"],
              "ep": p.get("expert_parallel_degree", 1),
              "etp": p.get("expert_tensor_parallel_degree", 1),
              "world_size": target.config.num_gpus, "enable_loss_parallel": True}
    known = inspect.signature(ParallelDims).parameters
    ParallelDims(**{name: value for name, value in values.items() if name in known})
    return "accepted: torchtitan's ParallelDims takes the degrees"


def _check_deepspeed(target: LaunchTarget, emitted: Emitted) -> str:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    DeepSpeedZeroConfig(**emitted.settings["zero_optimization"])
    return "accepted: DeepSpeedZeroConfig takes zero_optimization"


def _check_vllm(target: LaunchTarget, emitted: Emitted) -> str:
    from vllm.config import ParallelConfig

    c = target.config
    ParallelConfig(tensor_parallel_size=c.tp, pipeline_parallel_size=c.pp,
                   data_parallel_size=c.dp,
                   enable_expert_parallel="--enable-expert-parallel" in emitted.settings)
    return "accepted: vLLM's ParallelConfig takes the sizes"


def _check_torch(target: LaunchTarget, emitted: Emitted) -> str:
    compile(emitted.text, "<parplan launch --format torch>", "exec")
    return "accepted: the module compiles"


CHECKS: dict[str, tuple[str, Callable[[LaunchTarget, Emitted], str]]] = {
    "megatron": ("megatron-core / Megatron-LM", _check_megatron),
    "torchtitan": ("torchtitan", _check_torchtitan),
    "deepspeed": ("deepspeed", _check_deepspeed),
    "vllm": ("vllm", _check_vllm),
    "torch": ("python", _check_torch),
}


def validate_emitted(launch_format: str, target: LaunchTarget, emitted: Emitted) -> str:
    """One line: what the framework's own checks said, or why they did not run."""
    if launch_format not in CHECKS:
        return f"{launch_format}: nothing to validate"
    package, check = CHECKS[launch_format]
    try:
        return f"{launch_format}: {check(target, emitted)}"
    except ImportError:
        return f"{launch_format}: skipped ({package} is not installed)"
    except Exception as exc:  # the framework's own message is the answer
        message = " ".join(str(exc).split()) or exc.__class__.__name__
        return f"{launch_format}: rejected: {message}"
