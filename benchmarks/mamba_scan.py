"""The Mamba-2 SSD scan's achieved share of the tensor-core peak (solver.cost.layers.blocks
SSD_SCAN_PEAK_FRACTION), from measured forward latencies.

    .venv/bin/python benchmarks/mamba_scan.py [--min-tokens T]

Data: benchmarks/data/b200_mamba_chunk_scan.csv, the `mamba_chunk_scan_combined` rows of
shared/data/kernels/b200_sxm/mamba2.csv (AIConfigurator, TensorRT-LLM 1.3.0rc15, B200; the only
GPU with scan timings, see that folder's README). For every row: the scan's FLOPs under
solver.cost.layers.blocks.estimate_mixer_core_flops (Dao & Gu 2024 §6) over the measured latency, as a
share of the B200's dense bf16 peak. Printed: per model and token count, and the median over
the rows with at least --min-tokens tokens (a training micro-batch's rows; smaller launches are
latency-bound), which is the one constant the cost model takes. Nothing else is fitted.
"""

from __future__ import annotations

import argparse
import csv
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from solver.catalog import load_gpu_spec
from solver.cost.layers.blocks import SSD_SCAN_PEAK_FRACTION, estimate_mixer_core_flops
from solver.spec import ModelSpec

DATA = Path(__file__).resolve().parent / "data" / "b200_mamba_chunk_scan.csv"


def scan_spec(row: dict[str, str]) -> ModelSpec:
    """A one-layer Mamba model of the row's shape (only the mixer's sizes matter)."""
    heads, head_dim = int(row["nheads"]), int(row["head_dim"])
    return ModelSpec(name="scan", hidden_size=int(row["d_model"]), intermediate_size=1,
                     num_hidden_layers=1, num_attention_heads=1, vocab_size=1,
                     layer_types=("mamba",), mlp_layer_types=("none",),
                     mamba_num_heads=heads, mamba_head_dim=head_dim,
                     n_groups=int(row["n_groups"]), ssm_state_size=int(row["d_state"]),
                     chunk_size=int(row["chunk_size"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-tokens", type=int, default=8192)
    args = parser.parse_args()
    peak = load_gpu_spec("b200").peak_flop_per_s("bf16")
    table = Table(title="Mamba-2 chunk scan on B200: achieved share of the bf16 peak")
    for column in ("model", "tokens", "seq", "measured ms", "TFLOP/s", "share of peak"):
        table.add_column(column, justify="right")
    shares = []
    with DATA.open() as handle:
        for row in csv.DictReader(handle):
            tokens = int(row["num_tokens"])
            flops = tokens * estimate_mixer_core_flops(scan_spec(row), "mamba",
                                                       int(row["seq_len"]))
            seconds = float(row["latency_ms"]) * 1e-3
            share = flops / seconds / peak
            if tokens >= args.min_tokens:
                shares.append(share)
            table.add_row(row["model_name"].split("/")[-1], f"{tokens:,}", row["seq_len"],
                          f"{seconds * 1e3:.3f}", f"{flops / seconds / 1e12:.1f}",
                          f"{share:.4f}")
    console = Console()
    console.print(table)
    console.print(f"median share over {len(shares)} rows with >= {args.min_tokens:,} tokens: "
                  f"{statistics.median(shares):.4f} (solver.cost.layers.blocks.SSD_SCAN_PEAK_FRACTION "
                  f"= {SSD_SCAN_PEAK_FRACTION})")


if __name__ == "__main__":
    main()
