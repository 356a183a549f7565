"""`parplan optimize --gpus A,B,...` and `--objective cost|energy`: the best plan of each GPU
count, and the count whose best plan wins the objective.

Each count is solved on its own (solver.optimize.solve); the search ranks a count's plans by
step time for cost and energy too, as at a fixed GPU count both are proportional to it ($ per
step = price x GPUs x step time; kWh per step = GPUs x board power x step time). Across counts
they are not: more GPUs are faster but each does less of the work (a smaller share of the
batch, more communication), so the fastest count is seldom the cheapest. The measures
(solver.cost.serving.price, per million trained tokens):

    time    step seconds                    memory  worst-stage device bytes
    cost    $ per million tokens = price x GPUs / 3,600 / tokens per s x 1e6
    energy  kWh per million tokens = GPUs x board power / tokens per s x 1e6 / 3.6e6

The smallest wins, of equal ones the fewest GPUs. The chosen count's explanation gains a line
naming what it gives up against the fastest count (step time, tokens/s) or what it saves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from solver.cost.serving.price import (
    estimate_dollars_per_million_tokens,
    estimate_energy_kwh,
    estimate_kwh_per_million_tokens,
)
from solver.errors import InputError
from solver.spec.plan import Plan

OBJECTIVES = ("time", "memory", "cost", "energy")
# More counts than this in one `optimize` is a typo (a range such as 8-512 solves every count).
MAX_GPU_COUNTS = 16


@dataclass(frozen=True)
class Pricing:
    """What a plan costs to run: the cluster's price per GPU-hour (`--price-per-gpu-hour`;
    None: not priced) and its GPUs' board power (the catalog's power_limit_w; None: unknown)."""

    price_per_gpu_hour: float | None = None
    board_power_w: float | None = None

    def dollars_per_million_tokens(self, plan: Plan, num_gpus: int) -> float | None:
        if self.price_per_gpu_hour is None or plan.time is None:
            return None
        return float(estimate_dollars_per_million_tokens(
            self.price_per_gpu_hour * num_gpus, plan.time.tokens_per_second))

    def kwh_per_million_tokens(self, plan: Plan, num_gpus: int) -> float | None:
        if self.board_power_w is None or plan.time is None:
            return None
        return float(estimate_kwh_per_million_tokens(plan.time.tokens_per_second,
                                                     self.board_power_w * num_gpus))

    def dollars_for_budget(self, plan: Plan, num_gpus: int) -> float | None:
        """$ to train the token budget: price x GPU-hours (None without a price or budget)."""
        if self.price_per_gpu_hour is None or plan.time is None or plan.time.gpu_hours is None:
            return None
        return self.price_per_gpu_hour * plan.time.gpu_hours

    def kwh_for_budget(self, plan: Plan) -> float | None:
        """kWh to train the token budget at board power (None without one or a budget)."""
        if self.board_power_w is None or plan.time is None or plan.time.gpu_hours is None:
            return None
        return float(estimate_energy_kwh(plan.time.gpu_hours, self.board_power_w))

    def as_json(self, plans: tuple[Plan, ...], num_gpus: int) -> dict[str, Any]:
        """The price, the board power and each plan's $ and kWh per million tokens (and for
        the token budget), in the order of `plans` (None where not priced): `optimize --json`
        and each sweep line's "pricing"."""
        return {"price_per_gpu_hour": self.price_per_gpu_hour,
                "board_power_w": self.board_power_w,
                "plans": [{"dollars_per_million_tokens": self.dollars_per_million_tokens(p, n),
                           "kwh_per_million_tokens": self.kwh_per_million_tokens(p, n),
                           "dollars_for_token_budget": self.dollars_for_budget(p, n),
                           "kwh_for_token_budget": self.kwh_for_budget(p)}
                          for p, n in ((plan, num_gpus) for plan in plans)]}


def check_objective(objective: str, pricing: Pricing, gpu: str) -> None:
    """Refuse an objective its inputs cannot measure (one line naming the flag)."""
    if objective == "cost" and pricing.price_per_gpu_hour is None:
        raise InputError("--objective cost needs --price-per-gpu-hour (the catalog carries no "
                         "prices)")
    if objective == "energy" and pricing.board_power_w is None:
        raise InputError(f"--objective energy: the catalog has no board power for {gpu} "
                         "(power_limit_w in its GPU entry)")


def search_objective(objective: str) -> str:
    """What the search ranks one count's plans by: memory, else step time (module
    docstring)."""
    return "memory" if objective == "memory" else "time"


def measure(objective: str, plan: Plan, num_gpus: int, pricing: Pricing) -> float:
    """The plan's value under `objective`, smaller is better (module docstring)."""
    assert plan.time is not None
    if objective == "memory":
        return plan.worst_stage.total_bytes
    if objective == "cost":
        value = pricing.dollars_per_million_tokens(plan, num_gpus)
    elif objective == "energy":
        value = pricing.kwh_per_million_tokens(plan, num_gpus)
    else:
        value = plan.time.step_seconds
    assert value is not None  # check_objective
    return value


