"""PipelineLayout: what each virtual pipeline stage holds.

A pipeline of `pp` stages with `vpp` model chunks per stage has pp x vpp **virtual stages**,
numbered in model order; virtual stage v runs on pipeline stage v % pp (Megatron's interleaved
placement: stage i holds chunks i, i + pp, ..., i + (vpp - 1) pp). The decoder layers are cut
into pp x vpp consecutive runs, one per virtual stage. The embedding sits on virtual stage 0,
the final norm, LM head and loss (and the multi-token-prediction modules) on the last one, as
Megatron places them; a virtual stage may hold no decoder layer when it holds the embedding or
the loss (Megatron's `--account-for-embedding-in-pipeline-split` / `--account-for-loss-in-
pipeline-split` count each as a layer slot). `recompute_layers` of a virtual stage is how many
of its layers recompute in full during the backward pass (Megatron's block method: the first
ones); the others keep their activations at the configuration's level (none or selective).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field, model_validator

from solver.spec.strict import GpuCount, InputSpec, LayerCount


class VirtualStage(InputSpec):
    """One virtual pipeline stage: its decoder layers and how many of them recompute."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    layers: LayerCount = Field(ge=0)
    recompute_layers: LayerCount = Field(default=0, ge=0)
    embedding: bool = False
    loss: bool = False
    mtp_layers: LayerCount = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _recompute_within_layers(self) -> VirtualStage:
        if self.recompute_layers > self.layers:
            raise ValueError(f"recompute_layers ({self.recompute_layers}) exceeds the virtual "
                             f"stage's layers ({self.layers})")
        return self


class PipelineLayout(InputSpec):
    """The pp x vpp virtual stages of a plan, in model order (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pp: GpuCount = Field(gt=0)
    vpp: LayerCount = Field(gt=0)
    stages: tuple[VirtualStage, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _shape(self) -> PipelineLayout:
        count = self.pp * self.vpp
        if len(self.stages) != count:
            raise ValueError(f"a layout of pp {self.pp} x vpp {self.vpp} has {count} virtual "
                             f"stages, not {len(self.stages)}")
        if not self.stages[0].embedding or any(s.embedding for s in self.stages[1:]):
            raise ValueError("the embedding belongs to the first virtual stage only")
        if not self.stages[-1].loss or any(s.loss for s in self.stages[:-1]):
            raise ValueError("the LM head and loss belong to the last virtual stage only")
        if any(s.mtp_layers for s in self.stages[:-1]):
            raise ValueError("multi-token-prediction layers belong to the last virtual stage")
        for index, stage in enumerate(self.stages):
            if stage.layers == 0 and not (stage.embedding or stage.loss):
                raise ValueError(f"virtual stage {index} holds nothing: every virtual stage "
                                 "needs a decoder layer, the embedding or the loss")
        return self

    @property
    def num_layers(self) -> int:
        return sum(s.layers for s in self.stages)

    def stage_of(self, virtual: int) -> int:
        """The pipeline stage that runs virtual stage `virtual`."""
        return virtual % self.pp

    def layers_of_stage(self, stage: int) -> int:
        """Decoder layers of pipeline stage `stage` (all its chunks)."""
        return sum(s.layers for v, s in enumerate(self.stages) if v % self.pp == stage)

    @property
    def is_even(self) -> bool:
        """Whether the layers are spread as evenly as the virtual stages allow (differ by at
        most one) with no partial recompute."""
        counts = [s.layers for s in self.stages]
        return max(counts) - min(counts) <= 1 and all(
            s.recompute_layers in (0, s.layers) for s in self.stages)
