"""The error model with a between-source variance component, checked as error_model.py checks
the shipped one (issue 36: the alternative its leave-one-out coverage was compared with; not
shipped, see docs/accuracy.md).

    .venv/bin/python benchmarks/error_model_random_effect.py

Model: the error of row i of source s is b_s + w_i, the source's offset b_s ~ N(0, tau_c^2)
shared by every plan of the source (one publication's table, day or release: its software
and cluster), the row's own w_i ~ N(0, scale_c^2 W_i) with W_i error_model.py's component
variance of its step (time) or 1 (memory). A prediction for a source the fit has not seen has
variance tau_c^2 + scale_c^2 W_i.
  components   error_model.py's NNLS, on the errors less their source's mean times
               n / (n - 1) (so one source's offset does not inflate them)
  scale_c      the scaled-inverse-chi^2 shrinkage of error_model.py (PRIOR_ROWS), on those
               centred squares over W_i
  tau_c^2      method of moments over sources (each source one draw of b_s): the mean of
               mean_s^2 - (mean within variance of its rows) / n_s, each category shrunk to its
               parent with PRIOR_SOURCES sources' weight, clipped at 0
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from error_model import (  # noqa: E402
    PRIOR_ROWS,
    fit_group_sigma,
    fit_plan_sigma,
    group_squares,
    load_memory_rows,
    load_time_rows,
    render_coverage_markdown,
)

from solver.cost.uncertainty import lookup_scale  # noqa: E402

# A category's between-source variance weighs as much as its parent's once it has this many
# sources of its own (BLOOM's seven days, Megatron-Bridge's seven releases).
PRIOR_SOURCES = 2


def shrink(pairs: Sequence[tuple[tuple[str, ...], float]], prior: float) -> dict[str, float]:
    """Per category path, the mean of the values shrunk to the parent's with `prior` values'
    weight, clipped at 0; "parent/*" the mean of the parent's children (error_model.py)."""
    paths: dict[str, list[float]] = defaultdict(list)
    for levels, value in pairs:
        for depth in range(len(levels) + 1):
            paths["/".join(levels[:depth])].append(value)
    table = {"": max(0.0, float(np.mean(paths[""])))}
    for path in sorted(paths, key=lambda p: (p.count("/"), p)):
        if path:
            parent = table[path.rsplit("/", 1)[0] if "/" in path else ""]
            table[path] = max(0.0, (prior * parent + sum(paths[path])) / (prior + len(paths[path])))
    children: dict[str, list[float]] = defaultdict(list)
    for path, value in table.items():
        if path:
            children[path.rsplit("/", 1)[0] if "/" in path else ""].append(value)
    return {**table, **{f"{p}/*" if p else "*": float(np.mean(v)) for p, v in children.items()}}


def by_source(rows: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[row["source"]].append(row)
    return [groups[s] for s in sorted(groups)]


def fit_random_effect(rows: Sequence[dict[str, Any]], weight) -> dict[str, Any]:
    """tau^2 and scale^2 per category (module docstring); `weight(row)` is W_i."""
    centred = []
    for group in by_source(rows):
        if len(group) > 1:
            mean, n = np.mean([r["error"] for r in group]), len(group)
            centred += [(r["levels"], (r["error"] - mean) ** 2 * n / (n - 1) / weight(r))
                        for r in group]
    scale2 = shrink(centred, PRIOR_ROWS)
    offsets = [(group[0]["levels"], float(np.mean([r["error"] for r in group])) ** 2
                - float(np.mean([lookup_scale(scale2, r["levels"]) * weight(r)
                                 for r in group])) / len(group))
               for group in by_source(rows)]
    return {"scale2": scale2, "tau2": shrink(offsets, PRIOR_SOURCES), "weight": weight}


def sigma(fitted: dict[str, Any], row: dict[str, Any]) -> float:
    return math.sqrt(lookup_scale(fitted["tau2"], row["levels"])
                     + lookup_scale(fitted["scale2"], row["levels"]) * fitted["weight"](row))


def fit_time_random_effect(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The components on source-centred errors, then fit_random_effect with their W_i."""
    plan_sigma = fit_plan_sigma(rows)
    centred = []
    for group in by_source(rows):
        if len(group) > 1:
            mean, n = np.mean([r["error"] for r in group]), len(group)
            centred += [{**r, "error": (r["error"] - mean) * math.sqrt(n / (n - 1))}
                        for r in group]
    group_sigma = fit_group_sigma(centred, plan_sigma)
    sigmas2 = np.array([v ** 2 for v in group_sigma.values()])

    def weight(row: dict[str, Any]) -> float:
        return float(group_squares(row["parts"]) @ sigmas2) + plan_sigma ** 2

    return fit_random_effect(rows, weight)


def fit_memory_random_effect(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return fit_random_effect(rows, lambda row: 1.0)


def main() -> None:
    time_rows, memory_rows = load_time_rows(), load_memory_rows()
    print("Between-source variance component (not shipped): coverage of the 80% intervals")
    print("\n".join(render_coverage_markdown("time", time_rows, fit_time_random_effect, sigma)))
    print()
    print("\n".join(render_coverage_markdown("memory", memory_rows, fit_memory_random_effect,
                                             sigma)))


if __name__ == "__main__":
    main()
