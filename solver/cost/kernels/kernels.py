"""Measured kernel times: interpolation in the packaged kernel tables (solver/catalog/kernels/,
AIConfigurator's TensorRT-LLM forward timings per GPU; what they hold and how they were built
is in that folder's README and benchmarks/build_kernel_tables.py). The attention lookups and
the published attention rates are solver.cost.kernels.kernels_attention's, the fused-MoE lookups
solver.cost.kernels.kernels_moe's (which keep the work per GPU beyond the MoE grids' token edge).

Each table is a set of regular grids of measured latencies. Between two measured sizes a
kernel's latency is taken as affine in its work (a fixed part, launch, prologue, the tail wave,
plus work at a steady rate): a lookup interpolates the latency multilinearly in each axis' work
factor (the grids' work is a product of one factor per axis: m, n and k; batch, seq^2, heads
and head dim; ...), and returns the throughput there (work / latency), which the caller divides
its own work by. So that:
  - a grid point gives back its measured latency (up to rounding);
  - inside the grid time is monotone in every size the grid is monotone in (the weights are
    monotone in each size, the latencies along each axis are);
  - a kernel that does not fill the GPU, whose latency hardly grows with its work, is not
    charged for the concave fall of its throughput below the larger measured size: the log of
    the throughput interpolated in log sizes, this module's rule until 2026-12, overestimated
    such midpoints by 3-8% (fused MoE below 4K tokens, GQA attention with 2 query heads, the
    L40S windowed kernel; benchmarks/kernel_accuracy.py prints both rules' leave-one-out
    errors);
  - beyond the grid the throughput stays that of the nearest edge (the coordinate is clamped):
    a GEMM with m = 65536 runs at the rate of m = 32768, attention at 32K tokens at the rate
    of 16K, i.e. the time grows with the work and no faster; below a GEMM grid's smallest size
    (256) the latency stays the edge's instead (estimate_table_gemm_s).

Work per kernel (the grids' throughput unit; FLOPs, causal attention counts half the scores):
  GEMM       2 m n k                         y[m,n] = x[m,k] W[n,k]^T
  attention  2 b h s^2 d                     QK^T and PV, d the head dim, causal half
  window     4 b h s ctx d                   the same over a sliding window (ctx keys per
                                             query on average: window_attention_flop)
  MLA        b h s^2 (192 + 128)             DeepSeek geometry (q/k head dim 192, v 128)
  MoE        2 (T k / ep) h (i / etp) g      g = 3 gated (SwiGLU), 2 non-gated
Tables load once per process (functools.lru_cache) and are read-only.
"""

from __future__ import annotations

import functools
import itertools
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent.parent.parent / "catalog" / "kernels"
MS = 1e-3
# 64 MiB: the packaged tables expand to under 1 MB (B200's, 469 arrays: 792,744 bytes); a
# compressed archive can declare gigabytes in a few MB.
MAX_KERNEL_TABLE_BYTES = 2**26
# The grids' head dims (benchmarks/build_kernel_tables.py) and MLA's fixed geometry.
MLA_QK_HEAD_DIM, MLA_V_HEAD_DIM = 192, 128


def gemm_flop(m, n, k):
    return 2.0 * np.asarray(m, dtype=float) * n * k


def attention_flop(batch, seq, heads, head_dim):
    seq = np.asarray(seq, dtype=float)
    return 2.0 * np.asarray(batch, dtype=float) * heads * seq * seq * head_dim


def window_attention_flop(batch, seq, heads, head_dim, window):
    """Causal attention over a sliding window of `window` keys: query i sees min(i + 1, w)
    keys, w - w (w - 1) / (2 s) on average (ModelSpec.context_tokens), at
    4 flops per query-key-channel (QK^T and PV): 4 b h s ctx d, which is attention_flop's
    2 b h s^2 d for a window of the whole sequence."""
    seq = np.asarray(seq, dtype=float)
    context = np.minimum(seq / 2.0, window - window * (window - 1) / (2.0 * seq))
    return 4.0 * np.asarray(batch, dtype=float) * heads * seq * context * head_dim


def mla_flop(batch, seq, heads):
    seq = np.asarray(seq, dtype=float)
    return np.asarray(batch, dtype=float) * heads * seq * seq * (MLA_QK_HEAD_DIM + MLA_V_HEAD_DIM)


