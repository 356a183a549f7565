"""What every emitter takes (a plan on a cluster, laid out) and what it gives back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from solver.cost.layers.time_constants import TimeConstants
from solver.emit.layout import RankLayout
from solver.errors import InputError
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig, PipelineLayout
from solver.spec.layout import VirtualStage
from solver.spec.layout_syntax import parse_pipeline_layout
from solver.spec.model_ref import render_model_reference


@dataclass(frozen=True)
class LaunchTarget:
    """One plan to launch: the model, the cluster, the job, the degrees, their rank layout,
    what each virtual pipeline stage holds (`pipeline`; None: the even split) and the
    framework features to ask for (`time_constants`)."""

    model_spec: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    config: ParallelConfig
    layout: RankLayout
    pipeline: PipelineLayout | None = None
    # The framework profile's features the settings ask for (None: the format's own profile,
    # solver.cost.step.frameworks).
    time_constants: TimeConstants | None = None
    # The framework version the settings are written for (solver.emit.TARGETS; "": the
    # format's newest).
    version: str = ""

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per data-parallel rank and step (gradient accumulation steps)."""
        return self.job.global_batch // (self.config.dp * self.config.micro_batch)

    @property
    def model_id(self) -> str:
        """What a loader takes: the Hugging Face repository of the model's source, the folder of
        an imported config.json, else its name (solver.spec.model_ref)."""
        return render_model_reference(self.model_spec)

    def layers_per_virtual_stage(self) -> list[int]:
        """Decoder layers of each of the pp x vpp virtual stages, in layer order: the
        pipeline's, else the even split, where the first L % (pp x vpp) take one more, as the
        memory model splits them (cost/memory/layout.py)."""
        if self.pipeline is not None:
            return [stage.layers for stage in self.pipeline.stages]
        num_stages = self.config.pp * self.config.vpp
        base, extra = divmod(self.model_spec.num_hidden_layers, num_stages)
        return [base + (1 if stage < extra else 0) for stage in range(num_stages)]

    def pipeline_layout(self) -> PipelineLayout:
        """The pipeline, else the even split as a layout: the model's MTP layers with the loss,
        every layer recomputing in full under recompute "full"."""
        if self.pipeline is not None:
            return self.pipeline
        layers = self.layers_per_virtual_stage()
        full = self.config.recompute == "full"
        last = len(layers) - 1
        return PipelineLayout(pp=self.config.pp, vpp=self.config.vpp, stages=tuple(
            VirtualStage(layers=n, recompute_layers=n if full else 0, embedding=v == 0,
                         loss=v == last,
                         mtp_layers=self.model_spec.mtp_depths if v == last else 0)
            for v, n in enumerate(layers)))

    @property
    def other_recompute(self) -> str:
        """What the layers outside the layout's full-recompute counts keep: "selective"
        recompute or "none" (the layout holds the full recompute)."""
        return "none" if self.config.recompute == "full" else self.config.recompute


def check_pipeline_layout(pipeline: PipelineLayout, model_spec: ModelSpec,
                          config: ParallelConfig, source: str) -> PipelineLayout:
    """`pipeline` checked against the model and the degrees (one-line InputError naming
    `source`), with the model's MTP layers placed with the loss when it places none."""
    if (pipeline.pp, pipeline.vpp) != (config.pp, config.vpp):
        raise InputError(f"{source}: a layout of pp {pipeline.pp} x vpp {pipeline.vpp}, but the "
                         f"plan has pp {config.pp} x vpp {config.vpp}")
    if pipeline.num_layers != model_spec.num_hidden_layers:
        raise InputError(f"{source}: its virtual stages hold {pipeline.num_layers} decoder "
                         f"layers; {model_spec.name} has {model_spec.num_hidden_layers}")
    mtp = pipeline.stages[-1].mtp_layers
    wanted = model_spec.mtp_depths
    if mtp not in (0, wanted):
        raise InputError(f"{source}: its last virtual stage holds {mtp} MTP layers; "
                         f"{model_spec.name} runs {wanted} MTP depth(s)")
    if mtp == wanted:
        return pipeline
    last = pipeline.stages[-1].model_copy(update={"mtp_layers": wanted})
    return pipeline.model_copy(update={"stages": (*pipeline.stages[:-1], last)})


def parse_launch_pipeline(text: str, model_spec: ModelSpec, config: ParallelConfig,
                          recompute_num_layers: int | None = None) -> PipelineLayout:
    """`--layout TEXT` of launch and estimate (Megatron's syntax, which has no recompute
    counts): under --recompute full every layer recomputes in full, or, with
    `recompute_num_layers` R, the first min(R, layers) of each virtual stage (Megatron's
    --recompute-method block --recompute-num-layers R)."""
    pipeline = parse_pipeline_layout(text, config.pp, config.vpp, model_spec.num_hidden_layers,
                                     model_spec.mtp_depths)
    if recompute_num_layers is not None and config.recompute != "full":
        raise InputError(f"--recompute-num-layers {recompute_num_layers}: needs --recompute "
                         f"full (got {config.recompute})")
    if config.recompute != "full":
        return pipeline
    count = recompute_num_layers
    return pipeline.model_copy(update={"stages": tuple(
        stage.model_copy(update={"recompute_layers": stage.layers if count is None
                                 else min(count, stage.layers)})
        for stage in pipeline.stages)})


@dataclass(frozen=True)
class Emitted:
    """A framework's settings for a target: the file or command line as text, the same settings
    as data (for --json and validation), warnings (something will not work as planned) and
    notes (what the user must still do)."""

    text: str
    settings: Any
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
