"""Invariants of the memory model over random configurations (hypothesis).

- memory per GPU (worst stage) never rises when a sharding degree rises (tp, pp, cp, ep;
  dp under ZeRO >= 1), nor when the ZeRO stage or the recompute level rises; it never falls
  when the micro-batch or the sequence grows;
- every item is finite and non-negative, and the items add up to the totals;
- the vectorised path (many candidates, worst stage) equals the one-configuration path
  (every stage of one configuration), row by row.

Two physical exceptions are excluded by the strategies, each for a stated reason:
- ZeRO 2 -> 3 adds gathered layers ((1 + prefetch) x bf16 + one layer's gradients = 8 bytes
  per layer parameter) while saving (1 - 1/d) of the weights: it saves memory only when a stage
  holds enough layers; checked on dense models with >= 8 layers per stage and d >= 2.
- pp rises: with layers not divisible by pp x vpp the first stage takes ceil(L / (pp vpp))
  layers for pp micro-batches, which can exceed the smaller pp's share (layer counts here are
  powers of two, so every split is even); and under interleaving the first stage holds
  L (1 + (p - 1)/(p v)) layers' activations (Korthikanti et al. 2022 §4.2.3), which grows
  with p: the pp property is checked for 1F1B (vpp = 1), where it is L for every p.
The properties run under the default MemoryOptions, and the sharding ones again under
torchtitan's (FSDP2 under PP: fsdp_unsharded_under_pp). There a pipelined stage holds its
gradients unsharded at every ZeRO stage FSDP2 shards (and gathered at ZeRO-3), so at ZeRO >= 2
memory rises from pp 1 to pp 2 (the gradients go from 1/d of the model to 1/2 of it:
tests/test_memory_features.py and tests/test_fsdp_accumulated_grads.py pin it); every other
doubling, pp from 2 on and pp 1 -> 2 at ZeRO <= 1 included, still never raises it. Under
the flex and all-gather dispatchers (DeepEP, HybridEP, allgather) the dispatcher's buffers are
sized by the ETPxEP group (solver.cost.memory.dispatcher: HybridEP holds a slot for every
token of the group), so memory may rise with ep; every other degree keeps the property there.
Megatron's layer-level CPU offloading (MemoryOptions.cpu_offloading_num_layers) saves memory at
pp 1 without recompute only, where Megatron runs it, so memory may rise from pp 1 to 2 or from
no recompute to selective under it; every such configuration is refused (estimate, launch) or
pinned out (optimize: solver.cost.step.offload.check_layer_offload), and tests/test_layer_offload.py
checks that memory never rises with the number of layers offloaded.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver.api import check_parallel_config, estimate_plan
from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import (
    ITEMS,
    OTHER_ITEMS,
    estimate_all_stages,
    estimate_memory,
    estimate_memory_total,
)
from solver.cost.memory.options import MemoryOptions
from solver.errors import InputError
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig

DENSE_GQA = ModelSpec(name="dense-gqa", hidden_size=2048, intermediate_size=5632,
                      num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      vocab_size=128256)
DENSE_MHA_TIED = ModelSpec(name="dense-mha", hidden_size=2048, intermediate_size=8192,
                           num_hidden_layers=32, num_attention_heads=16, vocab_size=50304,
                           tie_word_embeddings=True, mlp_type="plain", norm_type="layernorm",
                           embedding_norm=True, qkv_bias=True, o_bias=True, mlp_bias=True)
MOE_GQA = ModelSpec(name="moe-gqa", hidden_size=2048, intermediate_size=6144,
                    num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=8,
                    vocab_size=32000, num_experts=16, num_experts_per_tok=2,
                    moe_intermediate_size=1408)
MOE_MLA = ModelSpec(name="moe-mla", hidden_size=2048, intermediate_size=10944,
                    num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=16,
                    vocab_size=102400, q_lora_rank=512, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128, num_experts=32, num_experts_per_tok=4,
                    moe_intermediate_size=1408, num_shared_experts=2, first_k_dense_layers=1,
                    num_nextn_predict_layers=1)
MODELS = [DENSE_GQA, DENSE_MHA_TIED, MOE_GQA, MOE_MLA]
GLOBAL_BATCH = 512  # a multiple of dp x micro-batch for every draw below

powers = st.sampled_from


@st.composite
def problems(draw, models=MODELS):
    """(model, job, config): degrees are powers of two small enough to double once."""
    model_spec = draw(st.sampled_from(models))
    pp = draw(powers([1, 2, 4]))
    moe = model_spec.is_moe
    config = ParallelConfig(
        tp=draw(powers([1, 2, 4])), pp=pp, dp=draw(powers([1, 2, 4, 8])),
        cp=draw(powers([1, 2])), ep=draw(powers([1, 2, 4])) if moe else 1,
        etp=draw(powers([1, 2])) if moe else 1, vpp=draw(powers([1, 2])) if pp > 1 else 1,
        zero=draw(st.integers(0, 3)), micro_batch=draw(powers([1, 2, 4])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
    )
    job = JobSpec(seq_len=draw(powers([1024, 2048, 4096])), global_batch=GLOBAL_BATCH,
                  precision=draw(st.sampled_from(["bf16", "fp8"])))
    assume(is_valid(model_spec, job, config))
    return model_spec, job, config


def is_valid(model_spec: ModelSpec, job: JobSpec, config: ParallelConfig) -> bool:
    """The rules `parplan estimate` enforces (e.g. ep x etp divides tp x cp x dp)."""
    try:
        check_parallel_config(model_spec, job, config.num_gpus, config)
    except InputError:
        return False
    return True


def worst_totals(model_spec: ModelSpec, job: JobSpec, *configs: ParallelConfig,
                 options: MemoryOptions | None = None) -> np.ndarray:
    return estimate_memory(model_spec, job, Candidates.from_configs(list(configs)),
                           options).total


def assert_not_above(model_spec: ModelSpec, job: JobSpec, base: ParallelConfig,
                     changed: ParallelConfig, options: MemoryOptions | None = None) -> None:
    before, after = worst_totals(model_spec, job, base, changed, options=options)
    assert after <= before * (1 + 1e-12), (base, changed, before, after)


def doubled(model_spec: ModelSpec, job: JobSpec, config: ParallelConfig,
            degree: str) -> ParallelConfig:
    """`config` with `degree` doubled, drawn only where the property holds (module
    docstring): ep on MoE models, dp under ZeRO >= 1, pp under 1F1B, a valid result."""
    if degree == "ep":
        assume(model_spec.is_moe)
    if degree == "dp":
        assume(config.zero >= 1)
    if degree == "pp":
        assume(config.vpp == 1)
    changed = config.model_copy(update={degree: 2 * getattr(config, degree)})
    assume(is_valid(model_spec, job, changed))
    return changed


@settings(max_examples=150, deadline=None)
@given(problems(), st.sampled_from(["tp", "pp", "cp", "ep", "dp"]))
def test_memory_never_rises_with_a_sharding_degree(problem, degree: str) -> None:
    model_spec, job, config = problem
    assert_not_above(model_spec, job, config, doubled(model_spec, job, config, degree))


@settings(max_examples=150, deadline=None)
@given(problems(), st.sampled_from(["tp", "pp", "cp", "ep", "dp"]))
def test_memory_never_rises_with_a_sharding_degree_under_torchtitan(problem, degree: str) -> None:
    """torchtitan's FSDP2 keeps a pipelined stage's gradients unsharded in fp32 (states.
    estimate_fsdp_accumulated_grad_bytes): their bytes do not fall with dp, cp, tp or ep
    doubling only where they are a stage's share of the model, which no degree but pp changes;
    pp 1 -> 2 at ZeRO >= 2 is the exception (module docstring)."""
    model_spec, job, config = problem
    if degree == "pp":
        assume(config.pp > 1 or config.zero <= 1)
    options = build_framework_profile("torchtitan").memory_options()
    assert options.fsdp_unsharded_under_pp
    assert_not_above(model_spec, job, config, doubled(model_spec, job, config, degree), options)


@settings(max_examples=100, deadline=None)
@given(problems())
def test_a_torchtitan_pipeline_holds_no_more_as_the_zero_stage_rises(problem) -> None:
    """Under PP torchtitan's ZeRO 1, 2 and 3 hold the same gradients (unsharded, fp32) and the
    same weights and optimizer state less what each shards: never more from one to the next
    (ZeRO 0 -> 1 shards the optimizer state; 2 -> 3 trades no gathered layer for the fp32
    shard)."""
    model_spec, job, config = problem
    assume(config.pp > 1 and config.zero < 3)
    options = build_framework_profile("torchtitan").memory_options()
    assert_not_above(model_spec, job, config, config.model_copy(update={"zero": config.zero + 1}),
                     options)


@settings(max_examples=60, deadline=None)
@given(problems(models=[MOE_GQA, MOE_MLA]), st.sampled_from(["tp", "pp", "cp", "dp"]),
       st.sampled_from(["deepep", "hybridep", "allgather"]))
def test_memory_never_rises_with_a_non_expert_degree_under_any_dispatcher(
        problem, degree: str, dispatcher: str) -> None:
    model_spec, job, config = problem
    assert_not_above(model_spec, job, config, doubled(model_spec, job, config, degree),
                     MemoryOptions(moe_dispatcher=dispatcher))


@settings(max_examples=150, deadline=None)
@given(problems())
def test_memory_never_rises_with_the_zero_stage_up_to_2(problem) -> None:
    model_spec, job, config = problem
    assume(config.zero < 2)
    assert_not_above(model_spec, job, config, config.model_copy(update={"zero": config.zero + 1}))


@settings(max_examples=100, deadline=None)
@given(problems(models=[DENSE_GQA, DENSE_MHA_TIED]))
def test_zero3_saves_memory_when_stages_are_deep_enough(problem) -> None:
    model_spec, job, config = problem
    assume(model_spec.num_hidden_layers // (config.pp * config.vpp) * config.vpp >= 8)
    assume(config.dp * config.cp >= 2)
    config = config.model_copy(update={"zero": 2})
    assert_not_above(model_spec, job, config, config.model_copy(update={"zero": 3}))


@settings(max_examples=150, deadline=None)
@given(problems())
def test_memory_never_rises_with_the_recompute_level(problem) -> None:
    model_spec, job, config = problem
    assume(config.recompute != "full")
    more = {"none": "selective", "selective": "full"}[config.recompute]
    assert_not_above(model_spec, job, config, config.model_copy(update={"recompute": more}))


@settings(max_examples=150, deadline=None)
@given(problems(), st.sampled_from(["micro_batch", "seq_len"]))
def test_memory_never_falls_when_the_work_grows(problem, knob: str) -> None:
    model_spec, job, config = problem
    if knob == "micro_batch":
        bigger_job, bigger = job, config.model_copy(update={"micro_batch": 2 * config.micro_batch})
    else:
        bigger_job, bigger = job.model_copy(update={"seq_len": 2 * job.seq_len}), config
    before = worst_totals(model_spec, job, config)[0]
    after = worst_totals(model_spec, bigger_job, bigger)[0]
    assert after >= before * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(problems())
def test_items_are_non_negative_and_add_up(problem) -> None:
    model_spec, job, config = problem
    stages = estimate_all_stages(model_spec, job, config)
    assert len(stages) == config.pp
    for name in ITEMS:
        assert np.all(np.isfinite(stages.items[name])) and np.all(stages.items[name] >= 0), name
    assert np.allclose(stages.total, sum(stages.items[name] for name in ITEMS), rtol=1e-12)
    assert np.allclose(stages.other, sum(stages.items[name] for name in OTHER_ITEMS), rtol=1e-12)
    cluster = ClusterSpec.model_validate({
        "name": "test", "gpus_per_node": 8,
        "gpu": {"name": "gpu", "memory_gib": 80, "peak_tflops_bf16": 989,
                "peak_tflops_fp16": 989, "peak_tflops_fp8": 1979, "hbm_gb_per_s": 3350},
        "tiers": [{"name": "fabric", "kind": "network", "bandwidth_gb_per_s": 40,
                   "latency_us": 20}],
    })
    plan = estimate_plan(model_spec, cluster, job, config)
    for stage, total in zip(plan.stages, stages.total):
        assert np.isclose(stage.total_bytes, total, rtol=1e-12)
    assert plan.fits == bool(stages.total.max() <= 80 * 2**30)


@settings(max_examples=100, deadline=None)
@given(st.lists(problems(models=[MOE_MLA]), min_size=1, max_size=6))
def test_vectorised_path_equals_the_per_stage_path(batch) -> None:
    """Many candidates at once (estimate_memory, worst stage) give, row by row, the worst of
    the one-configuration path (estimate_all_stages); the search's totals-only path
    (estimate_memory_total) the same totals and stages."""
    model_spec, job = batch[0][0], batch[0][1]
    configs = [config for _, _, config in batch]
    worst = estimate_memory(model_spec, job, Candidates.from_configs(configs))
    totals, stage = estimate_memory_total(model_spec, job, Candidates.from_configs(configs))
    assert np.allclose(totals, worst.total, rtol=1e-12)
    assert np.array_equal(stage, worst.stage)
    for row, config in enumerate(configs):
        stages = estimate_all_stages(model_spec, job, config)
        top = int(np.argmax(stages.total))
        assert int(worst.stage[row]) == top
        for name in ITEMS:
            assert np.isclose(worst.items[name][row], stages.items[name][top], rtol=1e-12)


@settings(max_examples=50, deadline=None)
@given(problems())
def test_candidates_round_trip(problem) -> None:
    _, _, config = problem
    table = Candidates.from_configs([config, config.model_copy(update={"recompute": "full"})])
    assert table.to_configs()[0] == config
    assert int(table.recompute[1]) == RECOMPUTE_FULL
    assert replace(table, tp=table.tp * 2).to_configs()[0].tp == 2 * config.tp


def test_no_candidates_give_empty_arrays() -> None:
    """The solvers may ask about an empty batch (every candidate cut): empty answers, no error."""
    from solver.catalog import load_model_spec
    from solver.cost.memory import estimate_memory
    from solver.cost.step.steptime import estimate_step_time

    empty = Candidates(**{name: np.zeros(0, dtype=np.int64) for name in (
        "tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute")})
    model_spec = load_model_spec("mixtral-8x7b")
    assert len(estimate_memory(model_spec, JobSpec(), empty).total) == 0
    from solver.catalog import load_cluster_spec
    assert len(estimate_step_time(model_spec, load_cluster_spec("dgx-h100"), JobSpec(),
                                  empty).step_s) == 0


MOE_UNEVEN = ModelSpec(name="moe-uneven", hidden_size=1024, intermediate_size=4096,
                       num_hidden_layers=29, num_attention_heads=16, num_key_value_heads=4,
                       vocab_size=32000, num_experts=8, num_experts_per_tok=2,
                       moe_intermediate_size=704, first_k_dense_layers=3, moe_layer_freq=2,
                       num_nextn_predict_layers=1)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 16]), st.sampled_from([1, 2, 3]),
       st.booleans(), st.sampled_from([1, 2, 4, 8, 16]), st.integers(0, 3))
def test_worst_stage_skips_only_stages_that_cannot_be_the_worst(
        pp: int, vpp: int, embedding_slots: bool, dp: int, zero: int) -> None:
    """estimate_memory skips a stage holding the same layers as the one before it (not the
    last): uneven splits, dense-then-MoE layers, MTP on the last stage, embedding slots and
    interleaving included, it picks the stage the every-stage path calls the worst."""
    from solver.cost.memory import MemoryOptions

    assume(vpp == 1 or pp > 1)
    options = MemoryOptions(account_for_embedding_in_pipeline_split=embedding_slots)
    job = JobSpec(seq_len=2048, global_batch=GLOBAL_BATCH)
    config = ParallelConfig(tp=1, pp=pp, dp=dp, ep=2, vpp=vpp, zero=zero, micro_batch=1)
    worst = estimate_memory(MOE_UNEVEN, job, Candidates.from_configs([config]), options)
    stages = estimate_all_stages(MOE_UNEVEN, job, config, options)
    assert int(worst.stage[0]) == int(np.argmax(stages.total))
    assert np.isclose(worst.total[0], stages.total.max(), rtol=1e-12)