def moe_flop(tokens, etp, ep, hidden: int, inter: int, topk: int, gated: bool):
    tokens = np.asarray(tokens, dtype=float)
    return 2.0 * tokens * topk / ep * hidden * (inter / np.asarray(etp, dtype=float)) * (
        3.0 if gated else 2.0)


@dataclass(frozen=True, eq=False)
class KernelGrid:
    """One regular grid: its axes (sizes), measured latencies, which points the build adjusted
    (filled or lowered to the monotone envelope), ln(work / latency) at every point, and each
    axis' ln work factor at its sizes (log_factors: the ln work of a grid point is the sum of
    its axes' factors)."""

    axis_names: tuple[str, ...]
    sizes: tuple[np.ndarray, ...]
    latency_s: np.ndarray
    adjusted: np.ndarray
    log_rate: np.ndarray  # ln(work / latency_s)
    log_factors: tuple[np.ndarray, ...]

    def interpolate_log_rate(self, *coords: np.ndarray | float) -> np.ndarray:
        """ln(throughput) at `coords` (one array per axis, broadcast together): the latency
        multilinear in each axis' work factor, the work's log summed from the factors, each
        coordinate clamped to its axis' range."""
        return interpolate_log_rate(self.sizes, self.latency_s, self.log_factors, coords)


def interpolate_log_rate(sizes: tuple[np.ndarray, ...], latency_s: np.ndarray,
                         log_factors: tuple[np.ndarray, ...], coords: tuple) -> np.ndarray:
    """ln(work / latency) at `coords`, vectorised over their broadcast shape; clamped beyond
    every edge. Within a cell [x0, x1] of axis a the work factor is a power of the size
    (ln f linear in ln x, exact for every grid but the window's sequence axis), and the
    latency's weight on the x1 side is (f(x) - f(x0)) / (f(x1) - f(x0)): latency affine in
    the work along the axis. Worked number (one axis): latencies 10 and 40 us at work 1 and 4,
    work 2 gives 20 us (rate 0.1 per us, as at both ends), where the log-rate rule gives the
    same; latencies 10 and 16 us (a 6 us fixed part), work 2: 12 us (rate 0.167), where the
    log-rate rule gives 12.6 us.

    The 2^axes cell corners are gathered in one indexing of the flattened table (corner c's
    offset from the cell's lower corner is the dot product of its bits with the table's
    strides), so a lookup costs a fixed few dozen numpy calls whatever the number of axes:
    the search calls it thousands of times per problem on short arrays."""
    points = np.broadcast_arrays(*(np.asarray(c, dtype=float) for c in coords))
    shape = points[0].shape
    n_axes = len(sizes)
    base = np.zeros(points[0].size, dtype=np.intp)
    weight = np.empty((n_axes, points[0].size))
    log_work = np.zeros(points[0].size)
    steps = np.empty(n_axes, dtype=np.intp)
    stride = 1
    for a in range(n_axes - 1, -1, -1):  # C order: the last axis varies fastest
        grid = _log2_axis(sizes[a])
        factors = log_factors[a]
        if len(grid) == 1:
            weight[a], steps[a] = 0.0, 0
            log_work += factors[0]
        else:
            x = np.log2(np.maximum(points[a].reshape(-1), 1e-300))
            i = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 2)
            u = np.clip((x - grid[i]) / (grid[i + 1] - grid[i]), 0.0, 1.0)
            rise = factors[i + 1] - factors[i]  # never 0: the work changes with every size
            weight[a] = np.expm1(u * rise) / np.expm1(rise)
            log_work += factors[i] + u * rise
            base += i * stride
            steps[a] = stride
        stride *= len(grid)
    bits = _corner_bits(n_axes)  # (2^axes, axes), corner 0 = all lower
    w = np.where(bits[:, :, None], weight[None], 1.0 - weight[None]).prod(axis=1)
    values = latency_s.reshape(-1)[base[None, :] + (bits @ steps)[:, None]]
    latency = np.where(w > 0, w * values, 0.0).sum(axis=0)
    return (log_work - np.log(latency)).reshape(shape)


@functools.lru_cache(maxsize=None)
def _corner_bits(n_axes: int) -> np.ndarray:
    return np.array(list(itertools.product((0, 1), repeat=n_axes)), dtype=bool).reshape(
        -1, n_axes)


