"""The search chooses Megatron's recompute modules (issue 17): which module sets it tries
(solver.cost.step.recompute_modules), that their union is searched exactly (solver.search.
module_variants), and that plans carry their modules to `launch`.

Sources: Megatron-Core --recompute-modules (core_attn, moe_act, layernorm, mla_up_proj, mlp,
moe, shared_experts; megatron/training/arguments.py); the Megatron-Bridge performance recipes
that choose them per GPU (scripts/performance/configs/deepseek/
deepseek_workload_base_configs.py @0426418: DeepSeek-V3 on H100 ["mla_up_proj", "mlp"], on
B200 NVFP4 ["mla_up_proj", "layernorm", "moe_act"]).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import MemoryOptions
from solver.cost.memory.activations import estimate_module_recompute_bytes
from solver.cost.step.recompute_modules import recompute_module_sets
from solver.optimize import build_problem, solve
from solver.spec import JobSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures

DEEPSEEK_LIGHT = ("core_attn", "moe_act", "layernorm")
DEEPSEEK_HEAVY = (*DEEPSEEK_LIGHT, "mla_up_proj", "mlp", "shared_experts")


@pytest.mark.parametrize(("model", "expected"), [
    # dense under FlashAttention: core_attn alone is recomputing nothing, mlp is the knob
    ("llama3.1-8b", (("core_attn", "mlp"),)),
    # DeepSeek-V3: MLA, 3 dense layers, a shared expert: one GEMM module more at a time
    ("deepseek-v3", (DEEPSEEK_LIGHT, (*DEEPSEEK_LIGHT, "mla_up_proj"),
                     (*DEEPSEEK_LIGHT, "mla_up_proj", "mlp"), DEEPSEEK_HEAVY)),
    # Mixtral: no MLA, no dense or shared MLP: the light set only
    ("mixtral-8x7b", (("core_attn", "moe_act", "layernorm"),)),
])
def test_module_sets_per_model(model: str, expected: tuple) -> None:
    spec = load_model_spec(model)
    constants = build_framework_profile("megatron").time_constants
    assert recompute_module_sets(spec, "megatron", constants) == expected


def test_module_sets_only_where_megatron_chooses_freely() -> None:
    """torchtitan's selective is op level (no module list); a --recompute-modules flag fixes
    the list; without FlashAttention the attention core is a module worth its own set."""
    spec = load_model_spec("llama3.1-8b")
    titan = build_framework_profile("torchtitan").time_constants
    assert recompute_module_sets(spec, "torchtitan", titan) == ()
    megatron = build_framework_profile("megatron").time_constants
    pinned = FrameworkFeatures(recompute_modules=("core_attn",))
    assert recompute_module_sets(spec, "megatron", megatron, pinned) == ()
    unfused = build_framework_profile("megatron", {"attention_kernel": "unfused"}).time_constants
    assert recompute_module_sets(spec, "megatron", unfused) == (("core_attn",),
                                                                 ("core_attn", "mlp"))


def test_mla_up_proj_saves_most_per_parameter_rerun() -> None:
    """The ladder's order (solver.cost.step.recompute_modules): DeepSeek-V3's MLA up-projections
    drop 128 x (2 x 192 + 128) x 2 B = 131,072 B per token for 54.5M parameters
    (1536 x 128 x 192 + 512 x 128 x 256), 2.4e-3 B per token and parameter; a shared expert
    drops 4F = 8,192 B for 3 x 7168 x 2048 = 44.0M parameters, 1.9e-4."""
    spec = load_model_spec("deepseek-v3")
    job = JobSpec(seq_len=4096, global_batch=1024)
    one = Candidates.from_configs([ParallelConfig(tp=1, dp=1, recompute="selective")])

    def dropped(modules: tuple[str, ...]) -> float:
        split, replicated = estimate_module_recompute_bytes(
            spec, job, one, MemoryOptions(recompute_modules=modules), moe=True)
        return float(np.asarray(split).sum()) + replicated

    mla, shared = dropped(("mla_up_proj",)), dropped(("shared_experts",))
    assert mla == 131_072
    assert shared == 4 * 2048
    up_params = 1536 * 128 * 192 + 512 * 128 * 256
    assert up_params == pytest.approx(54.5e6, rel=1e-3)
    assert mla / up_params == pytest.approx(2.4e-3, rel=0.01)
    assert shared / (3 * 7168 * 2048) == pytest.approx(1.86e-4, rel=0.01)


def _problem(modules: tuple[str, ...] | None = None):
    """(Offloads to the host pinned off: their searches are tests/test_offload.py's.)"""
    return build_problem("deepseek-v2-lite", "dgx-a100-40gb", 8, seq_len=8192, global_batch=256,
                         features=FrameworkFeatures(recompute_modules=modules,
                                                    optimizer_offload=False,
                                                    activation_offload=False))


def test_search_over_module_sets_equals_the_best_of_each_pinned() -> None:
    """Oracle: the search over the module sets gives the step time of the best of the
    searches with each set pinned by flag (the union is exact), and every plan fits and names
    the modules it recomputes (none for none or full)."""
    free = solve(_problem(), top=5, engine="even")
    sets = free.problem.recompute_module_sets
    assert len(sets) == 4
    pinned = [solve(_problem(modules), top=5, engine="even") for modules in sets]
    best = min(r.plans[0].time.step_seconds for r in pinned if r.plans)
    assert free.plans[0].time.step_seconds == pytest.approx(best, rel=1e-12)
    for plan in free.plans:
        assert plan.fits
        assert bool(plan.recompute_modules) == (plan.config.recompute == "selective")
        assert plan.recompute_modules in ((), *sets)


def test_launch_emits_the_plan_recompute_modules(tmp_path) -> None:
    """`launch --plan` emits the modules a selective plan recomputes; an unknown module name
    in the file is one line naming the field, exit 2."""
    args = ["--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "256",
            "--seq-len", "4096", "--global-batch", "1024"]
    answer = CliRunner().invoke(cli, ["optimize", *args, "--engine", "even", "--json",
                                      "--pp", "16", "--tp", "2", "--cp", "2", "--ep", "8"])
    assert answer.exit_code == 0, answer.output
    plans = json.loads(answer.stdout)["plans"]
    assert plans[0]["recompute"] == "selective"
    modules = plans[0]["recompute_modules"]
    # The best recomputes MLA's up-projections too, at micro-batch 1 (17.36 s, 82.2 GB): with
    # the H100's host link at its measured 51 GB/s (not PCIe's 64), micro-batch 2 with
    # activation offload (17.07 s at 64 GB/s) no longer hides its copies and is slower.
    assert modules == [*DEEPSEEK_LIGHT, "mla_up_proj"]
    assert not plans[0].get("offloads") and plans[0]["micro_batch"] == 1
    path = tmp_path / "plans.json"
    path.write_text(answer.stdout)
    launch = ["launch", *args, "--plan", str(path), "--format", "megatron"]
    emitted = CliRunner().invoke(cli, launch)
    assert emitted.exit_code == 0, emitted.output
    assert "--recompute-modules " + " ".join(modules) in emitted.output
    bad = json.loads(answer.stdout)
    bad["plans"][0]["recompute_modules"] = ["attention_everything"]
    path.write_text(json.dumps(bad))
    refused = CliRunner().invoke(cli, launch)
    assert refused.exit_code == 2
    assert "plans.0.recompute_modules" in refused.output


def test_module_sets_share_one_time_limit(monkeypatch) -> None:
    """`solve(time_limit_s=T)` bounds the whole solve: every module set's search runs to the
    deadline of the solve, never T afresh (four sets once took 3 x the sweep's 10 s limit)."""
    import time

    import solver.optimize as optimize

    deadlines: list = []
    original = optimize.LayoutSearch

    def recording(problem, top, cutoff_s, prior, deadline):
        deadlines.append(deadline)
        return original(problem, top, cutoff_s, prior, deadline)

    monkeypatch.setattr(optimize, "LayoutSearch", recording)
    before = time.perf_counter()
    solve(_problem(), top=3, engine="layout", time_limit_s=5.0)
    after = time.perf_counter()
    assert len(deadlines) >= 2 and len({id(d) for d in deadlines}) == 1
    assert before + 5.0 <= deadlines[0].at <= after + 5.0


def test_report_launch_line_carries_the_plan_modules() -> None:
    """The report page's copyable launch line recomputes what the plan recomputes."""
    from solver.optimize_json import render_result_json
    from solver.sweep.report_data import render_launch_line

    problem = build_problem("deepseek-v3", "dgx-h100", 256, seq_len=4096, global_batch=1024,
                            pins={"tp": (2,), "cp": (2,), "pp": (16,), "ep": (8,)})
    answer = render_result_json(solve(problem, top=1, engine="even", compare=False))
    line = {**answer, "model": "deepseek-v3", "cluster": "dgx-h100", "gpus": 256}
    plan = answer["plans"][0]
    launch = render_launch_line(line, plan).split()
    assert launch[launch.index("--recompute-modules") + 1] == ",".join(plan["recompute_modules"])


def test_module_sets_searched_below_the_cutoff_give_the_same_plans(monkeypatch) -> None:
    """Each module set after the first is searched only for plans at least as fast as the
    top-th found so far (solver.search.module_variants): exact, the same plans as searching
    each set whole (DeepSeek-V2-Lite on 8 A100s, four sets, layout engine)."""
    import solver.optimize as optimize
    from solver.search import module_variants

    cut = solve(_problem(), top=5, engine="layout", compare=False)
    original = optimize.LayoutSearch
    monkeypatch.setattr(optimize, "LayoutSearch", lambda problem, top, cutoff_s, prior, deadline:
                        original(problem, top, np.inf, prior, deadline))
    monkeypatch.setattr(module_variants, "_merged_bar", lambda *args: np.inf)
    full = solve(_problem(), top=5, engine="layout", compare=False)
    assert cut.status == full.status == "optimal"
    assert [p.config for p in cut.plans] == [p.config for p in full.plans]
    assert [p.time.step_seconds for p in cut.plans] == [p.time.step_seconds for p in full.plans]
    assert [p.recompute_modules for p in cut.plans] == [p.recompute_modules for p in full.plans]


def test_an_infeasible_problem_is_explained_once(monkeypatch) -> None:
    """Where no module set finds a plan, the first search's explanation stands: the conflicts
    are looked for once, not once per set (DeepSeek-V2-Lite at 32K tokens on one A100 40 GB:
    its weights and optimizer alone pass the memory)."""
    import solver.optimize as optimize

    calls = []
    original = optimize.find_conflicts
    monkeypatch.setattr(optimize, "find_conflicts",
                        lambda problem: calls.append(problem) or original(problem))
    problem = build_problem("deepseek-v2-lite", "dgx-a100-40gb", 1, seq_len=32768,
                            global_batch=8)
    assert len(problem.recompute_module_sets) > 1
    result = solve(problem, top=3, compare=False)
    assert result.status == "infeasible" and "memory_fits_hbm" in result.conflicts
    assert len(calls) == 1


def _opener(problem, own, answer):
    """An open_search (solver.search.module_variants.search_module_sets) whose own search is
    `own` and every other `answer(variant)`."""
    return lambda variant, cutoff_s, prior, deadline: own if variant is problem \
        else answer(variant)


def test_a_module_set_search_cut_short_leaves_the_answer_unproven() -> None:
    """A further set's search that stopped at the time limit and found nothing under its
    cutoff may have missed plans: the merged answer is `feasible`, not `optimal`."""
    from solver.search.layout_search import solve_with_layouts
    from solver.search.module_variants import RankedSearch, search_module_sets

    problem = _problem()
    found, proven = solve_with_layouts(problem, 3, 60.0)
    assert proven and found is not None and len(found.candidates) == 3
    own = RankedSearch(problem, found)
    merged = search_module_sets(problem, _opener(problem, own, lambda variant: RankedSearch(
        variant, None, proven=False)), 3)
    assert merged.status == "feasible" and len(merged.chosen) == 3
    assert search_module_sets(problem, _opener(problem, own, lambda variant: RankedSearch(
        variant, None)), 3).status == "optimal"


@pytest.mark.parametrize("model", ["deepseek-v2-lite", "deepseek-v3", "glm-4.5"])
def test_each_set_needs_no_more_memory_and_no_less_time(model: str) -> None:
    """The sets are nested, cheapest first (solver.cost.step.recompute_modules): under selective
    recompute, every configuration's memory never rises and its step time never falls from one
    set to the next (what module_variants relies on to search the last set first where
    nothing fits)."""
    from solver.search.enumerate import enumerate_feasible, rules_but_memory
    from solver.search.module_variants import module_variant

    problem = build_problem(model, "dgx-h100", 64, seq_len=4096, global_batch=512)
    sets = problem.recompute_module_sets
    assert len(sets) >= 2
    variants = [module_variant(problem, modules) for modules in sets]
    candidates = enumerate_feasible(variants[0], rules_but_memory(variants[0]))
    candidates = candidates.take(np.arange(0, len(candidates), max(len(candidates) // 400, 1)))
    from solver.cost.memory import estimate_memory_total
    from solver.cost.step.steptime import estimate_step_seconds

    memory = [estimate_memory_total(v.model_spec, v.job, candidates, v.memory_options)[0]
              for v in variants]
    seconds = [estimate_step_seconds(v.model_spec, v.cluster, v.job, candidates,
                                     v.time_constants) for v in variants]
    for before, after in zip(memory, memory[1:]):
        assert (after <= before * (1 + 1e-12)).all()
    for before, after in zip(seconds, seconds[1:]):
        assert (after >= before * (1 - 1e-12)).all()
    assert (memory[-1] < memory[0]).any()


def test_where_nothing_fits_the_last_set_is_searched_first() -> None:
    """Where the problem's own search finds nothing, the last (leanest) set is searched next;
    where it finds nothing either, the sets between are not searched (they need more memory);
    where it finds plans, they are."""
    from solver.search.layout_search import solve_with_layouts
    from solver.search.module_variants import RankedSearch, search_module_sets

    problem = _problem().model_copy(update={"offloads": ()})  # module sets only
    sets = problem.recompute_module_sets
    assert len(sets) == 4
    found = solve_with_layouts(problem, 3, 60.0)[0]
    nothing = RankedSearch(problem, None)
    asked = []

    def none_fit(variant):
        asked.append(variant.time_constants.recompute_modules)
        return RankedSearch(variant, None)

    assert search_module_sets(problem, _opener(problem, nothing, none_fit), 3).chosen == ()
    assert asked == [sets[-1]]
    asked.clear()

    def last_fits(variant):
        asked.append(variant.time_constants.recompute_modules)
        return RankedSearch(variant, found if variant.time_constants.recompute_modules
                            == sets[-1] else None)

    merged = search_module_sets(problem, _opener(problem, nothing, last_fits), 3)
    assert asked == [sets[-1], *sets[1:-1]] and merged.chosen
    asked.clear()
    # An unproven search of the last set proves nothing about the others.
    assert search_module_sets(problem, _opener(problem, nothing, lambda variant: asked.append(1)
                                               or RankedSearch(variant, None, proven=False)),
                              3).chosen == ()
    assert len(asked) == len(sets) - 1


def test_no_further_search_once_the_time_limit_is_spent(monkeypatch) -> None:
    """The module-set and offload searches share the solve's time limit; one the limit leaves
    no time for is not run (it would cost its first pass and even splits all the same), and
    the answer says `feasible`, not proved."""
    import solver.optimize as optimize

    calls = []
    original = optimize.LayoutSearch

    def counted(problem, *args):
        calls.append(problem.recompute_module_sets == ())  # a further set's search
        return original(problem, *args)

    monkeypatch.setattr(optimize, "LayoutSearch", counted)
    problem = _problem()
    assert len(problem.recompute_module_sets) > 1
    spent = solve(problem, top=3, engine="layout", time_limit_s=1e-9, compare=False)
    assert calls == [False] and spent.status == "feasible" and spent.plans
    assert spent.stopped_by == "time_limit"  # issue 40: the answer says the clock cut it
    calls.clear()
    whole = solve(problem, top=3, engine="layout", time_limit_s=60.0, compare=False)
    assert calls[0] is False and True in calls
    assert whole.status == "optimal" and whole.stopped_by is None


@pytest.mark.parametrize(("model", "cluster", "gpus"), [("deepseek-v2-lite", "dgx-a100-80gb", 8),
                                                        ("deepseek-v2-lite", "dgx-h100", 64),
                                                        ("llama3.1-70b", "dgx-a100-40gb", 32)])
def test_variants_from_the_first_pass_give_the_plans_of_their_own_search(
        monkeypatch, model: str, cluster: str, gpus: int) -> None:
    """The module-set and offload searches start from the problem's own first pass
    (solver.search.enumerate.candidates_below: its candidates within their pins, its bounds):
    the same plans as each enumerating and bounding its candidates afresh."""
    import solver.optimize as optimize

    problem = build_problem(model, cluster, gpus, seq_len=4096, global_batch=256)
    assert len(problem.recompute_module_sets) + len(problem.offloads) > 2
    from_first = solve(problem, top=5, engine="layout", compare=False)
    original = optimize.LayoutSearch
    monkeypatch.setattr(optimize, "LayoutSearch", lambda p, top, cutoff_s, prior, deadline:
                        original(p, top, cutoff_s, None, deadline))
    afresh = solve(problem, top=5, engine="layout", compare=False)
    assert from_first.status == afresh.status == "optimal"
    assert [(p.config, p.recompute_modules, p.offloads, p.time.step_seconds)
            for p in from_first.plans] == [(p.config, p.recompute_modules, p.offloads,
                                            p.time.step_seconds) for p in afresh.plans]
