"""The cost columns of `parplan serve --price-per-gpu-hour`: $ per million output and input
tokens and output tokens per joule at board power (solver.cost.serving.price), for a plan, a
Pareto point or a cluster of the `--objective gpus` comparison."""

from __future__ import annotations

import math
from typing import Any

from solver.cost.serving.price import estimate_dollars_per_million_tokens, estimate_tokens_per_joule


def plan_output_tokens_per_s(plan: Any, problem: Any) -> float | None:
    """The output tokens/s a plan's cost is priced at: at the offered load when there is one
    (None where the plan does not carry it), else at its full batch."""
    if problem.job.load.kind == "none":
        return plan.tokens_per_s
    return plan.load["at_load"]["tokens_per_s"]


def render_cost(price_per_gpu_hour: float, gpu: Any, num_gpus: int,
                output_tokens_per_s: float | None, job: Any) -> dict[str, Any]:
    """$ an hour, $ per million output and input tokens (the prompt tokens taken at the same
    requests/s: output x mean prompt / mean output) and output tokens per joule at the GPU's
    board power (None where the catalog has none), rounded for JSON."""
    power = gpu.power_limit_w
    return {"price_per_gpu_hour": price_per_gpu_hour,
            **render_pools_cost(price_per_gpu_hour * num_gpus,
                                None if power is None else power * num_gpus,
                                output_tokens_per_s, job),
            "board_power_w": power}


def render_pools_cost(dollars_per_hour: float | None, board_power_w: float | None,
                      output_tokens_per_s: float | None, job: Any) -> dict[str, Any]:
    """render_cost's numbers for GPUs that may differ (pools of a two-cluster plan): the
    deployment's $ an hour and its GPUs' board power summed; None where not known."""
    def number(value: Any, digits: int) -> float | None:
        return round(float(value), digits) if math.isfinite(float(value)) else None

    out = 0.0 if output_tokens_per_s is None else output_tokens_per_s
    prompt = out * job.input_distribution.mean / job.output_distribution.mean
    priced = dollars_per_hour is not None
    return {
        "dollars_per_hour": number(dollars_per_hour, 4) if priced else None,
        "dollars_per_million_output_tokens": number(
            estimate_dollars_per_million_tokens(dollars_per_hour, out), 4) if priced else None,
        "dollars_per_million_input_tokens": number(
            estimate_dollars_per_million_tokens(dollars_per_hour, prompt), 4)
        if priced else None,
        "output_tokens_per_joule": (None if board_power_w is None else
                                    number(estimate_tokens_per_joule(out, board_power_w), 4)),
    }


def render_cost_cells(cost: dict[str, Any]) -> list[str]:
    """A table's "$/h", "$/M out", "$/M in", "tok/J" cells ('-' where undefined)."""
    def cell(value: float | None, digits: int) -> str:
        return "-" if value is None else f"{value:,.{digits}f}"

    return [cell(cost["dollars_per_hour"], 2), cell(cost["dollars_per_million_output_tokens"], 3),
            cell(cost["dollars_per_million_input_tokens"], 3),
            cell(cost["output_tokens_per_joule"], 3)]


COST_COLUMNS = ["$/h", "$/M out", "$/M in", "tok/J"]
