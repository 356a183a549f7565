"""`launch --validate` for a ds_config (solver.emit.validate): DeepSpeed 0.19's own checks.

DeepSpeedConfig (deepspeed/runtime/config.py) parses the whole file: every section's pydantic
model (zero_optimization, bf16, tensor_parallel, ...), the batch rule train_batch_size =
train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size, and its
sanity checks. It reads the world from deepspeed.comm (rank, then mpu's data-parallel size),
which here is a stand-in for the plan's ranks (no process group is started). AutoEP's
validate_autoep_config (module_inject/auto_ep_config.py) then checks the expert_parallel section
against the world, pp and tp (build_folding_spec, validate_folding_global).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from solver.emit.deepspeed import VERSION
from solver.emit.target import Emitted, LaunchTarget
from solver.emit.check_harness import Validation, require_version, run_check


@dataclass(frozen=True)
class PlanRanks:
    """deepspeed.comm's backend and an mpu for one plan: rank 0 of the plan's world."""

    world_size: int
    tp: int
    pp: int
    dp: int

    def is_initialized(self) -> bool:
        return True

    def get_rank(self, group: object = None) -> int:
        return 0

    def get_world_size(self, group: object = None) -> int:
        return self.world_size

    def get_data_parallel_world_size(self) -> int:
        return self.dp

    def get_model_parallel_world_size(self) -> int:
        return self.tp

    def get_tensor_model_parallel_world_size(self) -> int:
        return self.tp

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.pp


@contextlib.contextmanager
def comm_backend(ranks: PlanRanks) -> Iterator[None]:
    """deepspeed.comm answering for the plan's ranks, restored afterwards."""
    from deepspeed.comm import comm as ds_comm

    saved = ds_comm.cdb
    ds_comm.cdb = ranks
    try:
        yield
    finally:
        ds_comm.cdb = saved


def check_deepspeed(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    """DeepSpeedConfig on the whole file, then AutoEP's rules (module docstring)."""
    if not require_version(validation, "deepspeed", VERSION, "the ds_config"):
        return
    c = target.config
    ranks = PlanRanks(world_size=c.num_gpus, tp=c.tp, pp=c.pp, dp=c.dp)

    def load() -> object:
        from deepspeed.runtime.config import DeepSpeedConfig

        with comm_backend(ranks):
            return DeepSpeedConfig(dict(emitted.settings), mpu=ranks)

    config = run_check("DeepSpeedConfig", load)
    validation.accepted.append(f"DeepSpeedConfig (the whole file; data-parallel size {c.dp})")
    if "expert_parallel" in emitted.settings:
        def autoep() -> None:
            from deepspeed.module_inject.auto_ep_config import validate_autoep_config

            validate_autoep_config(config.expert_parallel_config, c.num_gpus, c.pp, c.tp, 1,
                                   zero_stage=config.zero_optimization_stage)

        run_check("AutoEP's validate_autoep_config", autoep)
        validation.accepted.append(f"AutoEP's validate_autoep_config (ep {c.ep} over "
                                   f"{c.num_gpus} ranks, pp {c.pp}, tp {c.tp})")
    validation.unchecked.append("the model code: PipelineModule's partition and the MoE layers "
                                "AutoEP detects (they need the model)")
