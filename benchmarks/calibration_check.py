"""Does calibrating on one real run help predict the others (issue 36 item 5)?

    .venv/bin/python benchmarks/calibration_check.py

Where a public source measured several configurations on one cluster and framework
(benchmarks/data/published_runs.jsonl: BLOOM's days on Jean Zay's A100s, LLM Foundry's GPU and
micro-batch sweeps, Megatron-Bridge's release tables), each run in turn is the "one real run":
`calibrate training-log`'s update (solver.calibrate.scales.fit_scales: the error model's
priors for the run's category, the measured step with no noise since a published figure is
one number) is applied to every other run of the same group (solver.cost.uncertainty.
estimate_calibrated_step). A group is one source family, one GPU and one error-model category
(arch / framework / GPU generation / precision: what a calibration is keyed by); the first
tables take one model's sweep (benchmarks/time_accuracy.py sweep_keys: one source, model and
GPU, the parallel configuration varied): what a user who calibrates on one run of the model
and then searches its configurations gets. Printed per group, over every (calibrated-on,
predicted) pair:
  median |error|   |log(measured / predicted)| before (the cost model) and after (scaled)
  coverage         the share of the others inside their 80% interval: the error model's
                   (estimate_step_sigma) before, the posterior's after
  median width     (high - low) / point of those intervals
Priors: "shipped" is solver/catalog/error_model.json, fitted on every row (these too: the
in-sample view); "held out" refits the error model without the group's source family
(benchmarks/error_model.py fit_time), the honest view of a user's cluster the fit never saw.
Groups of fewer than MIN_GROUP_ROWS runs are left out. Nothing here is fitted to make the
table look better; the numbers are what the update gives.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import memory_accuracy  # noqa: E402
from error_model import BLOOM_MEMORY_PROFILE, LEVEL, _as_arrays, fit_plain, fit_time  # noqa: E402
from error_model import load_memory_rows as load_error_model_memory_rows  # noqa: E402
from memory_public import FRAMEWORK_PROFILE, summarize_public  # noqa: E402
from published import load_published_runs  # noqa: E402
from time_accuracy import SOURCE_FRAMEWORKS, estimate_runs, sweep_keys  # noqa: E402

from solver.calibrate.scales import build_prior_scales, fit_scales  # noqa: E402
from solver.cost.uncertainty import (  # noqa: E402
    TIME_GROUPS,
    ErrorModel,
    build_error_model,
    estimate_calibrated_step,
    estimate_step_sigma,
    interval_z,
    load_error_model,
    time_category,
)

MIN_GROUP_ROWS = 3
# A memory row's id up to its model-size token ("titan-2412-t1-8b-fsdp" -> "titan-2412-t1-8b":
# one source table, model and GPU), else without its last token ("mem-bloom-0220-topo-3").
MODEL_SIZE = re.compile(r"^\d+(\.\d+)?[bB]$")


def load_rows() -> list[dict[str, Any]]:
    """Per public run: family, group key, category levels, error, TIME_PARTS seconds."""
    runs, _ = load_published_runs()
    rows = []
    for run, step in estimate_runs(runs):
        levels = time_category(SOURCE_FRAMEWORKS[run.source_group], run.arch_kind, run.gpu,
                               run.precision)
        keys = sweep_keys(run)
        # Megatron-Bridge's tables have no sweeps: one model's rows of its releases stand in;
        # Megatron-LM's weak-scaling table grows the model with the GPUs: one model each.
        # ("sweep" stays error_model.py's: its plan sigma pools within those.)
        base = keys[0] if keys else f"{run.source_group} {run.gpu} {run.precision} releases"
        name = run.model_spec.name
        model_group = base if name in base else f"{base}: {name}"
        rows.append({
            "family": run.source_group, "sweep": keys[0] if keys else None,
            "model_group": model_group, "levels": levels,
            "model": run.model_spec.name,
            "group": f"{run.source_group} {run.gpu} {'/'.join(levels)}",
            "framework": SOURCE_FRAMEWORKS[run.source_group],
            "error": math.log(step["tokens_per_s_per_gpu"] / run.tokens_per_sec_per_gpu),
            "parts": {name: step[name] for group in TIME_GROUPS.values() for name in group},
        })
    return rows


def check_group(rows: Sequence[dict[str, Any]], error_model: ErrorModel) -> dict[str, Any]:
    """Every (calibrated-on, predicted) pair of a group: errors, coverage, widths."""
    z = interval_z(LEVEL)
    before, after, covered_before, covered_after, width_before, width_after = ([] for _ in
                                                                               range(6))
    for anchor in rows:
        prior = build_prior_scales(error_model, anchor["framework"], anchor["levels"],
                                   anchor["model"])
        predicted = sum(anchor["parts"].values())
        posterior = fit_scales(prior, anchor["parts"], predicted * math.exp(anchor["error"]),
                               noise_sigma=0.0)
        for other in rows:
            if other is anchor:
                continue
            parts = _as_arrays(other["parts"])
            sigma0 = float(estimate_step_sigma(error_model, other["levels"], parts)[0])
            step, sigma = estimate_calibrated_step(posterior, parts)
            shifted = other["error"] - math.log(float(step[0]) / sum(other["parts"].values()))
            before.append(abs(other["error"]))
            after.append(abs(shifted))
            covered_before.append(abs(other["error"]) <= z * sigma0)
            covered_after.append(abs(shifted) <= z * float(sigma[0]))
            width_before.append(2 * math.sinh(z * sigma0))
            width_after.append(2 * math.sinh(z * float(sigma[0])))
    return {"rows": len(rows), "pairs": len(before),
            "error_before": float(np.median(before)), "error_after": float(np.median(after)),
            "coverage_before": float(np.mean(covered_before)),
            "coverage_after": float(np.mean(covered_after)),
            "width_before": float(np.median(width_before)),
            "width_after": float(np.median(width_after))}


def held_out_model(rows: Sequence[dict[str, Any]], family: str) -> ErrorModel:
    """The error model's time fit without `family`'s rows (error_model.fit_time)."""
    fit = fit_time([r for r in rows if r["family"] != family])
    return build_error_model({"time": fit, "memory": {"sigma": {"": 1.0}},
                              "serve": {"sigma": {"": 1.0}}})


def render_table(title: str, table: Sequence[tuple[str, dict[str, Any]]]) -> None:
    print(f"\n{title}: calibrated on one run, predicting the others of its group "
          f"({LEVEL:.0%} intervals)")
    print(f"| {'group (family, GPU, category)':52} | runs | pairs | median error before -> "
          "after | coverage before -> after | median width before -> after |")
    print(f"|{'-' * 54}|------|-------|------------------------------|"
          "--------------------------|-------------------------------|")
    for name, t in table:
        print(f"| {name:52} | {t['rows']:4d} | {t['pairs']:5d} | "
              f"{t['error_before']:12.1%} -> {t['error_after']:6.1%}       | "
              f"{t['coverage_before']:9.0%} -> {t['coverage_after']:4.0%}       | "
              f"{t['width_before']:13.0%} -> {t['width_after']:4.0%}         |")


def group_rows(rows: Sequence[dict[str, Any]], key: str) -> list[tuple[str, list[dict]]]:
    """Rows by `key` ("sweep" or "group"), groups of at least MIN_GROUP_ROWS, sorted."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row[key] is not None:
            groups[row[key]].append(row)
    return sorted((name, members) for name, members in groups.items()
                  if len(members) >= MIN_GROUP_ROWS)


