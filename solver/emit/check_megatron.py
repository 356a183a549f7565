"""`launch --validate` for Megatron flags (solver.emit.validate).

Megatron-LM is not on PyPI. With a checkout on the path (`megatron.training` importable, core
version 0.16.x) the flags go through what pretrain_gpt.py runs first: parse_args (argv and the
WORLD_SIZE / RANK environment, set to the plan's for the call), validate_args (with
CUDA_DEVICE_MAX_CONNECTIONS=1 where the notes ask the user to export it) and
core_transformer_config_from_args, i.e. TransformerConfig.__post_init__ on the result (a refusal
for want of Transformer Engine kernels on the checking machine is reported as not checked).
validate_args asks the GPU's compute capability (GroupedGEMM needs sm 8.0+, and the
CUDA_DEVICE_MAX_CONNECTIONS rule ends at Blackwell); without a GPU it is answered with the
plan's GPU (GPU_ARCHES), only while the check runs.

With megatron-core alone (pip), the model and parallel flags that are TransformerConfig fields
build a TransformerConfig (MLATransformerConfig for MLA) whose __post_init__ runs Megatron-Core's
checks; the training flags are left unchecked and listed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import typing
from collections.abc import Iterator

from solver.emit.megatron import VERSION
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.check_harness import (
    Rejected,
    Validation,
    environment,
    require_version,
    run_check,
    run_parser,
)

# Compute capability (major, minor) by GPU name prefix (NVIDIA CUDA GPUs list).
GPU_ARCHES = (("A100", (8, 0)), ("A10", (8, 6)), ("L40", (8, 9)), ("L4", (8, 9)),
              ("H100", (9, 0)), ("H800", (9, 0)), ("H200", (9, 0)), ("H20", (9, 0)),
              ("GH200", (9, 0)), ("GB200", (10, 0)), ("GB300", (10, 3)), ("B200", (10, 0)),
              ("B300", (10, 3)))
# Megatron-Core's refusals for want of Transformer Engine kernels on the checking machine (e.g.
# "apply_rope_fusion is not available. Please install TE >= 1.4."): not a verdict on the file.
# Without TE, megatron-core's is_te_min_version compares None with a version (utils.py
# get_te_version): "'>=' not supported between instances of 'NoneType' and 'Version'".
NEEDS_TE = re.compile(r"install TE|Transformer ?Engine|transformer_engine|"
                      r"'NoneType' and 'Version'")
# Flags whose TransformerConfig field is named otherwise (ArgumentGroupFactory, arguments.py).
FIELD_NAMES = {"num_experts": "num_moe_experts", "swiglu": "gated_linear_unit",
               "disable_bias_linear": "add_bias_linear", "fp8_format": "fp8",
               "fp4_format": "fp4"}


def gpu_arch(target: LaunchTarget) -> tuple[int, int]:
    """The compute capability of the plan's GPU (Hopper's when the name is not listed)."""
    name = target.cluster.gpu.name.upper()
    for prefix, arch in sorted(GPU_ARCHES, key=lambda item: -len(item[0])):
        if prefix in name:
            return arch
    return (9, 0)


@contextlib.contextmanager
def plan_gpu(target: LaunchTarget) -> Iterator[None]:
    """torch.cuda answering the plan's GPU's compute capability where there is no GPU."""
    import torch

    if torch.cuda.is_available():
        yield
        return
    arch = gpu_arch(target)
    properties = type("Properties", (), {"major": arch[0], "minor": arch[1]})()
    saved = torch.cuda.get_device_capability, torch.cuda.get_device_properties
    torch.cuda.get_device_capability = lambda device=None: arch
    torch.cuda.get_device_properties = lambda device=None: properties
    try:
        yield
    finally:
        torch.cuda.get_device_capability, torch.cuda.get_device_properties = saved


def check_megatron(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    """Megatron-LM's argument checks, else megatron-core's TransformerConfig."""
    if not require_version(validation, "megatron-core", VERSION, "the flags"):
        return
    try:
        with contextlib.redirect_stderr(None), contextlib.redirect_stdout(None):
            import megatron.training.arguments  # noqa: F401
        has_megatron_lm = True
    except ImportError:
        has_megatron_lm = False
    tokens = list(emitted.settings)
    if has_megatron_lm:
        _check_megatron_lm(target, emitted, tokens, validation)
    else:
        _check_core(target, tokens, validation)


def _check_megatron_lm(target: LaunchTarget, emitted: Emitted, tokens: list[str],
                       validation: Validation) -> None:
    world = target.config.num_gpus
    # the environment the notes ask for (Megatron asserts CUDA_DEVICE_MAX_CONNECTIONS)
    job_env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if any(
        "export CUDA_DEVICE_MAX_CONNECTIONS=1" in note for note in emitted.notes) else {}

    def validate() -> object:
        from megatron.training.arguments import parse_args, validate_args

        saved_argv = sys.argv
        sys.argv = ["pretrain_gpt.py", *tokens]
        try:
            with environment(WORLD_SIZE=str(world), RANK="0"):
                args = run_parser("Megatron-LM's parse_args", parse_args)
        finally:
            sys.argv = saved_argv
        with plan_gpu(target), environment(**job_env):
            validate_args(args)
        return args

    args = run_check("Megatron-LM's validate_args", validate)
    validation.accepted.append(f"Megatron-LM's parse_args and validate_args ({world} ranks)")

    def transformer_config() -> None:
        from megatron.training.arguments import core_transformer_config_from_args

        with plan_gpu(target):
            core_transformer_config_from_args(args)

    try:
        run_check("Megatron-LM's core_transformer_config_from_args", transformer_config)
    except Rejected as exc:
        if not NEEDS_TE.search(exc.message):
            raise
        validation.unchecked.append(f"TransformerConfig's checks (they need Transformer Engine "
                                    f"on this machine: {exc.message})")
        return
    validation.accepted.append("core_transformer_config_from_args (TransformerConfig's checks)")


def _parse_flags(tokens: list[str]) -> dict[str, list[str]]:
    """Flag name (snake_case) -> its values (none for a switch)."""
    flags: dict[str, list[str]] = {}
    name = None
    for token in tokens:
        if token.startswith("--"):
            name = token[2:].replace("-", "_")
            flags[name] = []
        elif name is not None:
            flags[name].append(token)
    return flags


def _convert(hint: object, values: list[str], name: str) -> object:
    """A flag's values as the field's type (a switch is True; disable_bias_linear False)."""
    if not values:
        return name != "disable_bias_linear"
    if name == "moe_layer_freq":
        return eval(values[0], {"__builtins__": {}})  # Megatron's moe_freq_type evaluates it
    origin = typing.get_origin(hint)
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if origin is list or (args and typing.get_origin(args[0]) is list):
        return values
    for kind in (int, float):
        if hint is kind or kind in args:
            try:
                return kind(values[0])
            except ValueError:
                continue
    return values[0]


def _check_core(target: LaunchTarget, tokens: list[str], validation: Validation) -> None:
    """TransformerConfig from the flags that are its fields (module docstring)."""
    flags = _parse_flags(tokens)
    mla = "multi_latent_attention" in flags

    def build() -> list[str]:
        import torch
        import torch.nn.functional as F
        from megatron.core.transformer import MLATransformerConfig, TransformerConfig

        config_class = MLATransformerConfig if mla else TransformerConfig
        hints = typing.get_type_hints(config_class)
        names = {f.name for f in dataclasses.fields(config_class)}
        values: dict[str, object] = {}
        unused = []
        for flag, given in flags.items():
            field = FIELD_NAMES.get(flag, flag)
            if field in names:
                values[field] = _convert(hints.get(field), given, flag)
            elif flag not in ("multi_latent_attention", "bf16"):
                unused.append("--" + flag.replace("_", "-"))
        if "bf16" in flags:
            values.update(bf16=True, params_dtype=torch.bfloat16,
                          pipeline_dtype=torch.bfloat16)
        if values.get("gated_linear_unit"):
            values["activation_func"] = F.silu
        if values.get("num_query_groups") is None:
            values.pop("num_query_groups", None)
        config_class(**values)
        return unused

    unused = run_check(f"megatron-core's {'MLATransformerConfig' if mla else 'TransformerConfig'}",
                       build)
    validation.accepted.append(f"megatron-core's {'MLATransformerConfig' if mla else 'TransformerConfig'}"
                               " (its __post_init__ checks on the model and parallel flags)")
    validation.unchecked.append(
        f"{', '.join(unused)} and validate_args' rules (Megatron-LM's megatron.training is not "
        "importable: put a Megatron-LM core_v0.16 checkout on PYTHONPATH)")
