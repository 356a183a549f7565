"""Measured kernel times: interpolation in the packaged kernel tables (solver/catalog/kernels/,
AIConfigurator's TensorRT-LLM forward timings per GPU; what they hold and how they were built
is in that folder's README and benchmarks/build_kernel_tables.py). The attention lookups and
the published attention rates are solver.cost.kernels_attention's.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent.parent / "catalog" / "kernels"
MS = 1e-3
# The grids' head dims (benchmarks/build_kernel_tables.py) and MLA's fixed geometry.
MLA_QK_HEAD_DIM, MLA_V_HEAD_DIM = 192, 128


def gemm_flop(m, n, k):
    return 2.0 * np.asarray(m, dtype=float) * n * k


def attention_flop(batch, seq, heads, head_dim):
    seq = np.asarray(seq, dtype=float)
    return 2.0 * np.asarray(batch, dtype=float) * heads * seq * seq * head_dim


def window_attention_flop(batch, seq, heads, head_dim, window):
    """Causal attention over a sliding window of `window` keys: query i sees min(i + 1, w)
    keys, w - w (w - 1) / (2 s) on average (solver.spec.blocks.estimate_context_tokens), at
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
    """The packaged table `name` (a GpuSpec.kernel_table), loaded once per process."""
    path = KERNEL_DIR / f"{name}.npz"
    if not path.is_file():
        from solver.errors import InputError

        raise InputError(f"kernel_table '{name}': no packaged table {path.name} "
                         f"(known: {', '.join(list_kernel_tables())})")
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


def estimate_table_moe_s(table: KernelTable, dtype: str, *, hidden: int, inter: int, topk: int,
                         experts: int, gated: bool, tokens, etp, ep) -> np.ndarray | None:
    """Seconds of the table's fused MoE forward (routing from given logits, permutation, FC1,
    activation, FC2, un-permutation; no router GEMM, no all-to-all) on one GPU holding
    experts/ep experts split etp ways, for `tokens` tokens routed over all experts (the tokens
    of the ep x etp GPUs: each local expert gets tokens*topk/experts rows under balanced
    routing). None where the table has no MoE rows in `dtype`.

    The grid is looked up by rows per expert and local experts, never at a kernel with less
    work per GPU than the query's: the rate is the best of the grid's kernels that do the same
    work with no more rows per expert (the query's work as more local experts of fewer rows:
    a grouped GEMM may split an expert's rows into groups of its own), sampled where that line
    of constant work crosses the grid's token and ep sizes (_moe_line_samples), on a grid made
    monotone in both (envelope_moe_log_rate). Beyond the token edge (16,384 tokens of the EP
    group) the work per GPU is kept as more local experts of edge-sized rows; the rate of a
    kernel with more local experts than the model has, or more work than the query, is a
    bound only when it does no more work: a sample clamped onto more work is charged at the
    clamped kernel's latency. So, at a fixed number of token copies per GPU the seconds never
    grow with ep, and at fixed local experts the rate never falls as rows per expert grow.
    Worked number (GB200 fp8_block, DeepSeek-V3's 7168 x 2048 top-8 of 256, 4,096 tokens per
    GPU): at ep 8 (32,768 tokens, 1,024 rows on each of 32 experts) the rate is the grid's
    16,384 tokens at ep 4 (512 rows on each of 64 experts), 1,962 TFLOP/s, and so at ep 16 to
    64; the clamped lookup gave 1,765 at ep 8 and 853 at ep 64.

    A model whose shape the table lacks takes the nearest listed shape in (log hidden, log
    inter, log experts/topk), at the same rows per expert and local experts, times what the
    table's plain GEMMs say the shape change is worth at each grid point (_model_moe_grid).
    Worked number (H100, bf16): gpt-oss-120b (2880 x 2880, top-4 of 128) takes the 4096 x
    2048 top-8 of 256 shape (same experts per top-k); at 1024 rows per expert its GEMMs run
    at 705 against 732 TFLOP/s, so its fused MoE at 0.963 of that shape's rate."""
    samples = _moe_line_samples(table, dtype, hidden, inter, topk, experts, gated, tokens, etp,
                                ep)
    if samples is None:
        return None
    seconds, _, use = samples
    return np.where(use, seconds, np.inf).min(axis=0)


def estimate_table_moe_backward_s(table: KernelTable, dtype: str, *, hidden: int, inter: int,
                                  topk: int, experts: int, gated: bool, tokens, etp, ep
                                  ) -> np.ndarray | None:
    """Seconds of the backward of estimate_table_moe_s's fused MoE: each kernel on its line of
    constant work (estimate_table_moe_s) times the GEMM table's backward over forward time of
    one expert's two GEMMs at that kernel's rows per expert (estimate_expert_backward_ratio),
    the least of them: the backward's grouped GEMMs split an expert's rows into groups as the
    forward's can (the weight gradient sums the groups' partial products). So it too never
    grows with ep at a fixed number of token copies per GPU. None where the table has no MoE
    rows in `dtype`."""
    samples = _moe_line_samples(table, dtype, hidden, inter, topk, experts, gated, tokens, etp,
                                ep)
    if samples is None:
        return None
    seconds, rows, use = samples
    ratio = estimate_expert_backward_ratio(
        table, dtype, rows=rows, hidden=hidden, inter=inter,
        etp=np.broadcast_to(np.asarray(etp, dtype=float), rows.shape[1:]), gated=gated)
    return np.where(use, seconds * ratio, np.inf).min(axis=0)


