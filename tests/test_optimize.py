"""parplan optimize with the exhaustive engine: every plan meets every rule (checked here by an
independent checker, not the project's constraint code), the staged enumeration finds the same
optimum as a plain cartesian product, pins hold, answers are deterministic, and the seeds'
worked examples are placed in our ranking."""

from __future__ import annotations

import itertools
import json
from unittest import mock

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.memory import estimate_layout_memory, estimate_memory
from solver.cost.step.steptime import estimate_step_time
from solver.optimize import build_problem, solve
from solver.search import enumerate as enumerate_module
from solver.search.enumerate import enumerate_feasible, rank
from solver.search.module_variants import offload_variant
from solver.search.space import VARIABLES, variable_domains
from solver.spec import ParallelConfig, PipelineLayout

GIB = 2**30


def independent_violations(problem, config: ParallelConfig,
                           layout: PipelineLayout | None = None) -> list[str]:
    """The rules of issue 5 written again, plainly, one configuration at a time; memory under
    the plan's layout (None: the even split)."""
    m, job, c = problem.model_spec, problem.job, config
    domain = problem.cluster.scale_up_gpus
    bad = []
    if c.tp * c.cp * c.pp * c.dp != problem.num_gpus:
        bad.append("product")
    # KV heads: split whole, or (Megatron-Core >= 0.16, generic) replicated when tp is a
    # multiple of them; torchtitan and DeepSpeed split whole heads only.
    whole_heads_only = problem.framework in ("torchtitan", "deepspeed")
    kv_ok = m.is_mla or m.kv_heads % c.tp == 0 or (
        not whole_heads_only and c.tp % m.kv_heads == 0)
    if m.num_attention_heads % c.tp or not kv_ok:
        bad.append("heads")
    if not problem.allow_tp_across_nodes and (domain % c.tp or domain % c.etp):
        bad.append("nvlink")
    if c.pp > m.num_hidden_layers or c.pp * c.vpp > m.num_hidden_layers + 2 or (
            c.vpp > 1 and c.pp == 1):
        bad.append("layers")
    if m.is_moe and m.num_experts % c.ep or not m.is_moe and (c.ep, c.etp) != (1, 1):
        bad.append("experts")
    if (c.tp * c.cp * c.dp) % (c.ep * c.etp):
        bad.append("expert ranks")
    if job.seq_len % (2 * c.cp) or job.global_batch % (c.dp * c.micro_batch):
        bad.append("batch")
    if problem.framework == "megatron":
        if c.zero == 2 or (c.zero == 3 and c.pp > 1):
            bad.append("megatron zero")
        if c.vpp > 1 and (job.global_batch // (c.dp * c.micro_batch)) % c.pp:
            bad.append("megatron interleave")
    if problem.framework == "torchtitan" and c.zero == 1:
        bad.append("torchtitan zero")
    # torchtitan 0.3 ParallelDims.build_mesh: efsdp = dp_shard * cp * tp / ep, no expert TP
    if problem.framework == "torchtitan" and c.ep > 1 and (
            c.etp > 1 or ((c.dp if c.zero else 1) * c.cp * c.tp) % c.ep):
        bad.append("torchtitan experts")
    if problem.framework == "deepspeed" and ((c.pp > 1 and c.zero > 1) or c.cp > 1
                                             or (c.tp > 1 and c.zero == 3) or c.vpp > 1):
        bad.append("deepspeed")
    # DeepSpeed 0.19 AutoEP (auto_ep_folding.py validate_folding_global): etp 1, and AutoTP
    # folding only without pipeline parallelism
    if problem.framework == "deepspeed" and c.ep > 1 and (c.etp > 1 or (c.tp > 1 and c.pp > 1)):
        bad.append("deepspeed autoep")
    codes = {"none": 0, "selective": 1, "full": 2}
    for name, allowed in problem.pins.items():
        value = codes[c.recompute] if name == "recompute" else getattr(c, name)
        if value not in allowed:
            bad.append(f"pin {name}")
    if bad:
        return bad  # the memory model is the slow check: only for otherwise valid plans
    if layout is None:
        memory = estimate_memory(m, job, Candidates.from_configs([c]), problem.memory_options)
    else:
        if (layout.pp, layout.vpp) != (c.pp, c.vpp) or layout.num_layers != m.num_hidden_layers:
            bad.append("layout shape")
        if c.recompute != "full" and any(s.recompute_layers for s in layout.stages):
            bad.append("layout recompute")
        memory = estimate_layout_memory(m, job, c, layout, problem.memory_options)
    if float(memory.total.max()) > problem.cluster.gpu.memory_gib * GIB:
        bad.append("memory")
    return bad


MODELS = ["llama3.2-1b", "llama3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b", "gemma2-9b"]
CLUSTERS = ["dgx-h100", "dgx-a100-40gb", "l40s-pcie"]


@st.composite
def problems(draw, with_offloads: bool = False):
    """Planning problems over the zoo, the presets and the frameworks; the offloads to the host
    left out (the oracles here do not enumerate them; tests/test_offload.py does) unless
    `with_offloads`."""
    pins = {}
    if draw(st.booleans()):
        pins["tp"] = tuple(draw(st.lists(st.sampled_from([1, 2, 4, 8]), min_size=1, max_size=2)))
    if draw(st.booleans()):
        pins["zero"] = (draw(st.integers(0, 3)),)
    if draw(st.booleans()):
        pins["recompute"] = (draw(st.integers(0, 2)),)
    problem = build_problem(
        draw(st.sampled_from(MODELS)), draw(st.sampled_from(CLUSTERS)),
        draw(st.sampled_from([8, 16, 24, 32])), seq_len=draw(st.sampled_from([2048, 4096])),
        global_batch=draw(st.sampled_from([64, 96, 256])),
        framework=draw(st.sampled_from(["megatron", "torchtitan", "deepspeed", "generic"])),
        pins=pins)
    return problem if with_offloads else problem.model_copy(update={"offloads": ()})


@settings(max_examples=40, deadline=None)
@given(problems(with_offloads=True))
def test_every_plan_meets_every_rule_and_pins_hold(problem) -> None:
    """Offloading plans are checked under their offloads (the memory they leave on the GPU)."""
    result = solve(problem, top=5)
    for plan in result.plans:
        checked = offload_variant(problem, plan.offloads) if plan.offloads else problem
        assert checked is not None
        assert independent_violations(checked, plan.config, plan.layout) == []
        assert plan.fits


def brute_force_best(problem) -> float | None:
    """The plain cartesian product of the domains, filtered by the independent checker."""
    domains = variable_domains(problem)
    configs = []
    split = [d for d in itertools.product(*(domains[n] for n in ("tp", "cp", "pp", "dp")))
             if d[0] * d[1] * d[2] * d[3] == problem.num_gpus]
    rest = ("ep", "etp", "vpp", "zero", "micro_batch", "recompute")
    for first, second in itertools.product(split, itertools.product(*(domains[n]
                                                                       for n in rest))):
        c = dict(zip(VARIABLES, first + second))
        c["recompute"] = ("none", "selective", "full")[c["recompute"]]
        config = ParallelConfig(**c)
        if not independent_violations(problem, config):
            configs.append(config)
    if not configs:
        return None
    step = estimate_step_time(problem.model_spec, problem.cluster, problem.job,
                              Candidates.from_configs(configs), problem.time_constants)
    return float(step.step_s.min())


@settings(max_examples=6, deadline=None)
@given(model=st.sampled_from(["llama3.2-1b", "mixtral-8x7b"]), gpus=st.sampled_from([2, 4]),
       framework=st.sampled_from(["megatron", "generic"]))
def test_staged_enumeration_equals_the_plain_cartesian_product(model, gpus, framework) -> None:
    problem = build_problem(model, "dgx-h100", gpus, seq_len=2048, global_batch=8,
                            framework=framework)
    expected = brute_force_best(problem)
    feasible = enumerate_feasible(problem)
    if expected is None:
        assert len(feasible) == 0
        return
    best = rank(problem, feasible, 1)
    assert float(best.step_time.step_s[0]) == pytest.approx(expected, rel=1e-12)


def test_answers_are_deterministic() -> None:
    args = ["optimize", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "32",
            "--json"]
    first, second = CliRunner().invoke(cli, args), CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    strip = [{k: v for k, v in json.loads(r.stdout).items() if k != "solve_seconds"}
             for r in (first, second)]
    assert strip[0] == strip[1]


def test_json_has_the_design_fields() -> None:
    result = CliRunner().invoke(cli, ["optimize", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--top", "3", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "optimal" and answer["solve_seconds"] >= 0
    assert len(answer["plans"]) == 3
    steps = [p["step_seconds"] for p in answer["plans"]]
    assert steps == sorted(steps)
    for plan in answer["plans"]:
        assert {"tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute",
                "fits", "memory_gb", "step_seconds", "tokens_per_second",
                "tokens_per_second_per_gpu", "tflops_per_gpu", "mfu", "time_seconds"} <= set(plan)


def test_infeasible_is_an_answer_with_conflicts_and_fixes() -> None:
    result = CliRunner().invoke(cli, ["optimize", "--model", "llama3.1-405b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "infeasible"
    assert answer["conflicts"] == ["memory_fits_hbm"]
    assert any(fix.startswith("--gpus") for fix in answer["fixes"])


@pytest.mark.parametrize("pins", [{}, {"zero": (0, 1)}, {"tp": (3,)}])
def test_least_memory_is_that_of_the_leanest_plan_meeting_the_other_rules(pins) -> None:
    """find_conflicts computes the memory of the candidates the unchangeable rules allow once;
    its least memory equals the minimum over the plans meeting every other rule (pins
    included), enumerated apart; None when no plan meets them (tp 3 divides nothing)."""
    from solver.cost.memory import estimate_memory
    from solver.search.enumerate import enumerate_feasible, rules_but_memory
    from solver.search.explain import find_conflicts

    problem = build_problem("llama3.1-405b", "dgx-h100", 8, pins=pins)
    found = find_conflicts(problem)
    others = enumerate_feasible(problem, rules_but_memory(problem))
    if len(others) == 0:
        assert found.least_memory_bytes is None
        assert found.names in (["pin_tp"], ["memory_fits_hbm"])  # either one suffices
        return
    least = estimate_memory(problem.model_spec, problem.job, others,
                            problem.memory_options).total.min()
    assert found.least_memory_bytes == pytest.approx(float(least), rel=1e-12)
    assert found.names == ["memory_fits_hbm"]
    assert least > problem.cluster.gpu.memory_gib * 2**30


@pytest.mark.parametrize(("model", "gpus", "pins"), [
    ("llama3.1-405b", 8, {}), ("llama3.1-405b", 16, {"zero": (0,)}),
    ("llama3.1-405b", 16, {"recompute": (0,)}), ("deepseek-v2-lite", 1, {"micro_batch": (4,)}),
    ("kimi-k2", 64, {}), ("llama3.1-70b", 8, {"tp": (2,), "pp": (1,)})])
def test_conflicts_over_the_leanest_schedules_equal_those_over_all(monkeypatch, model, gpus,
                                                                   pins) -> None:
    """find_conflicts costs only the leanest schedules (explain._leanest: along the micro-batch
    and recompute level where no soft rule but memory reads them; Megatron's interleaving rule
    reads the micro-batch, pins may read either): the same names and least memory as costing
    every candidate."""
    from solver.search import explain

    problem = build_problem(model, "dgx-h100", gpus, pins=pins)
    lean = explain.find_conflicts(problem)
    monkeypatch.setattr(explain, "_leanest", lambda allowed, soft: np.arange(len(allowed)))
    whole = explain.find_conflicts(problem)
    assert lean.names == whole.names and lean.names
    assert lean.least_memory_bytes == whole.least_memory_bytes


def test_conflicting_pins_are_named() -> None:
    problem = build_problem("llama3.1-8b", "dgx-h100", 8, pins={"tp": (3,)})
    result = solve(problem)
    assert result.status == "infeasible"
    assert result.conflicts == ("pin_tp",)
    assert "drop the pin on tp" in result.fixes


def test_pcie_cluster_keeps_tp_at_one() -> None:
    """l40s-pcie has no NVLink domain: tp_within_nvlink leaves tp = 1 (issue 5)."""
    problem = build_problem("llama3.2-3b", "l40s-pcie", 8, seq_len=2048, global_batch=64)
    result = solve(problem, top=10)
    assert result.plans and all(p.config.tp == 1 for p in result.plans)


@pytest.mark.parametrize("args, needle", [
    (["--tp", "x"], "--tp"),
    (["--pp", "4-1"], "--pp"),
    (["--recompute", "sometimes"], "--recompute"),
    (["--engine", "simplex"], "--engine"),
])
def test_bad_optimize_input_is_one_line(args, needle) -> None:
    base = ["optimize", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    result = CliRunner().invoke(cli, base + args)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1 and needle in result.stderr


def test_gpus_for_days_finds_the_fewest_node_multiples() -> None:
    """The seed's "train on 2T tokens in 30 days": the answer is a multiple of the node size,
    meets the deadline, and one node fewer does not."""
    from solver.optimize import fewest_gpus

    problem = build_problem("llama3.1-8b", "dgx-h100", 8, seq_len=4096, global_batch=512,
                            token_budget=int(2e11))
    num_gpus, result = fewest_gpus(problem, days=10)
    assert num_gpus % 8 == 0
    assert result.plans[0].time.train_days <= 10
    fewer = solve(problem.model_copy(update={"num_gpus": num_gpus - 8}), top=1)
    assert fewer.status == "infeasible" or fewer.plans[0].time.train_days > 10


def test_nearby_round_counts_are_whole_nodes_nearest_first() -> None:
    """2^a or 3 x 2^a GPUs within a factor of 2, whole nodes, nearest first."""
    from solver.fixes import _nearby_round_counts

    assert _nearby_round_counts(build_problem("llama3.1-8b", "dgx-h100", 23040)) == [
        24576, 16384, 32768, 12288]
    # A request of 40 (5 nodes): 32, 48, 24, 64 (16 is below half, 80 is above twice).
    assert _nearby_round_counts(build_problem("llama3.1-8b", "dgx-h100", 40)) == [
        32, 48, 24, 64]


def test_nearby_global_batches_split_evenly_nearest_first() -> None:
    """d x 2^a with d dividing the GPU count's odd part (23,040 = 45 x 2^9), within a factor
    of 2 of the request, nearest first (ties: the smaller)."""
    from solver.fixes import _nearby_global_batches

    problem = build_problem("dbrx", "dgx-h100", 23040)
    assert _nearby_global_batches(problem) == [960, 1152, 768, 1280, 720, 640]


def test_deepspeed_plans_expose_dp_traffic_behind_a_pipeline() -> None:
    """--framework deepspeed brings its pipeline engine's schedule: with pp > 1 the gradient
    reduction runs after the last backward (pipe/engine.py, "We schedule the all-reduces"),
    so a plan's "dp" time is the whole volume of its collectives; without a pipeline ZeRO's
    overlap_comm hides the gradient reduction behind the backward, but ZeRO 1-2 gather the
    parameters inside the optimizer step (all_gather_dp_groups), exposed."""
    from solver.cost.step.data_parallel import estimate_dp_collectives_s

    megatron = build_problem("llama3.1-70b", "dgx-a100-80gb", 64, framework="megatron")
    deepspeed = build_problem("llama3.1-70b", "dgx-a100-80gb", 64, framework="deepspeed")
    assert megatron.time_constants.dp_overlap == "always"
    # FSDP gradients: fp32 under Megatron (main grads) and torchtitan (mixed_precision_reduce
    # "float32"), the parameters' dtype under DeepSpeed and the generic set.
    reduce_bytes = {framework: build_problem("llama3.1-8b", "dgx-h100", 8, framework=framework)
                    .time_constants.zero3_grad_reduce_bytes
                    for framework in ("megatron", "torchtitan", "deepspeed", "generic")}
    assert reduce_bytes == {"megatron": 4.0, "torchtitan": 4.0, "deepspeed": 2.0,
                            "generic": 2.0}
    assert deepspeed.time_constants.dp_overlap == "without_pipeline"
    c = Candidates.from_configs([ParallelConfig(tp=8, pp=4, dp=2, zero=1, micro_batch=1),
                                 ParallelConfig(tp=8, pp=1, dp=8, zero=1, micro_batch=1)])
    s = estimate_dp_collectives_s(deepspeed.model_spec, deepspeed.cluster, c,
                                  deepspeed.time_constants)
    ds = estimate_step_time(deepspeed.model_spec, deepspeed.cluster, deepspeed.job, c,
                            deepspeed.time_constants).dp
    mg = estimate_step_time(megatron.model_spec, megatron.cluster, megatron.job, c,
                            megatron.time_constants).dp
    assert ds[0] == pytest.approx(s["grads_reduce_scatter"][0] + s["params_all_gather"][0])
    assert ds[0] > mg[0]
    assert ds[1] > mg[1]
    exposed_gather = mg[1] + s["params_all_gather"][1]
    assert mg[1] < ds[1] <= exposed_gather * (1 + 1e-12)


def test_why_names_the_dp_traffic_the_framework_leaves_exposed() -> None:
    """The "why" of a winner says which DP collectives its framework does not overlap:
    DeepSpeed's pipeline engine none, its ZeRO 1-2 the parameter all-gather, Megatron none."""
    from solver.search.explain import _dp_overlap_note

    deepspeed = build_problem("llama3.1-70b", "dgx-h100", 64, framework="deepspeed")
    megatron = build_problem("llama3.1-70b", "dgx-h100", 64, framework="megatron")
    piped = ParallelConfig(tp=4, pp=4, dp=4, zero=1)
    flat = ParallelConfig(tp=8, pp=1, dp=8, zero=1)
    assert "overlaps none" in _dp_overlap_note(deepspeed, piped)
    assert "parameter all-gather" in _dp_overlap_note(deepspeed, flat)
    assert _dp_overlap_note(megatron, piped) == _dp_overlap_note(megatron, flat) == ""
    alone = ParallelConfig(tp=8, pp=8, dp=1, zero=1)
    assert _dp_overlap_note(deepspeed, alone) == ""  # no DP traffic at all


@settings(max_examples=25, deadline=None)
@given(problems(), st.sampled_from(["layout", "even"]))
def test_first_pass_prunes_only_plans_that_cannot_enter_the_top(problem, engine) -> None:
    """The search's first pass (solver.search.enumerate.may_enter_top) drops candidates whose
    bound from their layers' terms passes the top-th fastest even split among the least
    bounds: with it engaged on every problem (a first batch of 8 rows) the answer is the one
    of the search without it (every candidate costed), for both engines."""
    with mock.patch.object(enumerate_module, "FIRST_PASS", 8):
        pruned = solve(problem, top=3, engine=engine)
    with mock.patch.object(enumerate_module, "FIRST_PASS", 1 << 40):
        whole = solve(problem, top=3, engine=engine)
    assert pruned.status == whole.status
    assert [(p.config, p.layout, p.time.step_seconds) for p in pruned.plans] == [
        (p.config, p.layout, p.time.step_seconds) for p in whole.plans]


def test_fit_check_counts_the_problem_own_bytes_per_parameter() -> None:
    """The first "why" line sizes the model states with the memory options in force: Megatron's
    defaults keep bf16 weights (2 B), fp32 gradients (4 B) and fp32 master weights with Adam's
    moments (12 B) per parameter (solver.cost.memory.options); the precision-aware optimizer
    and bf16 gradients (Megatron --use-precision-aware-optimizer --grad-reduce-in-bf16) make
    it 2 + 2 + 8, and so does a search free to turn them on where a plan needs them (the
    default: solver.cost.step.frameworks.memory_saver_ladder)."""
    runner = CliRunner()
    # (No offload: an offloading winner holds no optimizer state on the GPU.)
    base = ["optimize", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--no-optimizer-offload", "--no-activation-offload"]
    plain = runner.invoke(cli, [*base, "--no-precision-aware-optimizer",
                                "--no-grad-reduce-in-bf16"])
    lean = runner.invoke(cli, [*base, "--precision-aware-optimizer", "--grad-reduce-in-bf16"])
    free = runner.invoke(cli, base)
    assert plain.exit_code == 0 and lean.exit_code == 0 and free.exit_code == 0
    assert "(12 bytes each: 2 + 2 + 8)" in free.output
    assert "(18 bytes each: 2 + 4 + 12)" in plain.output
    assert "(12 bytes each: 2 + 2 + 8)" in lean.output
