"""JobSpec (what is trained) and ParallelConfig (how it is split).

A **degree** is the number of ranks along one axis: tp (tensor), pp (pipeline), dp (data),
cp (context), ep (expert), etp (expert tensor). Dense layers use tp*cp*pp*dp GPUs; expert
layers carve ep and etp out of the same GPUs (Megatron's expert-data-parallel group has
tp*cp*dp / (ep*etp) ranks).
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from pydantic import ConfigDict, Field

from solver.spec.finetune import FinetuneSpec
from solver.spec.strict import (
    MAX_BATCH,
    MAX_SEQ_LEN,
    MAX_TOKENS,
    GpuCount,
    InputSpec,
    LayerCount,
)

# Training precision recipes (solver.cost.kernels.precision says what each quantises and where it
# runs); fp8 is tensor-wise (delayed or current) scaling. The one list of --precision choices.
Precision = Literal["bf16", "fp8", "fp8-blockwise", "mxfp8", "nvfp4"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
Recompute = Literal["none", "selective", "full"]
RECOMPUTE_LEVELS: tuple[Recompute, ...] = ("none", "selective", "full")
# The frameworks whose rules (solver.search.constraints) and timing
# (solver.cost.step.frameworks.framework_time_constants) parplan knows.
Framework = Literal["megatron", "torchtitan", "deepspeed", "generic"]
FRAMEWORKS: tuple[Framework, ...] = ("megatron", "torchtitan", "deepspeed", "generic")


class JobSpec(InputSpec):
    """A training job: sequence length, global batch (sequences), token budget, precision, and
    what it trains (`finetune`: pretraining by default; solver.spec.finetune)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seq_len: Annotated[int, MAX_SEQ_LEN] = Field(default=4096, gt=0)
    global_batch: Annotated[int, MAX_BATCH] = Field(default=1024, gt=0)
    token_budget: Annotated[int, MAX_TOKENS] | None = Field(default=None, gt=0)
    precision: Precision = "bf16"
    finetune: FinetuneSpec = FinetuneSpec()

    @property
    def tokens_per_step(self) -> int:
        return self.seq_len * self.global_batch


class ParallelConfig(InputSpec):
    """One parallel configuration; sequence parallel is on whenever tp > 1."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: GpuCount = Field(default=1, gt=0)
    pp: GpuCount = Field(default=1, gt=0)
    dp: GpuCount = Field(default=1, gt=0)
    cp: GpuCount = Field(default=1, gt=0)
    ep: GpuCount = Field(default=1, gt=0)
    etp: GpuCount = Field(default=1, gt=0)
    vpp: LayerCount = Field(default=1, gt=0)
    zero: int = Field(default=1, ge=0, le=3)
    micro_batch: Annotated[int, MAX_BATCH] = Field(default=1, gt=0)
    recompute: Recompute = "selective"

    @property
    def num_gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1

    @property
    def expert_dp(self) -> int:
        """Expert-data-parallel degree: the dense tp*cp*dp ranks of a stage regrouped by ep*etp.
        Integer only when ep*etp divides tp*cp*dp (a solver constraint)."""
        return self.tp * self.cp * self.dp // (self.ep * self.etp)


# The degrees and choices of a configuration, in ParallelConfig's order: the one list the cost
# model, the search (which binds them in its own order, solver.search.space.VARIABLES) and the
# JSON read.
PARALLEL_FIELDS: tuple[str, ...] = tuple(ParallelConfig.model_fields)