def _nearest_moe_shape(table: KernelTable, dtype: str, hidden: int, inter: int, topk: int,
                       experts: int, gated: bool) -> str | None:
    """The listed MoE grid in `dtype` nearest the model's shape in (log hidden, log inter,
    log experts/topk); None without one."""
    prefix = f"moe.{dtype}.{'gated' if gated else 'nongated'}."

    def distance(name: str) -> float:
        h, i, k, e = (int(x) for x in name.removeprefix(prefix).split("x"))
        return (abs(np.log(h / hidden)) + abs(np.log(i / inter))
                + abs(np.log((e / k) / (experts / topk))))

    shapes = [name for name in table.grids if name.startswith(prefix)]
    return min(shapes, key=distance) if shapes else None


def _moe_line_samples(table: KernelTable, dtype: str, hidden: int, inter: int, topk: int,
                      experts: int, gated: bool, tokens, etp, ep
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(seconds, rows per expert, whether used) of the kernels that do the query's work on its
    line of constant work, (samples, *query shape) each (estimate_table_moe_s), in the nearest
    listed shape re-rated to the model's; None without a listed shape in `dtype`."""
    name = _nearest_moe_shape(table, dtype, hidden, inter, topk, experts, gated)
    if name is None:
        return None
    _, _, k_, e_ = (int(x) for x in name.split(".")[3].split("x"))
    grid = _model_moe_grid(table, dtype, name, hidden, inter, gated)
    tokens, etp, ep = np.broadcast_arrays(np.asarray(tokens, dtype=float),
                                          np.asarray(etp, dtype=float),
                                          np.asarray(ep, dtype=float))
    shape = tokens.shape
    # The same rows per expert (tokens*topk/experts) and local experts (experts/ep) in the
    # listed shape.
    listed_tokens = tokens.reshape(-1) * topk * e_ / (experts * k_)
    log_rate, sample_tokens, use = _moe_line_log_rates(grid, listed_tokens, etp.reshape(-1),
                                                       ep.reshape(-1) * e_ / experts)
    work = moe_flop(tokens, etp, ep, hidden, inter, topk, gated).reshape(1, -1)
    seconds = np.where(work > 0, work / np.exp(log_rate), 0.0)
    rows = sample_tokens * k_ / e_
    samples = (len(seconds), *shape)
    return seconds.reshape(samples), rows.reshape(samples), use.reshape(samples)


def _moe_line_log_rates(grid: KernelGrid, tokens: np.ndarray, etp: np.ndarray, ep: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ln rate, tokens, whether used) of the kernels on the line of constant work per GPU
    through `tokens` x `etp` x `ep` (the grid's own coordinates, flat arrays) at no more
    tokens: where the line crosses each token size and each ep size of the grid
    (estimate_table_moe_s). A sample clamped onto a kernel with more work than its own (fewer
    tokens than the grid's least, ep or etp beyond the grid's largest) runs at that kernel's
    latency. Without any sample (fewer tokens than the grid's least at an ep below its least)
    the query itself, clamped the same way."""
    token_sizes = grid.sizes[0].astype(float)[:, None]
    ep_sizes = grid.sizes[2].astype(float)[:, None]
    sample_tokens = np.concatenate([np.broadcast_to(token_sizes, (len(token_sizes), tokens.size)),
                                    tokens.reshape(1, -1) * ep_sizes / ep.reshape(1, -1),
                                    tokens.reshape(1, -1)])
    sample_ep = np.concatenate([ep.reshape(1, -1) * token_sizes / tokens.reshape(1, -1),
                                np.broadcast_to(ep_sizes, (len(ep_sizes), ep.size)),
                                ep.reshape(1, -1)])
    on_line = np.concatenate([token_sizes <= tokens.reshape(1, -1),
                              ep_sizes <= ep.reshape(1, -1)])
    fallback = ~on_line.any(axis=0)
    use = np.concatenate([on_line, fallback[None, :]])
    etp_row = etp.reshape(1, -1)
    log_rate = grid.interpolate_log_rate(sample_tokens, etp_row, sample_ep)
    clamped = [np.clip(x, float(sizes[0]), float(sizes[-1])) for x, sizes in
               zip((sample_tokens, etp_row, sample_ep), grid.sizes)]
    # Work per GPU goes as tokens / (ep etp): the clamped kernel's over the sample's.
    more_work = (clamped[0] / sample_tokens) * (sample_ep / clamped[2]) * (etp_row / clamped[1])
    return log_rate - np.log(np.maximum(more_work, 1.0)), sample_tokens, use


@functools.lru_cache(maxsize=256)
def _model_moe_grid(table: KernelTable, dtype: str, name: str, hidden: int, inter: int,
                    gated: bool) -> KernelGrid:
    """The listed MoE grid `name` re-rated to a model's (hidden, inter): at each grid point its
    rate times the table's plain-GEMM rate of one expert's FC1 and FC2 at the model's shape
    over that at the listed shape, both at the point's rows per expert and etp
    (_expert_gemm_rate; the fused kernel is those two grouped GEMMs plus permutation, so its
    shape efficiency is theirs), then made monotone again (envelope_moe_log_rate, nothing
    filled). The listed grid itself where the shape is listed or the table has no GEMMs in
    `dtype`."""
    grid = table.grids[name]
    h_, i_, k_, e_ = (int(x) for x in name.split(".")[3].split("x"))
    if (h_, i_) == (hidden, inter) or not table.has(f"gemm.{dtype}"):
        return grid
    rows = grid.sizes[0].astype(float)[:, None] * k_ / e_
    etp = grid.sizes[1].astype(float)[None, :]
    factor = (_expert_gemm_rate(table, dtype, rows, hidden, inter, etp, gated)
              / _expert_gemm_rate(table, dtype, rows, h_, i_, etp, gated))
    log_rate = envelope_moe_log_rate(grid.log_rate + np.log(factor)[:, :, None],
                                     np.zeros(grid.log_rate.shape, dtype=bool))
    return KernelGrid(grid.axis_names, grid.sizes, grid.latency_s * np.exp(grid.log_rate - log_rate),
                      grid.adjusted | (log_rate != grid.log_rate), log_rate, grid.log_factors)


def _expert_gemm_rate(table: KernelTable, dtype: str, rows, hidden: int, inter: int, etp,
                      gated: bool) -> np.ndarray:
    """FLOP/s of one expert's FC1 (rows x hidden -> g inter/etp, g = 2 gated) and FC2
    (rows x inter/etp -> hidden) as the table's plain GEMMs in `dtype`."""
    width = np.asarray(inter, dtype=float) / np.asarray(etp, dtype=float)
    up = (2.0 if gated else 1.0) * width
    seconds = (estimate_table_gemm_s(table, dtype, rows, up, hidden)
               + estimate_table_gemm_s(table, dtype, rows, hidden, width))
    return (gemm_flop(rows, up, hidden) + gemm_flop(rows, hidden, width)) / seconds


def estimate_expert_backward_ratio(table: KernelTable, dtype: str, *, rows, hidden: int,
                                   inter: int, etp, gated: bool) -> np.ndarray:
    """Backward over forward seconds of one expert's FC1 and FC2 at `rows` tokens, from the
    table's plain GEMMs: dgrad dx[m,k] = dy[m,n] W[n,k] is the table's (m, k, n), wgrad
    dW[n,k] = dy^T[n,m] x[m,k] its (n, k, m) (kernel README caveat 2), as the dense GEMMs'
    backward is (solver.cost.efficiency.estimate_gemm_backward_s); 2 where the table has no
    GEMMs in `dtype`. The wgrad's reduction over the expert's few rows is what lifts it above
    2: H100 fp8, Qwen3-30B-A3B's experts (h 2048, i 768) at 1024 rows: 2.08; DeepSeek-V3's
    (7168, 2048) at 2048 rows: 2.22."""
    rows, etp = np.broadcast_arrays(np.asarray(rows, dtype=float), np.asarray(etp, dtype=float))
    if not table.has(f"gemm.{dtype}"):
        return np.full(rows.shape, 2.0)
    # A few distinct (rows, etp) among the candidates, the same ones call after call in a
    # search: look each set up once.
    pairs, back = np.unique(np.stack([rows.ravel(), etp.ravel()], axis=1), axis=0,
                            return_inverse=True)
    ratios = _expert_backward_ratios(table.name, dtype, pairs.tobytes(), hidden, inter, gated)
    return np.asarray(ratios)[back.ravel()].reshape(rows.shape)


@functools.lru_cache(maxsize=1024)
def _expert_backward_ratios(table_name: str, dtype: str, pairs_bytes: bytes, hidden: int,
                            inter: int, gated: bool) -> tuple[float, ...]:
    table = load_kernel_table(table_name)
    pairs = np.frombuffer(pairs_bytes).reshape(-1, 2)
    m, width = pairs[:, 0], inter / pairs[:, 1]
    up = (2.0 if gated else 1.0) * width
    forward = (estimate_table_gemm_s(table, dtype, m, up, hidden)
               + estimate_table_gemm_s(table, dtype, m, hidden, width))
    dgrad = (estimate_table_gemm_s(table, dtype, m, hidden, up)
             + estimate_table_gemm_s(table, dtype, m, width, hidden))
    wgrad = (estimate_table_gemm_s(table, dtype, up, hidden, m)
             + estimate_table_gemm_s(table, dtype, hidden, width, m))
    return tuple(float(r) for r in (dgrad + wgrad) / forward)
