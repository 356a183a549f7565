"""Rank layout: the coordinates of every rank, the groups of every axis, the tier of each group.

Vocabulary (STYLE.md): a **degree** is the number of ranks along an axis; a **rank** is a
global index; a **group** is the ranks that differ along one axis (or several, e.g. dp_cp);
a **tier** is an interconnect level (NVLink domain, fabric).

A rank **order** names the axes innermost (fastest-varying) first. Megatron-LM's default
"tp-cp-ep-dp-pp" means rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i)). Megatron-Core
(megatron/core/parallel_state.py: RankGenerator, generate_masked_orthogonal_rank_groups) lays
the same ranks out twice with the same order string:
  dense layers   tp, cp, dp, pp          (ep = 1)
  expert layers  etp, ep, edp, pp        (cp = 1; tp -> etp, dp -> edp = tp*cp*dp / (ep*etp))
so the default expert order is etp-ep-edp-pp, and the pipeline groups of both must coincide
(Megatron checks it). An axis an order leaves out is appended outermost, as Megatron does, and
only if its degree is 1. Megatron's --use-tp-pp-dp-mapping is the order tp-cp-ep-pp-dp.

Formula: along an axis of degree d whose stride s is the product of the degrees inside it, the
coordinate of rank r is (r // s) % d, and r = sum of coordinate x stride. The group of a set of
axes A through rank r holds the ranks that share r's coordinates on every other axis; with numpy
the ranks are reshaped to the degrees (outermost first) and A's axes moved last, which yields
Megatron's groups in Megatron's order (the tests check it against an itertools transcription).

Worked example (seed 000, 3D): tp=8, pp=4, dp=8 on 256 GPUs. Under tp-cp-ep-dp-pp the PP group
of rank 0 is {0, 64, 128, 192} and its DP group {0, 8, ..., 56}; under tp-pp-dp (the seed's "TP
fastest, then PP, then DP") they are {0, 8, 16, 24} and {0, 32, ..., 224}.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.emit import DEFAULT_ORDER
from solver.errors import InputError
from solver.spec import ClusterSpec, ParallelConfig
from solver.spec.hardware import SCALE_UP_KINDS

AXES = ("tp", "cp", "ep", "dp", "pp")
# The axis names of the expert view, by the dense-view name each takes the place of.
EXPERT_NAMES = {"tp": "etp", "ep": "ep", "dp": "edp", "pp": "pp"}
# The groups reported for every plan, by view: name -> the view's axes that vary inside one.
DENSE_GROUPS = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "pp": ("pp",), "dp_cp": ("cp", "dp")}
EXPERT_GROUPS = {"ep": ("ep",), "etp": ("etp",), "edp": ("edp",)}


@dataclass(frozen=True)
class Generator:
    """One view of the ranks: an axis name and a degree per axis, innermost first."""

    names: tuple[str, ...]
    degrees: tuple[int, ...]

    @property
    def num_ranks(self) -> int:
        return math.prod(self.degrees)

    @property
    def strides(self) -> tuple[int, ...]:
        """Ranks between neighbours along each axis: the product of the degrees inside it."""
        return tuple(math.prod(self.degrees[:i]) for i in range(len(self.degrees)))

    @property
    def order(self) -> str:
        return "-".join(self.names)

    def stride(self, axis: str) -> int:
        return self.strides[self.names.index(axis)]

    def coordinates(self, ranks: np.ndarray) -> dict[str, np.ndarray]:
        """Coordinate of each rank along every axis: (rank // stride) % degree."""
        return {name: (ranks // stride) % degree
                for name, degree, stride in zip(self.names, self.degrees, self.strides)}

    def rank_of(self, **coordinates: int) -> int:
        """The rank at the given coordinates (axes not given are 0)."""
        return sum(coordinates.get(name, 0) * stride
                   for name, stride in zip(self.names, self.strides))

    def groups(self, axes: tuple[str, ...]) -> np.ndarray:
        """Every group along `axes`, one row each: members with the innermost axis fastest,
        groups with the innermost other axis fastest (Megatron's RankGenerator.get_ranks)."""
        axes = tuple(dict.fromkeys(axes))
        last = len(self.names) - 1
        cube = np.arange(self.num_ranks).reshape(self.degrees[::-1])  # numpy axis = last - i
        inside = sorted(last - self.names.index(axis) for axis in axes)
        outside = [k for k in range(len(self.names)) if k not in inside]
        size = math.prod(self.degrees[self.names.index(axis)] for axis in axes)
        return cube.transpose(outside + inside).reshape(-1, size)


@dataclass(frozen=True)
class RankLayout:
    """The ranks of one plan under one order (all five axes, innermost first): the dense view
    and, for MoE models, the expert view over the same ranks."""

    order: tuple[str, ...]
    dense: Generator
    expert: Generator | None

    @property
    def num_ranks(self) -> int:
        return self.dense.num_ranks

    def groups(self) -> dict[str, np.ndarray]:
        """The groups of every reported axis. A dense model has no expert view: its ep groups
        are single ranks, as in Megatron with expert-model-parallel-size 1."""
        found = {name: self.dense.groups(axes) for name, axes in DENSE_GROUPS.items()}
        if self.expert is None:
            found["ep"] = np.arange(self.num_ranks).reshape(-1, 1)
        else:
            found.update({name: self.expert.groups(axes) for name, axes in EXPERT_GROUPS.items()})
        return found

    def coordinates(self) -> dict[str, np.ndarray]:
        """Per rank: its coordinate along every axis of both views."""
        ranks = np.arange(self.num_ranks)
        found = self.dense.coordinates(ranks)
        if self.expert is not None:
            found.update(self.expert.coordinates(ranks))
        else:
            found["ep"] = np.zeros_like(ranks)
        return found


def parse_order(text: str) -> tuple[str, ...]:
    """An order string such as "tp-cp-ep-dp-pp" (innermost first) as axis names."""
    names = tuple(part.strip().lower() for part in text.split("-"))
    unknown = [name for name in names if name not in AXES]
    if unknown:
        raise InputError(f"--order {text}: unknown axis '{unknown[0]}' (axes: "
                         f"{', '.join(AXES)}, innermost first, e.g. {DEFAULT_ORDER})")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise InputError(f"--order {text}: axis '{repeated[0]}' appears twice")
    return names


def _generator(order: tuple[str, ...], degrees: dict[str, int],
               names: dict[str, str]) -> Generator:
    """The view of the axes in `names` (renamed), in `order`, with `degrees`."""
    kept = [axis for axis in order if axis in names]
    return Generator(tuple(names[axis] for axis in kept), tuple(degrees[axis] for axis in kept))


def build_rank_layout(config: ParallelConfig, is_moe: bool,
                      order: str = DEFAULT_ORDER) -> RankLayout:
    """The layout of `config` under `order`; the expert view only for MoE models. Axes the
    order leaves out go outermost (Megatron's rule) and must have degree 1 in both views."""
    c = config
    dense_degrees = {"tp": c.tp, "cp": c.cp, "ep": 1, "dp": c.dp, "pp": c.pp}
    expert_degrees = {"tp": c.etp, "cp": 1, "ep": c.ep, "dp": c.expert_dp, "pp": c.pp}
    if is_moe and (c.tp * c.cp * c.dp) % (c.ep * c.etp):
        raise InputError(f"--ep ({c.ep}) x --etp ({c.etp}) must divide tp x cp x dp "
                         f"({c.tp * c.cp * c.dp}): expert layers reuse the ranks of a stage")
    given = parse_order(order)
    full = given + tuple(axis for axis in AXES if axis not in given)
    for axis in full[len(given):]:
        degree = max(dense_degrees[axis], expert_degrees[axis] if is_moe else 1)
        if degree > 1:
            raise InputError(f"--order {order} leaves out {axis}, whose degree is {degree}: "
                             "name every axis with a degree above 1")
    dense = _generator(full, dense_degrees, {"tp": "tp", "cp": "cp", "dp": "dp", "pp": "pp"})
    if not is_moe:
        return RankLayout(order=full, dense=dense, expert=None)
    expert = _generator(full, expert_degrees, EXPERT_NAMES)
    if not np.array_equal(dense.groups(("pp",)), expert.groups(("pp",))):
        raise InputError(f"--order {order}: the expert layers' pipeline groups differ from the "
                         "dense layers' (put pp outermost, or make dp equal the expert dp)")
    return RankLayout(order=full, dense=dense, expert=expert)


def assign_tiers(cluster: ClusterSpec, groups: np.ndarray) -> np.ndarray:
    """Index into `cluster.tiers` of the innermost tier holding each group (row): the first
    tier one of whose domains (consecutive blocks of its placement span, the job's segment on
    the NVLink tier) contains every member. For a group of `degree` ranks `stride` apart whose
    block stride x degree tiles the domains this is the tier the cost model charges."""
    first = groups[:, :1]
    found = np.full(len(groups), len(cluster.tiers) - 1)
    for index in reversed(range(len(cluster.tiers) - 1)):  # the outermost tier holds all
        span = cluster.placement_spans[index]
        assert span is not None
        inside = (groups // span == first // span).all(axis=1)
        found = np.where(inside, index, found)
    return found


def find_placement_warnings(layout: RankLayout, cluster: ClusterSpec) -> list[str]:
    """One line per tensor- or expert-parallel axis some of whose groups leave the NVLink
    domain (their traffic runs every layer, so the outer tier's bandwidth sets the pace)."""
    groups = layout.groups()
    warnings = []
    for name in ("tp", "etp", "ep"):
        if name not in groups or groups[name].shape[1] == 1:
            continue
        tiers = assign_tiers(cluster, groups[name])
        outside = [cluster.tiers[t].kind not in SCALE_UP_KINDS for t in tiers]
        if any(outside):
            tier_names = sorted({cluster.tiers[t].name for t, out in zip(tiers, outside) if out})
            domain = (f"the NVLink domain ({cluster.scale_up_gpus} GPUs)"
                      if cluster.scale_up_gpus > 1 else "an NVLink domain (the cluster has none)")
            warnings.append(f"{name}: {sum(outside)} of {len(tiers)} groups of "
                            f"{groups[name].shape[1]} ranks leave {domain} and run over "
                            f"{', '.join(repr(t) for t in tier_names)}")
    return warnings
