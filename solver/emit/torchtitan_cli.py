"""`launch --target torchtitan@0.3`: torchtitan 0.3's command-line overrides for a plan.

torchtitan 0.3 (pytorch/torchtitan v0.3.0) replaced the TOML job config by Python configs
(Trainer.Config in torchtitan/trainer.py, sections in torchtitan/config/configs.py) that a
config_registry function builds (`--module llama3 --config llama3_70b`) and tyro overrides from
the command line (torchtitan/config/manager.py ConfigManager.parse_args): `--SECTION.FIELD
VALUE`, booleans as bare flags, string lists comma-separated. Against the TOML releases
(solver.emit.torchtitan, whose sections this reuses):
  - activation checkpointing is a subcommand chosen last: `activation-checkpoint:none`,
    `:selective` (per-op, SelectiveAC) or `:full` (FullAC); there is no selective_ac_option;
  - expert_tensor_parallel_degree is gone: "EP borrows ranks from FSDP and TP: efsdp = dp_shard
    * cp * tp / ep" (ParallelismConfig.expert_parallel_degree), so experts are not tensor
    parallel; the DeepEP / HybridEP dispatchers are model configs, not a parallelism field;
  - CUDA graphs are captured by default and Trainer.Config._validate_cuda_graphs refuses
    pipeline parallelism ("CUDA graphs do not support pipeline parallelism yet. Set
    --training.disable_cuda_graphs.") and expert parallelism with a dispatcher that
    synchronises with the host (all but HybridEP with a capacity factor and MinimalAsyncEP):
    such plans get `--training.disable_cuda_graphs`;
  - training.mixed_precision_reduce takes float32 only;
  - the LM head's module name is "lm_head" (module_fqns_per_model_part).
The model comes from torchtitan's own registry (REGISTRY, by zoo name); a model torchtitan does
not ship gets no --module / --config and a note saying so.
"""

from __future__ import annotations

import shlex

from solver.emit.nodes import render_torchrun_prefix
from solver.emit.quoting import render_comment_text
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.torchtitan import build_torchtitan_config, render_plan_line

VERSION = "0.3"
# torchtitan 0.3's config_registry functions (torchtitan/models/*/config_registry.py) for the
# zoo models they build.
REGISTRY: dict[str, tuple[str, str]] = {
    "llama3.1-8b": ("llama3", "llama3_8b"),
    "llama3.1-70b": ("llama3", "llama3_70b"),
    "llama3.1-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
    "qwen3-32b": ("qwen3", "qwen3_32b"),
    "qwen3-30b-a3b": ("qwen3", "qwen3_30b_a3b"),
    "gpt-oss-20b": ("gpt_oss", "gpt_oss_20b"),
    "gpt-oss-120b": ("gpt_oss", "gpt_oss_120b"),
}
# Fields of the TOML releases that 0.3 has no field for (module docstring).
DROPPED = {("parallelism", "expert_tensor_parallel_degree"),
           ("parallelism", "expert_parallel_comm_backend"),
           ("activation_checkpoint", "selective_ac_option")}


def _value_tokens(value: object) -> list[str]:
    """tyro's spelling of a value: booleans are bare flags (handled by the caller), string
    lists comma-separated, a list of lists one comma-separated token per inner list."""
    if isinstance(value, list):
        if value and isinstance(value[0], list):
            return [",".join(inner) for inner in value]
        return [",".join(str(item) for item in value)]
    return [str(value)]


