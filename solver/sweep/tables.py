"""The tables of a sweep report, from its results lines: the summary rows, the groups (one model
under one job) and their pivots, the markdown rows and the status counts. The writers
(solver.sweep.report, report_html, plots) read them; none of them is imported here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from solver.spec.plan_json import DEGREES
from solver.sweep.problems import KEY_FIELDS, key_of_line

METRICS = ("memory_gb", "step_seconds", "tokens_per_second", "tokens_per_second_per_gpu",
           "mfu")
# The best plan's allocated and reserved views (memory_gb is its total, the device view), and
# the reserved view as torch.cuda.max_memory_reserved() reads it on the problem's GPU
# (solver.spec.plan.OBSERVED_VIEWS); empty for lines written before them.
VIEW_COLUMNS = ("allocated_gb", "reserved_gb", "reserved_gb_observed")
# The best plan's device memory as a percentage of the GPU's whole memory (memory_percent),
# and the features it turns on beyond the framework's defaults (render_features).
SUMMARY_COLUMNS = (KEY_FIELDS + ("status",) + DEGREES + METRICS + ("memory_percent_of_gpu",)
                   + VIEW_COLUMNS + ("features", "note"))
JOB_FIELDS = ("seq_len", "global_batch", "precision", "framework", "objective")


@dataclass(frozen=True)
class Group:
    """One model under one job: its rows (best plan per cluster and GPU count)."""

    model: str
    job: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        j = self.job
        return (f"{self.model}: seq {j['seq_len']}, global batch {j['global_batch']}, "
                f"{j['precision']}, {j['framework']}, objective {j['objective']}")

    @property
    def slug(self) -> str:
        return group_slug(self.model, self.job)


def group_slug(model: str, job: dict[str, Any]) -> str:
    """A group's name in file names and page anchors: `llama3.2-1b-4096-1024-bf16-megatron-time`."""
    text = "-".join([model] + [str(job[name]) for name in JOB_FIELDS])
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_.")


def render_config(row: dict[str, Any]) -> str:
    """`tp 8 pp 2 dp 4 zero 1 mb 1 selective (core_attn,mlp) +grad-reduce-in-bf16`, with cp,
    ep, etp and vpp only when > 1, the module set where selective names one, and each feature
    the plan turns on (render_features)."""
    if row["status"] not in ("optimal", "feasible"):
        return row["status"]
    parts = [f"tp {row['tp']}", f"pp {row['pp']}", f"dp {row['dp']}"]
    parts += [f"{name} {row[name]}" for name in ("cp", "ep", "etp", "vpp") if row[name] > 1]
    parts += [f"zero {row['zero']}", f"mb {row['micro_batch']}", str(row["recompute"])]
    if row.get("recompute_modules") and row["recompute"] == "selective":
        parts[-1] += f" ({','.join(row['recompute_modules'])})"  # what selective recomputes
    parts += [f"+{name}" for name in render_features(row).split()]
    return " ".join(parts)


def render_features(row: dict[str, Any]) -> str:
    """The memory savers and offloads a plan (or a summary row) turns on to fit, as their
    launch flags without the dashes: `grad-reduce-in-bf16 activation-offload` (Plan.memory_savers,
    Plan.offloads); "" for none."""
    names = [*(row.get("memory_savers") or []), *(row.get("offloads") or [])]
    return " ".join(str(name).replace("_", "-") for name in names)


def select_problem_lines(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first line of each problem key, sorted by the key (the order of a report)."""
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for line in lines:
        first.setdefault(key_of_line(line), line)
    return [first[key] for key in sorted(first)]


def build_summary_rows(lines: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per problem (the first line of a key), sorted by the key: the best plan's
    degrees and metrics, or the conflicts and fixes (infeasible) or the message (error)."""
    rows = []
    for line in select_problem_lines(lines):
        row: dict[str, Any] = dict(zip(KEY_FIELDS, key_of_line(line)))
        row["status"] = line.get("status", "")
        plans = line.get("plans") or []
        best = plans[0] if plans else {}
        row.update({name: best.get(name, "") for name in DEGREES})
        row["recompute_modules"] = best.get("recompute_modules") or []
        row["memory_savers"] = best.get("memory_savers") or []
        row["offloads"] = best.get("offloads") or []
        row["features"] = render_features(row)
        row["memory_gb"] = best.get("memory_gb", {}).get("total", "") if best else ""
        row.update({name: best.get(name, "") for name in METRICS[1:] + VIEW_COLUMNS})
        row["note"] = _note(line)
        row["memory_breakdown_gb"] = best.get("memory_gb", {}) if best else {}
        row["gpu_memory_gb"] = best.get("gpu_memory_gb", "") if best else ""
        row["memory_percent_of_gpu"] = memory_percent(best) if best else ""
        rows.append(row)
    return rows


def memory_percent(plan: dict[str, Any]) -> float | str:
    """A plan's worst-stage device memory as a percentage of the GPU's whole memory, to 0.1:
    83.1 of 85.9 GB -> 96.7 ("" without the GPU's memory)."""
    gpu = plan.get("gpu_memory_gb")
    if not gpu:
        return ""
    return round(100.0 * float(plan["memory_gb"]["total"]) / float(gpu), 1)


def _note(line: dict[str, Any]) -> str:
    if line.get("status") == "infeasible":
        fixes = "; fixes: " + ", ".join(line["fixes"]) if line.get("fixes") else ""
        return "conflicts: " + ", ".join(line.get("conflicts", [])) + fixes
    if line.get("status") == "error":
        return str(line.get("error", ""))
    gap = line.get("optimality_gap")
    if line.get("status") == "feasible" and gap is not None:
        return ("not proven but the best plan" if gap == 0 else
                f"not proven: the best within {100 * gap:.1f}% of the optimum")
    return ""


def build_groups(rows: Sequence[dict[str, Any]]) -> list[Group]:
    """Rows grouped by model and job, in row order."""
    groups: dict[tuple[Any, ...], Group] = {}
    for row in rows:
        job = {name: row[name] for name in JOB_FIELDS}
        key = (row["model"], *job.values())
        groups.setdefault(key, Group(model=row["model"], job=job)).rows.append(row)
    return list(groups.values())


def build_pivot(group: Group) -> tuple[list[str], list[list[str]]]:
    """The configuration chosen at each scale: one row per GPU count, one column per cluster."""
    clusters = list(dict.fromkeys(row["cluster"] for row in group.rows))
    cells = {(row["gpus"], row["cluster"]): render_config(row) for row in group.rows}
    table = [[str(gpus)] + [cells.get((gpus, c), "") for c in clusters]
             for gpus in sorted({row["gpus"] for row in group.rows})]
    return ["GPUs"] + clusters, table


def format_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


MARKDOWN_COLUMNS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision",
                    "status", "configuration", "device GB", "% of GPU", "step s", "tokens/s", "MFU %", "note")


def build_markdown_row(row: dict[str, Any]) -> list[str]:
    solved = row["status"] in ("optimal", "feasible")
    metrics = [format_value(row["memory_gb"]), format_value(row["memory_percent_of_gpu"]),
               format_value(row["step_seconds"]),
               f"{row['tokens_per_second']:,.0f}", f"{100 * row['mfu']:.1f}"] if solved else \
        ["", "", "", "", ""]
    return ([str(row[name]) for name in MARKDOWN_COLUMNS[:7]] + [render_config(row)] + metrics
            + [row["note"]])


def count_statuses(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """How many rows have each status, by status name."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["status"]] = counts.get(row["status"], 0) + 1
    return dict(sorted(counts.items()))
