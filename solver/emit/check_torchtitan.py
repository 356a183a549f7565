"""`launch --validate` for torchtitan (solver.emit.validate).

torchtitan 0.3: ConfigManager().parse_args(the overrides) builds the registry's Trainer.Config
and applies them with tyro, whose dataclasses run their checks (Trainer.Config.__post_init__:
pipeline micro-batches, CUDA graphs against PP and EP, activation checkpointing);
ParallelDims.from_config(...).build_mesh() then lays the degrees out on the plan's world (a
"fake" torch.distributed process group of that size: no GPUs, no traffic), which refuses an ep
that does not tile dp_shard x cp x tp; with pipeline parallelism and torchtitan's own split,
_get_pipeline_metadata checks the stages against the schedule. A model torchtitan does not ship
is checked with a registry model of the same kind as a stand-in, and said so.
torchtitan 0.2 (TOML): its ConfigManager reads the file with --job.config_file.
torchtitan 0.3's Python config (solver.emit.torchtitan_python): the file is saved as
parplan_plan.py in a temporary folder put on sys.path, and ConfigManager.parse_args runs
`--module parplan_plan --config FUNCTION` as torchtitan.train would, then the same mesh checks.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from solver.emit.target import Emitted, LaunchTarget
from solver.emit.check_harness import Validation, require_version, run_check, run_parser

# Registry models standing in for a model torchtitan 0.3 does not ship (dense, MoE).
STAND_INS = {False: ("llama3", "llama3_8b"), True: ("qwen3", "qwen3_30b_a3b")}


def check_torchtitan(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    """The version's whole-file check, then the mesh (module docstring)."""
    if target.version == "0.2":
        _check_toml(target, emitted, validation)
        return
    if not require_version(validation, "torchtitan", "0.3", "the command line"):
        return
    tokens = list(emitted.settings)
    if "--module" not in tokens:
        module, config_name = STAND_INS[target.model_spec.is_moe]
        tokens = ["--module", module, "--config", config_name, *tokens]
        validation.unchecked.append(
            f"the model (torchtitan 0.3 ships no {target.model_spec.name}; the overrides were "
            f"checked on its {config_name} instead)")

    def parse() -> object:
        from torchtitan.config.manager import ConfigManager

        return ConfigManager().parse_args(tokens)

    config = run_check("torchtitan's ConfigManager", lambda: run_parser(
        "torchtitan's ConfigManager.parse_args", parse))
    validation.accepted.append("ConfigManager.parse_args (the whole command line and "
                               "Trainer.Config's checks)")
    _check_mesh(target, config.parallelism, validation, config)
    validation.unchecked.append("the trainer's start-up on GPUs (model build, checkpoint, "
                                "data)")


def check_torchtitan_python(target: LaunchTarget, emitted: Emitted,
                            validation: Validation) -> None:
    """ConfigManager on the config module, then the mesh (module docstring)."""
    if not require_version(validation, "torchtitan", "0.3", "the config module"):
        return
    function = emitted.settings["function"]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "parplan_plan.py").write_text(emitted.text, encoding="utf-8")

        def parse() -> object:
            from torchtitan.config.manager import ConfigManager

            sys.path.insert(0, folder)
            try:
                return ConfigManager().parse_args(["--module", "parplan_plan",
                                                   "--config", function])
            finally:
                sys.path.remove(folder)
                sys.modules.pop("parplan_plan", None)

        config = run_check("torchtitan's ConfigManager", lambda: run_parser(
            "torchtitan's ConfigManager.parse_args", parse))
    validation.accepted.append(f"ConfigManager.parse_args (--module parplan_plan --config "
                               f"{function}, and Trainer.Config's checks)")
    if any("ships no" in warning for warning in emitted.warnings):
        validation.unchecked.append(f"the model (torchtitan 0.3 ships no "
                                    f"{target.model_spec.name}; the file calls a stand-in)")
    _check_mesh(target, config.parallelism, validation, config)
    validation.unchecked.append("the trainer's start-up on GPUs (model build, checkpoint, "
                                "data)")


def _check_mesh(target: LaunchTarget, parallelism: object, validation: Validation,
                config: object = None) -> None:
    """ParallelDims on a fake process group of the plan's world size; the pipeline split."""
    world = target.config.num_gpus

    def build() -> object:
        import torch.distributed as dist
        from torch.testing._internal.distributed.fake_pg import FakeStore
        from torchtitan.distributed import ParallelDims

        dims = _parallel_dims(ParallelDims, parallelism, world)
        started = not dist.is_initialized()
        if started:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        try:
            dims.build_mesh()
        finally:
            if started:
                dist.destroy_process_group()
        return dims

    dims = run_check("torchtitan's ParallelDims", build)
    validation.accepted.append(f"ParallelDims.build_mesh on {world} ranks")
    model = getattr(getattr(config, "model_spec", None), "model", None)
    if target.config.pp > 1 and model is not None and \
            getattr(parallelism, "module_fqns_per_model_part", None) is None:
        def split() -> None:
            from torchtitan.distributed.pipeline_parallel import _get_pipeline_metadata

            _get_pipeline_metadata(dims, parallelism, model)

        run_check("torchtitan's pipeline split", split)
        validation.accepted.append("the pipeline split (_get_pipeline_metadata)")


def _parallel_dims(parallel_dims: type, parallelism: object, world: int) -> object:
    """ParallelDims of the config: 0.3's from_config, or 0.2's constructor (with etp)."""
    if hasattr(parallel_dims, "from_config"):
        return parallel_dims.from_config(parallelism, world)
    p = parallelism
    return parallel_dims(dp_replicate=p.data_parallel_replicate_degree,
                         dp_shard=p.data_parallel_shard_degree, cp=p.context_parallel_degree,
                         tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                         ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree,
                         world_size=world)


def _check_toml(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    """torchtitan 0.2: ConfigManager on the TOML file, then the mesh."""
    if not require_version(validation, "torchtitan", "0.2", "the TOML file"):
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "job.toml"
        path.write_text(emitted.text, encoding="utf-8")

        def parse() -> object:
            from torchtitan.config import ConfigManager

            return ConfigManager().parse_args([f"--job.config_file={path}"])

        config = run_check("torchtitan's ConfigManager", lambda: run_parser(
            "torchtitan's ConfigManager.parse_args", parse))
    validation.accepted.append("ConfigManager.parse_args (the TOML file)")
    _check_mesh(target, config.parallelism, validation)
    validation.unchecked.append("the model and the trainer's start-up on GPUs")
