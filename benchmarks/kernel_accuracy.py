"""How well the compute model reproduces the measured kernels (issue 16, "Measured kernels").

    .venv/bin/python benchmarks/kernel_accuracy.py

For every packaged kernel table (solver/catalog/kernels) and op family (GEMM per dtype, fused
attention MHA and GQA, MLA, fused MoE per dtype), on training-size shapes (GEMM m >= 1024 and
n, k >= 1024; attention and MLA 1K-16K tokens per sequence; MoE >= 1024 tokens), it prints the
median and 90th-percentile |predicted / measured - 1| of

  leave-one-out  the table path with the point held out: each grid point is predicted from
                 its two neighbours along one axis (what interpolation gives where that size
                 was not measured), for every axis with a neighbour on both sides; only points
                 the build left as one measured row (not filled, lowered or a median) are
                 scored, so GQA cells count only where one KV-head count was measured (none
                 on A100). Beside it, the median of the rule the table path used before
                 (log throughput linear in log size; solver.cost.kernels.kernels says why it changed).
  datasheet      the path GPUs without a table take (peak x MAMF fraction roofline + t_kernel;
                 attention at attention_peak_fraction of the BF16 peak; per-expert GEMMs plus
                 the permutation traffic for MoE), at the same shapes.

The table path itself returns every unadjusted grid point exactly (tests/test_kernels.py). Last,
a sanity print (not a fit, not a test): the throughput ratio of two precision recipes run on
one configuration by Megatron-Bridge on Blackwell (FP8 current scaling over MXFP8: measured
1.04-1.06; NVFP4 over MXFP8 or FP8: 1.31-1.50), predicted and measured.
"""

from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from solver.catalog import load_gpu_spec
from solver.cost.kernels.efficiency import (
    ComputeConstants,
    estimate_datasheet_gemm_s,
    estimate_streaming_s,
)
from solver.cost.kernels.kernels import (
    KernelGrid,
    KernelTable,
    list_kernel_tables,
    load_kernel_table,
)
from solver.cost.kernels.kernels_moe import estimate_table_moe_s

GPU_OF_TABLE = {"a100_sxm": "a100-80gb", "h100_sxm": "h100-sxm", "h200_sxm": "h200",
                "b200_sxm": "b200", "b300_sxm": "b300", "gb200": "gb200", "gb300": "gb300",
                "l40s": "l40s"}
RECIPE_OF_DTYPE = {"bfloat16": "bf16", "fp8": "fp8", "fp8_block": "fp8-blockwise",
                   "nvfp4": "nvfp4"}
TRAINING = {"gemm": {"m": 1024, "n": 1024, "k": 1024}, "attention": {"seq": 1024},
            "window": {"seq": 1024},
            "mla": {"seq": 1024}, "moe": {"tokens": 1024}}


def training_mask(grid: KernelGrid, kind: str) -> np.ndarray:
    """The points scored: measured as one row (not adjusted) and of training size."""
    mask = ~grid.adjusted
    for axis, name in enumerate(grid.axis_names):
        if name in TRAINING[kind]:
            shape = [1] * grid.latency_s.ndim
            shape[axis] = -1
            mask = mask & (grid.sizes[axis] >= TRAINING[kind][name]).reshape(shape)
    return mask


