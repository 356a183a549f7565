"""Collective latency as NCCL models it: grows with the ranks and nodes a group spans.

NCCL picks an algorithm and protocol per call by the smallest `latency + bytes / bandwidth`
(NCCL 2.30.7, NVIDIA/nccl 5067397c, src/graph/tuning.cc ncclTopoTuneModel and
ncclTopoGetAlgoTime; notes §1.2). Its latency, in us, for a group of n ranks on N nodes
(ppn = n / N ranks per node):

    ring       base + (steps - inter_steps) x intra + inter_steps x inter
               steps = 2(n - 1) all-reduce, n - 1 all-gather / reduce-scatter;
               inter_steps = 0 on one node, 2(N - 1) all-reduce, N - 1 all-gather / reduce-scatter;
               intra at least the host's net overhead across nodes (1 us on Intel x86, 3x for
               Simple); all-reduce Simple across nodes x 1.4 ("plateau effect of ring")
    tree       base + 2 ((ppn - 1) x intra + floor(log2 N) x inter)      (all-reduce only)

with inter the NET hop latency (the tree's when ppn = 1: "with ppn=1 latencies are fully
exposed"). The latency covers LL too (6.6 + 7 x 0.6 = 10.8 us for a small all-gather on 8
NVLink GPUs; 10.1 us measured). The choice takes LL128 (NVLink only: tuning.cc enables it
where the intra-node path is NVLink; the bus bandwidth x 0.92) and Simple (the full bus
bandwidth); the tree all-reduce moves its bytes at 0.92 of the ring's bandwidth (its LL128
x 7/9 more on one node, x 120/128 across nodes). Left out of the choice [B]: LL (half the
bandwidth, capped at 20-282 GB/s by the GPU generation and host CPU, which the specs do not
hold: it wins only for messages of a few MB or less), NVLS, CollNet and PAT, the tree's size
correction table and its 0.85 on plain tree patterns, and a network plugin's own latency (IB
reports none, so NCCL adds none).

Worked number: an all-gather over 512 ranks on 64 eight-GPU NVLink nodes, ring Simple:
8.4 + 448 x 3.4 + 63 x 14 = 2,414 us; LL128: 14 + 448 x 1.9 + 63 x 4.0 = 1,117 us.
"""

from __future__ import annotations

import numpy as np

from solver.spec.calibration import Collective

# Per (algorithm, protocol), us: ncclTunerConstantsDefaults baseLatencies and hwLatencies.
BASE_US = {("ring", "ll"): 6.6, ("ring", "ll128"): 14.0, ("ring", "simple"): 8.4,
           ("tree", "ll"): 6.8, ("tree", "ll128"): 14.0, ("tree", "simple"): 8.4}
NVLINK_HOP_US = {("ring", "ll"): 0.6, ("ring", "ll128"): 1.9, ("ring", "simple"): 3.4,
                 ("tree", "ll"): 0.6, ("tree", "ll128"): 1.25, ("tree", "simple"): 4.0}
PCI_HOP_US = {("ring", "ll"): 1.0, ("ring", "ll128"): 2.5, ("ring", "simple"): 5.7,
              ("tree", "ll"): 1.0, ("tree", "ll128"): 1.9, ("tree", "simple"): 4.0}
NET_HOP_US = {("ring", "ll"): 2.7, ("ring", "ll128"): 4.0, ("ring", "simple"): 14.0,
              ("tree", "ll"): 5.0, ("tree", "ll128"): 8.5, ("tree", "simple"): 14.0}
# getNetOverhead on Intel x86 (AMD: 2 us) [B: other hosts taken as Intel], x3 for Simple.
NET_OVERHEAD_US = 1.0
RING_ALL_REDUCE_PLATEAU = 1.4  # compute capability >= 8.0
LL128_BANDWIDTH = 0.92  # 120 / 128 bytes of each line carry data
TREE_BANDWIDTH = 0.92
TREE_LL128_NET_BANDWIDTH = 120.0 / 128.0
TREE_LL128_NODE_BANDWIDTH = 7.0 / 9.0