def build_torchtitan_overrides(target: LaunchTarget) -> tuple[
        tuple[str, str] | None, dict[str, dict[str, object]], str, list[str], list[str]]:
    """What torchtitan 0.3 is told on top of its registry config: the registry's (module,
    config function), None for a model it does not ship; the fields by section (without
    DROPPED); the activation-checkpoint mode (none, selective, full); warnings and notes."""
    sections, warnings, notes = build_torchtitan_config(target, head="lm_head")
    c, model_spec = target.config, target.model_spec
    registry = REGISTRY.get(model_spec.name)
    if registry is None:
        notes.append(f"torchtitan 0.3 ships no {model_spec.name}: put your model's "
                     "--module M --config C first (a config_registry function of yours)")
    if c.etp > 1:
        warnings.append(f"torchtitan 0.3 has no expert tensor parallelism: its experts borrow "
                        f"ranks from FSDP and TP, not etp {c.etp}")
    training = sections["training"]
    if training.get("mixed_precision_reduce", "float32") != "float32":
        del training["mixed_precision_reduce"]
        warnings.append("torchtitan 0.3 reduces gradients in float32 only "
                        "(training.mixed_precision_reduce)")
    if sections.pop("quantize.linear.float8", None):
        warnings.append("torchtitan 0.3's float8 is rowwise, with all communication in high "
                        "precision (float8.md): no float8 all-gather (torchtitan 0.2's "
                        "tensorwise float8 has it: --target torchtitan@0.2)")
    if sections["parallelism"].get("expert_parallel_comm_backend"):
        warnings.append("torchtitan 0.3 picks DeepEP / HybridEP in the model config, not on the "
                        "command line: use a *_deepep / *_hybridep config of its registry")
    if c.pp > 1 or (model_spec.is_moe and c.ep > 1):
        training["disable_cuda_graphs"] = True
    mode = str(sections.pop("activation_checkpoint")["mode"])
    fields = {section: {name: value for name, value in values.items()
                        if (section, name) not in DROPPED}
              for section, values in sections.items()}
    if target.job.precision != "bf16":
        notes[:] = [n for n in notes if not n.startswith("fp8:")]
        notes.append(f"{target.job.precision}: torchtitan 0.3 quantises through the model "
                     "config's converters (e.g. llama3_8b_mxfp8, deepseek_v3_671b_float8 in its "
                     "registry), which the overrides do not set")
    return registry, fields, mode, warnings, notes


def build_torchtitan_args(target: LaunchTarget) -> tuple[list[str], list[str], list[str]]:
    """The override tokens (registry choice first, the activation-checkpoint subcommand last),
    warnings and notes."""
    registry, fields, mode, warnings, notes = build_torchtitan_overrides(target)
    tokens: list[str] = []
    if registry is not None:
        tokens += ["--module", registry[0], "--config", registry[1]]
    for section, values in fields.items():
        for name, value in values.items():
            flag = f"--{section}.{name}"
            if isinstance(value, bool):
                tokens.append(flag if value else f"--{section}.no_{name}")
            else:
                tokens += [flag, *_value_tokens(value)]
    tokens.append(f"activation-checkpoint:{mode}")
    return tokens, warnings, notes


def render_torchtitan_cli(target: LaunchTarget) -> Emitted:
    """The overrides as a shell continuation after the torchrun line, headed by the plan."""
    tokens, warnings, notes = build_torchtitan_args(target)
    header = [render_plan_line(target), f"torchtitan {VERSION}: tyro overrides of "
              "torchtitan.train (ConfigManager.parse_args)"]
    launcher = render_torchrun_prefix(target) + ["-m", "torchtitan.train"]
    lines = [f"# {render_comment_text(line)}" for line in header]
    lines.append(" ".join(shlex.quote(t) for t in launcher))
    body, pending = [], []
    for token in tokens:  # one flag with its values per line
        if token.startswith("--") or token.startswith("activation-checkpoint:"):
            if pending:
                body.append(pending)
            pending = [token]
        else:
            pending.append(token)
    body.append(pending)
    lines += ["  " + " ".join(shlex.quote(t) for t in line) for line in body]
    text = " \\\n".join(lines[len(header):])
    return Emitted(text="\n".join(lines[:len(header)]) + "\n" + text + "\n", settings=tokens,
                   warnings=tuple(warnings), notes=tuple(notes))