def main() -> None:
    rows = load_rows()
    shipped = load_error_model()
    held = {family: held_out_model(rows, family) for family in {r["family"] for r in rows}}
    for key, what in (("model_group", "Same model and GPU (a source's sweep of configurations)"),
                      ("group", "Same GPU and category, other models too")):
        for prior, model_of in (("shipped prior, in-sample", lambda m: shipped),
                                ("held-out prior: refitted without the family",
                                 lambda m: held[m[0]["family"]])):
            grouped = group_rows(rows, key)
            table = [(name[:52], check_group(members, model_of(members)))
                     for name, members in grouped]
            families = [(family, check_group_pooled(
                [t for (name, members), t in zip(grouped, table)
                 if members[0]["family"] == family]))
                for family in sorted({members[0]["family"] for _, members in grouped})]
            render_table(f"{what}; {prior}",
                         [*table, *[(f"{f}: all (median of groups)", t) for f, t in families],
                          ("all (median of groups; coverage by pairs)",
                           check_group_pooled(table))])


def check_group_pooled(table: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """The groups' rows: medians of their medians, coverage weighted by pairs."""
    pairs = np.array([t["pairs"] for _, t in table], dtype=float)
    return {"rows": int(sum(t["rows"] for _, t in table)), "pairs": int(pairs.sum()),
            **{key: float(np.median([t[key] for _, t in table]))
               for key in ("error_before", "error_after", "width_before", "width_after")},
            **{key: float(np.average([t[key] for _, t in table], weights=pairs))
               for key in ("coverage_before", "coverage_after")}}


def load_memory_rows() -> list[dict[str, Any]]:
    """Per public memory row (error_model.load_memory_rows' rows): family, framework
    profile, table-and-model group (MODEL_SIZE), log(measured / predicted)."""
    rows = [(r["source"], FRAMEWORK_PROFILE[r["framework"]], r) for r in
            summarize_public()["rows"]]
    rows += [("bloom", BLOOM_MEMORY_PROFILE, r) for r in memory_accuracy.summarize(
        memory_accuracy.load_memory_cases())["rows"] if r["measured_gb"] is not None]
    out = []
    for family, profile, r in rows:
        tokens = r["id"].split("-")
        size = next((i for i, t in enumerate(tokens) if MODEL_SIZE.match(t)), None)
        group = "-".join(tokens[:size + 1] if size is not None else tokens[:-1])
        out.append({"family": family, "framework": profile, "group": group,
                    "error": math.log(r["measured_gb"] / r["predicted_gb"])})
    return out


def fit_memory_shared_share(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per framework profile ("" for every row), the share of the memory error's variance the
    plans of one source share (error_model.load_memory_rows: a source is one document's table
    or BLOOM's day): 1 - (the mean square of the errors less their source's mean, times
    n / (n - 1)) / (the mean square of the errors), clipped to [0, 1] (the method of moments
    of a source offset beside each row's own error); without a source of two rows, the
    root's. torchtitan's tables: within 0.029, total 0.110, share 0.93; BLOOM's days: 0.23."""
    sources: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        sources[row["source"]].append(row)
    within: dict[str, list[float]] = defaultdict(list)
    total: dict[str, list[float]] = defaultdict(list)
    for members in sources.values():
        mean, n = float(np.mean([r["error"] for r in members])), len(members)
        for r in members:
            for key in ("", r["levels"][0]):
                total[key].append(r["error"] ** 2)
                if n > 1:
                    within[key].append((r["error"] - mean) ** 2 * n / (n - 1))
    return {key: min(1.0, max(0.0, 1.0 - float(np.mean(within[key]) / np.mean(total[key]))))
            for key in total if within[key] or key == ""}


def check_memory_group(rows: Sequence[dict[str, Any]], error_model: ErrorModel,
                       shares: dict[str, float]) -> dict[str, Any]:
    """As check_group, for the memory scale with `shares` of its variance shared (per
    framework profile, "" for the rest: fit_memory_shared_share; solver.calibrate.scales
    uses none, MEMORY_SHARED_SHARE)."""
    z = interval_z(LEVEL)
    stats: dict[str, list[float]] = defaultdict(list)
    zero = {name: 0.0 for group in TIME_GROUPS.values() for name in group} | {"compute": 1.0}
    for anchor in rows:
        prior = build_prior_scales(error_model, anchor["framework"], ("dense",), "m",
                                   memory_shared_share=shares.get(anchor["framework"],
                                                                  shares[""]))
        posterior = fit_scales(prior, zero, 1.0, 0.0, math.exp(anchor["error"]), 1.0)
        sigma0 = math.hypot(prior.memory_log_sigma, prior.memory_plan_sigma)
        sigma = math.hypot(posterior.memory_log_sigma, posterior.memory_plan_sigma)
        for other in rows:
            if other is not anchor:
                shifted = other["error"] - posterior.memory_log_mean
                stats["before"].append(abs(other["error"]))
                stats["after"].append(abs(shifted))
                stats["covered_before"].append(abs(other["error"]) <= z * sigma0)
                stats["covered_after"].append(abs(shifted) <= z * sigma)
                stats["width_before"].append(2 * math.sinh(z * sigma0))
                stats["width_after"].append(2 * math.sinh(z * sigma))
    return {"rows": len(rows), "pairs": len(stats["before"]),
            "error_before": float(np.median(stats["before"])),
            "error_after": float(np.median(stats["after"])),
            "coverage_before": float(np.mean(stats["covered_before"])),
            "coverage_after": float(np.mean(stats["covered_after"])),
            "width_before": float(np.median(stats["width_before"])),
            "width_after": float(np.median(stats["width_after"]))}


def main_memory() -> None:
    rows = load_memory_rows()
    shipped = load_error_model()
    grouped = group_rows(rows, "group")
    shares = fit_memory_shared_share(load_error_model_memory_rows())
    print("\nMemory variance shared by a source's plans (fit_memory_shared_share): "
          + ", ".join(f"{k or 'all'} {v:.2f}" for k, v in sorted(shares.items())))
    for prior, model_of in (
            ("shipped prior, in-sample", lambda members: shipped),
            ("held-out prior: refitted without the family", lambda members: dataclasses.replace(
                shipped, memory_sigma=fit_plain(
                    [{"levels": (r["framework"],), "error": r["error"]} for r in rows
                     if r["family"] != members[0]["family"]])))):
        table = [(name[:52], check_memory_group(members, model_of(members), shares))
                 for name, members in grouped]
        render_table(f"Memory if that share were shared (parplan shares none), one source "
                     f"table, model and GPU; {prior}",
                     [*table, ("all (median of groups; coverage by pairs)",
                               check_group_pooled(table))])


if __name__ == "__main__":
    main()
    main_memory()
