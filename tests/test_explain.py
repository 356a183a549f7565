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
from solver.spec.features import FrameworkFeatures

# Llama 3.1 405B at 8K tokens on 512 H100s: the winner splits each sequence over 2 GPUs (cp 2),
# a choice the rule of thumb keeps for long sequences.
CP_CASE = dict(model="llama3.1-405b", cluster="dgx-h100", num_gpus=512, seq_len=8192,
               global_batch=1024)


def _last_line(compare: bool = True, **kwargs: object) -> tuple[object, str]:
    args = dict(kwargs)
    # fp32 gradients and Adam moments (memory savers pinned off), and no offload to the host:
    # with them the scenarios change, and the comparison's memory is the search's (every saver
    # on), not each plan's
    args.setdefault("features", FrameworkFeatures(grad_reduce_in_bf16=False,
                                                  precision_aware_optimizer=False,
                                                  optimizer_offload=False,
                                                  activation_offload=False))
    problem = build_problem(args.pop("model"), args.pop("cluster"), args.pop("num_gpus"),
                            **args)
    result = solve(problem, top=5, compare=compare)
    return result, result.why[-1]


# Llama 3.1 8B at 128K tokens on 8 H100s: every listed plan uses CP; the best without it
# comes from a second solve.
LONG_CASE = dict(model="llama3.1-8b", cluster="dgx-h100", num_gpus=8, seq_len=131072,
                 global_batch=64)


@pytest.mark.parametrize("case", [CP_CASE, LONG_CASE], ids=["listed", "solved"])
def test_cp_is_compared_with_the_best_plan_without_cp(case: dict[str, object]) -> None:
    result, line = _last_line(**case)
    assert result.plans[0].config.cp > 1
    assert line.startswith(f"7. without context parallelism (cp {result.plans[0].config.cp}): "
                           "the best plan with cp = 1 is ")
    # The oracle: the same problem solved with cp pinned to 1.
    pinned, _ = _last_line(**case, pins={"cp": (1,)})
    alternative = pinned.plans[0]
    described = ", ".join(f"{n} {getattr(alternative.config, n)}" for n in
                          ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "zero", "micro_batch",
                           "recompute"))
    assert described in line
    assert ("listed)" in line) == any(p.config.cp == 1 for p in result.plans)
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
    # Nothing else is questioned: 405B needs pp (its bf16 weights need tp >= 14 in 70% of an
    # H100, more than one 8-GPU NVLink domain) and tp, and the winner keeps ZeRO 1.
    assert result.plans[0].config.pp > 1 and result.plans[0].config.zero < 3
    assert not any(why.startswith("7. without") for why in result.why)


def test_without_a_solve_the_listed_plans_answer_or_the_pin_is_named() -> None:
    """Sweeps compare with the listed plans only (no solve per problem): the first listed plan
    without the choice, else the optimize pin that would show the best one."""
    result, line = _last_line(compare=False, **CP_CASE)
    listed = [i for i, plan in enumerate(result.plans) if plan.config.cp == 1]
    if listed:
        assert f"(#{listed[0] + 1} listed)" in line
    else:
        assert line.endswith("none of the 5 listed plans goes without it (parplan optimize "
                             "--cp 1 shows the best that does)")
    result, line = _last_line(compare=False, model="llama3.1-8b",
                              cluster="dgx-h100", num_gpus=8, seq_len=131072, global_batch=64)
    assert result.plans[0].config.cp > 1 and all(p.config.cp > 1 for p in result.plans)
    assert line == (f"7. without context parallelism (cp {result.plans[0].config.cp}): none of "
                    "the 5 listed plans goes without it (parplan optimize --cp 1 shows the best "
                    "that does)")


def test_no_plan_without_the_choice_names_the_clash() -> None:
    """Llama 3.1 70B on 32 H100s without ZeRO 3 needs pipeline stages: with pp = 1 the
    leanest plan the other rules allow does not fit an 80 GiB (85.5 GB) GPU. (pp is
    questioned: 70B's bf16 weights need tp 3, within one 8-GPU NVLink domain.)"""
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
