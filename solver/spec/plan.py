"""Plan: one parallel configuration with what the cost model says about it.

Memory is per GPU and per pipeline stage, in bytes, itemized: the four model-state and
activation terms, plus named other items (logits, temporary buffers, fixed reserves), and in
the three views users measure it in (MEMORY_VIEWS, solver.cost.memory.views): allocated,
reserved and device, the total. The worst stage's device view decides whether the plan fits.
Beside them, what the counters would read on the plan's GPU (OBSERVED_VIEWS): PyTorch's caching
allocator keeps its cache while the GPU has room, so reserved and device read higher on a roomy
GPU than the views the plan needs (solver.cost.memory.views.estimate_memory_views_with_room);
allocated is the same in both, and fits are judged on the needed device view.
`time` is the step-time model's answer: seconds per step, throughput, MFU, the breakdown of the
step, and the days and GPU-hours of the job's token budget when it has one.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from solver.spec.headroom import MemoryHeadroom
from solver.spec.job import ParallelConfig, Recompute
from solver.spec.layout import PipelineLayout


# The views of a stage's memory (solver.cost.memory.views), each with what reports it: the
# number a user's measurement is compared with.
MEMORY_VIEWS = {
    "allocated": "torch.cuda.max_memory_allocated()",
    "reserved": "torch.cuda.max_memory_reserved()",
    "device": "nvidia-smi, or an out-of-memory error",
}
# The views whose reading on the plan's GPU can differ from what the plan needs, each with
# what reports it: a training plan's allocator cache grows into the room the GPU leaves
# (solver.cost.memory.views.estimate_memory_views_with_room); allocated does not move.
OBSERVED_VIEWS = {
    "reserved": "torch.cuda.max_memory_reserved() as it reads on this GPU",
    "device": "nvidia-smi as it reads on this GPU",
}


class StageMemory(BaseModel):
    """Bytes per GPU on one pipeline stage: items, and the allocated and reserved views (the
    device view is the total); `observed_reserved_bytes` and `observed_device_bytes`: the
    reserved and device views as the counters read them on the plan's GPU (OBSERVED_VIEWS)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    stage: int = Field(ge=0)
    weights_bytes: float = Field(ge=0)
    grads_bytes: float = Field(ge=0)
    optimizer_bytes: float = Field(ge=0)
    activations_bytes: float = Field(ge=0)
    other_bytes: dict[str, float]
    allocated_bytes: float = Field(ge=0)
    reserved_bytes: float = Field(ge=0)
    observed_reserved_bytes: float = Field(ge=0)
    observed_device_bytes: float = Field(ge=0)

    @model_validator(mode="after")
    def _views_are_ordered(self) -> StageMemory:
        # Our invariant (solver.cost.memory.views): allocated <= reserved <= device, and the
        # observed views at least the needed ones; the items are summed in another order for
        # the total, hence the rounding allowance.
        slack = 1e-9 * self.total_bytes
        assert self.allocated_bytes <= self.reserved_bytes <= self.total_bytes + slack, (
            self.allocated_bytes, self.reserved_bytes, self.total_bytes)
        assert self.reserved_bytes <= self.observed_reserved_bytes <= (
            self.observed_device_bytes + slack), (self.reserved_bytes,
                                                  self.observed_reserved_bytes,
                                                  self.observed_device_bytes)
        assert self.total_bytes <= self.observed_device_bytes + slack, (
            self.total_bytes, self.observed_device_bytes)
        return self

    @property
    def other_total_bytes(self) -> float:
        return sum(self.other_bytes.values())

    @property
    def total_bytes(self) -> float:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activations_bytes + self.other_total_bytes)

    @property
    def device_bytes(self) -> float:
        """What nvidia-smi shows: the total."""
        return self.total_bytes

    def view_bytes(self, view: str) -> float:
        """Bytes in `view` (MEMORY_VIEWS)."""
        return {"allocated": self.allocated_bytes, "reserved": self.reserved_bytes,
                "device": self.device_bytes}[view]

    def observed_view_bytes(self, view: str) -> float:
        """Bytes in `view` (MEMORY_VIEWS) as the counter reads it on the plan's GPU: the
        observed reserved and device views, allocated as it is."""
        return {"allocated": self.allocated_bytes, "reserved": self.observed_reserved_bytes,
                "device": self.observed_device_bytes}[view]


TIME_PARTS = ("compute", "recompute", "tp", "cp", "ep", "offload", "dp", "pp", "bubble",
              "optimizer")


class PlanTime(BaseModel):
    """Step time and throughput of one plan; `time_seconds` holds TIME_PARTS and adds up to
    `step_seconds`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_seconds: float = Field(gt=0)
    tokens_per_second: float = Field(gt=0)
    tokens_per_second_per_gpu: float = Field(gt=0)
    tflops_per_gpu: float = Field(ge=0)
    mfu: float = Field(ge=0)
    time_seconds: dict[str, float]
    train_days: float | None = None
    gpu_hours: float | None = None


class Equivalent(BaseModel):
    """Another setting of a plan that gives the same step time (solver.search.twins): its
    recompute and ZeRO stage (the plan's where only the other differs), and the worst-stage
    bytes it needs (at least the plan's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recompute: Recompute
    zero: int = Field(ge=0, le=3)
    total_bytes: float = Field(ge=0)


class Plan(BaseModel):
    """A configuration, its per-stage memory, the GPU it must fit on, and what each virtual
    pipeline stage holds (`layout`); `equivalent`: the settings that give the same step time;
    `memory_savers`: the framework features it needs on to fit; `recompute_modules`: the
    modules it recomputes where the search chose them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    config: ParallelConfig
    gpu_memory_bytes: float = Field(gt=0)
    memory_headroom: MemoryHeadroom = MemoryHeadroom()
    stages: tuple[StageMemory, ...] = Field(min_length=1)
    time: PlanTime | None = None
    layout: PipelineLayout | None = None
    equivalent: tuple[Equivalent, ...] = ()
    # Framework features the plan turns on to fit (solver.cost.step.frameworks.MEMORY_SAVERS, e.g.
    # "grad_reduce_in_bf16"): `launch --plan` emits them.
    memory_savers: tuple[str, ...] = ()
    # What `selective` recomputes where the search chose it (Megatron --recompute-modules,
    # solver.cost.step.recompute_modules); empty: the framework's own choice.
    recompute_modules: tuple[str, ...] = ()
    # Offloads to the host the plan uses where the search chose them (solver.spec.framework.
    # OFFLOADS, solver.cost.step.offload): `launch --plan` turns them on.
    offloads: tuple[str, ...] = ()

    @property
    def worst_stage(self) -> StageMemory:
        """The stage with the largest total (the first of equals)."""
        return max(self.stages, key=lambda s: s.total_bytes)

    @property
    def usable_memory_bytes(self) -> float:
        """The GPU's memory less the headroom: what the worst stage may hold."""
        return self.memory_headroom.usable_bytes(self.gpu_memory_bytes)

    @property
    def fits(self) -> bool:
        """Judged on the device view (nvidia-smi's number is what runs out)."""
        return self.worst_stage.device_bytes <= self.usable_memory_bytes
