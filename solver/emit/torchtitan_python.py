"""`launch --format torchtitan-python`: a plan as a torchtitan 0.3 Python config.

torchtitan 0.3 (pytorch/torchtitan v0.3.0) builds its Trainer.Config in Python: `--module M
--config F` of torchtitan.train imports M.config_registry, else M itself
(torchtitan/config/manager.py ConfigManager._load_config), and calls F(). The file written here
is such a module: one function, named after the plan, that calls the registry function of the
model (torchtitan/models/*/config_registry.py, solver.emit.torchtitan_cli.REGISTRY) and sets the
same fields as the command-line overrides (build_torchtitan_overrides) as attributes, the
activation-checkpoint policy as its Config class (SelectiveAC.Config, FullAC.Config, None for
none: torchtitan/distributed/activation_checkpoint.py ActivationCheckpointingConfig).
ConfigManager hands the result to tyro as the default, which builds the dataclasses again, so
Trainer.Config.__post_init__ checks the changed fields as it checks overrides.
"""

from __future__ import annotations

import re
import unicodedata

from solver.emit.nodes import render_torchrun_prefix
from solver.emit.quoting import render_comment_text
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.torchtitan import render_plan_line
from solver.emit.torchtitan_cli import VERSION, build_torchtitan_overrides

# The registry config a model torchtitan 0.3 does not ship is written on (dense, MoE): the user
# replaces it by their own (the notes say so).
STAND_INS = {False: ("llama3", "llama3_8b"), True: ("qwen3", "qwen3_30b_a3b")}
# The activation-checkpoint modes as torchtitan 0.3's policy configs.
AC_CONFIGS = {"none": None, "selective": "SelectiveAC", "full": "FullAC"}


def config_function_name(target: LaunchTarget) -> str:
    """The function's name: the model and the degrees, a Python identifier
    ("llama3_1_70b_tp8_pp2_dp4")."""
    c = target.config
    degrees = [f"{name}{value}" for name, value in (
        ("tp", c.tp), ("pp", c.pp), ("vpp", c.vpp), ("cp", c.cp), ("ep", c.ep), ("dp", c.dp))
        if value > 1 or name == "dp"]
    # ASCII letters and digits only: `\w` also matches characters no identifier may hold
    # ("½", "²": str.isalnum but not str.isidentifier), and an ASCII name is the same one
    # whatever the terminal's encoding; accents are folded first ("café" -> "cafe").
    folded = unicodedata.normalize("NFKD", target.model_spec.name.lower())
    name = re.sub(r"[^0-9a-z]+", "_", folded.encode("ascii", "ignore").decode()).strip("_")
    return "_".join(["parplan", *([name] if name else []), *degrees])


def render_torchtitan_python(target: LaunchTarget) -> Emitted:
    """The config module (module docstring), headed by the plan and the line that runs it."""
    registry, fields, mode, warnings, notes = build_torchtitan_overrides(target)
    if registry is None:
        registry = STAND_INS[target.model_spec.is_moe]
        notes = [n for n in notes if "ships no" not in n]
        warnings.append(f"torchtitan 0.3 ships no {target.model_spec.name}: the file calls "
                        f"{registry[1]}() as a stand-in; replace it by your model's config "
                        "function")
    function = config_function_name(target)
    launcher = " ".join(render_torchrun_prefix(target) + [
        "-m", "torchtitan.train", "--module", "parplan_plan", "--config", function])
    lines = [f"# {render_comment_text(line)}" for line in (
        render_plan_line(target),
        f"torchtitan {VERSION}: a config module; save it as parplan_plan.py in a folder on "
        "PYTHONPATH and run",
        launcher)]
    ac_class = AC_CONFIGS[mode]
    lines += ["", "from torchtitan.trainer import Trainer"]
    if ac_class is not None:
        lines.append(f"from torchtitan.distributed.activation_checkpoint import {ac_class}")
    lines += [f"from torchtitan.models.{registry[0]}.config_registry import {registry[1]}",
              "", "",
              f"def {function}() -> Trainer.Config:",
              f'    """{registry[1]} with the plan\'s parallelism and batch."""',
              f"    config = {registry[1]}()"]
    for section, values in fields.items():
        for name, value in values.items():
            lines.append(f"    config.{section}.{name} = {value!r}")
    lines.append(f"    config.activation_checkpoint = "
                 f"{'None' if ac_class is None else ac_class + '.Config()'}")
    lines.append("    return config")
    return Emitted(text="\n".join(lines) + "\n", settings={"function": function},
                   warnings=tuple(warnings), notes=tuple(notes))
