"""Pareto fronts of a report: the points no other point beats on both axes.

A `Front` is what the page draws as one chart: its points in named series (one per cluster),
each point with a label for its tooltip and the problem it opens, and the indices of the
points on the front. The training report draws two per group (solver.sweep.report_data):
tokens/s against GPUs (more tokens/s, fewer GPUs) and GPU-hours against days for a token
budget (both fewer). Other planners add theirs the same way: build `Front`s with
`build_front` and pass them to `write_report(..., fronts=...)`; the page draws every front it
is given in its "Pareto fronts" section, under the title and axes the front names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

Better = Literal["lower", "higher"]


@dataclass(frozen=True)
class FrontPoint:
    """One point: its series (a cluster), coordinates, tooltip label, and the problem it opens
    on the page (an index into the page's problems, or None)."""

    series: str
    x: float
    y: float
    label: str
    problem: int | None = None


@dataclass(frozen=True)
class Front:
    """A chart of points and the Pareto front among them (`on_front`: indices into `points`,
    sorted by x). `group`: the group of problems it belongs to (the page shows a group's
    fronts with its problems; "" for a front of its own)."""

    title: str
    x_label: str
    y_label: str
    x_better: Better
    y_better: Better
    points: tuple[FrontPoint, ...]
    on_front: tuple[int, ...] = field(default=())
    group: str = ""
    x_log: bool = False
    y_log: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"title": self.title, "x_label": self.x_label, "y_label": self.y_label,
                "x_axis": render_axis(self.x_label, self.x_log),
                "y_axis": render_axis(self.y_label, self.y_log),
                "x_better": self.x_better, "y_better": self.y_better, "group": self.group,
                "x_log": self.x_log, "y_log": self.y_log, "on_front": list(self.on_front),
                "points": [[p.series, p.x, p.y, p.label, p.problem] for p in self.points]}


def render_axis(label: str, log: bool) -> dict[str, str]:
    """How the page draws an axis so that its scale reads honestly: a linear axis from zero
    (Plotly's rangemode "tozero"; a GPU-hours axis zoomed to its points' 0.01% spread made equal
    costs look far apart), a log axis saying so in its title (it has no zero)."""
    if log:
        return {"title": f"{label} (log scale)", "type": "log"}
    return {"title": label, "type": "linear", "rangemode": "tozero"}


def _key(value: float, better: Better) -> float:
    return value if better == "lower" else -value


def pareto_indices(xs: Sequence[float], ys: Sequence[float], x_better: Better = "lower",
                   y_better: Better = "lower") -> tuple[int, ...]:
    """Indices of the points no other point dominates (at least as good on both axes and
    better on one), sorted by x (best x first); of equal points, the first. A sweep along x:
    a point is on the front when its y beats every y before it."""
    order = sorted(range(len(xs)), key=lambda i: (_key(xs[i], x_better), _key(ys[i], y_better), i))
    front: list[int] = []
    best_y: float | None = None
    for i in order:
        y = _key(ys[i], y_better)
        if best_y is None or y < best_y:
            front.append(i)
            best_y = y
    return tuple(sorted(front, key=lambda i: (_key(xs[i], x_better), i)))


def build_front(title: str, x_label: str, y_label: str, x_better: Better, y_better: Better,
                points: Sequence[FrontPoint], group: str = "", x_log: bool = False,
                y_log: bool = False) -> Front:
    """A Front of `points` with its Pareto front computed."""
    on_front = pareto_indices([p.x for p in points], [p.y for p in points], x_better, y_better)
    return Front(title, x_label, y_label, x_better, y_better, tuple(points), on_front, group,
                 x_log, y_log)
