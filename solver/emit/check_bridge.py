"""`launch --validate` for Megatron-Bridge overrides (solver.emit.validate).

What Bridge 0.3.1's scripts/training/run_recipe.py does before it trains, on the file's
overrides: process_config_with_overrides (Hydra's parser in struct mode: a key the
ConfigContainer lacks is an error; a value a field refuses is logged by _apply_overrides and
counted here as a refusal), then what pretrain() runs first, runtime_config_update
(training/config.py) with the plan's WORLD_SIZE: the mixed-precision preset's setup, which
writes its fields over the model's, optimizer's and DDP's (a setting of the file it changes is
a refusal here: the file would not do what it says), then ConfigContainer.validate(): each
sub-config's finalize (the model provider's is TransformerConfig.__post_init__), the
data-parallel size, the distributed-optimizer, mixed-precision, FSDP, checkpoint, scheduler,
context-parallel and sequence-length rules, and the flex-dispatcher check, which asks the GPU's
compute capability (answered with the plan's GPU where there is none, as for Megatron-LM).

What it cannot run: the recipe itself, which reads the model's config.json from the Hugging Face
Hub. The overrides go instead on Bridge's own recipe base (recipes/common.py _pretrain_common)
with the provider class the recipe builds (MambaModelProvider, MLAModelProvider, or
GPTModelProvider with the recipe's activation); the line says so. Bridge 0.3.1 imports Transformer Engine, a CUDA build,
in its LoRA modules (peft/lora.py, peft/lora_layers.py) on the way to its config; on a machine
without it those two modules are stood in for by empty ones (no LoRA runs here), and the
recipes package's __init__, which imports every recipe (the VLM ones need megatron-energon), is
skipped for recipes/common.py. Bridge needs transformers < 5, vLLM >= 5: it lives in a folder
of its own (.ci/run), ahead on the path of the `parplan launch --validate` that checks it.
"""

from __future__ import annotations

import enum
import importlib.util
import logging
import os
import sys
import types

from solver.emit.bridge import VERSION, pick_recipe
from solver.emit.check_megatron import NEEDS_TE, plan_gpu
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.check_harness import (
    Rejected,
    Validation,
    environment,
    installed_version,
    quiet,
    run_check,
)

# Bridge modules that import Transformer Engine unguarded, for LoRA only.
TE_ONLY_MODULES = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora")
OVERRIDES_LOGGER = "megatron.bridge.training.utils.omegaconf_utils"


class _StandIn(types.ModuleType):
    """An empty module whose every name is an empty class (what importers subclass or list)."""

    def __getattr__(self, name: str) -> type:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})


class _Refusals(logging.Handler):
    """_apply_overrides' warnings ("not found in config object", "Could not set attribute"):
    a key or value Bridge skips is a refusal."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _import_bridge() -> bool:
    """Import Bridge's config code (module docstring); False when Bridge is not importable."""
    if importlib.util.find_spec("megatron") is None or \
            importlib.util.find_spec("megatron.bridge") is None:
        return False
    if importlib.util.find_spec("transformer_engine") is None:
        for name in TE_ONLY_MODULES:
            sys.modules.setdefault(name, _StandIn(name))
    if "megatron.bridge.recipes" not in sys.modules:
        root = importlib.util.find_spec("megatron.bridge").submodule_search_locations[0]
        package = types.ModuleType("megatron.bridge.recipes")
        package.__path__ = [os.path.join(root, "recipes")]
        sys.modules["megatron.bridge.recipes"] = package
    return True


def _import_problem() -> str | None:
    """Why Bridge's config code does not import here, None when it does."""
    try:
        with quiet():
            if not _import_bridge():
                return "megatron.bridge is not importable"
            importlib.import_module("megatron.bridge.training.config")
    except ImportError as exc:
        return f"Megatron-Bridge does not import here: {exc}"
    return None


def _base_config(target: LaunchTarget) -> tuple[object, str]:
    """Bridge's recipe base with the provider the recipe would build, and its name."""
    import torch.nn.functional as F
    from megatron.bridge.models import GPTModelProvider
    from megatron.bridge.models.mla_provider import MLAModelProvider
    from megatron.bridge.recipes.common import _pretrain_common

    config = _pretrain_common()
    if "mamba" in target.model_spec.layer_mixers:
        from megatron.bridge.models.mamba.mamba_provider import MambaModelProvider

        config.model, name = MambaModelProvider(), "MambaModelProvider"
    elif target.model_spec.is_mla:
        config.model, name = MLAModelProvider(), "MLAModelProvider"
    elif target.model_spec.mlp_type == "gated":
        config.model = GPTModelProvider(activation_func=F.silu, gated_linear_unit=True)
        name = "GPTModelProvider with SiLU"
    else:
        config.model, name = GPTModelProvider(activation_func=F.gelu), "GPTModelProvider with GeLU"
    return config, name


