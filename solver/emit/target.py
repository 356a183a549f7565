"""What every emitter takes (a plan on a cluster, laid out) and what it gives back."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from solver.emit.layout import RankLayout
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig

HF_REPO = re.compile(r"^https?://huggingface\.co/([\w.-]+/[\w.-]+)")


@dataclass(frozen=True)
class LaunchTarget:
    """One plan to launch: the model, the cluster, the job, the degrees and their rank layout."""

    model_spec: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    config: ParallelConfig
    layout: RankLayout

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per data-parallel rank and step (gradient accumulation steps)."""
        return self.job.global_batch // (self.config.dp * self.config.micro_batch)

    @property
    def model_id(self) -> str:
        """The Hugging Face repository of the model when its source names one, else its name."""
        found = HF_REPO.match(self.model_spec.source)
        return found.group(1) if found else self.model_spec.name

    def layers_per_virtual_stage(self) -> list[int]:
        """Decoder layers of each of the pp x vpp virtual stages, in layer order; the first
        L % (pp x vpp) take one more, as the memory model splits them (cost/memory/layout.py)."""
        num_stages = self.config.pp * self.config.vpp
        base, extra = divmod(self.model_spec.num_hidden_layers, num_stages)
        return [base + (1 if stage < extra else 0) for stage in range(num_stages)]


@dataclass(frozen=True)
class Emitted:
    """A framework's settings for a target: the file or command line as text, the same settings
    as data (for --json and validation), warnings (something will not work as planned) and
    notes (what the user must still do)."""

    text: str
    settings: Any
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
