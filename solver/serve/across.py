"""`parplan serve --objective gpus` over several clusters (`--cluster A --cluster B`): each
cluster's own answer (the fewest of its GPUs that carry the load within the SLOs, solver.serve
.solve), and the cluster chosen among them.

The choice: the lowest $ an hour (price per GPU-hour x GPUs) when every cluster has a price,
else the fewest GPUs; ties go to the cheaper, then to the cluster given first. A cluster with
no plan that meets the targets is listed with what it lacks and never chosen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solver.serve.solve import ServeResult


@dataclass(frozen=True)
class ClusterOption:
    """One cluster's answer under its name as given, and its price per GPU-hour (None: not
    priced)."""

    name: str
    result: ServeResult
    price_per_gpu_hour: float | None = None

    @property
    def fewest_gpus(self) -> int | None:
        """The GPUs of its best plan (objective gpus: the fewest), None when it has none."""
        return self.result.plans[0].num_gpus if self.result.status == "optimal" else None

    @property
    def dollars_per_hour(self) -> float | None:
        if self.fewest_gpus is None or self.price_per_gpu_hour is None:
            return None
        return self.price_per_gpu_hour * self.fewest_gpus


@dataclass(frozen=True)
class ClusterChoice:
    """Every cluster's option in the order given, the index of the chosen one (-1 when no
    cluster has a plan) and what decided: "dollars_per_hour" or "gpus"."""

    options: tuple[ClusterOption, ...]
    chosen: int
    by: str

    @property
    def result(self) -> ServeResult:
        """The answer shown in full: the chosen cluster's, else the first cluster's."""
        return self.options[max(self.chosen, 0)].result


def choose_cluster(options: Sequence[ClusterOption]) -> ClusterChoice:
    """The cluster that serves the job cheapest when all are priced, else on the fewest GPUs
    (module docstring)."""
    by = "dollars_per_hour" if all(o.price_per_gpu_hour is not None for o in options) else "gpus"
    inf = float("inf")

    def key(k: int) -> tuple[float, float, int]:
        o = options[k]
        gpus = inf if o.fewest_gpus is None else float(o.fewest_gpus)
        money = inf if o.dollars_per_hour is None else o.dollars_per_hour
        return (money, gpus, k) if by == "dollars_per_hour" else (gpus, money, k)

    feasible = [k for k, o in enumerate(options) if o.fewest_gpus is not None]
    chosen = min(feasible, key=key) if feasible else -1
    return ClusterChoice(options=tuple(options), chosen=chosen, by=by)
