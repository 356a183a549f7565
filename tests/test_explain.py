"""The "why" of a plan compares the winner with the best plan without its most surprising
choice (solver.search.explain.compare_without_surprise): the alternative it names is the one
a pinned solve finds, the step-time gap it prints is the difference of the two step times,
a choice the user pinned is not questioned, and when no plan goes without the choice the line
names the constraints that clash."""

from __future__ import annotations

import re

import pytest

from solver.optimize import build_problem, solve
from solver.search.explain import SURPRISES
from solver.spec.figures import format_significant
from solver.spec.framework import FrameworkFeatures

# Llama 3.1 405B at 8K tokens on 512 H100s: the winner splits each sequence over 2 GPUs (cp 2),
# a choice the rule of thumb keeps for long sequences.
CP_CASE = dict(model="llama3.1-405b", cluster="dgx-h100", num_gpus=512, seq_len=8192,
               global_batch=1024)


def _last_line(**kwargs: object) -> tuple[object, str]:
    args = dict(kwargs)
    # fp32 gradients and Adam moments (memory savers pinned off): with them the scenarios
    # change, and the comparison's memory is the search's (every saver on), not each plan's
    args.setdefault("features", FrameworkFeatures(grad_reduce_in_bf16=False,
                                                  precision_aware_optimizer=False))
    problem = build_problem(args.pop("model"), args.pop("cluster"), args.pop("num_gpus"),
                            **args)
    result = solve(problem, top=5)
    return result, result.why[-1]


def test_cp_at_8k_tokens_is_compared_with_the_best_plan_without_cp() -> None:
    result, line = _last_line(**CP_CASE)
    assert result.plans[0].config.cp > 1
    assert line.startswith(f"7. without context parallelism (cp {result.plans[0].config.cp}): "
                           "the best plan with cp = 1 is ")
    # The oracle: the same problem solved with cp pinned to 1.
    pinned, _ = _last_line(**CP_CASE, pins={"cp": (1,)})
    alternative = pinned.plans[0]
    described = ", ".join(f"{n} {getattr(alternative.config, n)}" for n in
                          ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "zero", "micro_batch",
                           "recompute"))
    assert described in line
    gap = alternative.time.step_seconds - result.plans[0].time.step_seconds
    assert gap > 0
    percent = 100 * gap / result.plans[0].time.step_seconds
    assert f"{format_significant(gap)} s ({percent:.1f}%) slower per step" in line
    memory = re.search(r"worst stage ([0-9.]+) GB against ([0-9.]+) GB", line)
    assert memory is not None
    assert float(memory[1]) == pytest.approx(alternative.worst_stage.total_bytes / 1e9, abs=0.05)
    assert float(memory[2]) == pytest.approx(result.plans[0].worst_stage.total_bytes / 1e9,
                                             abs=0.05)


def test_a_pinned_choice_is_not_questioned() -> None:
    result, line = _last_line(**CP_CASE, pins={"cp": (2,)})
    assert result.plans[0].config.cp == 2
    assert "context parallelism" not in line
    # The next surprise in the order: pipeline parallelism.
    assert line.startswith(f"7. without pipeline parallelism (pp {result.plans[0].config.pp})")


def test_no_plan_without_the_choice_names_the_clash() -> None:
    """Llama 3.1 70B on 32 H100s without ZeRO 3 needs pipeline stages: with pp = 1 the
    leanest plan the other rules allow does not fit an 80 GB (85.5 GB decimal) GPU."""
    result, line = _last_line(model="llama3.1-70b", cluster="dgx-h100", num_gpus=32,
                              seq_len=4096, global_batch=1024, pins={"zero": (0, 1, 2)})
    assert result.plans[0].config.pp > 1
    match = re.search(r"no plan with pp = 1 meets every rule on 32 GPUs \((.*)\): the leanest "
                      r"needs ([0-9.]+) GB of 85.5 GB", line)
    assert match is not None, line
    assert "memory_fits_hbm" in match[1] and float(match[2]) > 85.5


def test_surprises_are_ordered_and_each_has_its_usual_values() -> None:
    assert [c.name for c in SURPRISES] == ["cp", "pp", "tp", "zero"]
    assert all(c.usual for c in SURPRISES)
