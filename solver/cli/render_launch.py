"""Rendering `launch` answers: the groups as tables, the settings as text or JSON, a file."""

from __future__ import annotations

import json
from typing import Any

import click

from solver.cli.render import echo_table
from solver.output_file import write_output_file
from solver.spec.plan_json import render_layout_json

MAX_RANK_ROWS = 64
MAX_GROUPS_SHOWN = 4


def render_launch_json(launch_format: str, target: Any, emitted: Any,
                       validation: str | None) -> dict[str, Any]:
    """The envelope of a non-groups format: what it is for (with the pipeline layout when one
    was given), the settings, the text."""
    answer: dict[str, Any] = {
        "format": launch_format,
        "model": target.model_spec.name,
        "cluster": target.cluster.name,
        "world_size": target.layout.num_ranks,
        "order": "-".join(target.layout.order),
        "plan": target.config.model_dump(),
        "settings": emitted.settings,
        "text": emitted.text,
        "warnings": list(emitted.warnings),
        "notes": list(emitted.notes),
    }
    if target.pipeline is not None:
        answer["layout"] = render_layout_json(target.pipeline)
    if validation is not None:
        answer["validation"] = validation
    return answer


def echo_groups(target: Any, document: dict[str, Any]) -> None:
    """The groups of every axis (count, size, tiers, the first few) and the rank table."""
    c, layout = target.config, target.layout
    click.echo(f"{target.model_spec.name} on {layout.num_ranks} x {target.cluster.gpu.name} "
               f"({target.cluster.name}, {target.cluster.gpus_per_node} per node): tp {c.tp} "
               f"pp {c.pp} dp {c.dp} cp {c.cp} ep {c.ep} etp {c.etp}")
    expert = f"; expert layers {document['expert_order']}" if document["expert_order"] else ""
    click.echo(f"rank order {document['order']} (innermost first){expert}")
    rows = []
    for name, groups in document["groups"].items():
        tiers = document["tiers"][name]
        shown = "  ".join(_brace(g) for g in groups[:MAX_GROUPS_SHOWN])
        hidden = len(groups) - MAX_GROUPS_SHOWN
        more = f"  ... ({hidden} more)" if hidden > 0 else ""
        spans = ", ".join(f"{t} x{tiers.count(t)}" for t in dict.fromkeys(tiers) if t) or "-"
        rows.append((name, len(groups[0]), len(groups), spans, shown + more))
    echo_table("groups", ["axis", "size", "groups", "tier", "first groups"], rows)
    ranks = document["ranks"]
    columns = list(ranks[0])
    echo_table("ranks" if len(ranks) <= MAX_RANK_ROWS else
               f"ranks (first {MAX_RANK_ROWS} of {len(ranks)}; --json lists all)",
               columns, [[entry[k] for k in columns] for entry in ranks[:MAX_RANK_ROWS]])


def _brace(group: list[int]) -> str:
    if len(group) > 8:
        return "{" + ",".join(str(r) for r in group[:3]) + f",...,{group[-1]}" + "}"
    return "{" + ",".join(str(r) for r in group) + "}"


def echo_launch(launch_format: str, target: Any, emitted: Any, *, as_json: bool,
                output: str | None, validation: str | None) -> None:
    """Stdout gets the settings (the groups: tables, or their JSON with --json); -o FILE gets
    the same text (the groups always as JSON); stderr the warnings, notes and validation."""
    if as_json and launch_format != "groups":
        envelope = render_launch_json(launch_format, target, emitted, validation)
        content = json.dumps(envelope, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    else:
        content = emitted.text
    if output is not None:
        write_output_file(output, content)  # whole or not at all
        click.echo(f"wrote {output} ({launch_format}, {target.layout.num_ranks} ranks)")
    elif launch_format == "groups" and not as_json:
        echo_groups(target, emitted.settings)
    else:
        click.echo(content, nl=False)
    for line in emitted.warnings:
        click.echo(f"warning: {line}", err=True)
    for line in emitted.notes:
        click.echo(f"note: {line}", err=True)
    if validation is not None:
        click.echo(f"validation: {validation}", err=True)
