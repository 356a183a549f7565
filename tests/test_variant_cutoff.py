"""The searches beside the problem's own (recompute module sets, offloads:
solver.search.module_variants) are asked only for plans under a cutoff, the top-th of the
plans found so far, and start from the first pass of the search they vary. Exact: the merged
top is the one of every search run whole, without a cutoff or a first pass, and asked for four
times as many plans (so that offloading twins dropped from a search's list, below, leave no
plan out).

The cutoff is the top-th of the distinct plans (an offloading twin of a plan ranked before it
is dropped from the top, so it cannot hold a place), widened by a tie's last bits: found on
Mistral-7B on 8 H100s, where the 5th plan (pp 2 x vpp 8 with activations offloaded) ties the
balanced bound of its configuration exactly and sits above the top-th of the plans counted
with their twins.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from solver.optimize import build_problem, solve


def _plans(result, layouts: bool = True) -> list[tuple]:
    return [(p.config, p.recompute_modules, p.offloads,
             p.layout.model_dump_json() if p.layout and layouts else None,
             round(p.time.step_seconds, 9)) for p in result.plans]


@pytest.mark.parametrize(("model", "cluster", "gpus", "batch", "top"),
                         [pytest.param(
                              "mistral-7b", "dgx-h100", 8, 1024, 5, marks=pytest.mark.xfail(
                                  strict=True, reason=(
                                      "the searches rank by the step time without memory "
                                      "savers (an upper bound) and re-rank the merged top by "
                                      "the plans' own: since DP collectives pay NCCL's "
                                      "latency per call, tp 1 dp 8 zero 3 mb 4 (47.3626 s "
                                      "without savers, 47.1769 s with grad_reduce_in_bf16) "
                                      "is 4th by the upper bound and 2nd by its own time, so "
                                      "top 3 misses it and top 5 lists it"))),
                          ("qwen2.5-32b", "gb200-nvl72", 8, 1024, 5),
                          ("deepseek-v2-lite", "dgx-h100", 64, 256, 5),
                          # Its layouts of equal step time differ with the bar CP-SAT is
                          # given (the same answer for the same input): compared without.
                          ("deepseek-v3", "gb200-nvl72", 1024, 1024, 7)])
def test_the_merged_top_is_that_of_every_search_run_whole(monkeypatch, model, cluster, gpus,
                                                          batch, top) -> None:
    import solver.optimize as optimize

    problem = build_problem(model, cluster, gpus, seq_len=4096, global_batch=batch)
    assert problem.offloads
    cut = solve(problem, top=top, engine="layout", compare=False)
    shorter = solve(problem, top=top - 2, engine="layout", compare=False)
    from solver.search import module_variants

    original = optimize.LayoutSearch
    monkeypatch.setattr(optimize, "LayoutSearch", lambda p, top, cutoff_s, prior, deadline:
                        original(p, 4 * top, np.inf, None, deadline))
    monkeypatch.setattr(module_variants, "_merged_bar", lambda *args: np.inf)
    # The whole search's wall-clock deadline (optimize's time limit) must not cut it short on a
    # loaded machine: DeepSeek-V3 on 1,024 GB200s needs about 30 s of CPU, over 60 s of wall
    # clock beside other jobs on 2 cores. The answer does not depend on the limit once it ends.
    whole = solve(problem, top=top, engine="layout", time_limit_s=600.0, compare=False)
    assert cut.status == whole.status == "optimal"
    layouts = model != "deepseek-v3"
    assert _plans(cut, layouts) == _plans(whole, layouts)
    # A shorter list is the head of a longer one (DeepSeek-V3 on 1,024 GB200s: a plan of one
    # module set was dropped as an offloading twin of another set's plan with its layout).
    assert shorter.status == "optimal"
    assert _plans(shorter, layouts) == _plans(cut, layouts)[:top - 2]


def test_plans_of_two_module_sets_are_not_twins() -> None:
    """An offloading plan is dropped where a plan ranked before has its configuration and
    module set (solver.search.module_variants._without_offloaded_twins), whatever the
    layouts; one of another module set, same configuration and layout, stays."""
    from types import SimpleNamespace

    from solver.search.module_variants import _without_offloaded_twins
    from solver.spec import ParallelConfig

    config = ParallelConfig(tp=1, pp=4, vpp=9, dp=256, ep=8, recompute="selective")

    def searched(modules: tuple[str, ...], offloads: int, layout: str, step_s: float = 1.0,
                 memory_bytes: float = 7e10):
        ranked = SimpleNamespace(candidates=SimpleNamespace(config=lambda _: config),
                                 layouts=(layout,),
                                 step_time=SimpleNamespace(step_s=np.array([step_s])),
                                 memory_bytes=np.array([memory_bytes]))
        problem = SimpleNamespace(time_constants=SimpleNamespace(recompute_modules=modules))
        return SimpleNamespace(ranked=ranked, problem=problem, offloads=offloads)

    first = searched(("core_attn", "mlp"), 1, "A")
    other_set = searched(("core_attn", "mla_up_proj"), 1, "A", step_s=1.01)
    same_set = searched(("core_attn", "mlp"), 1, "B")
    kept = _without_offloaded_twins([(first, 0), (other_set, 0), (same_set, 0)])
    assert [entry for entry, _ in kept] == [first, other_set]
    # Issue 39: another module set of the same step time and memory is the same plan.
    same_cost = searched(("core_attn", "moe_act"), 0, "A")
    other_memory = searched(("core_attn", "layernorm"), 0, "A", memory_bytes=6e10)
    kept = _without_offloaded_twins([(first, 0), (same_cost, 0), (other_memory, 0)])
    assert [entry for entry, _ in kept] == [first, other_memory]


def test_the_explanation_reads_the_listed_plans() -> None:
    """The why's runner-up number and its count of listed plans are those of the merged list
    the user sees (Qwen2.5-32B on 8 GB200s: the winner offloads its activations, and the
    plans listed come from several searches)."""
    problem = build_problem("qwen2.5-32b", "gb200-nvl72", 8, seq_len=4096, global_batch=1024)
    result = solve(problem, top=5, engine="layout", compare=False)
    assert {p.offloads for p in result.plans} - {None, ()}, "plans of several searches"
    runner = next(line for line in result.why if line.startswith("runner-up #"))
    number = int(re.match(r"runner-up #(\d+)", runner).group(1))
    listed = result.plans[number - 1].config
    assert f"pp {listed.pp}, dp {listed.dp}" in runner and f"zero {listed.zero}" in runner
    counted = [line for line in result.why if "listed plans" in line]
    assert all(f"{len(result.plans)} listed plans" in line for line in counted)
