"""Collectives on a tiered topology: time = latency + bytes x factor / bus bandwidth.

The factors are those nccl-tests uses to turn algorithm bandwidth into bus bandwidth
(NVIDIA/nccl-tests doc/PERFORMANCE.md; notes §1.1): a collective over n ranks moving S bytes
takes S * factor(n) / busbw, so a bus bandwidth measured by nccl-tests plugs in directly.

A **group** is the ranks that differ along one axis. Under a rank order (Megatron's default
"tp-cp-ep-dp-pp", TP fastest-varying) the ranks of a group of `degree` members are `stride`
apart, so a group spans a block of stride * degree consecutive ranks. It communicates over the
innermost tier whose span holds that block. A group that crosses an outer tier with several
members inside each inner domain (e.g. DP over two 8-GPU nodes with stride 1) runs
hierarchically: only the fraction (k-1)/(n-1) of its bus traffic crosses the outer tier, k being
the number of inner domains it touches (notes §1.4, ml-engineering's conversion
busbw = per-GPU NIC rate * (n-1)/(k-1)); it is still capped by the inner tier's bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from solver.spec import ClusterSpec

Collective = Literal[
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast"
]


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
    """Bus bandwidth (B/s) and per-collective latency (s) of groups, one entry per candidate."""

    bandwidth_bytes_per_s: np.ndarray
    latency_s: np.ndarray


def estimate_group_link(
    cluster: ClusterSpec, stride: np.ndarray | int, degree: np.ndarray | int
) -> GroupLink:
    """The link of groups of `degree` ranks spaced `stride` apart (vectorised).

    Worked number: dgx-h100 with NVLink 360 GB/s and a 40 GB/s fabric; a DP group of 16 with
    stride 1 touches k = 2 nodes, so its bus bandwidth is min(360, 40 * 15 / 1) = 360 GB/s;
    with stride 8 (TP = 8 inside each node) it touches 16 nodes: 40 GB/s.
    """
    stride_arr, degree_arr = np.broadcast_arrays(
        np.asarray(stride, dtype=np.int64), np.asarray(degree, dtype=np.int64)
    )
    span = stride_arr * degree_arr
    bandwidth = np.zeros(span.shape)
    latency = np.zeros(span.shape)
    assigned = np.zeros(span.shape, dtype=bool)
    inner_span = 1
    inner_bw = np.inf
    for tier in cluster.tiers:
        tier_span = tier.span_gpus if tier.span_gpus is not None else np.iinfo(np.int64).max
        # A block of `span` ranks stays inside one domain only if domains tile it evenly.
        here = ~assigned & (span <= tier_span) & ((tier_span % span == 0) | (tier.span_gpus is None))
        tier_bw = tier.bandwidth_gb_per_s * 1e9
        members_inside = np.clip(inner_span // np.maximum(stride_arr, 1), 1, None)
        members_inside = np.minimum(members_inside, degree_arr)
        domains = np.maximum(degree_arr // members_inside, 1)
        share = np.where(
            domains > 1, (degree_arr - 1) / np.maximum(domains - 1, 1), 1.0
        )
        bandwidth = np.where(here, np.minimum(inner_bw, tier_bw * share), bandwidth)
        latency = np.where(here, tier.latency_us * 1e-6, latency)
        assigned |= here
        inner_span = tier_span
        inner_bw = tier_bw
    assert assigned.all()
    return GroupLink(bandwidth_bytes_per_s=bandwidth, latency_s=latency)


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
    seconds = link.latency_s + np.asarray(size_bytes, dtype=float) * collective_factor(op, n) / (
        link.bandwidth_bytes_per_s
    )
    return np.where(n > 1, seconds, 0.0)