def _log2_axis(axis: np.ndarray) -> np.ndarray:
    return np.log2(axis.astype(float))


@dataclass(frozen=True, eq=False)
class KernelTable:
    """One GPU's measured kernels: grids by name (gemm.<dtype>, attention.<mha|gqa>, mla,
    moe.<dtype>.<gated|nongated>.<hidden>x<inter>x<topk>x<experts>)."""

    name: str
    grids: dict[str, KernelGrid]

    def has(self, grid: str) -> bool:
        return grid in self.grids


WORK = {"gemm": gemm_flop, "attention": attention_flop, "mla": mla_flop}


@functools.lru_cache(maxsize=None)
def load_kernel_table(name: str) -> KernelTable:
    """The packaged table `name` (a GpuSpec.kernel_table), loaded once per process: a name
    of KERNEL_DIR's tables only (no path leaves it), whose arrays expand to at most
    MAX_KERNEL_TABLE_BYTES (the sizes the archive declares, checked before it is loaded)."""
    from solver.errors import InputError

    if name not in list_kernel_tables():
        raise InputError(f"kernel_table '{name}': no packaged table of that name "
                         f"(known: {', '.join(list_kernel_tables())})")
    path = KERNEL_DIR / f"{name}.npz"
    with zipfile.ZipFile(path) as archive:
        expanded_bytes = sum(member.file_size for member in archive.infolist())
    if expanded_bytes > MAX_KERNEL_TABLE_BYTES:
        raise InputError(f"kernel_table '{name}': its arrays expand to {expanded_bytes:,} "
                         f"bytes, more than {MAX_KERNEL_TABLE_BYTES:,} (64 MiB; the packaged "
                         "tables hold under 1 MB)")
    with np.load(path, allow_pickle=False) as data:
        arrays = {key: data[key] for key in data.files}
    grids: dict[str, KernelGrid] = {}
    for key in arrays:
        if not key.endswith(".latency_ms"):
            continue
        name_ = key.removesuffix(".latency_ms")
        latency_s = arrays[key] * MS
        axis_names = _axis_names(name_)
        sizes = tuple(arrays[f"{name_}.{a}"] for a in axis_names)
        mesh = np.meshgrid(*[s.astype(float) for s in sizes], indexing="ij")
        log_work = np.log(_work(name_)(*mesh))
        log_rate, adjusted = log_work - np.log(latency_s), arrays[f"{name_}.adjusted"]
        if name_.startswith("moe."):
            enveloped = envelope_moe_log_rate(log_rate, arrays[f"{name_}.filled"])
            adjusted = adjusted | (enveloped != log_rate)
            log_rate, latency_s = enveloped, np.exp(log_work - enveloped)
        grids[name_] = KernelGrid(axis_names, sizes, latency_s, adjusted, log_rate,
                                  axis_log_factors(log_work))
    return KernelTable(name, grids)


def envelope_moe_log_rate(log_rate: np.ndarray, filled: np.ndarray) -> np.ndarray:
    """A fused-MoE grid's ln rates (tokens x etp x ep) made monotone as the kernel must be: a
    GPU never runs its experts slower for having more rows per expert (more tokens, same
    ep) or more local experts of as many rows (same tokens, smaller ep), since it could run
    that work as several launches of the smaller kernel, each at the smaller kernel's rate.
    So a measured point takes the best rate of the measured points it contains (fewer or as
    many tokens, as large or larger ep; the orthant maximum); a point no source row measured
    (`filled`, at constant throughput from a neighbour) is held between the measured points
    it contains and those that contain it; then the orthant maximum once more over all.
    The measured grids need it: TensorRT-LLM picks its tactic per shape, and some rows
    are several times slower than a kernel they contain (H100 bf16, 5120 x 8192 top-1 of
    16, 16,384 tokens: 132 TFLOP/s at ep 2, 8 local experts, against 767 at ep 4, 4 local
    experts of as many rows), and the grid's floor is what each row's routing of every
    token of the EP group costs on top of its local work (README "MoE", kernels/)."""
    measured = np.where(filled, -np.inf, log_rate)
    raised = _orthant_max(measured)
    upper = -_orthant_max(np.flip(np.flip(np.where(filled, -np.inf, -raised), 0), 2))
    upper = np.flip(np.flip(upper, 0), 2)
    held = np.minimum(np.maximum(log_rate, raised), upper)
    return _orthant_max(np.where(filled, held, raised))


