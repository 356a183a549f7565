"""GpuSpec, TierSpec, ClusterSpec: the hardware a plan runs on.

A **tier** is an interconnect level, innermost first (NVLink domain, then the fabric between
nodes). A group of ranks communicates at the bandwidth and latency of the outermost tier it
spans. Bandwidths are per GPU and unidirectional, in GB/s (1e9 B/s), comparable with the
nccl-tests "busbw" column; presets ship datasheet-derived values until calibration replaces them.

A **segment** is the aligned block of one NVLink domain a job is allocated in (SLURM's
topology/block plugin, `sbatch --segment=<nodes>`: https://slurm.schedmd.com/topology.html).
On a rack-scale domain a job rarely gets whole racks: on GB200 NVL72 (18 trays of 4 GPUs) the
usual segment is 16 trays = 64 GPUs, so consecutive ranks fill 64 GPUs of one rack and rank 64
starts the next rack. Ranks are placed in segments in order, so for placement the NVLink tier
spans one segment (`ClusterSpec.placement_spans`); the hardware spans (`tier_for_span`, what a
calibration measured) are unchanged.
"""

from __future__ import annotations

from math import gcd
from typing import Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator

from solver.spec.calibration import TierCurves
from solver.spec.headroom import MemoryHeadroom, check_headroom_leaves_memory
from solver.spec.strict import GpuCount, InputSpec

SCALE_UP_KINDS = ("nvlink", "xgmi")
MemoryType = Literal["HBM2", "HBM2e", "HBM3", "HBM3e", "GDDR6", "GDDR6X", "GDDR7"]
BlockScaledFormat = Literal["mxfp8", "nvfp4"]


class GpuSpec(InputSpec):
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
    # rows are not 16-byte aligned falls back to (solver.cost.kernels.efficiency); None if unknown.
    peak_tflops_fp32: float | None = Field(default=None, gt=0)
    # The share of the dense peak that kernels written for the previous generation's MMA
    # instructions can reach (Ampere's mma.sync on Hopper: about 2/3; FlashAttention-3 paper,
    # Shah et al. 2024, §1): what 2023-era attention kernels ran at. None: no such limit known.
    legacy_mma_fraction: float | None = Field(default=None, gt=0, le=1)
    # Board power limit (W) the part ships with, where it differs between variants of one chip
    # (the 96 GB H100 of Meta's Grand Teton runs at a default 500 W against the SXM's 700 W),
    # and the memory technology. `parplan serve --price-per-gpu-hour` prices energy at it
    # (solver.cost.serving.price: tokens per joule at board power, an upper bound on energy).
    power_limit_w: float | None = Field(default=None, gt=0)
    hbm_type: MemoryType | None = None
    # Dense FP4 tensor-core peak (Blackwell), the NVFP4 recipe's datasheet rate.
    peak_tflops_fp4: float | None = Field(default=None, gt=0)
    # Block-scaled tensor-core formats (Blackwell's MXFP8 / NVFP4 MMA): which recipes of
    # solver.cost.kernels.kernels.precision the GPU can run natively.
    block_scaled_formats: tuple[BlockScaledFormat, ...] = ()
    # The packaged table of measured kernel times (solver/catalog/kernels/<name>.npz) the
    # compute model interpolates in; None: the datasheet path (peaks x fitted efficiencies).
    # A name, never a path: no file outside that folder is read (issue 37).
    kernel_table: str | None = Field(default=None, pattern=r"^[a-z0-9_]{1,64}$")
    # The GPU's own link to its host CPU, per direction, GB/s, from the datasheet: PCIe x16
    # (Gen4 32, Gen5 64, Gen6 128) or NVLink-C2C on Grace superchips; what activation and
    # optimizer offload move over (solver.cost.step.offload). None: unknown (no offload planned).
    host_link_gb_per_s: float | None = Field(default=None, gt=0)
    # The same link measured, GB/s per direction: the slower of pinned host-to-device and
    # device-to-host copies of one GPU (nvbandwidth host_to_device_memcpy_ce /
    # device_to_host_memcpy_ce), with the source in the GPU's file; what offload is costed at
    # where given (solver.cost.step.offload.host_link_bytes_per_s), the datasheet rate else.
    host_link_measured_gb_per_s: float | None = Field(default=None, gt=0)
    source: str = ""

    def peak_flop_per_s(self, precision: str) -> float:
        """Dense peak in FLOP/s of the GEMMs of `precision` (bf16 | fp16 | fp8 | a recipe of
        solver.spec.job.PRECISIONS: fp8-blockwise and mxfp8 run at the FP8 rate, nvfp4 at FP4)."""
        tflops = {
            "bf16": self.peak_tflops_bf16,
            "fp16": self.peak_tflops_fp16,
            "fp8": self.peak_tflops_fp8,
            "fp8-blockwise": self.peak_tflops_fp8,
            "mxfp8": self.peak_tflops_fp8,
            "nvfp4": self.peak_tflops_fp4,
        }[precision]
        if tflops is None:
            from solver.errors import InputError

            raise InputError(f"gpu '{self.name}': precision {precision} is not supported")
        return tflops * 1e12

    def mamf_fraction(self, precision: str) -> float | None:
        """The measured best-shape matmul fraction of the peak for `precision`, if known (the
        FP8 one for every 8-bit recipe; none measured for FP4)."""
        if precision == "nvfp4":
            return None
        return self.mamf_fraction_bf16 if precision in ("bf16", "fp16") else self.mamf_fraction_fp8


