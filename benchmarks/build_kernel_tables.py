"""Build the packaged kernel tables (solver/catalog/kernels/<gpu>.npz) from AIConfigurator's
measured TensorRT-LLM kernel timings (the CSV copies described in their README).

    .venv/bin/python benchmarks/build_kernel_tables.py SOURCE_DIR

SOURCE_DIR holds one folder per GPU with gemm.csv, context_attention.csv, context_mla.csv and
moe.csv. The project never reads it at run time; this script is how the packaged tables were
made, and what solver/catalog/kernels/README.md describes. Per GPU it keeps the training-
relevant rows and puts them on regular grids (latency in ms, float64 as measured):

  gemm.<dtype>            m x n x k; dtypes bfloat16, fp8, fp8_block, nvfp4; m multiples of 256
  attention.<mha|gqa>     batch x seq x heads x head_dim; bf16, causal, no window, TRT-LLM
                          backend; head_dim 64/128/256; gqa cells are the median over kv heads
  window.<w>.<mha|gqa>    the same for sliding-window attention of w keys (the source's window
                          rows: w = 128 at head_dim 64, gpt-oss's geometry, with its sinks)
  mla                     batch x seq x local heads (DeepSeek geometry), bf16 KV cache
  moe.<dtype>.<kernel>.<hidden>x<inter>x<topk>x<experts>   tokens x etp x ep, balanced routing

and records in `<grid>.adjusted` which grid points are not one source row as measured: filled
holes (constant throughput from the nearest measured neighbour) and points lowered so that no
larger shape is faster (the lower monotone envelope; measurement noise, README caveat 8).
"""

from __future__ import annotations

import argparse
import csv
import functools
import itertools
from collections import defaultdict
from pathlib import Path

import numpy as np

from solver.cost.kernels.kernels import window_attention_flop

OUT = Path(__file__).resolve().parent.parent / "solver" / "catalog" / "kernels"
GPUS = ("a100_sxm", "h100_sxm", "h200_sxm", "b200_sxm", "b300_sxm", "gb200", "gb300", "l40s")
GEMM_DTYPES = ("bfloat16", "fp8", "fp8_block", "nvfp4")
TILE_ROWS = 256  # m values just above a multiple (257, 513, ...) probe tile steps; dropped
HEAD_DIMS = (64, 128, 256)
GQA_HEADS = (2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96)
MHA_HEADS = (1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 64, 96)
MOE_KERNELS = ("cutlass", "nongated", "deepgemm")
WINDOWS = (128,)  # the windows the source measured at the kept head dims


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def gemm_work(m, n, k):
    return 2.0 * m * n * k


def attention_work(batch, seq, heads, head_dim):
    # causal QK^T and PV: 4 b h s^2 d / 2
    return 2.0 * batch * heads * seq * seq * head_dim