def _orthant_max(log_rate: np.ndarray) -> np.ndarray:
    """At each point, the max over the points with no more tokens (axis 0) and no smaller ep
    (axis 2), at its own etp."""
    along_tokens = np.maximum.accumulate(log_rate, axis=0)
    return np.flip(np.maximum.accumulate(np.flip(along_tokens, 2), axis=2), 2)


def axis_log_factors(log_work: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each axis' ln work factor at its sizes, from the ln work of every grid point: along the
    axis through the grid's first point, less that point's (the first axis keeps it), so that
    a point's factors sum to its ln work (the work formulas are products of one factor per
    axis)."""
    origin = float(log_work.reshape(-1)[0])
    factors = []
    for a in range(log_work.ndim):
        line = log_work[tuple(slice(None) if b == a else 0 for b in range(log_work.ndim))]
        factors.append(line - (origin if a else 0.0))
    return tuple(factors)


def list_kernel_tables() -> list[str]:
    return sorted(p.stem for p in KERNEL_DIR.glob("*.npz"))


def _axis_names(grid: str) -> tuple[str, ...]:
    kind = grid.split(".")[0]
    return {"gemm": ("m", "n", "k"), "attention": ("batch", "seq", "heads", "head_dim"),
            "window": ("batch", "seq", "heads", "head_dim"), "mla": ("batch", "seq", "heads"),
            "moe": ("tokens", "etp", "ep")}[kind]


def _work(grid: str):
    kind = grid.split(".")[0]
    if kind == "window":  # window.<keys>.<mha|gqa>
        return functools.partial(window_attention_flop, window=int(grid.split(".")[1]))
    if kind != "moe":
        return WORK[kind]
    _, _, gated, shape = grid.split(".")
    hidden, inter, topk, _ = (int(x) for x in shape.split("x"))
    return functools.partial(_moe_grid_work, hidden=hidden, inter=inter, topk=topk,
                             gated=gated == "gated")


def _moe_grid_work(tokens, etp, ep, *, hidden, inter, topk, gated):
    return moe_flop(tokens, etp, ep, hidden, inter, topk, gated)


def estimate_table_gemm_s(table: KernelTable, dtype: str, m, n, k) -> np.ndarray:
    """Seconds of one forward GEMM y[m,n] = x[m,k] W[n,k]^T in `dtype` (zero where m n k = 0).
    H100 bf16 8192^3: 1.10e12 FLOP at the measured 783 TFLOP/s = 1.40 ms.

    A size below the grid's smallest (256) costs as that size: such GEMMs no longer fill the
    GPU, so their latency, not their throughput, is what carries over (the source dropped
    them; kernel README "What was dropped")."""
    grid = table.grids[f"gemm.{dtype}"]
    floored = [np.maximum(np.asarray(x, dtype=float), axis[0]) for x, axis in
               zip((m, n, k), grid.sizes)]
    rate = np.exp(grid.interpolate_log_rate(*floored))
    return np.where(gemm_flop(m, n, k) > 0, gemm_flop(*floored) / rate, 0.0)


def estimate_table_quantize_s(table: KernelTable, dtype: str, m, k) -> np.ndarray:
    """Seconds the table's `dtype` GEMM rows spend quantizing their m x k input: the collector
    times a Linear with its dynamic activation quantization inside (kernel README "GEMM"), so
    the `dtype` row less the BF16 row at the grid's smallest n (256), where the GEMM itself is
    least, is that quantization (floored at 0); 0 for BF16 or without both grids. Worked
    number: H100 fp8, 16384 x 4096: 209 - 58 = 151 us, 7.6 B per element at the 3.35 TB/s
    HBM3 peak."""
    if dtype == "bfloat16" or not (table.has(f"gemm.{dtype}") and table.has("gemm.bfloat16")):
        return np.zeros(np.broadcast(np.asarray(m), np.asarray(k)).shape)
    n = float(table.grids[f"gemm.{dtype}"].sizes[1][0])
    return np.maximum(estimate_table_gemm_s(table, dtype, m, n, k)
                      - estimate_table_gemm_s(table, "bfloat16", m, n, k), 0.0)
