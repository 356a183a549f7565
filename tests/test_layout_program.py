"""The layout program against brute force, the cost model and the even split (hypothesis).

- the coefficients it is built from reproduce `estimate` (estimate_layout_step_time,
  estimate_layout_memory) on any layout: the program optimises the model, not a copy of it;
- its optimum equals a brute-force enumeration of every layout (layers and recompute per
  virtual stage) on small models (up to 10 layers, pp up to 4, vpp up to 2);
- its step time equals `estimate` of the layout it returns, and every stage fits;
- the balanced lower bound never exceeds the optimum;
- through `optimize`, the layout engine is never worse than the even split.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec
from solver.cost.candidates import Candidates
from solver.cost.step.layout_terms import (
    estimate_layer_time_coefficients,
    estimate_layout_coefficients,
    estimate_layout_lower_bound_s,
    time_coefficients,
)
from solver.cost.memory import MemoryOptions, estimate_layout_memory
from solver.cost.memory.layout import build_even_layout, layer_kinds, layout_layer_counts
from solver.cost.step.steptime import estimate_layout_step_time, estimate_time_terms
from solver.optimize import build_problem, solve
from solver.search.layout_program import LayoutRules, build_layout, solve_layout
from solver.search.layout_bounds import estimate_memory_bounds
from solver.search.space import Problem
from solver.spec import JobSpec, ModelSpec, ParallelConfig

CLUSTER = load_cluster_spec("dgx-h100")
GB = 1e9


def tiny_model(num_layers: int, moe: bool) -> ModelSpec:
    """A small Llama-like model; the MoE one has dense first layers (DeepSeek's pattern), so
    its layers differ by kind."""
    extra = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024,
                 first_k_dense_layers=2) if moe else {}
    return ModelSpec(name=f"tiny-{num_layers}{'-moe' if moe else ''}", hidden_size=2048,
                     intermediate_size=5632, num_hidden_layers=num_layers,
                     num_attention_heads=16, num_key_value_heads=4, vocab_size=64000, **extra)


@st.composite
def layout_problems(draw):
    num_layers = draw(st.integers(4, 10))
    moe = draw(st.booleans())
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    assume(pp * vpp <= num_layers + 2)
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    uniform = draw(st.booleans())
    assume(recompute != "full" or uniform or num_layers <= 8)
    micro = draw(st.sampled_from([1, 2]))
    num_micro = pp * draw(st.integers(1, 4))
    ep = 2 if moe and draw(st.booleans()) else 1
    config = ParallelConfig(tp=2, pp=pp, vpp=vpp, dp=2, ep=ep, zero=1, micro_batch=micro,
                            recompute=recompute)
    job = JobSpec(seq_len=4096, global_batch=2 * micro * num_micro)
    return tiny_model(num_layers, moe), job, config, uniform


def all_layouts(num_layers: int, num_virtual: int):
    """Every split of the layers over the virtual stages (the first and last may be empty)."""
    if num_virtual == 1:
        yield (num_layers,)
        return
    lows = [0] + [1] * (num_virtual - 2) + [0]

    def splits(left: int, position: int):
        if position == num_virtual - 1:
            yield (left,)
            return
        need = sum(lows[position + 1:])
        for size in range(lows[position], left - need + 1):
            for rest in splits(left - size, position + 1):
                yield (size, *rest)

    yield from splits(num_layers, 0)


@st.composite
def one_layout(draw, num_layers: int, num_virtual: int) -> tuple[int, ...]:
    """A random split as all_layouts gives them."""
    if num_virtual == 1:
        return (num_layers,)
    cuts = sorted(draw(st.lists(st.integers(0, num_layers - (num_virtual - 2)),
                                min_size=num_virtual - 1, max_size=num_virtual - 1)))
    # Stars and bars over the layers left once every middle stage has its one.
    sizes = [b - a for a, b in zip((0, *cuts), (*cuts, num_layers - (num_virtual - 2)))]
    return tuple(size + (0 if v in (0, num_virtual - 1) else 1)
                 for v, size in enumerate(sizes))


def all_recomputes(sizes: tuple[int, ...], full: bool, uniform: bool):
    if not full:
        yield (0,) * len(sizes)
        return
    if uniform:
        for count in range(1, max(sizes) + 1):
            yield tuple(min(count, s) for s in sizes)
        return
    for choice in itertools.product(*(range(s + 1) for s in sizes)):
        if sum(choice) >= 1:
            yield choice


def brute_force(model, config, coefficients, capacity, uniform):
    best = np.inf
    for sizes in all_layouts(model.num_hidden_layers, config.pp * config.vpp):
        for recompute in all_recomputes(sizes, config.recompute == "full", uniform):
            layout = build_layout(config, list(sizes), list(recompute), 0)
            layers, recomputed = layout_layer_counts(coefficients.kinds, layout)
            if coefficients.memory_bytes(layers, recomputed).max() <= capacity:
                best = min(best, coefficients.step_s(layers, recomputed))
    return best


@settings(max_examples=40, deadline=None)
@given(layout_problems(), st.data())
def test_coefficients_reproduce_estimate_on_any_layout(problem, data) -> None:
    model, job, config, _ = problem
    coefficients = estimate_layout_coefficients(model, CLUSTER, job, config)
    sizes = data.draw(one_layout(model.num_hidden_layers, config.pp * config.vpp))
    assert sum(sizes) == model.num_hidden_layers
    recompute = [data.draw(st.integers(0, s)) for s in sizes] if config.recompute == "full" \
        else [0] * len(sizes)
    layout = build_layout(config, list(sizes), recompute, 0)
    layers, recomputed = layout_layer_counts(layer_kinds(model), layout)
    step = estimate_layout_step_time(model, CLUSTER, job, [config], [layout]).step_s[0]
    memory = estimate_layout_memory(model, job, config, layout).total
    assert coefficients.step_s(layers, recomputed) == pytest.approx(step, rel=1e-12)
    assert coefficients.memory_bytes(layers, recomputed) == pytest.approx(memory, rel=1e-12)


@settings(max_examples=100, deadline=None)
@given(layout_problems(), st.floats(0.02, 1.0))
def test_program_equals_brute_force_and_estimate(problem, squeeze) -> None:
    model, job, config, uniform = problem
    coefficients = estimate_layout_coefficients(model, CLUSTER, job, config)
    even = build_even_layout(model, config.pp, config.vpp, config.recompute == "full")
    layers, recomputed = layout_layer_counts(coefficients.kinds, even)
    even_memory = coefficients.memory_bytes(layers, recomputed).max()
    # A capacity between the bytes of the fullest empty stage and 130% of the even split's
    # worst stage, so the memory limit binds in some examples and not in others (not on a
    # stage's exact bytes: the program rounds each term up to a KiB, so a layout that fits by
    # less may be refused).
    floor = coefficients.base_bytes.max()
    capacity = floor + (0.3 + squeeze) * (even_memory - floor) + 2.0**20
    rules = LayoutRules(recompute=config.recompute == "full", uniform_recompute=uniform)
    answer, proven = solve_layout(config, coefficients, capacity, rules)
    expected = brute_force(model, config, coefficients, capacity, uniform)
    assert proven
    event("memory binds" if even_memory > capacity else "memory free")
    if np.isinf(expected):
        event("no layout fits")
        assert answer is None
        return
    assert answer is not None
    # Time coefficients are rounded to 1 us in the program: equal up to that.
    assert answer.step_s == pytest.approx(expected, rel=1e-4)
    step = estimate_layout_step_time(model, CLUSTER, job, [config], [answer.layout]).step_s[0]
    memory = estimate_layout_memory(model, job, config, answer.layout).total
    assert answer.step_s == pytest.approx(step, rel=1e-12)
    assert np.all(memory <= capacity)
    assert answer.layout.num_layers == model.num_hidden_layers
    if even_memory <= capacity and config.recompute != "full":
        assert answer.step_s <= coefficients.step_s(layers, recomputed) * (1 + 1e-9)
    times = time_coefficients(estimate_time_terms(model, CLUSTER, job,
                                                  Candidates.from_configs([config])))
    bound = estimate_layout_lower_bound_s(model, times, np.array([config.pp]),
                                          np.array([config.recompute == "full"]))
    balanced = estimate_layout_lower_bound_s(model, times, np.array([config.pp]),
                                             np.array([config.recompute == "full"]), -np.inf)
    assert balanced[0] <= bound[0] * (1 + 1e-12) and bound[0] <= answer.step_s * (1 + 1e-9)
    # The search's first pass (solver.search.enumerate.may_enter_top): the layers' terms alone bound
    # the full ones from below.
    light = estimate_layer_time_coefficients(model, CLUSTER, job,
                                             Candidates.from_configs([config]))
    for name, value in light.items():
        assert np.all(value <= times[name] * (1 + 1e-12)), name
    assert estimate_layout_lower_bound_s(model, light, np.array([config.pp]), np.array(
        [config.recompute == "full"]))[0] <= bound[0] * (1 + 1e-12)
    # The search's memory-aware bounds (solver.search.layout_bounds): a layout fits, so the
    # test says it may, and no layout beats the bound, under either recompute rule.
    gpu = CLUSTER.gpu.model_copy(update={"memory_gib": capacity / 2**30})
    problem_spec = Problem(model_spec=model, cluster=CLUSTER.model_copy(update={"gpu": gpu}),
                           job=job, num_gpus=config.num_gpus,
                           framework="megatron" if uniform else "generic")
    for bar in (np.inf, 1e9):
        fits, _, memory_bound = estimate_memory_bounds(
            problem_spec, Candidates.from_configs([config]), times, bar)
        assert fits[0] and memory_bound[0] <= expected * (1 + 1e-9)


def test_megatron_405b_recipe_pp16_vpp8_counts_embedding_and_loss() -> None:
    """Megatron-Bridge's Llama-3.1-405B recipe (llama3_405b pretrain config: TP 8, PP 8... and
    the issue's pp 16 x vpp 8 with --account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split): 126 layers + 2 slots = 128 virtual stages of one
    slot each: the first holds the embedding alone, the last the loss alone."""
    model = load_model_spec("llama3.1-405b")
    config = ParallelConfig(tp=8, pp=16, vpp=8, dp=8, zero=1, recompute="full")
    layout = build_even_layout(model, 16, 8, True)
    assert [s.layers for s in layout.stages] == [0] + [1] * 126 + [0]
    assert layout.stages[0].embedding and layout.stages[-1].loss
    job = JobSpec(seq_len=8192, global_batch=2048)
    step = estimate_layout_step_time(model, CLUSTER, job, [config], [layout])
    memory = estimate_layout_memory(model, job, config, layout)
    assert len(memory.total) == 16 and np.all(memory.total > 0)
    assert step.step_s[0] > 0


@pytest.mark.parametrize(("model", "gpus"), [("llama3.1-8b", 16), ("mixtral-8x7b", 32),
                                             ("qwen3-30b-a3b", 32), ("llama3.2-1b", 8)])
def test_layout_engine_never_worse_than_even(model: str, gpus: int) -> None:
    problem = build_problem(model, "dgx-a100-40gb", gpus, seq_len=4096, global_batch=256)
    layout = solve(problem, top=3, engine="layout")
    even = solve(problem, top=3, engine="even")
    assert layout.status == "optimal"
    for best_layout, best_even in zip(layout.plans, even.plans):
        assert best_layout.time.step_seconds <= best_even.time.step_seconds * (1 + 1e-9)
    for plan in layout.plans:
        assert plan.fits and plan.layout is not None


def test_uneven_layout_makes_deepseek_fit_without_recompute() -> None:
    """DeepSeek-V3 (61 layers, 3 dense first, one MTP module) on pp 16, no recompute: the
    even split's first stage holds 16 micro-batches of 4 layers' activations and does not fit
    an H800; moving layers towards the last stages (fewer micro-batches in flight) does."""
    model = load_model_spec("deepseek-v3")
    cluster = load_cluster_spec("hgx-h800")
    job = JobSpec(seq_len=4096, global_batch=8192)
    config = ParallelConfig(tp=1, pp=16, dp=128, ep=64, zero=1, recompute="none")
    coefficients = estimate_layout_coefficients(model, cluster, job, config)
    capacity = cluster.gpu.memory_gib * 2**30
    even = build_even_layout(model, 16, 1, False, mtp_layers=1)
    assert estimate_layout_memory(model, job, config, even).total.max() > capacity
    answer, proven = solve_layout(config, coefficients, capacity,
                                  LayoutRules(recompute=False, uniform_recompute=True,
                                              mtp_layers=1))
    assert proven and answer is not None
    layers = [s.layers for s in answer.layout.stages]
    assert sum(layers) == 61 and layers[0] < layers[-2]
    assert estimate_layout_memory(model, job, config, answer.layout).total.max() <= capacity


def load_model_spec(name: str) -> ModelSpec:
    from solver.catalog import load_model_spec as load
    return load(name)


__all__ = ["GB", "MemoryOptions"]


@settings(max_examples=20, deadline=None)
@given(layout_problems())
def test_selective_recompute_costs_no_time(problem) -> None:
    """The layout search skips a mesh without recompute when its selective twin found no
    layout (solver.search.layout_search): sound only while the step time does not tell none
    from selective (FlashAttention keeps no scores to recompute) and selective never needs
    more memory (tests/test_memory_properties.py)."""
    model, job, config, _ = problem
    twins = [config.model_copy(update={"recompute": level}) for level in ("none", "selective")]
    terms = estimate_time_terms(model, CLUSTER, job, Candidates.from_configs(twins))
    assert np.array_equal(terms.per_layer[0], terms.per_layer[1])
    assert np.array_equal(terms.recompute[0], terms.recompute[1])
    assert terms.last[0].tolist() == terms.last[1].tolist()
