"""Does `parplan estimate --plan FILE` give every plan of a zoo sweep its own numbers? (issue 35,
item 5: "estimate --plan reproduces every plan of a sweep of the zoo on two presets and two
scales").

For each zoo model, preset and GPU count: `optimize --json --top K`, then `estimate --plan
FILE --rank k --json` of each plan, and the plan's fields compared (the search's own fields
apart: equivalent, memory_savers, recompute_modules, offloads). A plan is counted identical,
or as differing in memory, or in step time only; the step time of a plan that turns memory
savers on is costed without them by `optimize` and with them by `estimate` (issue 35 drift
3), so those are counted apart. Prints the plans that differ and the counts.

    PYTHONPATH=. python benchmarks/estimate_plan_roundtrip.py --clusters dgx-h100,dgx-a100-80gb \\
        --gpus 64,512
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import tempfile
from pathlib import Path

from click.testing import CliRunner

from solver.catalog import list_zoo_names
from solver.cli import cli

SEARCH_FIELDS = {"equivalent", "memory_savers", "recompute_modules", "offloads"}
TIME_FIELDS = {"step_seconds", "tokens_per_second", "tokens_per_second_per_gpu",
               "tflops_per_gpu", "mfu", "time_seconds", "train_days", "gpu_hours"}


def classify(plan: dict, estimated: dict) -> tuple[str, list[str]]:
    """How the estimate of `plan` compares with it, and the fields that differ."""
    differ = [k for k in plan if k not in SEARCH_FIELDS and plan[k] != estimated.get(k)]
    if any(k not in TIME_FIELDS for k in differ):
        return "memory differs", differ
    if differ:
        saver = "savers, drift 3" if plan.get("memory_savers") else "no savers"
        return f"time differs ({saver})", differ
    return "identical", differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None, help="comma-separated; default: the zoo")
    parser.add_argument("--clusters", default="dgx-h100,dgx-a100-80gb")
    parser.add_argument("--gpus", default="64,512")
    parser.add_argument("--top", type=int, default=2)
    parser.add_argument("--time-limit", default="3")
    args = parser.parse_args()
    models = args.models.split(",") if args.models else list_zoo_names()
    counts: collections.Counter[str] = collections.Counter()
    folder = Path(tempfile.mkdtemp(prefix="plan-roundtrip-"))
    runner = CliRunner()
    for model, cluster, gpus in itertools.product(models, args.clusters.split(","),
                                                  args.gpus.split(",")):
        problem = ["--model", model, "--cluster", cluster, "--gpus", gpus]
        result = runner.invoke(cli, ["optimize", *problem, "--top", str(args.top),
                                     "--time-limit", args.time_limit, "--json"])
        if result.exit_code:
            counts["optimize error"] += 1
            continue
        path = folder / f"{model}-{cluster}-{gpus}.json"
        path.write_text(result.stdout, encoding="utf-8")
        plans = json.loads(result.stdout)["plans"]
        counts["infeasible problems"] += not plans
        for rank, plan in enumerate(plans, 1):
            again = runner.invoke(cli, ["estimate", "--plan", str(path), "--rank", str(rank),
                                        "--json"])
            if again.exit_code:
                counts["estimate error"] += 1
                print(model, cluster, gpus, rank, "estimate error:", again.output.strip())
                continue
            kind, differ = classify(plan, json.loads(again.stdout)["plans"][0])
            counts[kind] += 1
            if kind != "identical" and "drift 3" not in kind:
                print(model, cluster, gpus, rank, kind, differ)
    print(dict(counts))


if __name__ == "__main__":
    main()