def build_grid(points: dict[tuple, list[float]], axes: list[list[int]], work, monotone_axes
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Latency grid over `axes` from {grid key: [latencies]} (median of log where several),
    holes filled at constant throughput, then the lower monotone envelope along
    `monotone_axes` (no point slower than a point larger in those sizes); with which points
    are adjusted and which of those were holes (no source row at all)."""
    shape = tuple(len(a) for a in axes)
    latency = np.full(shape, np.nan)
    adjusted = np.zeros(shape, dtype=bool)
    index = [{v: i for i, v in enumerate(a)} for a in axes]
    for key, values in points.items():
        at = tuple(index[d][v] for d, v in enumerate(key))
        latency[at] = values[0] if len(values) == 1 else float(np.exp(np.median(np.log(values))))
        adjusted[at] = len(values) > 1
    mesh = np.meshgrid(*[np.asarray(a, dtype=float) for a in axes], indexing="ij")
    log_rate = np.log(work(*mesh)) - np.log(latency)
    holes = np.isnan(log_rate)
    for axis in range(len(axes)):  # constant throughput from the nearest measured neighbour
        for reverse in (False, True):
            log_rate = _fill_along(log_rate, axis, reverse)
    assert not np.isnan(log_rate).any(), "a grid with no measured point at all"
    latency = np.where(holes, work(*mesh) / np.exp(log_rate), latency)
    adjusted |= holes
    for axis in monotone_axes:
        flipped = np.flip(latency, axis)
        envelope = np.flip(np.minimum.accumulate(flipped, axis=axis), axis)
        adjusted |= envelope < latency
        latency = envelope
    return latency, adjusted, holes


def _fill_along(values: np.ndarray, axis: int, reverse: bool) -> np.ndarray:
    out = np.moveaxis(values.copy(), axis, 0)
    order = range(out.shape[0] - 2, -1, -1) if reverse else range(1, out.shape[0])
    for i in order:
        prev = out[i + 1] if reverse else out[i - 1]
        out[i] = np.where(np.isnan(out[i]), prev, out[i])
    return np.moveaxis(out, 0, axis)


def add_grid(arrays: dict, name: str, axis_names: tuple[str, ...], axes, latency, adjusted,
             filled: np.ndarray | None = None):
    for axis_name, axis in zip(axis_names, axes):
        arrays[f"{name}.{axis_name}"] = np.asarray(axis, dtype=np.int64)
    arrays[f"{name}.latency_ms"] = latency
    arrays[f"{name}.adjusted"] = adjusted
    if filled is not None:  # the MoE grids: which points no source row measured at all
        arrays[f"{name}.filled"] = filled


def build_gemm(rows, arrays: dict, stats: dict) -> None:
    for dtype in GEMM_DTYPES:
        points: dict[tuple, list[float]] = defaultdict(list)
        for r in rows:
            if r["dtype"] == dtype and int(r["m"]) % TILE_ROWS == 0:
                points[(int(r["m"]), int(r["n"]), int(r["k"]))].append(float(r["latency_ms"]))
        if not points:
            continue
        axes = [sorted({key[d] for key in points}) for d in range(3)]
        latency, adjusted, _ = build_grid(points, axes, gemm_work, (0, 1, 2))
        add_grid(arrays, f"gemm.{dtype}", ("m", "n", "k"), axes, latency, adjusted)
        stats[f"gemm.{dtype}"] = (len(points), latency.size, int(adjusted.sum()))


def build_attention(rows, arrays: dict, stats: dict, window: int = 0) -> None:
    """attention.<kind> (window 0: full causal attention) or window.<window>.<kind>."""
    for kind, heads in (("mha", MHA_HEADS), ("gqa", GQA_HEADS)):
        points: dict[tuple, list[float]] = defaultdict(list)
        for r in rows:
            h, kv = int(r["num_heads"]), int(r["num_kv_heads"])
            if (r["attn_dtype"], r["kv_cache_dtype"], r["backend"], r["window_size"]) != (
                    "bfloat16", "bfloat16", "trtllm", str(window)):
                continue
            if int(r["head_dim"]) not in HEAD_DIMS or h not in heads:
                continue
            if (kv == h) != (kind == "mha"):
                continue
            key = (int(r["batch_size"]), int(r["seq_len"]), h, int(r["head_dim"]))
            points[key].append(float(r["latency_ms"]))
        if not points:
            continue
        axes = [sorted({key[d] for key in points}) for d in range(4)]
        work = (functools.partial(window_attention_flop, window=window) if window
                else attention_work)
        latency, adjusted, _ = build_grid(points, axes, work, (0, 1, 2, 3))
        name = f"window.{window}.{kind}" if window else f"attention.{kind}"
        add_grid(arrays, name, ("batch", "seq", "heads", "head_dim"), axes, latency, adjusted)
        stats[name] = (len(points), latency.size, int(adjusted.sum()))


def build_mla(rows, arrays: dict, stats: dict) -> None:
    points: dict[tuple, list[float]] = defaultdict(list)
    for r in rows:
        if r["kv_cache_dtype"] == "bfloat16" and int(r["seq_len"]) >= 512:
            key = (int(r["batch_size"]), int(r["seq_len"]), int(r["num_heads_per_gpu"]))
            points[key].append(float(r["latency_ms"]))
    axes = [sorted({key[d] for key in points}) for d in range(3)]

    def work(batch, seq, heads):  # q/k head dim 192, v head dim 128, causal
        return batch * heads * seq * seq * (192.0 + 128.0)

    latency, adjusted, _ = build_grid(points, axes, work, (0, 1, 2))
    add_grid(arrays, "mla", ("batch", "seq", "heads"), axes, latency, adjusted)
    stats["mla"] = (len(points), latency.size, int(adjusted.sum()))


def build_moe(rows, arrays: dict, stats: dict) -> None:
    shapes: dict[tuple, dict[tuple, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if r["distribution"] != "balanced" or r["kernel"] not in MOE_KERNELS:
            continue
        if r["dtype"] not in GEMM_DTYPES:
            continue
        gated = "nongated" if r["kernel"] == "nongated" else "gated"
        shape = (r["dtype"], gated, int(r["hidden_size"]), int(r["inter_size"]), int(r["topk"]),
                 int(r["num_experts"]))
        key = (int(r["num_tokens"]), int(r["moe_tp_size"]), int(r["moe_ep_size"]))
        shapes[shape][key].append(float(r["latency_ms"]))
    for (dtype, gated, hidden, inter, topk, experts), points in sorted(shapes.items()):
        axes = [sorted({key[d] for key in points}) for d in range(3)]
        factor = 3.0 if gated == "gated" else 2.0

        def work(tokens, etp, ep):
            return 2.0 * tokens * topk / ep * hidden * inter / etp * factor

        latency, adjusted, filled = build_grid(points, axes, work, (0,))
        name = f"moe.{dtype}.{gated}.{hidden}x{inter}x{topk}x{experts}"
        add_grid(arrays, name, ("tokens", "etp", "ep"), axes, latency, adjusted, filled)
        stats[name] = (len(points), latency.size, int(adjusted.sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="folder with <gpu>/gemm.csv etc.")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for gpu in GPUS:
        arrays: dict[str, np.ndarray] = {}
        stats: dict[str, tuple[int, int, int]] = {}
        folder = args.source / gpu
        build_gemm(read_rows(folder / "gemm.csv"), arrays, stats)
        attention_rows = read_rows(folder / "context_attention.csv")
        build_attention(attention_rows, arrays, stats)
        for window in WINDOWS:
            build_attention(attention_rows, arrays, stats, window)
        build_mla(read_rows(folder / "context_mla.csv"), arrays, stats)
        build_moe(read_rows(folder / "moe.csv"), arrays, stats)
        np.savez_compressed(OUT / f"{gpu}.npz", **arrays)
        size_kb = (OUT / f"{gpu}.npz").stat().st_size / 1024
        print(f"{gpu}: {size_kb:.0f} KB")
        for name, (measured, points, adjusted) in stats.items():
            if not name.startswith("moe."):
                print(f"  {name:<18} {measured:>6} measured cells, {points:>6} grid points, "
                      f"{adjusted:>5} adjusted ({adjusted / points:.1%})")
        moe = [v for k, v in stats.items() if k.startswith("moe.")]
        if moe:
            measured, points, adjusted = (sum(x) for x in zip(*moe))
            print(f"  moe ({len(moe)} shapes)  {measured:>6} measured cells, {points:>6} grid "
                  f"points, {adjusted:>5} adjusted ({adjusted / points:.1%})")


if __name__ == "__main__":
    main()
