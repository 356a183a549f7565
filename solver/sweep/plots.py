"""The plots of a sweep report (matplotlib, the optional extra `parplan[report]`, imported
here only): per group, MFU and tokens/s against the GPU count (one line per cluster), and the
memory per GPU of each winner, itemized, against the GPU's capacity.

Figures are made with `matplotlib.figure.Figure` (no pyplot, so no global figure state and no
GUI backend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from solver.sweep.tables import Group

MEMORY_ITEMS = ("weights", "grads", "optimizer", "activations", "other")
DPI = 110


def matplotlib_missing() -> str | None:
    """Why plots cannot be drawn (matplotlib missing), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "matplotlib is not installed (pip install 'parplan[report]')"
    return None


def _solved(group: Group) -> list[dict[str, Any]]:
    return [row for row in group.rows if row["status"] in ("optimal", "feasible")]


def draw_group_plots(group: Group, directory: Path) -> list[Path]:
    """scaling-<slug>.png and memory-<slug>.png for a group with solved problems."""
    rows = _solved(group)
    if not rows:
        return []
    directory.mkdir(parents=True, exist_ok=True)
    return [draw_scaling(group, rows, directory / f"scaling-{group.slug}.png"),
            draw_memory(group, rows, directory / f"memory-{group.slug}.png")]


def draw_scaling(group: Group, rows: list[dict[str, Any]], path: Path) -> Path:
    """MFU (%) and tokens/s of the best plan against the GPU count, one line per cluster."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(10, 4), dpi=DPI, layout="constrained")
    mfu_axes, rate_axes = figure.subplots(1, 2)
    for cluster in dict.fromkeys(row["cluster"] for row in rows):
        points = sorted((r["gpus"], r["mfu"], r["tokens_per_second"]) for r in rows
                        if r["cluster"] == cluster)
        gpus = [p[0] for p in points]
        mfu_axes.plot(gpus, [100 * p[1] for p in points], marker="o", label=cluster)
        rate_axes.plot(gpus, [p[2] for p in points], marker="o", label=cluster)
    ticks = sorted({row["gpus"] for row in rows})
    for axes, label in ((mfu_axes, "MFU (%)"), (rate_axes, "tokens/s (whole job)")):
        axes.set_xscale("log", base=2)
        axes.set_xticks(ticks, [str(n) for n in ticks])
        axes.minorticks_off()
        axes.set_xlabel("GPUs")
        axes.set_ylabel(label)
        axes.grid(True, alpha=0.3)
    rate_axes.set_yscale("log")
    mfu_axes.set_ylim(bottom=0)
    rate_axes.legend(fontsize="small")
    figure.suptitle(group.title, fontsize="medium")
    figure.savefig(path)
    return path


def draw_memory(group: Group, rows: list[dict[str, Any]], path: Path) -> Path:
    """Stacked bars of the winner's worst-stage memory per GPU (GB), one bar per cluster and
    GPU count, with the GPU's capacity as a marker."""
    from matplotlib.figure import Figure

    rows = sorted(rows, key=lambda r: (r["cluster"], r["gpus"]))
    figure = Figure(figsize=(max(6.0, 0.45 * len(rows) + 3), 4.5), dpi=DPI,
                    layout="constrained")
    axes = figure.subplots()
    positions = list(range(len(rows)))
    bottom = [0.0] * len(rows)
    for item in MEMORY_ITEMS:
        heights = [float(r["memory_breakdown_gb"].get(item, 0.0)) for r in rows]
        axes.bar(positions, heights, bottom=bottom, label=item)
        bottom = [b + h for b, h in zip(bottom, heights)]
    axes.hlines([float(r["gpu_memory_gb"]) for r in rows], [x - 0.45 for x in positions],
                [x + 0.45 for x in positions], colors="black", linestyles="dashed",
                label="GPU capacity")
    axes.set_xticks(positions, [f"{r['cluster']} {r['gpus']}" for r in rows], rotation=90,
                    fontsize="x-small")
    axes.set_ylabel("GB per GPU (worst stage)")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.suptitle(f"memory of the best plans\n{group.title}", fontsize="medium")
    figure.savefig(path)
    return path
