"""GpuSpec, TierSpec, ClusterSpec: the hardware a plan runs on.

A **tier** is an interconnect level, innermost first (NVLink domain, then the fabric between
nodes). A group of ranks communicates at the bandwidth and latency of the outermost tier it
spans. Bandwidths are per GPU and unidirectional, in GB/s (1e9 B/s), comparable with the
nccl-tests "busbw" column; presets ship datasheet-derived values until calibration replaces them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from solver.spec.calibration import TierCurves

SCALE_UP_KINDS = ("nvlink", "xgmi")


class GpuSpec(BaseModel):
    """One accelerator model. Peaks are dense (no 2:4 sparsity) tensor-core TFLOP/s."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    vendor: Literal["nvidia", "amd"] = "nvidia"
    memory_gib: float = Field(gt=0)
    peak_tflops_bf16: float = Field(gt=0)
    peak_tflops_fp16: float = Field(gt=0)
    peak_tflops_fp8: float | None = Field(default=None, gt=0)
    hbm_gb_per_s: float = Field(gt=0)
    nvlink_gb_per_s: float = Field(default=0.0, ge=0)
    num_sms: int | None = Field(default=None, gt=0)
    # Maximum achievable matmul FLOP/s over the dense peak, best shape, measured (MAMF,
    # stas00/ml-engineering compute/accelerator/benchmarks/mamf-finder.py); None if unmeasured.
    mamf_fraction_bf16: float | None = Field(default=None, gt=0, le=1)
    mamf_fraction_fp8: float | None = Field(default=None, gt=0, le=1)
    # FP32 on the CUDA cores (no tensor cores), the datasheet's "FP32" line: what a GEMM whose
    # rows are not 16-byte aligned falls back to (solver.cost.efficiency); None if unknown.
    peak_tflops_fp32: float | None = Field(default=None, gt=0)
    # The share of the dense peak that kernels written for the previous generation's MMA
    # instructions can reach (Ampere's mma.sync on Hopper: about 2/3; FlashAttention-3 paper,
    # Shah et al. 2024, §1): what 2023-era attention kernels ran at. None: no such limit known.
    legacy_mma_fraction: float | None = Field(default=None, gt=0, le=1)
    source: str = ""

    def peak_flop_per_s(self, precision: str) -> float:
        """Dense peak in FLOP/s for `precision` (bf16 | fp16 | fp8)."""
        tflops = {
            "bf16": self.peak_tflops_bf16,
            "fp16": self.peak_tflops_fp16,
            "fp8": self.peak_tflops_fp8,
        }[precision]
        if tflops is None:
            from solver.errors import InputError

            raise InputError(f"gpu '{self.name}': precision {precision} is not supported")
        return tflops * 1e12

    def mamf_fraction(self, precision: str) -> float | None:
        """The measured best-shape matmul fraction of the peak for `precision`, if known."""
        return self.mamf_fraction_fp8 if precision == "fp8" else self.mamf_fraction_bf16


class TierSpec(BaseModel):
    """One interconnect level; `span_gpus` None means it spans the whole cluster.

    `curves` holds measured collective-time curves (a calibration profile applied to the
    cluster); a collective with a curve uses it instead of `bandwidth_gb_per_s` and
    `latency_us` (solver.cost.comm)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    kind: Literal["nvlink", "xgmi", "pcie", "network"]
    span_gpus: int | None = Field(default=None, gt=0)
    bandwidth_gb_per_s: float = Field(gt=0)
    latency_us: float = Field(ge=0)
    curves: TierCurves | None = None


class ClusterSpec(BaseModel):
    """A cluster preset: one GPU type, GPUs per node, and its tiers innermost first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    gpu: GpuSpec
    gpus_per_node: int = Field(gt=0)
    tiers: tuple[TierSpec, ...] = Field(min_length=1)
    source: str = ""

    @field_validator("tiers")
    @classmethod
    def _check_tiers(
        cls, tiers: tuple[TierSpec, ...], info: ValidationInfo
    ) -> tuple[TierSpec, ...]:
        """Innermost first: spans grow and nest, bandwidth never rises outward, and only the
        outermost tier (the network or PCIe, never a scale-up link) spans the whole cluster."""
        *inner, outer = tiers
        if outer.span_gpus is not None:
            raise ValueError(f"the outermost tier '{outer.name}' must span the whole cluster "
                             "(omit its span_gpus)")
        if outer.kind in SCALE_UP_KINDS:
            raise ValueError(f"the outermost tier '{outer.name}' is kind {outer.kind}; give it "
                             "a span_gpus and add the network tier around it")
        spans = []
        for tier in inner:
            if tier.span_gpus is None:
                raise ValueError(f"tier '{tier.name}' omits span_gpus; only the outermost tier "
                                 "may span the whole cluster")
            spans.append(tier.span_gpus)
        for span, (nxt, nxt_span) in zip(spans, zip(inner[1:], spans[1:])):
            if nxt_span <= span or nxt_span % span:
                raise ValueError(f"tier spans must grow and nest: '{nxt.name}' spans "
                                 f"{nxt_span}, not a larger multiple of {span}")
        node = info.data.get("gpus_per_node")  # absent when gpus_per_node itself was invalid
        for tier, span in zip(inner, spans):
            if node and span % node and node % span:
                raise ValueError(f"tier '{tier.name}' spans {span} GPUs, neither a divisor nor "
                                 f"a multiple of gpus_per_node ({node})")
        for tier, nxt in zip(tiers, tiers[1:]):
            if nxt.bandwidth_gb_per_s > tier.bandwidth_gb_per_s:
                raise ValueError(
                    f"tier '{nxt.name}' ({nxt.bandwidth_gb_per_s:g} GB/s) is faster than the "
                    f"tier inside it ('{tier.name}', {tier.bandwidth_gb_per_s:g} GB/s); tiers go "
                    "innermost (fastest) first"
                )
        return tiers

    @property
    def scale_up_gpus(self) -> int:
        """GPUs in one NVLink / xGMI domain (1 when GPUs only meet over PCIe or the network).
        A scale-up tier always has a span: validation keeps it off the outermost tier."""
        spans = [t.span_gpus for t in self.tiers if t.kind in SCALE_UP_KINDS]
        return max((s for s in spans if s is not None), default=1)

    def tier_for_span(self, num_gpus: int) -> TierSpec:
        """The innermost tier whose span holds `num_gpus` consecutive ranks."""
        for tier in self.tiers:
            if tier.span_gpus is None or num_gpus <= tier.span_gpus:
                return tier
        raise AssertionError("the outermost tier spans everything")

    def with_gpus_per_node(self, gpus_per_node: int) -> ClusterSpec:
        """The same cluster with another node size; tiers that spanned a node follow it."""
        tiers = tuple(
            t.model_copy(update={"span_gpus": gpus_per_node})
            if t.span_gpus == self.gpus_per_node
            else t
            for t in self.tiers
        )
        data = self.model_dump()
        data.update(gpus_per_node=gpus_per_node, tiers=[t.model_dump() for t in tiers])
        return ClusterSpec.model_validate(data)