def leave_one_out(grid: KernelGrid, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """(relative errors, index of each scored point) of the table path with the point held
    out: for every axis and every inner size on it, the grid without that size
    (KernelGrid.interpolate_log_rate, the lookup the cost model makes) predicts the points at
    that size."""
    mask = training_mask(grid, kind)
    errors, points = [], []
    for axis in range(grid.latency_s.ndim):
        for j in range(1, len(grid.sizes[axis]) - 1):
            keep = np.take(mask, j, axis=axis)
            if not keep.any():
                continue
            index = np.argwhere(keep)
            index = np.insert(index, axis, j, axis=1)
            coords = [grid.sizes[a][index[:, a]] for a in range(grid.latency_s.ndim)]
            held_out = KernelGrid(
                grid.axis_names,
                tuple(np.delete(s, j) if a == axis else s for a, s in enumerate(grid.sizes)),
                np.delete(grid.latency_s, j, axis=axis), np.delete(grid.adjusted, j, axis=axis),
                np.delete(grid.log_rate, j, axis=axis),
                tuple(np.delete(f, j) if a == axis else f
                      for a, f in enumerate(grid.log_factors)))
            predicted = held_out.interpolate_log_rate(*coords)
            errors.append(np.exp(grid.log_rate[tuple(index.T)] - predicted) - 1.0)
            points.append(index)
    if not errors:
        return np.array([]), np.zeros((0, grid.latency_s.ndim), dtype=int)
    return np.concatenate(errors), np.concatenate(points)


def log_rate_chord_errors(grid: KernelGrid, kind: str) -> np.ndarray:
    """The same held-out points predicted by the rule the table path used until 2026-12: the
    log throughput linear in the log size between the two neighbours."""
    mask = training_mask(grid, kind)
    errors = []
    for axis in range(grid.latency_s.ndim):
        x = np.log2(grid.sizes[axis].astype(float))
        if len(x) < 3:
            continue
        lo, mid, hi = (np.take(grid.log_rate, range(s, s + len(x) - 2), axis=axis)
                       for s in (0, 1, 2))
        t = ((x[1:-1] - x[:-2]) / (x[2:] - x[:-2]))
        shape = [1] * grid.latency_s.ndim
        shape[axis] = -1
        predicted = lo + (hi - lo) * t.reshape(shape)
        keep = np.take(mask, range(1, len(x) - 1), axis=axis)
        errors.append(np.exp(mid - predicted)[keep] - 1.0)  # predicted time / measured - 1
    return np.concatenate(errors) if errors else np.array([])


def datasheet_errors(table_name: str, grid_name: str, grid: KernelGrid,
                     index: np.ndarray) -> np.ndarray:
    gpu, cc = load_gpu_spec(GPU_OF_TABLE[table_name]), ComputeConstants()
    values = [grid.sizes[a][index[:, a]].astype(float) for a in range(len(grid.sizes))]
    measured = grid.latency_s[tuple(index.T)]
    kind = grid_name.split(".")[0]
    if kind == "gemm":
        recipe = RECIPE_OF_DTYPE[grid_name.split(".")[1]]
        m, n, k = values
        predicted = estimate_datasheet_gemm_s(gpu, recipe, m, k, n, cc)
    elif kind in ("attention", "window", "mla"):
        work = np.exp(grid.log_rate[tuple(index.T)]) * measured
        predicted = work / (cc.attention_peak_fraction * gpu.peak_flop_per_s("bf16"))
    else:
        _, dtype, gated, shape = grid_name.split(".")
        hidden, inter, topk, experts = (int(x) for x in shape.split("x"))
        tokens, etp, ep = values
        rows = tokens * topk / experts
        width = (3.0 if gated == "gated" else 2.0) * inter / (2.0 * etp)
        gemms = 2.0 * experts / ep * estimate_datasheet_gemm_s(
            gpu, RECIPE_OF_DTYPE[dtype], rows, hidden, width, cc)
        permute = estimate_streaming_s(gpu, 2 * 2 * 2.0 * tokens * topk / ep * hidden, cc)
        predicted = gemms + permute
    return predicted / measured - 1.0


def family(grid_name: str) -> str:
    parts = grid_name.split(".")
    return {"gemm": f"gemm {parts[-1]}", "attention": f"attention {parts[-1]}",
            "window": f"window {parts[1:2] and parts[1]} {parts[-1]}", "mla": "mla",
            "moe": f"moe {parts[1] if len(parts) > 1 else ''}"}[parts[0]]


def render_accuracy(console: Console) -> dict[str, list[float]]:
    table = Table(title="Compute model vs measured kernels, training-size shapes: |predicted / "
                        "measured - 1|")
    for name in ("gpu", "op"):
        table.add_column(name)
    for name in ("points", "leave-one-out median", "p90", "log-rate rule median",
                 "datasheet median", "p90"):
        table.add_column(name, justify="right")
    medians: dict[str, list[float]] = {"loo": [], "datasheet": []}
    for table_name in list_kernel_tables():
        grids = load_kernel_table(table_name).grids
        by_family: dict[str, list[tuple[np.ndarray, ...]]] = {}
        for grid_name, grid in sorted(grids.items()):
            kind = grid_name.split(".")[0]
            loo, index = leave_one_out(grid, kind)
            if not len(loo):
                continue
            sheet = datasheet_errors(table_name, grid_name, grid, index)
            chord = log_rate_chord_errors(grid, kind)
            by_family.setdefault(family(grid_name), []).append((loo, sheet, chord))
        for op, parts in by_family.items():
            loo, sheet, chord = (np.abs(np.concatenate([p[i] for p in parts])) for i in range(3))
            medians["loo"].append(float(np.median(loo)))
            medians["datasheet"].append(float(np.median(sheet)))
            table.add_row(table_name, op, str(len(loo)), f"{np.median(loo):.1%}",
                          f"{np.percentile(loo, 90):.1%}", f"{np.median(chord):.1%}",
                          f"{np.median(sheet):.1%}",
                          f"{np.percentile(sheet, 90):.1%}")
        table.add_section()
    console.print(table)
    return medians


def moe_shape_transfer_errors(table: KernelTable, shape_grid: str, corrected: bool
                              ) -> np.ndarray:
    """|predicted / measured - 1| of one fused-MoE shape's measured training-size points
    (tokens >= 1024, not adjusted) predicted from the table without that shape: the nearest
    other shape's rate (estimate_table_moe_s), `corrected` by the GEMM table's shape
    efficiency or not (the table without its GEMM grid in that dtype)."""
    _, dtype, gated, shape = shape_grid.split(".")
    hidden, inter, topk, experts = (int(x) for x in shape.split("x"))
    drop = {shape_grid} if corrected else {shape_grid, f"gemm.{dtype}"}
    others = KernelTable(table.name, {n: g for n, g in table.grids.items() if n not in drop})
    if not any(n.startswith(f"moe.{dtype}.{gated}.") for n in others.grids):
        return np.array([])
    grid = table.grids[shape_grid]
    index = np.argwhere(~grid.adjusted)
    tokens, etp, ep = (grid.sizes[a][index[:, a]].astype(float) for a in range(3))
    keep = tokens >= TRAINING["moe"]["tokens"]
    predicted = estimate_table_moe_s(others, dtype, hidden=hidden, inter=inter, topk=topk,
                                     experts=experts, gated=gated == "gated",
                                     tokens=tokens[keep], etp=etp[keep], ep=ep[keep])
    return np.abs(predicted / grid.latency_s[tuple(index[keep].T)] - 1.0)


def render_moe_shape_transfer(console: Console) -> None:
    """How well a fused-MoE shape the tables lack is predicted from the listed ones: each
    listed shape held out in turn (solver.cost.kernels.kernels_moe.estimate_table_moe_s)."""
    table = Table(title="Fused MoE, each listed shape held out and predicted from the nearest "
                        "other shape: |predicted / measured - 1|, with and without the GEMM "
                        "table's shape-efficiency correction")
    for name in ("gpu", "dtype", "shapes"):
        table.add_column(name)
    for name in ("points", "nearest shape median", "p90", "corrected median", "p90"):
        table.add_column(name, justify="right")
    for table_name in list_kernel_tables():
        kernels = load_kernel_table(table_name)
        by_dtype: dict[str, list[str]] = {}
        for name in sorted(kernels.grids):
            if name.startswith("moe."):
                by_dtype.setdefault(name.split(".")[1], []).append(name)
        for dtype, shapes in by_dtype.items():
            plain = np.concatenate([moe_shape_transfer_errors(kernels, s, False)
                                    for s in shapes])
            fixed = np.concatenate([moe_shape_transfer_errors(kernels, s, True) for s in shapes])
            if not len(plain):
                continue
            table.add_row(table_name, dtype, str(len(shapes)), str(len(plain)),
                          f"{np.median(plain):.1%}", f"{np.percentile(plain, 90):.1%}",
                          f"{np.median(fixed):.1%}", f"{np.percentile(fixed, 90):.1%}")
    console.print(table)


# Megatron-Bridge runs of one configuration under two recipes (NVIDIA-NeMo/Megatron-Bridge
# @067f987 docs/performance-summary-archive.md): (label, model, cluster, GPUs, seq, global
# batch, degrees, {recipe: measured tokens/s per GPU}). 25.11: "FP8-CS (FP8-MX)" rows, the
# parenthesis the MXFP8 run; 26.06: the GB200 Llama 3.1 405B MXFP8 and NVFP4 rows, the same
# tp 4, pp 16, vp 8, and GB300's FP8 and NVFP4 rows, the same tp 4, pp 8, vp 4 (its MXFP8 row
# ran tp 2, cp 2); 26.04.01: Llama 3 70B's MXFP8 and NVFP4 rows (GB300 tp 1, GB200 tp 2; pp 4,
# vp 5; LLAMA3_70B is llama3.1-70b here, as in benchmarks/published.py).
RECIPE_PAIRS = (
    ("25.11 Llama3 8B", "llama3.1-8b", "gb300-nvl72", 8, 8192, 128, dict(micro_batch=2),
     {"fp8": 37556, "mxfp8": 36108}),
    ("25.11 Llama3 8B", "llama3.1-8b", "gb200-nvl72", 8, 8192, 128, dict(micro_batch=2),
     {"fp8": 31508, "mxfp8": 29789}),
    ("25.11 Llama3 8B", "llama3.1-8b", "dgx-b200", 8, 8192, 128, dict(micro_batch=2),
     {"fp8": 30624, "mxfp8": 29521}),
    ("25.11 Llama3.1 405B", "llama3.1-405b", "dgx-b200", 128, 8192, 64,
     dict(tp=4, pp=8, cp=2, vpp=8, micro_batch=1), {"fp8": 661, "mxfp8": 624}),
    ("26.06 Llama3.1 405B", "llama3.1-405b", "gb200-nvl72", 256, 8192, 1536,
     dict(tp=4, pp=16, vpp=8, micro_batch=1), {"mxfp8": 783, "nvfp4": 1166}),
    ("26.06 Llama3.1 405B", "llama3.1-405b", "gb300-nvl72", 256, 8192, 1536,
     dict(tp=4, pp=8, vpp=4, micro_batch=1), {"fp8": 1048, "nvfp4": 1413}),
    ("26.04.01 Llama3 70B", "llama3.1-70b", "gb300-nvl72", 64, 8192, 256,
     dict(tp=1, pp=4, vpp=5, micro_batch=1), {"mxfp8": 4864, "nvfp4": 7296}),
    ("26.04.01 Llama3 70B", "llama3.1-70b", "gb200-nvl72", 64, 8192, 256,
     dict(tp=2, pp=4, vpp=5, micro_batch=1), {"mxfp8": 3712, "nvfp4": 4864}),
)


def render_recipes(console: Console) -> None:
    """Sanity print, not fitted: the throughput ratio of two recipes on one configuration,
    predicted and measured (RECIPE_PAIRS)."""
    from solver.api import estimate

    table = Table(title="Sanity print, not fitted: tokens/s of two precision recipes on one "
                        "configuration, Megatron-Bridge runs (performance-summary-archive.md)")
    for name in ("run", "cluster", "gpus", "recipes"):
        table.add_column(name)
    for name in ("measured ratio", "predicted ratio", "predicted tok/s/GPU"):
        table.add_column(name, justify="right")
    for label, model, cluster, gpus, seq, batch, degrees, measured in RECIPE_PAIRS:
        predicted = {p: estimate(model, cluster, gpus, seq_len=seq, global_batch=batch,
                                 precision=p, **degrees).plan.time.tokens_per_second_per_gpu
                     for p in measured}
        first, second = measured
        table.add_row(label, cluster, str(gpus), f"{first} / {second}",
                      f"{measured[first] / measured[second]:.3f}",
                      f"{predicted[first] / predicted[second]:.3f}",
                      " / ".join(f"{predicted[p]:,.0f}" for p in measured))
    console.print(table)


def main() -> None:
    console = Console() if Console().is_terminal else Console(width=140)
    medians = render_accuracy(console)
    loo, sheet = np.median(medians["loo"]), np.median(medians["datasheet"])
    console.print(f"median of the per-GPU, per-op medians: leave-one-out {loo:.1%}, "
                  f"datasheet {sheet:.1%}")
    render_moe_shape_transfer(console)
    render_recipes(console)


if __name__ == "__main__":
    main()