def estimate_nccl_latency_s(op: Collective, algorithm: str, protocol: str,
                            num_ranks: np.ndarray | int, num_nodes: np.ndarray | int,
                            nvlink: bool = True) -> np.ndarray:
    """NCCL's modelled latency (s) of one `op` call (module docstring), vectorised over ranks
    and nodes; `nvlink`: the ranks inside a node meet over NVLink (else PCIe).

    Worked number: 8 ranks on one NVLink node, ring all-gather LL128: 14 + 7 x 1.9 = 27.3 us;
    the all-reduce over 16 ranks on 2 nodes by tree Simple: 8.4 + 2 (7 x 4.0 + 1 x 14) = 92.4 us.
    """
    n = np.asarray(num_ranks, dtype=float)
    nodes = np.maximum(np.asarray(num_nodes, dtype=float), 1.0)
    key = (algorithm, protocol)
    intra = (NVLINK_HOP_US if nvlink else PCI_HOP_US)[key]
    ppn = n / nodes
    # "With ppn=1 latencies are fully exposed, use the Tree network latency".
    inter = np.where(ppn == 1, NET_HOP_US[("tree", protocol)], NET_HOP_US[key])
    if algorithm == "tree":
        if op != "all_reduce":
            raise AssertionError("NCCL's tree runs all-reduce only")
        latency = BASE_US[key] + 2 * ((ppn - 1) * intra + np.floor(np.log2(nodes)) * inter)
        return latency * 1e-6
    assert algorithm == "ring"
    all_reduce = op == "all_reduce"
    steps = np.where(all_reduce, 2 * (n - 1), n - 1)
    inter_steps = np.where(nodes == 1, 0.0, np.where(all_reduce, 2 * (nodes - 1), nodes - 1))
    overhead = NET_OVERHEAD_US * (3.0 if protocol == "simple" else 1.0)
    intra = np.where(nodes > 1, np.maximum(intra, overhead), intra)
    latency = BASE_US[key] + (steps - inter_steps) * intra + inter_steps * inter
    if all_reduce and protocol == "simple":
        latency = np.where(nodes > 1, latency * RING_ALL_REDUCE_PLATEAU, latency)
    return latency * 1e-6


def nccl_choices(op: Collective, nvlink: bool) -> list[tuple[str, str, float]]:
    """(algorithm, protocol, bandwidth ratio to the ring's Simple bus bandwidth) NCCL chooses
    among for `op`; a tree's LL128 takes a further 7/9 on one node and 120/128 across nodes
    (estimate_nccl_time_s)."""
    protocols = [("simple", 1.0)] + ([("ll128", LL128_BANDWIDTH)] if nvlink else [])
    choices = [("ring", p, ratio) for p, ratio in protocols]
    if op == "all_reduce":
        choices += [("tree", p, TREE_BANDWIDTH) for p, _ in protocols]
    return choices


def estimate_nccl_time_s(op: Collective, size_bytes: np.ndarray | float,
                         num_ranks: np.ndarray | int, num_nodes: np.ndarray | int,
                         num_calls: np.ndarray | float, bus_bytes_per_s: np.ndarray | float,
                         factor: np.ndarray | float, nvlink: bool = True) -> np.ndarray:
    """Seconds of `num_calls` equal calls of `op` moving `size_bytes` in all (nccl-tests size,
    summed over the calls) on a group whose ring bus bandwidth is `bus_bytes_per_s`: NCCL's
    choice, the fastest of nccl_choices, calls x latency + size x factor / (bandwidth x ratio).
    A tree all-reduce moves its bytes at its own rate: 2 size / (ratio x bandwidth) where the
    ring moves 2 (n - 1) / n of them (tuning.cc: tree algbw = busBw / 2).

    Worked number: 48 all-gathers of 2.1 MB each (100 MB) over 512 ranks on 64 nodes at a
    324 GB/s bus bandwidth: Simple 48 x 2,414 us + 0.31 ms = 116.2 ms; LL128
    48 x 1,117 us + 0.34 ms = 53.9 ms, NCCL's choice."""
    size = np.asarray(size_bytes, dtype=float)
    nodes = np.asarray(num_nodes)
    best = None
    for algorithm, protocol, ratio in nccl_choices(op, nvlink):
        latency = estimate_nccl_latency_s(op, algorithm, protocol, num_ranks, nodes, nvlink)
        if algorithm == "tree":
            if protocol == "ll128":
                ratio = ratio * np.where(nodes > 1, TREE_LL128_NET_BANDWIDTH,
                                         TREE_LL128_NODE_BANDWIDTH)
            moved = 2.0 * size
        else:
            moved = size * factor
        seconds = num_calls * latency + moved / (np.asarray(bus_bytes_per_s) * ratio)
        best = seconds if best is None else np.minimum(best, seconds)
    assert best is not None
    return best
