"""`parplan models`, `parplan models show`, `parplan clusters`."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.render import echo_json, echo_table, format_params


def model_summary(model_spec: Any) -> dict[str, Any]:
    """The `models --json` object of one model (DESIGN.md, Interfaces)."""
    return {
        "name": model_spec.name,
        "model_type": model_spec.model_type,
        "total_params": model_spec.total_params,
        "active_params": model_spec.active_params,
        "num_hidden_layers": model_spec.num_hidden_layers,
        "hidden_size": model_spec.hidden_size,
        "num_attention_heads": model_spec.num_attention_heads,
        "num_key_value_heads": model_spec.kv_heads,
        "num_experts": model_spec.num_experts,
        "num_experts_per_tok": model_spec.num_experts_per_tok,
        "attention": "mla" if model_spec.is_mla else "mha/gqa",
        "source": model_spec.source,
    }


def block_kind_counts(model_spec) -> dict[str, int]:
    """Layers per (mixer + MLP) kind, in the order the kinds appear."""
    counts: dict[str, int] = {}
    for mixer, mlp in zip(model_spec.layer_mixers, model_spec.layer_mlps):
        key = " + ".join(part for part in (mixer, mlp) if part != "none")
        counts[key] = counts.get(key, 0) + 1
    return counts


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.pass_context
def models(ctx: click.Context, as_json: bool) -> None:
    """List the model zoo (parameter counts computed from the architecture)."""
    if ctx.invoked_subcommand is not None:
        return
    from solver.catalog import load_zoo

    summaries = [model_summary(m) for m in load_zoo()]
    if as_json:
        echo_json(summaries)
        return
    rows = [
        (
            s["name"],
            format_params(s["total_params"]),
            format_params(s["active_params"]),
            s["num_hidden_layers"],
            s["hidden_size"],
            f'{s["num_attention_heads"]}/{s["num_key_value_heads"]}',
            f'{s["num_experts"]} (top {s["num_experts_per_tok"]})' if s["num_experts"] else "-",
        )
        for s in summaries
    ]
    columns = ["model", "total", "active", "layers", "hidden", "heads/kv", "experts"]
    echo_table(f"parplan model zoo ({len(rows)} models)", columns, rows)


@models.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def show(ref: str, as_json: bool) -> None:
    """Parameter breakdown of one model: a zoo NAME, a zoo TOML or an HF config.json PATH."""
    from solver.catalog import load_model_spec
    from solver.spec.blocks import render_pattern

    model_spec = load_model_spec(ref)
    summary = model_summary(model_spec)
    breakdown = model_spec.breakdown()
    summary["breakdown"] = breakdown
    summary["mtp_params"] = model_spec.mtp_params
    summary["mtp"] = {"depths": model_spec.mtp_depths, "modules": model_spec.mtp_modules,
                      "loss_scale_per_depth": model_spec.mtp_loss_scale_per_depth}
    summary["flops_per_token_4k"] = model_spec.flops_per_token(4096)
    summary["block_pattern"] = render_pattern(model_spec.layer_mixers, model_spec.layer_mlps)
    summary["block_kinds"] = block_kind_counts(model_spec)
    summary["spec"] = model_spec.model_dump(exclude_defaults=True)
    if as_json:
        echo_json(summary)
        return
    total = model_spec.total_params
    rows = [(kind, format_params(n), n, f"{100 * n / total:.1f}%") for kind, n in breakdown.items()]
    rows.append(("total", format_params(total), total, "100.0%"))
    rows.append(("active per token", format_params(model_spec.active_params),
                 model_spec.active_params, f"{100 * model_spec.active_params / total:.1f}%"))
    echo_table(f"{model_spec.name} ({model_spec.model_type})", ["part", "params", "exact", "share"],
               rows)
    if model_spec.mtp_params:
        depths, modules = model_spec.mtp_depths, model_spec.mtp_modules
        click.echo(f"multi-token prediction (not in total): {format_params(model_spec.mtp_params)} "
                   f"in {modules} module(s), trained at {depths} depth(s)"
                   f"{' (one module repeated)' if modules < depths else ''}, loss weight "
                   f"{model_spec.mtp_loss_scaling_factor:g} ({model_spec.mtp_loss_scale_per_depth:g}"
                   f" a depth) on the last pipeline stage")
    # every model's pattern: a plain one's dense and MoE layers too
    kinds = ", ".join(f"{n} x {kind}" for kind, n in summary["block_kinds"].items())
    click.echo(f"block pattern: {summary['block_pattern']}\n  (M Mamba-2, * attention, "
               f"s sliding, c chunked, L linear attention, - MLP, E MoE): {kinds}")
    if model_spec.is_sparse_attention:
        click.echo(f"  every * is DeepSeek Sparse Attention: a lightning indexer of "
                   f"{model_spec.index_n_heads} heads x {model_spec.index_head_dim} picks the "
                   f"{model_spec.index_topk} keys each query attends to")
    if model_spec.num_zero_experts:
        click.echo(f"  every E picks top {model_spec.num_experts_per_tok} of "
                   f"{model_spec.num_experts} FFN and {model_spec.num_zero_experts} "
                   f"zero-computation experts: {model_spec.experts_per_token:g} FFN experts a "
                   f"token on average")
    click.echo(f"training FLOPs per token at 4096 tokens (causal): "
               f"{model_spec.flops_per_token(4096):.4g}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def clusters(as_json: bool) -> None:
    """List the cluster presets and their GPUs."""
    from solver.catalog import load_clusters

    presets = load_clusters()
    if as_json:
        echo_json([dict(c.model_dump(), scale_up_gpus=c.scale_up_gpus) for c in presets])
        return
    rows = [
        (
            c.name,
            c.gpu.name,
            round(c.gpu.memory_gib * 2**30 / 1e9, 1),
            c.gpus_per_node,
            c.scale_up_gpus,
            c.gpu.peak_tflops_bf16,
            " > ".join(
                f"{t.name} {t.bandwidth_gb_per_s:g} GB/s" for t in c.tiers
            ),
        )
        for c in presets
    ]
    columns = ["cluster", "gpu", "memory GB", "gpus/node", "nvlink domain", "bf16 TFLOP/s", "tiers"]
    echo_table(f"parplan cluster presets ({len(rows)})", columns, rows)
