"""The fused-MoE lookups in the packaged kernel tables (solver.cost.kernels.kernels loads them, made
monotone in rows per expert and local experts: envelope_moe_log_rate): one GPU's routed
experts forward (estimate_table_moe_s) and backward (estimate_table_moe_backward_s), at the
work per GPU the query has however far beyond the measured grid, in the nearest listed shape
re-rated to the model's by the GEMM tables.

Work per kernel: MoE 2 (T k / ep) h (i / etp) g, g = 3 gated (SwiGLU), 2 non-gated
(solver.cost.kernels.kernels.moe_flop).
"""

from __future__ import annotations

import functools

import numpy as np

from solver.cost.kernels.kernels import (
    KernelGrid,
    KernelTable,
    envelope_moe_log_rate,
    estimate_table_gemm_s,
    gemm_flop,
    load_kernel_table,
    moe_flop,
)


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
    backward is (solver.cost.kernels.efficiency.estimate_gemm_backward_s); 2 where the table has no
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
