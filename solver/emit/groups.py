"""`launch --format groups`: the rank table and every group, with the tier each group spans.

The JSON shape is DESIGN.md's ("Interfaces"): {"world_size", "order", "groups": {"tp", "pp",
"dp", "cp", "ep", ...}, "ranks"}; added fields: "expert_order", "tiers" (per axis, the name of the
tier each group spans, in the order of "groups"; null for a group of one rank), "warnings",
and per rank its node and local rank.
"""

from __future__ import annotations

import json

from solver.emit.layout import assign_tiers, find_placement_warnings
from solver.emit.target import Emitted, LaunchTarget


def build_groups_document(target: LaunchTarget) -> dict:
    """The groups document of DESIGN.md with the tiers, the expert order and the warnings."""
    layout, cluster = target.layout, target.cluster
    groups = layout.groups()
    coordinates = layout.coordinates()
    node_gpus = cluster.gpus_per_node
    ranks = [
        {"rank": rank, "node": rank // node_gpus, "local_rank": rank % node_gpus,
         **{axis: int(values[rank]) for axis, values in coordinates.items()}}
        for rank in range(layout.num_ranks)
    ]
    return {
        "world_size": layout.num_ranks,
        "order": "-".join(layout.order),
        "expert_order": layout.expert.order if layout.expert is not None else None,
        "gpus_per_node": node_gpus,
        "groups": {name: rows.tolist() for name, rows in groups.items()},
        "tiers": {name: [cluster.tiers[i].name if rows.shape[1] > 1 else None
                         for i in assign_tiers(cluster, rows)] for name, rows in groups.items()},
        "ranks": ranks,
        "warnings": find_placement_warnings(layout, cluster),
    }


def render_compact_json(value: object, depth: int = 0) -> str:
    """JSON with one line per group and per rank: containers of plain values stay on one line,
    so a 16,384-rank table is 16,384 lines, not a quarter of a million."""
    pad, inner = "  " * depth, "  " * (depth + 1)
    nested = isinstance(value, (dict, list)) and any(
        isinstance(v, (dict, list)) for v in (value.values() if isinstance(value, dict) else value))
    if isinstance(value, dict) and nested:
        body = ",\n".join(f"{inner}{json.dumps(key)}: {render_compact_json(v, depth + 1)}"
                          for key, v in value.items())
        return "{\n" + body + "\n" + pad + "}"
    if isinstance(value, list) and nested:
        body = ",\n".join(inner + render_compact_json(v, depth + 1) for v in value)
        return "[\n" + body + "\n" + pad + "]"
    return json.dumps(value, allow_nan=False)


def render_groups(target: LaunchTarget) -> Emitted:
    """The groups document as JSON text (what `-o FILE` and `--json` write) and as data."""
    document = build_groups_document(target)
    return Emitted(text=render_compact_json(document) + "\n", settings=document,
                   warnings=tuple(document["warnings"]))
