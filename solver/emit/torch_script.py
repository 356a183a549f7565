"""`launch --format torch`: a runnable Python module that builds a plan's process groups.

The module builds every group with `torch.distributed.new_group`, called by every rank for
every group in the same order (seed 000, "From Configuration to Process Groups": new_group is
collective over the whole world, so a rank that skips one deadlocks the others), and the same
layout as `init_device_mesh` meshes (dims outermost first, so row-major mesh order is the rank
order). It recomputes the groups from the degrees with an itertools transcription of
Megatron-Core's generator instead of listing them, so it stays small at 16,384 ranks; the tests
check its groups against `solver.emit.layout` and run it on 8 gloo processes (`--check`
all-reduces every rank's id in each of its groups and compares with the members' sum).
"""

from __future__ import annotations

from solver.emit.layout import DENSE_GROUPS, EXPERT_GROUPS
from solver.emit.quoting import render_python_text
from solver.emit.target import Emitted, LaunchTarget

BODY = '''

def axis_groups(view, axes):
    """Every group of ranks that differ only along `axes` of `view`, as Megatron-Core's
    RankGenerator.get_ranks lists them: innermost axis fastest, for members and for groups."""
    names = [name for name, _ in view]
    degrees = [degree for _, degree in view]
    strides = [math.prod(degrees[:i]) for i in range(len(degrees))]
    inside = [i for i, name in enumerate(names) if name in axes]
    outside = [i for i in range(len(names)) if i not in inside]

    def offsets(indices):
        # itertools.product varies its last factor fastest: give the axes outermost first.
        outer_first = list(reversed(indices))
        for coords in itertools.product(*(range(degrees[i]) for i in outer_first)):
            yield sum(c * strides[i] for c, i in zip(coords, outer_first))

    return [[base + offset for offset in offsets(inside)] for base in offsets(outside)]


def all_groups():
    """Group name -> every group of that axis (lists of global ranks)."""
    views = {"dense": DENSE, "expert": EXPERT}
    found = {name: axis_groups(views[view], axes) for name, (view, axes) in GROUP_AXES.items()}
    if EXPERT is None:  # a dense model: expert-parallel groups of one rank
        found["ep"] = [[rank] for rank in range(WORLD_SIZE)]
    return found


def build_groups(rank):
    """This rank's (group, members) along every axis. Every rank creates every group of every
    axis, in the same order, including the groups it is not in."""
    mine = {}
    for name, groups in all_groups().items():
        for ranks in groups:
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                mine[name] = (group, ranks)
    return mine


def build_device_meshes(device_type):
    """The layout as DeviceMeshes, outermost dim first: "dense" (pp, dp, cp, tp) and, for a
    MoE model, "expert" (pp, edp, ep, etp)."""
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {}
    for view_name, view in (("dense", DENSE), ("expert", EXPERT)):
        if view is not None:
            shape = tuple(degree for _, degree in reversed(view))
            names = tuple(name for name, _ in reversed(view))
            meshes[view_name] = init_device_mesh(device_type, shape, mesh_dim_names=names)
    return meshes


def check(rank, groups, meshes, device):
    """All-reduce the rank ids in each group (the sum must be the members' sum) and compare
    each mesh dim's group with the group of the same axis."""
    for name, (group, ranks) in groups.items():
        value = torch.tensor([rank], dtype=torch.int64, device=device)
        dist.all_reduce(value, group=group)
        if value.item() != sum(ranks):
            raise SystemExit(f"rank {rank}: {name} all-reduce gave {value.item()}, "
                             f"expected {sum(ranks)} for {ranks}")
    for view_name, mesh in meshes.items():
        for dim in mesh.mesh_dim_names:
            ranks = dist.get_process_group_ranks(mesh.get_group(dim))
            if sorted(ranks) != sorted(groups[dim][1]):
                raise SystemExit(f"rank {rank}: {view_name} mesh dim {dim} holds {ranks}, "
                                 f"not {groups[dim][1]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description="Build this plan's process groups.")
    parser.add_argument("--check", action="store_true",
                        help="all-reduce inside every group and check the sums")
    args = parser.parse_args(argv)
    use_cuda = torch.cuda.is_available()
    if use_cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if use_cuda else "gloo")
    if dist.get_world_size() != WORLD_SIZE:
        raise SystemExit(f"this layout is for {WORLD_SIZE} ranks, not {dist.get_world_size()}")
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else "cpu"
    groups = build_groups(rank)
    meshes = build_device_meshes("cuda" if use_cuda else "cpu")
    if args.check:
        check(rank, groups, meshes, device)
    dist.barrier()
    if rank == 0:
        checked = ", all-reduce checks passed" if args.check else ""
        sys.stdout.write(f"built {len(groups)} groups per rank and {len(meshes)} device "
                         f"mesh(es) on {WORLD_SIZE} ranks{checked}\\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def _view(generator) -> str:
    if generator is None:
        return "None"
    pairs = ", ".join(f"({name!r}, {degree})"
                      for name, degree in zip(generator.names, generator.degrees))
    return f"({pairs},)"


def render_torch_module(target: LaunchTarget) -> Emitted:
    """The module's text: a docstring naming the plan, its constants, then the fixed body."""
    layout, c = target.layout, target.config
    axes = {name: ("dense", found) for name, found in DENSE_GROUPS.items()}
    if layout.expert is not None:
        axes.update({name: ("expert", found) for name, found in EXPERT_GROUPS.items()})
    nodes = -(-layout.num_ranks // target.cluster.gpus_per_node)
    per_node = min(layout.num_ranks, target.cluster.gpus_per_node)
    expert = f"\nExpert layers: {layout.expert.order}." if layout.expert is not None else ""
    model_name = render_python_text(target.model_spec.name)
    cluster_name = render_python_text(target.cluster.name)
    header = f'''"""Process groups for {model_name} on {layout.num_ranks} GPUs \
({cluster_name}): tp {c.tp} pp {c.pp} dp {c.dp} cp {c.cp} ep {c.ep} etp {c.etp}.

Written by `parplan launch --format torch`.
Rank order: {"-".join(layout.order)}, innermost first.{expert}
Run it on every rank, e.g.
    torchrun --nnodes {nodes} --nproc-per-node {per_node} THIS_FILE --check
Every rank calls torch.distributed.new_group for every group, in the same order: the call is
collective over the whole world, and a rank that skipped one would leave the others waiting.
"""

import argparse
import itertools
import math
import os
import sys

import torch
import torch.distributed as dist

WORLD_SIZE = {layout.num_ranks}
# Each view of the ranks: (axis, degree), innermost first.
DENSE = {_view(layout.dense)}
EXPERT = {_view(layout.expert)}
# Group name -> (view, axes that vary inside a group).
GROUP_AXES = {axes!r}
'''
    return Emitted(text=header + BODY, settings=None)
