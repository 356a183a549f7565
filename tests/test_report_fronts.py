"""Pareto fronts of the report (solver.sweep.report_fronts.pareto_indices) against a brute
force: a point is on the front exactly when no other point dominates it (at least as good on
both axes, better on one), one of equal points kept; the front is sorted by x."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from solver.sweep.report_fronts import FrontPoint, build_front, pareto_indices

values = st.integers(min_value=0, max_value=6).map(float)  # small range: many ties
points = st.lists(st.tuples(values, values), min_size=0, max_size=25)
better = st.sampled_from(["lower", "higher"])


def _dominates(a: tuple[float, float], b: tuple[float, float], sx: int, sy: int) -> bool:
    return (sx * a[0] <= sx * b[0] and sy * a[1] <= sy * b[1]
            and (sx * a[0] < sx * b[0] or sy * a[1] < sy * b[1]))


@given(points, better, better)
def test_front_is_the_set_of_undominated_points(pts: list[tuple[float, float]], x_better: str,
                                                y_better: str) -> None:
    sx = 1 if x_better == "lower" else -1
    sy = 1 if y_better == "lower" else -1
    front = pareto_indices([p[0] for p in pts], [p[1] for p in pts], x_better, y_better)
    undominated = [i for i, p in enumerate(pts)
                   if not any(_dominates(q, p, sx, sy) for q in pts)]
    # Equal undominated points: exactly one of them is on the front.
    assert sorted({pts[i] for i in front}) == sorted({pts[i] for i in undominated})
    assert len(front) == len({pts[i] for i in front})
    assert [sx * pts[i][0] for i in front] == sorted(sx * pts[i][0] for i in front)


def test_throughput_against_gpus() -> None:
    """More tokens/s with fewer GPUs: 16 GPUs at 2.0 beats 32 GPUs at 1.9."""
    pts = [FrontPoint("a", 8, 1.0, "8"), FrontPoint("a", 16, 2.0, "16"),
           FrontPoint("b", 32, 1.9, "32"), FrontPoint("b", 64, 3.5, "64")]
    front = build_front("t", "GPUs", "tokens/s", "lower", "higher", pts)
    assert [front.points[i].label for i in front.on_front] == ["8", "16", "64"]
    assert front.as_json()["points"][0] == ["a", 8, 1.0, "8", None]
