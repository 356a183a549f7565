"""Collectives on a tiered topology: time = latency + bytes x factor / bus bandwidth.

The factors are those nccl-tests uses to turn algorithm bandwidth into bus bandwidth
(NVIDIA/nccl-tests doc/PERFORMANCE.md; notes §1.1): a collective over n ranks moving S bytes
takes S * factor(n) / busbw, so a bus bandwidth measured by nccl-tests plugs in directly.

A **group** is the ranks that differ along one axis. Under a rank order (Megatron's default
"tp-cp-ep-dp-pp", TP fastest-varying) the ranks of a group of `degree` members are `stride`
apart, so a group spans a block of stride * degree consecutive ranks, blocks starting at
multiples of that span. Ranks fill the job's segments in order (ClusterSpec.placement_spans:
on NVL72 the NVLink tier holds one 64-GPU segment, not the 72-GPU rack). A group communicates
over the innermost tier whose (placement) span its blocks tile. A group that crosses an outer
tier with several members inside each inner domain (e.g. DP over two 8-GPU nodes with stride 1)
runs hierarchically: only the fraction (k-1)/(n-1) of its bus traffic crosses the outer tier, k
being the number of inner domains it touches (notes §1.4, ml-engineering's conversion
busbw = per-GPU NIC rate * (n-1)/(k-1)); it is still capped by the inner tier's bandwidth.
An all-to-all cannot aggregate that way (every byte has its own destination): each rank sends
the share (n-m)/n of its buffer off its domain, m being the group's members inside one domain,
through its own link, so its bus bandwidth is the per-GPU rate * (n-1)/(n-m) (notes §1.5:
OCI MI355X 8x400G, 2 nodes: 50 GB/s x 15/8 = 94 GB/s against 86.7 measured; B300 8x800G,
2 nodes: 100 x 15/8 = 188 against 181). The slowest group sets the pace, so k is the most
domains one group touches and m the fewest members one group has in a domain (a block that
straddles a boundary unevenly: `_count_worst_parts`).

Calibration: a tier that carries measured curves (`TierSpec.curves`, from a profile of
`parplan calibrate`) replaces its single bandwidth and latency by the curve's segment at the
message size: t = alpha_i + S * factor(n) / min(inner rate_i(S), rate_i * share), where rate_i is
the segment's bus bandwidth converted to the tier's per-GPU unit (divided by the measured
group's own share, see solver.spec.calibration), never below the curve's latency floor. For the
measured group itself this gives back the fitted curve exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.distinct import distinct_inverse
from solver.spec import ClusterSpec, TierSpec
from solver.spec.calibration import Collective, CollectiveCurve, select_curve

# Longer candidate arrays are reduced to their distinct (stride, degree) pairs first.
UNIQUE_BELOW = 256

__all__ = ["Collective", "GroupLink", "collective_factor", "estimate_collective_s",
           "estimate_curve_s", "estimate_group_link", "estimate_group_nodes"]


def collective_factor(op: Collective, num_ranks: np.ndarray | int) -> np.ndarray:
    """nccl-tests bus factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all
    (n-1)/n; send/recv and broadcast 1. For n = 8: 1.75, 0.875, 0.875, 1."""
    n = np.asarray(num_ranks, dtype=float)
    if op == "all_reduce":
        return 2.0 * (n - 1.0) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1.0) / n
    if op in ("send_recv", "broadcast"):
        return np.ones_like(n)
    raise AssertionError(f"unknown collective {op}")


@dataclass(frozen=True)
class GroupLink:
    """Bus bandwidth (B/s) and per-collective latency (s) of groups, one entry per candidate,
    from the tiers' preset numbers. When a tier of the cluster carries measured curves, the
    link also keeps which tier each group uses, its bus share of that tier's per-GPU rate, and
    the tiers, so that the time can follow the curve at each message size."""

    bandwidth_bytes_per_s: np.ndarray
    latency_s: np.ndarray
    tier_index: np.ndarray | None = None
    share: np.ndarray | None = None
    tiers: tuple[TierSpec, ...] = ()


def estimate_group_link(
    cluster: ClusterSpec, stride: np.ndarray | int, degree: np.ndarray | int,
    all_to_all: bool = False,
) -> GroupLink:
    """The link of groups of `degree` ranks spaced `stride` apart (vectorised), for
    all-to-all traffic when `all_to_all` (its own share across domains, module docstring).

    Worked number: dgx-h100 with NVLink 360 GB/s and a 40 GB/s fabric; a DP group of 16 with
    stride 1 touches k = 2 nodes, so its bus bandwidth is min(360, 40 * 15 / 1) = 360 GB/s;
    with stride 8 (TP = 8 inside each node) it touches 16 nodes: 40 GB/s.
    """
    stride_arr, degree_arr = np.broadcast_arrays(
        np.asarray(stride, dtype=np.int64), np.asarray(degree, dtype=np.int64)
    )
    if stride_arr.ndim == 1 and len(stride_arr) > UNIQUE_BELOW:
        # Candidate arrays repeat a few (stride, degree) pairs many times: solve each once.
        width = int(degree_arr.max(initial=0)) + 1
        keys, back = distinct_inverse(stride_arr * width + degree_arr)
        link = _group_link(cluster, keys // width, keys % width, all_to_all)
        return GroupLink(
            bandwidth_bytes_per_s=link.bandwidth_bytes_per_s[back],
            latency_s=link.latency_s[back],
            tier_index=None if link.tier_index is None else link.tier_index[back],
            share=None if link.share is None else link.share[back], tiers=link.tiers)
    return _group_link(cluster, stride_arr, degree_arr, all_to_all)


def _group_link(cluster: ClusterSpec, stride_arr: np.ndarray, degree_arr: np.ndarray,
                all_to_all: bool) -> GroupLink:
    """estimate_group_link on arrays of equal shape, element by element."""
    span = stride_arr * degree_arr
    bandwidth = np.zeros(span.shape)
    latency = np.zeros(span.shape)
    tier_index = np.zeros(span.shape, dtype=np.int64)
    group_share = np.ones(span.shape)
    assigned = np.zeros(span.shape, dtype=bool)
    inner_span = 1
    inner_bw = np.inf
    for index, (tier, placed_span) in enumerate(zip(cluster.tiers, cluster.placement_spans)):
        tier_span = placed_span if placed_span is not None else np.iinfo(np.int64).max
        # A block of `span` ranks stays inside one domain only if domains tile it evenly.
        here = ~assigned & (span <= tier_span) & ((tier_span % span == 0) | (placed_span is None))
        tier_bw = tier.bandwidth_gb_per_s * 1e9
        members_inside, domains = _count_worst_parts(stride_arr, degree_arr, inner_span)
        if all_to_all:
            off_domain = np.maximum(degree_arr - members_inside, 1)
            share = np.where(domains > 1, (degree_arr - 1) / off_domain, 1.0)
        else:
            share = np.where(domains > 1, (degree_arr - 1) / np.maximum(domains - 1, 1), 1.0)
        bandwidth = np.where(here, np.minimum(inner_bw, tier_bw * share), bandwidth)
        latency = np.where(here, tier.latency_us * 1e-6, latency)
        tier_index = np.where(here, index, tier_index)
        group_share = np.where(here, share, group_share)
        assigned |= here
        inner_span = tier_span
        inner_bw = tier_bw
    assert assigned.all()
    if not any(tier.curves for tier in cluster.tiers):
        return GroupLink(bandwidth_bytes_per_s=bandwidth, latency_s=latency)
    return GroupLink(bandwidth_bytes_per_s=bandwidth, latency_s=latency, tier_index=tier_index,
                     share=group_share, tiers=cluster.tiers)


def estimate_group_nodes(cluster: ClusterSpec, stride: np.ndarray | int,
                         degree: np.ndarray | int) -> tuple[np.ndarray, bool]:
    """(the most nodes one group of `degree` ranks `stride` apart touches, whether the ranks
    inside a node meet over NVLink): NCCL's nNodes and intra-node path. A node is the innermost
    tier's (placement) domain, an NVLink segment on NVL72 (NCCL's multi-node NVLink treats the
    NVLink domain as one node); without a scale-up tier every GPU is its own node.
    Worked number: dgx-h100, a DP group of 512 with stride 1 touches 64 nodes; with stride 8
    (TP = 8 inside each node) 512."""
    stride_arr, degree_arr = np.broadcast_arrays(
        np.asarray(stride, dtype=np.int64), np.asarray(degree, dtype=np.int64))
    inner = cluster.tiers[0]
    if inner.kind == "network":
        return degree_arr.copy(), False
    if cluster.placement_spans[0] is None:
        return np.ones_like(degree_arr), inner.kind == "nvlink"
    _, nodes = _count_worst_parts(stride_arr, degree_arr, int(cluster.placement_spans[0]))
    return nodes, inner.kind == "nvlink"


def _count_worst_parts(stride: np.ndarray, degree: np.ndarray, domain_span: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(m, k) of the slowest groups of `degree` ranks `stride` apart over domains of
    `domain_span` consecutive ranks: m the fewest members one group has inside one domain it
    touches, k the most domains one group touches (blocks start at multiples of the span).

    When the stride divides the domain, a group is `degree` consecutive slots of
    s = domain_span / stride per domain, starting at a multiple of g = gcd(degree, s); the worst
    start (s - g) leaves g members in the first domain and touches 1 + ceil((degree - g) / s)
    domains. Worked number: a block of 48 GPUs in 64-GPU segments (stride 1) straddles as
    16 + 32, so m = 16 and k = 2; a block of 128 fills two segments: m = 64, k = 2. A stride
    longer than the domain puts every member in its own domain (m = 1, k = degree); a shorter
    stride that does not divide it is approximated by domain_span // stride members per
    domain."""
    slots = domain_span // stride
    divides = domain_span % stride == 0
    g = np.gcd(degree, np.maximum(slots, 1))
    exact_k = 1 + -(-(degree - g) // np.maximum(slots, 1))
    rough_m = np.minimum(np.maximum(slots, 1), degree)
    members = np.where(slots == 0, 1, np.where(divides, g, rough_m))
    domains = np.where(slots == 0, degree,
                       np.where(divides, exact_k, np.maximum(degree // rough_m, 1)))
    return members, domains


def estimate_collective_s(
    op: Collective, size_bytes: np.ndarray | float, num_ranks: np.ndarray | int, link: GroupLink
) -> np.ndarray:
    """Seconds for one collective of `size_bytes` (nccl-tests "size": the full buffer for
    all-reduce, the gathered output for all-gather, the input for reduce-scatter, each rank's
    send buffer for all-to-all, the message for send/recv). Zero for a group of one rank.

    Worked number (seed 003, example 2): a 64 MB all-reduce in 8 ranks at 900 GB/s with no
    latency takes 64e6 * 1.75 / 900e9 = 0.124 ms; the seed's 2 * 64 MB / 900 GB/s = 0.142 ms
    uses factor 2 (the n -> infinity limit).
    """
    n = np.asarray(num_ranks)
    if link.tier_index is None:
        seconds = link.latency_s + np.asarray(size_bytes, dtype=float) * collective_factor(
            op, n) / link.bandwidth_bytes_per_s
    else:
        seconds = _estimate_calibrated_s(op, size_bytes, n, link)
    return np.where(n > 1, seconds, 0.0)


@dataclass(frozen=True)
class _CurveBands:
    """A curve as alpha-beta segments: segment i holds sizes from knot i on (the first also
    below, the last also above); `rate` is its bus bandwidth in the tier's per-GPU unit."""

    knot_bytes: np.ndarray
    alpha_s: np.ndarray
    rate_bytes_per_s: np.ndarray
    floor_s: float

    def at(self, size_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        band = np.searchsorted(self.knot_bytes, size_bytes, side="right") - 1
        band = np.clip(band, 0, len(self.alpha_s) - 1)
        return self.rate_bytes_per_s[band], self.alpha_s[band]


def _curve_bands(curve: CollectiveCurve, curve_op: Collective) -> _CurveBands:
    size = np.array([k.size_bytes for k in curve.knots], dtype=float)
    time_s = np.array([k.time_us for k in curve.knots]) * 1e-6
    slope = np.diff(time_s) / np.diff(size)  # seconds per byte of the segment, >= 0
    with np.errstate(divide="ignore"):
        busbw = np.where(slope > 0, collective_factor(curve_op, curve.num_ranks) / slope, np.inf)
    return _CurveBands(knot_bytes=size, alpha_s=time_s[:-1] - slope * size[:-1],
                       rate_bytes_per_s=busbw / curve.measured_share, floor_s=float(time_s[0]))


def estimate_curve_s(curve: CollectiveCurve, curve_op: Collective,
                     size_bytes: np.ndarray | float) -> np.ndarray:
    """Seconds of `curve_op` on the group the curve was measured on: the fitted curve itself
    (knot times, linear in size between knots, the latency floor below the first knot).

    Worked number: knots (1 MiB, 27.37 us) and (16 MiB, 123.8 us) of an 8-rank all-reduce give
    27.37 + (123.8 - 27.37) * 7 / 15 = 72.4 us at 8 MiB, a bus bandwidth of
    8 MiB * 1.75 / 72.4 us = 203 GB/s (the DGX H100 log measures 178 there)."""
    bands = _curve_bands(curve, curve_op)
    size = np.asarray(size_bytes, dtype=float)
    rate, alpha = bands.at(size)
    factor = collective_factor(curve_op, curve.num_ranks)
    with np.errstate(divide="ignore"):
        seconds = alpha + size * factor / (rate * curve.measured_share)
    return np.maximum(seconds, bands.floor_s)


def _tier_rate(tier: TierSpec, op: Collective, size: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-GPU rate (B/s), latency (s) and time floor (s) of a tier for `op` at each size:
    the measured curve's segment when the tier has one, else the preset numbers."""
    chosen = select_curve(tier.curves, op)
    if chosen is None:
        return (np.full(size.shape, tier.bandwidth_gb_per_s * 1e9),
                np.full(size.shape, tier.latency_us * 1e-6), 0.0)
    curve_op, curve = chosen
    bands = _curve_bands(curve, curve_op)
    rate, alpha = bands.at(size)
    return rate, alpha, bands.floor_s


def _estimate_calibrated_s(op: Collective, size_bytes: np.ndarray | float, n: np.ndarray,
                           link: GroupLink) -> np.ndarray:
    assert link.tier_index is not None and link.share is not None
    size, num_ranks, tier_index, share = np.broadcast_arrays(
        np.asarray(size_bytes, dtype=float), n, link.tier_index, link.share)
    factor = collective_factor(op, num_ranks)
    rates = [_tier_rate(tier, op, size) for tier in link.tiers]
    seconds = np.zeros(size.shape)
    for index, (rate, alpha, floor_s) in enumerate(rates):
        here = tier_index == index
        if not here.any():
            continue
        cap = rates[index - 1][0] if index > 0 else np.inf
        bandwidth = np.minimum(cap, rate * share)
        with np.errstate(divide="ignore"):
            time_s = np.maximum(alpha + size * factor / bandwidth, floor_s)
        seconds = np.where(here, time_s, seconds)
    return seconds
