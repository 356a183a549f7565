"""The launch formats (solver.emit.FORMATS), by name: each renders a `LaunchTarget` to an
`Emitted`."""

from __future__ import annotations

from collections.abc import Callable

from solver.emit.bridge import render_bridge
from solver.emit.deepspeed import render_deepspeed
from solver.emit.groups import render_groups
from solver.emit.megatron import render_megatron
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.torch_script import render_torch_module
from solver.emit.torchtitan import render_torchtitan_toml
from solver.emit.torchtitan_cli import render_torchtitan_cli
from solver.emit.torchtitan_python import render_torchtitan_python
from solver.emit.vllm import render_vllm


def render_torchtitan(target: LaunchTarget) -> Emitted:
    """torchtitan's settings for the target's release: 0.2's TOML job config
    (solver.emit.torchtitan), later releases' command-line overrides
    (solver.emit.torchtitan_cli)."""
    if target.version == "0.2":
        return render_torchtitan_toml(target)
    return render_torchtitan_cli(target)


RENDERERS: dict[str, Callable[[LaunchTarget], Emitted]] = {
    "groups": render_groups,
    "torch": render_torch_module,
    "megatron": render_megatron,
    "megatron-bridge": render_bridge,
    "torchtitan": render_torchtitan,
    "torchtitan-python": render_torchtitan_python,
    "deepspeed": render_deepspeed,
    "vllm": render_vllm,
}


def render_launch(launch_format: str, target: LaunchTarget) -> Emitted:
    """The settings of `target` in `launch_format` (one of FORMATS)."""
    return RENDERERS[launch_format](target)