def choose_count(objective: str, pricing: Pricing, counts: tuple[int, ...],
                 solve_count: Callable[[int], object]) -> object:
    """The OptimizeResult of the count whose best plan wins `objective` (module docstring),
    its explanation led by the comparison with the other counts; the first count's answer
    where none is feasible, and a single count's answer as it is."""
    if len(counts) > MAX_GPU_COUNTS:
        raise InputError(f"--gpus: {len(counts)} GPU counts, at most {MAX_GPU_COUNTS} in one "
                         "optimize (use parplan sweep for more)")
    answers = [(n, solve_count(n)) for n in sorted(set(counts))]
    feasible = [(n, r) for n, r in answers if r.plans]  # type: ignore[attr-defined]
    if not feasible:
        return answers[0][1]
    best_n, best = min(feasible, key=lambda a: (measure(objective, a[1].plans[0], a[0], pricing),
                                                a[0]))
    line = explain_counts(objective, pricing, best_n, feasible)
    if line is None:
        return best
    return replace(best, why=(line,) + tuple(best.why))  # type: ignore[type-var]


def explain_counts(objective: str, pricing: Pricing, chosen: int,
                   feasible: list[tuple[int, object]]) -> str | None:
    """One line: the chosen count against the fastest one (for time: against the cheapest
    or, unpriced, the fewest GPUs), what it gives up and what it gains."""
    if len(feasible) < 2 and objective in ("time", "memory"):
        return None
    plans = {n: r.plans[0] for n, r in feasible}  # type: ignore[attr-defined]
    counts = ", ".join(str(n) for n, _ in feasible)
    mine = plans[chosen]
    if objective == "time":
        other = min(plans, key=lambda n: (measure("cost", plans[n], n, pricing)
                                          if pricing.price_per_gpu_hour is not None else n, n))
    else:
        other = min(plans, key=lambda n: (plans[n].time.step_seconds, n))  # type: ignore
    head = f"{objective}: {chosen} GPUs ({describe(mine, chosen, pricing)}), the best of " \
           f"{counts} GPUs"
    if len(feasible) == 1:
        return head + (f"; at one GPU count {objective} ranks the plans as step time does "
                       "(proportional to it)")
    if other == chosen:
        return head + "; it is also the fastest" if objective != "time" else head
    them = plans[other]
    assert mine.time is not None and them.time is not None
    slower = mine.time.step_seconds / them.time.step_seconds - 1.0
    fewer = them.time.tokens_per_second - mine.time.tokens_per_second
    text = f"{head}; against {other} GPUs ({describe(them, other, pricing)})"
    if objective in ("cost", "energy", "memory") and slower > 0:
        text += (f" it gives up {slower:.0%} more step time and {fewer:,.0f} tokens/s "
                 f"({fewer / them.time.tokens_per_second:.0%} of the throughput)")
        saved = _saving(objective, mine, chosen, them, other, pricing)
        if saved:
            text += f" for {saved}"
    elif objective == "time":
        saved = _saving("cost", them, other, mine, chosen, pricing)
        text += f" it takes {-slower:.0%} less step time" + (
            f"; the other costs {saved}" if saved else "")
    return text


def _saving(objective: str, mine: Plan, mine_n: int, them: Plan, them_n: int,
            pricing: Pricing) -> str:
    """"12% less $ per million tokens" (or kWh, or memory) of `mine` against `them`."""
    if objective == "memory":
        a, b, unit = mine.worst_stage.total_bytes, them.worst_stage.total_bytes, "memory"
    elif objective == "energy":
        a = pricing.kwh_per_million_tokens(mine, mine_n)  # type: ignore[assignment]
        b = pricing.kwh_per_million_tokens(them, them_n)  # type: ignore[assignment]
        unit = "kWh per million tokens"
    else:
        a = pricing.dollars_per_million_tokens(mine, mine_n)  # type: ignore[assignment]
        b = pricing.dollars_per_million_tokens(them, them_n)  # type: ignore[assignment]
        unit = "$ per million tokens"
    if a is None or b is None or b <= 0:
        return ""
    return f"{1 - a / b:.0%} less {unit}"


def describe(plan: Plan, num_gpus: int, pricing: Pricing) -> str:
    """"3.21 s a step, 40,833 tokens/s, $0.136 per million tokens, 0.0381 kWh per million"."""
    assert plan.time is not None
    parts = [f"{plan.time.step_seconds:.3g} s a step",
             f"{plan.time.tokens_per_second:,.0f} tokens/s"]
    dollars = pricing.dollars_per_million_tokens(plan, num_gpus)
    if dollars is not None:
        parts.append(f"${dollars:.3g} per million tokens")
    kwh = pricing.kwh_per_million_tokens(plan, num_gpus)
    if kwh is not None:
        parts.append(f"{kwh:.3g} kWh per million tokens")
    return ", ".join(parts)