def _read(config: object, key: str) -> object:
    """The value at a dotted override key in the file's spelling (_spell)."""
    value = config
    for part in key.split("."):
        value = getattr(value, part, None)
    return _spell(value)


def _spell(value: object) -> object:
    """A value as the file writes it: torch dtypes and enums by name (Bridge's finalize turns
    "attn" into CudaGraphScope.attn), lists item by item, other objects as text (a layout
    string and the layout object Bridge parses it into)."""
    if isinstance(value, (list, tuple)):
        return [_spell(item) for item in value]
    if isinstance(value, enum.Enum):
        return value.name
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value).removeprefix("torch.")


def check_bridge(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    """process_config_with_overrides and ConfigContainer.validate() (module docstring)."""
    found = installed_version("megatron-bridge")
    why = None
    if found is None:
        why = ("megatron-bridge is not installed: it needs transformers < 5, so it goes in a "
               "folder of its own ahead on PYTHONPATH, as .ci/run does")
    elif found != VERSION and not found.startswith(VERSION + "."):
        why = f"megatron-bridge {found} is installed; the file is for {VERSION}"
    if why is None:
        why = _import_problem()
    if why is not None:
        validation.unchecked.append(f"the recipe overrides ({why})")
        return
    recipe, _ = pick_recipe(target)
    overrides = list(emitted.settings["overrides"])
    # The PEFT recipe's LoRA (peft.*) is no field of the pretraining base the overrides are
    # checked on, and its modules import Transformer Engine: the rest is checked.
    peft = [token for token in overrides if token.startswith("peft.")]
    if peft:
        overrides = [token for token in overrides if not token.startswith("peft.")]
        validation.unchecked.append(f"the LoRA settings {', '.join(peft)} ({recipe}'s "
                                    "_peft_common base and peft/lora.py are not built here)")
    world = target.config.num_gpus

    def apply() -> tuple[object, str]:
        from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

        config, provider = _base_config(target)
        refusals = _Refusals()
        logger = logging.getLogger(OVERRIDES_LOGGER)
        logger.addHandler(refusals)
        try:
            process_config_with_overrides(config, cli_overrides=overrides)
        finally:
            logger.removeHandler(refusals)
        if refusals.messages:
            raise ValueError(" ".join(refusals.messages))
        return config, provider

    config, provider = run_check("Megatron-Bridge's process_config_with_overrides", apply)

    # the preset's name becomes its config in the setup: not a change
    keys = [key for key in (token.partition("=")[0] for token in overrides)
            if key != "mixed_precision"]
    asked = {key: _read(config, key) for key in keys}

    def validate() -> None:
        from megatron.bridge.training.config import runtime_config_update

        with plan_gpu(target), environment(WORLD_SIZE=str(world), RANK="0"):
            runtime_config_update(config)
        changed = [f"{key} to {_read(config, key)!r} (the file: {asked[key]!r})"
                   for key in keys if _read(config, key) != asked[key]]
        if changed:
            raise ValueError("its setup changes " + "; ".join(changed))

    try:
        run_check("Megatron-Bridge's runtime_config_update", validate)
    except Rejected as exc:
        if not NEEDS_TE.search(exc.message):
            raise
        validation.accepted.append(f"Megatron-Bridge {found}'s process_config_with_overrides")
        validation.unchecked.append(f"runtime_config_update and ConfigContainer.validate() (they "
                                    f"need Transformer Engine on this machine: {exc.message})")
        return
    validation.accepted.append(
        f"Megatron-Bridge {found}'s process_config_with_overrides and runtime_config_update "
        f"(the mixed-precision preset's setup, then ConfigContainer.validate(); {world} ranks, "
        f"data-parallel size {config.data_parallel_size}; no setting of the file changed)")
    validation.unchecked.append(
        f"the values of recipe {recipe} that the overrides leave as they are (the recipe reads "
        f"the model's config from the Hugging Face Hub; the overrides were applied to Bridge's "
        f"_pretrain_common base with a {provider})")
    if isinstance(sys.modules.get(TE_ONLY_MODULES[0]), _StandIn):
        validation.unchecked.append("Bridge's LoRA modules (they import Transformer Engine, "
                                    "absent here: empty stand-ins were imported; the file sets "
                                    "no LoRA)")