class TierSpec(InputSpec):
    """One interconnect level; `span_gpus` None means it spans the whole cluster.

    `curves` holds measured collective-time curves (a calibration profile applied to the
    cluster); a collective with a curve uses it instead of `bandwidth_gb_per_s` and
    `latency_us` (solver.cost.comm.comm.comm)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    kind: Literal["nvlink", "xgmi", "pcie", "network"]
    span_gpus: GpuCount | None = Field(default=None, gt=0)
    bandwidth_gb_per_s: float = Field(gt=0)
    latency_us: float = Field(ge=0)
    curves: TierCurves | None = None


class DispatcherRates(InputSpec):
    """What an MoE token dispatcher library (the flex dispatcher's backends: DeepEP, HybridEP)
    measured across nodes on this cluster: per rank, one dispatch's and one combine's bytes
    over their time, at each EP group size `ranks` (ascending, every group spanning nodes),
    the bytes counted as the library's benchmark counts them: each token once for every node
    that holds one of its experts, its own included (solver.cost.comm.comm.comm_ep.
    estimate_dispatcher_s); where it also timed an FP8 dispatch of the same tokens, that rate
    over the FP8 bytes. The benchmark's own test: `tokens_per_rank` tokens of `hidden_size`
    values each, top-`topk` routing, `ranks_per_node` ranks a node, `num_sms` SMs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dispatcher: Literal["deepep", "hybridep"]
    ranks: tuple[GpuCount, ...] = Field(min_length=1)
    dispatch_gb_per_s: tuple[float, ...] = Field(min_length=1)
    combine_gb_per_s: tuple[float, ...] = Field(min_length=1)
    dispatch_fp8_gb_per_s: tuple[float, ...] | None = None
    tokens_per_rank: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    topk: int = Field(gt=0)
    ranks_per_node: GpuCount = Field(gt=0)
    num_sms: int = Field(gt=0)
    source: str = ""

    @field_validator("dispatch_gb_per_s", "combine_gb_per_s", "dispatch_fp8_gb_per_s")
    @classmethod
    def _check_rates(cls, rates: tuple[float, ...] | None, info: ValidationInfo
                     ) -> tuple[float, ...] | None:
        if rates is None:
            return rates
        ranks = info.data.get("ranks")
        if ranks is not None and len(rates) != len(ranks):
            raise ValueError(f"{info.field_name} gives {len(rates)} rates for {len(ranks)} ranks")
        if any(rate <= 0 for rate in rates):
            raise ValueError(f"{info.field_name} must be positive")
        return rates

    @field_validator("ranks")
    @classmethod
    def _check_ranks(cls, ranks: tuple[int, ...]) -> tuple[int, ...]:
        if list(ranks) != sorted(set(ranks)) or ranks[0] < 2:
            raise ValueError("ranks must ascend, each group of at least 2 ranks")
        return ranks


class ClusterSpec(InputSpec):
    """A cluster preset: one GPU type, GPUs per node, and its tiers innermost first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    gpu: GpuSpec
    gpus_per_node: GpuCount = Field(gt=0)
    tiers: tuple[TierSpec, ...] = Field(min_length=1)
    # GPUs of the aligned segment of one NVLink domain a job is allocated in (module docstring);
    # None: `default_segment_gpus`. `--segment-gpus` overrides it.
    segment_gpus: GpuCount | None = Field(default=None, gt=0)
    # GPU memory every plan leaves free (solver.spec.headroom); `--memory-headroom` sets it.
    memory_headroom: MemoryHeadroom = MemoryHeadroom()
    # The host CPUs' memory bandwidth per GPU of a node, GB/s (the sockets' channels x transfer
    # rate over the GPUs per node, from the CPU datasheets): what an optimizer step on the host
    # streams at (solver.cost.step.offload). None: unknown (no optimizer offload planned).
    host_memory_gb_per_s: float | None = Field(default=None, gt=0)
    # Host CPU time of one eager PyTorch op issued from Python (module call, dispatcher, its
    # kernel's launch), in microseconds, measured on this cluster's CPU: what the training
    # framework's host pays per op (solver.cost.layers.host_time.estimate_host_s). None: unmeasured
    # (TimeConstants.host_op_s's x86 reference is used).
    host_op_us: float | None = Field(default=None, gt=0)
    # Measured throughput of the flex dispatcher's backends across this cluster's nodes
    # (DispatcherRates), at most one per dispatcher; none: the tiers' all-to-all model.
    dispatcher_rates: tuple[DispatcherRates, ...] = ()
    source: str = ""

    @field_validator("dispatcher_rates")
    @classmethod
    def _check_dispatcher_rates(cls, rates: tuple[DispatcherRates, ...]
                                ) -> tuple[DispatcherRates, ...]:
        names = [rate.dispatcher for rate in rates]
        if len(names) != len(set(names)):
            raise ValueError(f"dispatcher_rates lists a dispatcher twice: {names}")
        return rates

    def dispatcher_rate(self, dispatcher: str) -> DispatcherRates | None:
        """The measured rates of `dispatcher` on this cluster, None where it has none."""
        return next((rate for rate in self.dispatcher_rates if rate.dispatcher == dispatcher),
                    None)

    @field_validator("tiers")
    @classmethod
    def _check_tiers(
        cls, tiers: tuple[TierSpec, ...], info: ValidationInfo
    ) -> tuple[TierSpec, ...]:
        """Innermost first: spans grow and nest, bandwidth never rises outward, and only the
        outermost tier (the network or PCIe, never a scale-up link) spans the whole cluster."""
        *inner, outer = tiers
        names = [tier.name for tier in tiers]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # a calibration profile and the error lines name tiers by name
            raise ValueError(f"tier names must differ: '{twice[0]}' names more than one tier")
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

    @field_validator("segment_gpus")
    @classmethod
    def _check_segment(cls, segment: int | None, info: ValidationInfo) -> int | None:
        """A whole number of nodes (of the inner tiers' domains) inside one NVLink domain."""
        tiers, node = info.data.get("tiers"), info.data.get("gpus_per_node")
        if segment is None or not tiers or not node:  # those failed validation themselves
            return segment
        domain = _scale_up_span(tiers)
        if domain == 1:
            raise ValueError(f"segment_gpus ({segment}): the cluster has no NVLink or xGMI "
                             "domain to allocate segments of")
        unit = _segment_unit(tiers, node)
        if segment > domain:
            raise ValueError(f"segment_gpus ({segment}) must be at most the NVLink domain "
                             f"({domain} GPUs)")
        if segment % unit and unit == domain:
            raise ValueError(f"segment_gpus ({segment}) must be the whole NVLink domain "
                             f"({domain} GPUs): a job gets whole nodes of {node} GPUs")
        if segment % unit:
            raise ValueError(f"segment_gpus ({segment}) must be a multiple of {unit} GPUs "
                             f"(whole nodes of {node} GPUs and whole inner-tier domains)")
        return segment

    @property
    def default_segment_gpus(self) -> int:
        """The segment when none is given: the largest power-of-two number of nodes (inner
        domains) that fits in one NVLink domain; 16 trays x 4 = 64 GPUs on NVL72, the domain
        itself when it is one node (8-GPU DGX/HGX) or less, 1 without a scale-up domain."""
        domain = self.scale_up_gpus
        unit = _segment_unit(self.tiers, self.gpus_per_node)
        if unit >= domain:
            return domain
        return unit * 2 ** ((domain // unit).bit_length() - 1)

    @property
    def job_segment_gpus(self) -> int:
        """The segment the job is allocated in: `segment_gpus`, else the default."""
        return self.segment_gpus if self.segment_gpus is not None else self.default_segment_gpus

    @property
    def placement_spans(self) -> tuple[int | None, ...]:
        """Each tier's span as the job's ranks see it: the NVLink tier holds one segment, a
        tier outside it as many segments as it holds domains, tiers inside it unchanged.
        Equal to the tiers' spans when the segment is the whole domain."""
        domain, segment = self.scale_up_gpus, self.job_segment_gpus
        return tuple(None if t.span_gpus is None
                     else t.span_gpus // domain * segment if t.span_gpus >= domain
                     else t.span_gpus for t in self.tiers)

    @property
    def scale_up_gpus(self) -> int:
        """GPUs in one NVLink / xGMI domain (1 when GPUs only meet over PCIe or the network).
        A scale-up tier always has a span: validation keeps it off the outermost tier."""
        return _scale_up_span(self.tiers)

    def tier_for_span(self, num_gpus: int) -> TierSpec:
        """The innermost tier whose span holds `num_gpus` consecutive ranks."""
        for tier in self.tiers:
            if tier.span_gpus is None or num_gpus <= tier.span_gpus:
                return tier
        raise AssertionError("the outermost tier spans everything")

    def with_gpus_per_node(self, gpus_per_node: int) -> ClusterSpec:
        """The same cluster with another node size; tiers (and a segment) that spanned a node
        follow it."""
        tiers = tuple(
            t.model_copy(update={"span_gpus": gpus_per_node})
            if t.span_gpus == self.gpus_per_node
            else t
            for t in self.tiers
        )
        segment = (gpus_per_node if self.segment_gpus == self.gpus_per_node
                   else self.segment_gpus)
        data = self.model_dump()
        data.update(gpus_per_node=gpus_per_node, tiers=[t.model_dump() for t in tiers],
                    segment_gpus=segment)
        return ClusterSpec.model_validate(data)

    @property
    def gpu_memory_bytes(self) -> float:
        """The memory of one GPU, in bytes."""
        return self.gpu.memory_gib * 2**30

    @property
    def usable_memory_bytes(self) -> float:
        """What a plan may use of each GPU: its memory less the headroom."""
        return self.memory_headroom.usable_bytes(self.gpu_memory_bytes)

    def with_memory_headroom(self, headroom: MemoryHeadroom) -> ClusterSpec:
        """The same cluster keeping `headroom` free on every GPU (an InputError when that
        leaves nothing)."""
        check_headroom_leaves_memory(headroom, self.gpu_memory_bytes)
        return self.model_copy(update={"memory_headroom": headroom})

    def with_segment_gpus(self, segment_gpus: int) -> ClusterSpec:
        """The same cluster with the job allocated in segments of `segment_gpus` GPUs."""
        data = self.model_dump()
        data.update(segment_gpus=segment_gpus)
        return ClusterSpec.model_validate(data)


def _scale_up_span(tiers: tuple[TierSpec, ...]) -> int:
    """GPUs in one NVLink / xGMI domain of `tiers` (1 without a scale-up tier)."""
    spans = [t.span_gpus for t in tiers if t.kind in SCALE_UP_KINDS]
    return max((s for s in spans if s is not None), default=1)


def _segment_unit(tiers: tuple[TierSpec, ...], gpus_per_node: int) -> int:
    """What a segment is made of: whole nodes and whole domains of the tiers inside the NVLink
    domain (validation makes those spans nest with the node size, so their lcm is the
    largest); the domain itself when it is one node or smaller."""
    domain = _scale_up_span(tiers)
    inner = [t.span_gpus for t in tiers if t.span_gpus is not None and t.span_gpus < domain]
    unit = 1
    for span in [min(gpus_per_node, domain), *inner]:
        unit = unit * span // gcd(unit, span)
    return unit
