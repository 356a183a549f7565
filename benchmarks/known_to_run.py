"""The "known to run" table (issue 17): every published run predicted to fit or not.

    .venv/bin/python benchmarks/known_to_run.py [--json]

Every run of benchmarks/data/published_runs.jsonl that benchmarks/published.py maps, and every
row its source reports out of memory (status "oom", mapped by the same rules), is estimated
with `solver.cost.memory.estimate_memory` under its own framework's profile
(time_accuracy.SOURCE_FRAMEWORKS: Megatron-LM and Megatron-Bridge -> megatron, BLOOM ->
deepspeed with the 2022 Megatron-DeepSpeed options of memory_accuracy.bloom_memory_options,
LLM Foundry -> generic) and its stated configuration (degrees, ZeRO stage, micro-batch,
recompute, precision). Printed: per run whether the worst stage fits the GPU's memory, its GB
against the capacity; the share of runs that ran predicted to fit (issue 17 asks for at least
98%), the out-of-memory rows predicted not to fit, and every miss with its largest item.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_accuracy import bloom_memory_options  # noqa: E402
from published import DATA_PATH, PublishedRun, _map_row, _Unmappable  # noqa: E402
from time_accuracy import BLOOM_BF16_OPTIMIZER_FROM, SOURCE_FRAMEWORKS  # noqa: E402

from solver.cost.candidates import Candidates  # noqa: E402
from solver.cost.frameworks import build_framework_profile  # noqa: E402
from solver.cost.memory import ITEMS, MemoryOptions, estimate_memory  # noqa: E402

GIB = 2**30


@dataclass(frozen=True)
class KnownRun:
    """One run's verdict: predicted worst-stage bytes against the GPU's capacity."""

    run: PublishedRun
    ran: bool  # False: the source reports it out of memory
    predicted_bytes: float
    capacity_bytes: float
    largest_item: str
    largest_item_bytes: float

    @property
    def fits(self) -> bool:
        return self.predicted_bytes <= self.capacity_bytes


def load_known_runs(path: Path = DATA_PATH) -> tuple[list[tuple[PublishedRun, bool]],
                                                     list[tuple[str, str]]]:
    """(run, ran) for every mappable row, ok or out of memory; (id, reason) for the others.
    An out-of-memory row measured nothing: it goes through published.py's mapping with a
    placeholder throughput (0), which this table never reads."""
    runs, skipped = [], []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        ran = row["status"] == "ok"
        if row["status"] == "oom":
            row = {**row, "status": "ok", "tokens_per_sec_per_gpu": 0.0}
        try:
            runs.append((_map_row(row), ran))
        except _Unmappable as exc:
            skipped.append((row["id"], str(exc)))
    return runs, skipped


def run_memory_options(run: PublishedRun) -> MemoryOptions:
    """The run's framework profile's memory options, from its stated era for BLOOM."""
    base = None
    if run.source_group == "bloom":
        date = run.id.split("-")[1]
        base = bloom_memory_options(not (date.isdigit() and date < BLOOM_BF16_OPTIMIZER_FROM))
    return build_framework_profile(SOURCE_FRAMEWORKS[run.source_group]).memory_options(base)


def evaluate_known_run(run: PublishedRun, ran: bool) -> KnownRun:
    candidates = Candidates.from_configs([run.parallel])
    breakdown = estimate_memory(run.model_spec, run.job, candidates, run_memory_options(run))
    items = {name: float(breakdown.items[name][0]) for name in ITEMS}
    largest = max(items, key=items.__getitem__)
    return KnownRun(run=run, ran=ran, predicted_bytes=float(breakdown.total[0]),
                    capacity_bytes=run.cluster.gpu.memory_gib * GIB, largest_item=largest,
                    largest_item_bytes=items[largest])


def summarize(results: list[KnownRun]) -> dict[str, Any]:
    ran = [r for r in results if r.ran]
    oom = [r for r in results if not r.ran]
    fit = sum(r.fits for r in ran)
    return {
        "num_ran": len(ran), "num_ran_fit": fit,
        "percent_ran_fit": 100.0 * fit / len(ran) if ran else float("nan"),
        "num_oom": len(oom), "num_oom_predicted_oom": sum(not r.fits for r in oom),
        "misses": [_row(r) for r in results if r.fits != r.ran],
        "rows": [_row(r) for r in results],
    }


def _row(result: KnownRun) -> dict[str, Any]:
    run = result.run
    return {"id": run.id, "group": run.source_group, "gpu": run.gpu,
            "precision": run.precision, "degrees": _degrees(run), "ran": result.ran,
            "fits": result.fits, "predicted_gb": result.predicted_bytes / 1e9,
            "capacity_gb": result.capacity_bytes / 1e9, "largest_item": result.largest_item,
            "largest_item_gb": result.largest_item_bytes / 1e9}


def _degrees(run: PublishedRun) -> str:
    p = run.parallel
    return (f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} ep{p.ep} vpp{p.vpp} z{p.zero} "
            f"mb{p.micro_batch} {p.recompute}")


def render(summary: dict[str, Any], skipped: list[tuple[str, str]], console: Console) -> None:
    table = Table(title="Known to run: worst stage against capacity (GB)")
    for column in ("run", "source", "gpu", "prec", "configuration", "pred GB", "cap GB",
                   "source says", "predicted"):
        table.add_column(column, justify="right" if "GB" in column else "left")
    for row in summary["rows"]:
        agree = row["fits"] == row["ran"]
        style = "" if agree else "bold red"
        table.add_row(row["id"], row["group"], row["gpu"], row["precision"], row["degrees"],
                      f"{row['predicted_gb']:.1f}", f"{row['capacity_gb']:.1f}",
                      "ran" if row["ran"] else "OOM", "fits" if row["fits"] else "OOM",
                      style=style)
    console.print(table)
    misses = Table(title="Misses: the tool disagrees with the source")
    for column in ("run", "configuration", "source says", "pred GB", "cap GB", "largest item",
                   "item GB"):
        misses.add_column(column)
    for row in summary["misses"]:
        misses.add_row(row["id"], row["degrees"], "ran" if row["ran"] else "OOM",
                       f"{row['predicted_gb']:.1f}", f"{row['capacity_gb']:.1f}",
                       row["largest_item"], f"{row['largest_item_gb']:.1f}")
    console.print(misses)
    console.print(f"{summary['num_ran_fit']} of {summary['num_ran']} runs that ran predicted "
                  f"to fit ({summary['percent_ran_fit']:.1f}%); "
                  f"{summary['num_oom_predicted_oom']} of {summary['num_oom']} out-of-memory rows "
                  f"predicted not to fit; {len(skipped)} rows not mapped")


def main(argv: list[str]) -> None:
    runs, skipped = load_known_runs()
    summary = summarize([evaluate_known_run(run, ran) for run, ran in runs])
    if "--json" in argv:
        print(json.dumps({**summary, "skipped": skipped}, indent=2))
        return
    render(summary, skipped, Console(width=200))


if __name__ == "__main__":
    main(sys.argv[1:])
