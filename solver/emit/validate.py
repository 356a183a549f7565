"""`launch --validate`: hand the emitted file to the framework's own whole-file check.

None of the frameworks is a dependency (the `frameworks` extra installs the versions of
solver.emit.TARGETS): each check imports its framework lazily, inside `quiet()`
(solver.emit.check_harness) so that its logging does not reach the emitted text. A check says what it ran ("accepted by ...") and, separately, what
it could not check and why; a file the framework refuses is "rejected" with the framework's own
message. Nothing is "accepted" that no framework code looked at. What each check runs:
  megatron    Megatron-LM's parse_args + validate_args + core_transformer_config_from_args
              (TransformerConfig.__post_init__) when `megatron.training` is importable (a
              Megatron-LM checkout on the path; it is not on PyPI), else megatron-core's
              TransformerConfig / MLATransformerConfig built from the model and parallel flags
              (solver.emit.check_megatron);
  megatron-bridge  Megatron-Bridge's process_config_with_overrides (Hydra, struct mode) and
              ConfigContainer.validate() with the plan's world size, on Bridge's recipe base
              (solver.emit.check_bridge);
  torchtitan  0.3: ConfigManager.parse_args on the whole command line (tyro, then
              Trainer.Config.__post_init__), ParallelDims.build_mesh on a fake process group of
              the plan's world size, the pipeline split (solver.emit.check_torchtitan);
  torchtitan-python  0.3: the same on the config module, loaded as torchtitan.train loads it
              (--module, --config);
  deepspeed   DeepSpeedConfig on the whole ds_config with the plan's data-parallel size, then
              AutoEP's validate_autoep_config (solver.emit.check_deepspeed);
  vllm        `vllm serve`'s own parser (make_arg_parser, validate_parsed_serve_args), the
              engine arguments, ParallelConfig and SchedulerConfig (solver.emit.check_vllm);
  torch       the module must compile (always available).
"""

from __future__ import annotations

from collections.abc import Callable

from solver.emit import TARGETS
from solver.emit.check_bridge import check_bridge
from solver.emit.check_deepspeed import check_deepspeed
from solver.emit.check_harness import Rejected, Validation
from solver.emit.check_megatron import check_megatron
from solver.emit.check_torchtitan import check_torchtitan, check_torchtitan_python
from solver.emit.check_vllm import check_vllm
from solver.emit.target import Emitted, LaunchTarget


def _check_torch(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    try:
        compile(emitted.text, "<parplan launch --format torch>", "exec")
    except SyntaxError as exc:
        raise Rejected("Python's compile", str(exc)) from None
    validation.accepted.append("Python's compile (the module compiles)")


CHECKS: dict[str, Callable[[LaunchTarget, Emitted, Validation], None]] = {
    "megatron": check_megatron, "megatron-bridge": check_bridge,
    "torchtitan": check_torchtitan, "torchtitan-python": check_torchtitan_python,
    "deepspeed": check_deepspeed, "vllm": check_vllm, "torch": _check_torch}


def validate_emitted(launch_format: str, target: LaunchTarget, emitted: Emitted) -> str:
    """One line: what the framework's own checks accepted or rejected, and what they could not
    check and why."""
    if launch_format not in CHECKS:
        return f"{launch_format}: not checked (no framework reads it)"
    version = target.version or TARGETS.get(launch_format, ("",))[0]
    name = f"{launch_format}@{version}" if version else launch_format
    validation = Validation(name)
    try:
        CHECKS[launch_format](target, emitted, validation)
    except Rejected as exc:
        validation.rejected = exc
    return validation.render()
