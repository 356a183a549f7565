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
from time_accuracy import (  # noqa: E402
    BLOOM_BF16_OPTIMIZER_FROM,
    SOURCE_FRAMEWORKS,
    run_profile,
)

from solver.cost.candidates import Candidates  # noqa: E402
from solver.cost.step.frameworks import build_framework_profile  # noqa: E402
from solver.cost.memory import ITEMS, MemoryOptions, estimate_memory  # noqa: E402
from solver.spec.profiles import BRIDGE_RECIPE_FEATURES, resolve_profile  # noqa: E402

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


# LLM Foundry's MPT loss (llmfoundry/models/mpt/modeling_mpt.py, loss_fn defaults to
# 'fused_crossentropy' at mosaicml/llm-foundry@4952183, lines 1000-1006): flash-attn's
# CrossEntropyLoss(inplace_backward=False) saves the bf16 logits and the log-sum-exp, and its
# backward allocates a new bf16 gradient (flash_attn/losses/cross_entropy.py): 2 + 2 B per
# logit, not the 6 of Megatron's fp32 copy.
LLM_FOUNDRY_LOGITS_BYTES = 4.0
# Megatron-Bridge's performance recipes reduce gradients in bf16: `_benchmark_common` sets
# cfg.ddp.grad_reduce_in_fp32 = False and `_perf_precision` mixed_precision.grad_reduce_in_fp32
# = False (src/megatron/bridge/perf_recipes/_common.py @067f987; `grad_reduce_in_fp32: false`
# in every perf config since the first perf scripts, #403, 2025-08-28, before the archive's
# first release 25.09): Megatron's --grad-reduce-in-bf16.
# They compute the loss with Transformer Engine's fused cross-entropy
# (cross_entropy_fusion_impl "te": the 25.09 configs/*.yaml @ad151f3, _benchmark_common @067f987;
# cross_entropy_loss_fusion defaults to True in GPTModelProvider), whose backward writes the
# gradient into the logits tensor in place (transformer_engine/pytorch/triton/cross_entropy.py
# cross_entropy_backward_kernel: "performed in-place on the tensor pointed by X_ptr"): the bf16
# logits only, 2 B per logit (loss_implementation "fused", solver.cost.memory.loss). Both are
# the megatron-bridge profile's (solver.spec.profiles.BRIDGE_RECIPE_FEATURES).
MEGATRON_BRIDGE_RECIPE_FEATURES = {name: BRIDGE_RECIPE_FEATURES[name]
                                   for name in ("grad_reduce_in_bf16", "loss_implementation")}
# Their fp8 mixed-precision recipes keep fp8 parameters (--fp8-param-gather: megatron/bridge/
# training/mixed_precision.py bf16_with_fp8_current_scaling_mixed, bf16_with_fp8_delayed_
# scaling_mixed and bf16_with_mxfp8_mixed set fp8_param_gather = True), applied to low-precision
# rows in run_memory_options.
# Their MoE benchmarks "force-balance the token distribution among experts" (the tables'
# footnote; moe_router_force_load_balancing in the recipes): the busiest GPU gets the average.
BALANCED_ROUTING_CAPACITY = 1.0
# Why a run the source reports is still missed (shown with the misses).
KNOWN_MISSES = {
    "mb-archive-25.11-H100-GPT_OSS_120B-BF16-64g-235":
        "the row's MBS 4 contradicts its own GBS 512 = MBS x GA 2 x DP 16; the 25.11 recipe "
        "(configs/gpt_oss/workload_base_configs.py @da98070) runs MBS 1: 65.4 GB predicted "
        "without recompute, it fits",
    "bloom-0228-206B-19":
        "BLOOM 206B (h 14336, 82 layers, tp 4 pp 12 mb 2) OOM at 66.6 GB predicted, as its "
        "neighbours that ran: 203B (h 13312, 94 layers, same degrees) predicted 66.7, measured "
        "67 GB; 176B (h 14336, 70 layers) measured 60 GB, and one more layer on the first stage "
        "adds 616.6M x 9.5 B = 5.9 GB of states and 12 x 117 MB = 1.4 GB of checkpointed "
        "inputs: 67.3 GB. No steady-state item separates it from the 203B row; the source "
        "records no memory (no snapshot), so the OOM came from something the steady state "
        "does not hold (not fitted to this row)",
}


def run_memory_options(run: PublishedRun) -> MemoryOptions:
    """The run's framework profile's memory options with what its source states: BLOOM's
    era, LLM Foundry's fused cross-entropy, Megatron-Bridge's bf16 gradient reduction."""
    base, features = None, {}
    if run.source_group == "bloom":
        date = run.id.split("-")[1]
        base = bloom_memory_options(not (date.isdigit() and date < BLOOM_BF16_OPTIMIZER_FROM))
    elif run.source_group == "llm-foundry":
        base = MemoryOptions(logits_bytes=LLM_FOUNDRY_LOGITS_BYTES)
    elif run.source_group == "megatron-bridge":
        # The recompute the tables do not state, from the release's recipe
        # (its megatron-bridge@<release> profile, solver.spec.profiles: DeepSeek-V3 on H100 at
        # 25.09 recomputes mla_up_proj and mlp under selective granularity).
        recipe = resolve_profile(run_profile(run), run.model_spec.name).features
        features = {**MEGATRON_BRIDGE_RECIPE_FEATURES,
                    "fp8_param_gather": run.precision != "bf16",
                    **({"recompute_modules": recipe["recompute_modules"]}
                       if "recompute_modules" in recipe else {})}
        base = MemoryOptions(moe_capacity_factor=BALANCED_ROUTING_CAPACITY)
    profile = build_framework_profile(SOURCE_FRAMEWORKS[run.source_group], features)
    return profile.memory_options(base)


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
            "largest_item_gb": result.largest_item_bytes / 1e9,
            "why": KNOWN_MISSES.get(run.id, f"largest item {result.largest_item}")}


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
                   "item GB", "why"):
        misses.add_column(column)
    for row in summary["misses"]:
        misses.add_row(row["id"], row["degrees"], "ran" if row["ran"] else "OOM",
                       f"{row['predicted_gb']:.1f}", f"{row['capacity_gb']:.1f}",
                       row["largest_item"], f"{row['largest_item_gb']:.1f}", row["why"])
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
