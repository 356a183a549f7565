"""Memory features a framework profile chooses (issue 17), pinned to the frameworks' sources.

fp8 weight copies: Transformer Engine caches a row-wise and a column-wise quantised copy of
every GEMM weight it holds across micro-batches (TE docs, "FP8 weight caching",
is_first_microbatch; MXFP8BlockScaling / NVFP4BlockScaling keep "both row-wise and column-wise
quantized copies"), sharded as the weights are; torchao float8 (torchtitan) casts on the fly
and keeps none (Float8Linear; float8_experimental#181 removed its weight cache).

Invariants (hypothesis): a profile without copies never needs more memory than one with them;
at bf16 the choice changes nothing; under ZeRO-3 the copies never rise when dp rises.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.cost.memory.states import estimate_fp8_copy_bytes_per_param
from solver.spec import JobSpec, ModelSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures
from solver.spec.framework import RECOMPUTE_MODULES
from solver.spec.job import PRECISIONS

SMALL = ModelSpec(name="dense-small", hidden_size=1024, intermediate_size=2816,
                  num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
                  vocab_size=32000)


def _weights_gb(model_spec: ModelSpec, precision: str, copies: str, **degrees: int) -> float:
    config = ParallelConfig(micro_batch=1, recompute="full", **degrees)
    breakdown = estimate_memory(model_spec, JobSpec(seq_len=8192, global_batch=512,
                                                    precision=precision),
                                Candidates.from_configs([config]),
                                MemoryOptions(fp8_weight_copies=copies))
    return float(breakdown.items["weights"][0]) / 1e9


@pytest.mark.parametrize(("precision", "expected"), [
    ("bf16", 0.0), ("fp8", 2.0), ("fp8-blockwise", 2.0625), ("mxfp8", 2.0625),
    # NVFP4: every decoder layer (Megatron's first_last_layers_bf16 is off by default;
    # solver.cost.kernels.precision), half a byte and a sixteenth per element, two copies
    ("nvfp4", 2 * 0.5625)])
def test_copy_bytes_per_precision(precision: str, expected: float) -> None:
    te = MemoryOptions(fp8_weight_copies="transformer_engine")
    assert estimate_fp8_copy_bytes_per_param(precision, te) == pytest.approx(expected)
    assert estimate_fp8_copy_bytes_per_param(precision, MemoryOptions(
        fp8_weight_copies="none")) == 0.0


def test_llama3_70b_fsdp_copies_are_sharded() -> None:
    """Issue 17: "every fp8 run gets 2 B per parameter of copies, unsharded: 139 GB for
    Llama-3-70B under FSDP". Sharded over dp 64 the copies are 136.9 / 64 = 2.1 GB."""
    spec = load_model_spec("llama3.1-70b")
    bf16 = _weights_gb(spec, "bf16", "transformer_engine", dp=64, zero=3)
    te = _weights_gb(spec, "fp8", "transformer_engine", dp=64, zero=3)
    assert te - bf16 == pytest.approx(2.14, abs=0.01)
    assert _weights_gb(spec, "fp8", "none", dp=64, zero=3) == pytest.approx(bf16)
    # Below ZeRO-3 each GPU holds (and copies) every weight: 136.9 GB
    assert (_weights_gb(spec, "fp8", "transformer_engine", dp=64, zero=1)
            - _weights_gb(spec, "bf16", "transformer_engine", dp=64, zero=1)
            == pytest.approx(136.9, abs=0.1))


def test_profiles_choose_the_copies() -> None:
    assert build_framework_profile("megatron").memory_options().fp8_weight_copies \
        == "transformer_engine"
    assert build_framework_profile("deepspeed").memory_options().fp8_weight_copies \
        == "transformer_engine"
    assert build_framework_profile("torchtitan").memory_options().fp8_weight_copies == "none"
    assert build_framework_profile(
        "torchtitan", {"fp8_weight_copies": "transformer_engine"}
    ).memory_options().fp8_weight_copies == "transformer_engine"


@settings(max_examples=40, deadline=None)
@given(precision=st.sampled_from(PRECISIONS), tp=st.sampled_from([1, 2, 4]),
       dp=st.sampled_from([1, 2, 4, 8]), zero=st.integers(0, 3))
def test_no_copies_never_needs_more(precision: str, tp: int, dp: int, zero: int) -> None:
    te = _weights_gb(SMALL, precision, "transformer_engine", tp=tp, dp=dp, zero=zero)
    none = _weights_gb(SMALL, precision, "none", tp=tp, dp=dp, zero=zero)
    assert none <= te
    if precision == "bf16":
        assert none == te
    if zero == 3 and dp > 1:
        fewer = _weights_gb(SMALL, precision, "transformer_engine", tp=tp, dp=dp // 2, zero=3)
        assert te <= fewer


# ---- precision-aware optimizer and bf16 gradient reduction (Megatron, opt-in) -------------------

def _profile_states(precision: str = "bf16", **features: bool) -> dict[str, float]:
    """Per-GPU states of Llama-3.1-8B on 8 GPUs (dp 8, ZeRO-1), GB, under the megatron profile
    with `features`."""
    options = build_framework_profile("megatron", features).memory_options()
    breakdown = estimate_memory(load_model_spec("llama3.1-8b"),
                                JobSpec(seq_len=8192, precision=precision),
                                Candidates.from_configs([ParallelConfig(dp=8, zero=1)]),
                                options)
    return {k: float(breakdown.items[k][0]) / 1e9
            for k in ("grads", "optimizer", "comm_buckets")}


def test_precision_aware_optimizer_keeps_bf16_moments() -> None:
    """Megatron arguments.py: --use-precision-aware-optimizer with --exp-avg-dtype and
    --exp-avg-sq-dtype bf16 (default fp32; off by default): m 2 B + v 2 B, and the fp32 master
    kept as the 16 bits a bf16 parameter lacks (Megatron-Core optimizer_config.py
    store_param_remainders, default True with TE >= 2.1; distrib_optimizer.py: an int16
    master_param), 2 B: 6 B per parameter, sharded over dp: 8.03e9 x 6 / 8 = 6.0 GB (12.0 GB
    with fp32 moments). Below bf16 Megatron keeps its own fp32 master
    (use_precision_aware_optimizer_no_fp8_or_ds_fp8 false for current scaling): 8 B."""
    plain, aware = _profile_states(), _profile_states(precision_aware_optimizer=True)
    assert plain["optimizer"] == pytest.approx(12.05, abs=0.02)
    assert aware["optimizer"] == pytest.approx(plain["optimizer"] * 6 / 12)
    assert aware["grads"] == plain["grads"]
    fp8 = _profile_states("fp8", precision_aware_optimizer=True)
    assert fp8["optimizer"] == pytest.approx(plain["optimizer"] * 8 / 12)


def test_grad_reduce_in_bf16_halves_the_buffer_and_the_dp_bytes() -> None:
    """Megatron --grad-reduce-in-bf16 (distributed_data_parallel_config.py grad_reduce_in_fp32
    False): the gradient buffer is bf16, 2 B per parameter instead of fp32's 4 (32.1 -> 16.1 GB
    for Llama-3.1-8B), and the DP reduction moves half the bytes."""
    plain, bf16 = _profile_states(), _profile_states(grad_reduce_in_bf16=True)
    assert bf16["grads"] == pytest.approx(plain["grads"] / 2)
    assert bf16["comm_buckets"] == pytest.approx(plain["comm_buckets"] / 2)
    from solver.catalog import load_cluster_spec
    from solver.cost.step.data_parallel import estimate_dp_collectives_s

    spec, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    candidates = Candidates.from_configs([ParallelConfig(dp=64, zero=1)])
    seconds = {on: estimate_dp_collectives_s(
        spec, cluster, candidates,
        build_framework_profile("megatron", {"grad_reduce_in_bf16": on}).time_constants)
        ["grads_reduce_scatter"][0] for on in (False, True)}
    # NCCL latency per bucket + bytes / bandwidth: the same 126 buckets of 64e6 parameters
    # (Megatron's max(40e6, 1e6 x 64)) by ring LL128 either way (solver.cost.comm.nccl_latency), so
    # the bandwidth part halves: 2 B x 8.03e9 x 63/64 / (0.92 x 360 GB/s) = 47.7 ms less.
    assert seconds[False] - seconds[True] == pytest.approx(
        8_030_261_248 * 2 * 63 / 64 / (0.92 * 360e9), rel=1e-3)


def test_megatron_launch_emits_the_optimizer_features() -> None:
    from click.testing import CliRunner

    from solver.cli import cli

    args = ["launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--format", "megatron"]
    plain = CliRunner().invoke(cli, args)
    assert plain.exit_code == 0, plain.output
    assert "--use-precision-aware-optimizer" not in plain.output
    assert "--grad-reduce-in-bf16" not in plain.output
    chosen = CliRunner().invoke(cli, [*args, "--precision-aware-optimizer",
                                       "--grad-reduce-in-bf16"])
    assert chosen.exit_code == 0, chosen.output
    for flag in ("--use-precision-aware-optimizer", "--exp-avg-dtype bf16",
                 "--exp-avg-sq-dtype bf16", "--main-grads-dtype bf16", "--grad-reduce-in-bf16"):
        assert flag in chosen.output


@settings(max_examples=30, deadline=None)
@given(aware=st.booleans(), bf16=st.booleans(), dp=st.sampled_from([1, 2, 8]),
       zero=st.integers(0, 3))
def test_optimizer_features_never_need_more(aware: bool, bf16: bool, dp: int, zero: int) -> None:
    """Invariant: turning the precision-aware optimizer or bf16 gradient reduction on never
    raises the memory of any configuration."""
    job = JobSpec(seq_len=2048, global_batch=64)
    candidates = Candidates.from_configs([ParallelConfig(dp=dp, zero=zero)])

    def total(**features: bool) -> float:
        options = build_framework_profile("megatron", features).memory_options()
        return float(estimate_memory(SMALL, job, candidates, options).total[0])

    assert total(precision_aware_optimizer=aware, grad_reduce_in_bf16=bf16) <= total()


# ---- Megatron --recompute-modules (selective, module level) ----------------------------------

def _layer_bytes(model_spec: ModelSpec, modules: tuple[str, ...], moe: bool = False,
                 **options: object) -> float:
    from solver.cost.memory import estimate_layer_activation_bytes

    candidates = Candidates.from_configs([ParallelConfig(recompute="selective")])
    return float(estimate_layer_activation_bytes(
        model_spec, JobSpec(seq_len=1), candidates,
        MemoryOptions(recompute_modules=modules, **options), moe=moe)[0])


def test_mlp_recompute_drops_the_mlp_interior() -> None:
    """megatron/core/transformer/mlp.py: with "mlp" in recompute_modules the MLP runs under
    tensor_parallel.checkpoint, keeping its input only: Llama-3.1-8B (F 14336) drops the
    activation input and fc2 input, 2 x 14336 x 2 B = 57,344 B per token."""
    spec = load_model_spec("llama3.1-8b")
    dropped = _layer_bytes(spec, ("core_attn",)) - _layer_bytes(spec, ("core_attn", "mlp"))
    assert dropped == pytest.approx(57_344)


def test_moe_recompute_covers_its_parts() -> None:
    """moe checkpoints the whole MoE block (moe_layer.py); moe_act (experts.py) and
    shared_experts (shared_experts.py) drop parts of it; core_attn off keeps the core
    (transformer_config.py recompute_modules)."""
    spec = load_model_spec("deepseek-v3")
    base = _layer_bytes(spec, ("core_attn",), moe=True)
    parts = _layer_bytes(spec, ("core_attn", "moe_act", "shared_experts"), moe=True)
    whole = _layer_bytes(spec, ("core_attn", "moe"), moe=True)
    assert whole < parts < base
    assert _layer_bytes(spec, ("core_attn", "mla_up_proj"), moe=True) < base
    unfused = {"flash_attention": False}
    assert _layer_bytes(spec, ("mlp",), **unfused) > _layer_bytes(spec, ("core_attn", "mlp"),
                                                                  **unfused)


def test_module_recompute_costs_time_and_launches() -> None:
    from click.testing import CliRunner

    from solver.api import estimate
    from solver.cli import cli

    common = dict(seq_len=8192, tp=1, pp=1, micro_batch=2, recompute="selective")
    # core_attn alone: estimate's default on Llama is (core_attn, mlp), optimize's first set.
    plain = estimate("llama3.1-8b", "dgx-h100", 8, features=FrameworkFeatures(
        recompute_modules=("core_attn",)), **common).plan
    mlp = estimate("llama3.1-8b", "dgx-h100", 8, features=FrameworkFeatures(
        recompute_modules=("core_attn", "mlp")), **common).plan
    assert mlp.worst_stage.total_bytes < plain.worst_stage.total_bytes
    assert mlp.time.step_seconds > plain.time.step_seconds
    result = CliRunner().invoke(cli, [
        "launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
        "--recompute", "selective", "--recompute-modules", "core_attn,mlp",
        "--format", "megatron"])
    assert result.exit_code == 0, result.output
    assert "--recompute-modules core_attn mlp" in result.output


@settings(max_examples=40, deadline=None)
@given(modules=st.sets(st.sampled_from(RECOMPUTE_MODULES)), extra=st.sampled_from(
    RECOMPUTE_MODULES), moe=st.booleans())
def test_recomputing_one_more_module_never_needs_more(modules: set, extra: str,
                                                      moe: bool) -> None:
    """Invariant: adding a module to --recompute-modules never raises a layer's activations,
    which never fall below full recompute's (the layer input)."""
    spec = load_model_spec("deepseek-v3") if moe else load_model_spec("llama3.1-8b")
    fewer = _layer_bytes(spec, tuple(sorted(modules)), moe=moe)
    more = _layer_bytes(spec, tuple(sorted(modules | {extra})), moe=moe)
    assert more <= fewer
    assert more >= 2.0 * spec.hidden_size


def test_estimate_prints_its_memory_assumptions() -> None:
    """Issue 17: estimate prints the assumptions it made ("fp8 weight copies: none (torchao
    float8)")."""
    from click.testing import CliRunner

    from solver.cli import cli

    args = ["estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--precision", "fp8"]
    titan = CliRunner().invoke(cli, [*args, "--framework", "torchtitan"])
    assert titan.exit_code == 0, titan.output
    assert "fp8 weight copies: none (torchao float8" in titan.output
    chosen = CliRunner().invoke(cli, [*args, "--precision-aware-optimizer",
                                      "--recompute-modules", "core_attn,mlp"])
    assert "bf16 Adam moments (precision-aware optimizer)" in chosen.output
    assert "--recompute selective: modules core_attn,mlp" in chosen.output


def test_torchtitan_and_deepspeed_launch_bf16_reduction() -> None:
    """torchtitan job_config.py Training.mixed_precision_reduce ("float32" by default);
    DeepSpeed ds_config communication_data_type. Neither has a precision-aware optimizer:
    a warning."""
    from click.testing import CliRunner

    from solver.cli import cli

    args = ["launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--grad-reduce-in-bf16", "--precision-aware-optimizer"]
    titan = CliRunner().invoke(cli, [*args, "--target", "torchtitan@0.2"])
    assert titan.exit_code == 0, titan.output
    assert 'mixed_precision_reduce = "bfloat16"' in titan.output
    assert "no precision-aware optimizer" in titan.output
    # torchtitan 0.3: Training.mixed_precision_reduce takes "float32" only
    newer = CliRunner().invoke(cli, [*args, "--format", "torchtitan"])
    assert "mixed_precision_reduce" not in newer.stdout
    assert "reduces gradients in float32 only" in newer.stderr
    deepspeed = CliRunner().invoke(cli, [*args, "--format", "deepspeed"])
    assert deepspeed.exit_code == 0, deepspeed.output
    assert '"communication_data_type": "bf16"' in deepspeed.output
    assert "no precision-aware optimizer" in deepspeed.output


def test_only_megatron_keeps_its_gradients_in_the_reduce_dtype() -> None:
    """Megatron's grad buffer takes the reduction dtype (param_and_grad_buffer.py); FSDP2's
    MixedPrecisionPolicy(reduce_dtype=bf16) casts the reduced shard back to the fp32 sharded
    parameter's dtype (torchtitan), so its gradients stay 4 B."""
    titan = build_framework_profile("torchtitan", {"grad_reduce_in_bf16": True})
    assert titan.memory_options().grad_bytes == 4.0
    megatron = build_framework_profile("megatron", {"grad_reduce_in_bf16": True})
    assert megatron.memory_options().grad_bytes == 2.0


# ---- PyTorch FSDP: the fp32 parameter shard is the master copy ---------------------------------

def _states_gb(framework: str, zero: int, dp: int = 8) -> dict[str, float]:
    """Per-GPU weights, gradients and optimizer state of Llama-3.1-8B, GB."""
    options = build_framework_profile(framework).memory_options()
    config = ParallelConfig(dp=dp, zero=zero, recompute="full")
    breakdown = estimate_memory(load_model_spec("llama3.1-8b"), JobSpec(seq_len=8192),
                                Candidates.from_configs([config]), options)
    return {k: float(breakdown.items[k][0]) / 1e9 for k in ("weights", "grads", "optimizer")}


def test_fsdp_shard_is_the_fp32_master() -> None:
    """torchtitan trains "in the default fp32 training configuration" with "fp32 parameters
    and fp32 grads" (docs/bf16_optimizer_states.md @b5bcd76) and shards them with
    fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype)) (torchtitan/
    distributed/fsdp.py): bf16 exists only in the gathered copy. Composer (LLM Foundry) does
    the same with FSDP1's MixedPrecision, param_dtype = the autocast dtype ("DEFAULT" and
    "PURE", composer/distributed/mosaic_parallelism.py get_mixed_precision @6405188). So the
    ZeRO-3 shard holds 4 (param, the master) + 4 (grad) + 8 (Adam m, v) = 16 B per parameter:
    8.03e9 x 16 / 8 = 16.1 GB for Llama-3.1-8B over dp 8, against 18 B / 8 = 18.1 GB for
    Megatron-FSDP and DeepSpeed, which keep a bf16 shard beside the fp32 one."""
    titan, generic, megatron = (_states_gb(f, zero=3) for f in ("torchtitan", "generic",
                                                                  "megatron"))
    assert sum(titan.values()) == pytest.approx(8.03 * 16 / 8, rel=0.01)
    assert sum(megatron.values()) == pytest.approx(8.03 * 18 / 8, rel=0.01)
    assert titan["weights"] == pytest.approx(2 * megatron["weights"])  # 4 B, not 2
    assert titan["optimizer"] == pytest.approx(megatron["optimizer"] * 8 / 12)
    assert generic == titan
    assert _states_gb("deepspeed", zero=3) == megatron
    # Below ZeRO-3 the bf16 weights are whole on every GPU either way: nothing changes
    for zero in (0, 1, 2):
        assert _states_gb("torchtitan", zero) == _states_gb("megatron", zero)


@settings(max_examples=40, deadline=None)
@given(dp=st.sampled_from([1, 2, 4, 8, 16]), zero=st.integers(0, 3),
       aware=st.booleans())
def test_fsdp_master_never_needs_more(dp: int, zero: int, aware: bool) -> None:
    """Invariants: the fp32-shard rule never needs more than a separate master copy, and under
    it the states never rise when dp rises."""
    config = ParallelConfig(dp=dp, zero=zero, recompute="full")
    optimizer_bytes = 8.0 if aware else 12.0

    def total(fsdp: bool, candidates: Candidates) -> np.ndarray:
        options = MemoryOptions(fp32_sharded_params=fsdp, optimizer_bytes=optimizer_bytes)
        return estimate_memory(SMALL, JobSpec(seq_len=4096), candidates, options).total

    candidates = Candidates.from_configs([config, config.model_copy(update={"dp": 2 * dp})])
    fsdp, separate = total(True, candidates), total(False, candidates)
    assert np.all(fsdp <= separate)
    if zero >= 1:
        assert fsdp[1] <= fsdp[0]


def test_fit_check_and_assumptions_name_the_fsdp_master() -> None:
    """The first "why" line counts FSDP's fully sharded 4 + 4 + 8 bytes under torchtitan, and
    `estimate` says where the master weights live."""
    from click.testing import CliRunner

    from solver.cli import cli

    args = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--framework", "torchtitan"]
    plan = CliRunner().invoke(cli, ["optimize", *args])
    assert plan.exit_code == 0, plan.output
    assert "(16 bytes each: 4 + 4 + 8)" in plan.output
    shown = CliRunner().invoke(cli, ["estimate", *args, "--zero", "3"])
    assert "the fp32 parameter shard is the master (PyTorch FSDP)" in shown.output


# ---- memory savers chosen by the search (issue 17: knobs, by dominance) -----------------------

def test_saver_ladder_leaves_flags_alone() -> None:
    """The search may turn on the savers no flag set, in MEMORY_SAVERS' order, and only under
    Megatron, where they save memory (FrameworkProfile.memory_options: torchtitan's FSDP2
    casts the reduced shard back to fp32, DeepSpeed's communication_data_type changes traffic
    only)."""
    from solver.cost.step.frameworks import memory_saver_ladder

    assert memory_saver_ladder("megatron") == ("grad_reduce_in_bf16", "precision_aware_optimizer")
    assert memory_saver_ladder("megatron", FrameworkFeatures(grad_reduce_in_bf16=False)) == (
        "precision_aware_optimizer",)
    assert memory_saver_ladder("megatron", FrameworkFeatures(
        grad_reduce_in_bf16=True, precision_aware_optimizer=False)) == ()
    assert memory_saver_ladder("torchtitan") == memory_saver_ladder("deepspeed") == ()


def _solve(model: str, gpus: int, engine: str = "even", **features: bool):
    from solver.optimize import build_problem, solve

    problem = build_problem(model, "dgx-h100", gpus,
                            features=FrameworkFeatures(**features) if features else None)
    return solve(problem, top=5, engine=engine, compare=False)


def _assert_shortest_prefix(result) -> None:
    """Every plan fits with its savers and not with one fewer (the shortest prefix)."""
    from solver.ranked_plans import saver_levels

    levels = dict(saver_levels(result.problem))
    problem = result.problem
    for plan in result.plans:
        assert plan.fits
        assert plan.memory_savers == problem.memory_savers[:len(plan.memory_savers)]
        if plan.memory_savers:
            fewer = plan.memory_savers[:-1]
            from solver.cost.memory import estimate_layout_memory

            total = estimate_layout_memory(problem.model_spec, problem.job, plan.config,
                                           plan.layout, levels[fewer]).total.max()
            assert total > plan.usable_memory_bytes


def test_llama31_8b_turns_savers_on_only_where_a_plan_needs_them() -> None:
    """Llama-3.1-8B on 8 H100s (seq 4096, global batch 1024): the fastest plans need bf16
    gradient reduction to fit (without it the winner's worst stage holds 103.5 GB of the 85.5
    usable), so the search turns it on for them; plans that fit without keep it off. With the
    savers pinned off the best plan is no faster (dominance: they only save memory and never
    add step time), and with them pinned on every plan is costed on the same memory."""
    free = _solve("llama3.1-8b", 8)
    off = _solve("llama3.1-8b", 8, grad_reduce_in_bf16=False, precision_aware_optimizer=False,
                 optimizer_offload=False, activation_offload=False)
    assert free.problem.memory_savers == ("grad_reduce_in_bf16", "precision_aware_optimizer")
    assert off.problem.memory_savers == ()
    assert free.plans[0].memory_savers  # the winner needs one
    assert all(not plan.memory_savers for plan in off.plans)
    assert free.plans[0].time.step_seconds <= off.plans[0].time.step_seconds
    _assert_shortest_prefix(free)
    assert any(line.startswith("memory savers: --grad-reduce-in-bf16") for line in free.why)


@settings(max_examples=6, deadline=None)
@given(model=st.sampled_from(["llama3.1-8b", "llama3.1-70b", "qwen3-30b-a3b"]),
       gpus=st.sampled_from([8, 16, 64]))
def test_every_returned_plan_fits_with_its_savers(model: str, gpus: int) -> None:
    """Invariant: every plan optimize returns fits under the savers it names, and they are the
    shortest prefix of the ladder that fits (the layout engine, the default)."""
    _assert_shortest_prefix(_solve(model, gpus, engine="layout"))


def test_launch_emits_the_plan_savers(tmp_path) -> None:
    """`launch --plan` turns on what the plan needs (Megatron --grad-reduce-in-bf16); a flag
    still overrides the plan."""
    import json

    from click.testing import CliRunner

    from solver.cli import cli

    args = ["--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    answer = CliRunner().invoke(cli, ["optimize", *args, "--engine", "even", "--json"])
    assert answer.exit_code == 0, answer.output
    plans = json.loads(answer.stdout)["plans"]
    assert plans[0]["memory_savers"][0] == "grad_reduce_in_bf16"
    path = tmp_path / "plans.json"
    path.write_text(answer.stdout)
    launch = ["launch", *args, "--plan", str(path), "--format", "megatron"]
    emitted = CliRunner().invoke(cli, launch)
    assert emitted.exit_code == 0, emitted.output
    assert "--grad-reduce-in-bf16" in emitted.output
    pinned = CliRunner().invoke(cli, [*launch, "--no-grad-reduce-in-bf16"])
    assert "--grad-reduce-in-bf16" not in pinned.output
    bad = json.loads(answer.stdout)
    bad["plans"][0]["memory_savers"] = ["cpu_offload"]
    path.write_text(json.dumps(bad))
    refused = CliRunner().invoke(cli, launch)
    assert refused.exit_code == 2
    assert "plans.0.memory_savers" in refused.output and "cpu_offload" in refused.output


def test_torchtitan_keeps_a_pipeline_stage_gathered() -> None:
    """torchtitan/distributed/fsdp.py get_fsdp_reshard_after_forward_policy: "For PP, by
    default do not reshard after forward" (returns `not pp_enabled`); torch/distributed/
    pipelining/stage.py backward_maybe_with_nosync sets set_reshard_after_backward(False) and
    set_requires_gradient_sync(False) until the last micro-batch; FSDPParam.
    to_accumulated_grad_if_needed accumulates the unsharded gradient in the reduce dtype (fp32
    in torchtitan). Llama-3.1-405B, tp 8, pp 8, dp 8, ZeRO-3: a stage holds 405.9e9 / 64 = 6.34e9
    parameters per GPU, gathered in bf16 (12.7 GB) on top of the 16 B / 8 shard, and fp32
    gradients (25.4 GB) in place of their 4 B / 8 shard (None until the last micro-batch's
    reduce-scatter: tests/test_fsdp_accumulated_grads.py); Megatron-FSDP reshards (no such
    term). The state at pp 1 is unchanged: the one documented case where memory rises with a
    sharding degree (pp 1 -> 2)."""
    spec = load_model_spec("llama3.1-405b")
    titan = build_framework_profile("torchtitan").memory_options()
    assert titan.fsdp_unsharded_under_pp
    assert not build_framework_profile("megatron").memory_options().fsdp_unsharded_under_pp

    def items(options: MemoryOptions, **degrees: int) -> dict[str, float]:
        config = ParallelConfig(tp=8, zero=3, micro_batch=1, recompute="full", **degrees)
        breakdown = estimate_memory(spec, JobSpec(seq_len=8192, global_batch=64),
                                    Candidates.from_configs([config]), options)
        return {k: float(v[0]) / 1e9 for k, v in breakdown.items.items()}

    resharded = titan.model_copy(update={"fsdp_unsharded_under_pp": False})
    kept, plain = items(titan, pp=8, dp=8), items(resharded, pp=8, dp=8)
    stage = spec.total_params / 64 / 1e9  # ~6.34e9 per GPU; the worst stage holds the head
    assert kept["weights"] - plain["weights"] == pytest.approx(2 * stage, rel=0.05)
    assert kept["grads"] - plain["grads"] == pytest.approx(4 * stage * (1 - 1 / 8), rel=0.05)
    assert kept["zero3_gather"] == 0.0 < plain["zero3_gather"]  # nothing gathered apart
    assert items(titan, pp=1, dp=64) == items(resharded, pp=1, dp=64)
    total = {pp: sum(items(titan, pp=pp, dp=64 // pp).values()) for pp in (1, 2)}
    assert total[1] < total[2]


def test_report_launch_line_carries_the_plan_savers() -> None:
    """The report page's copyable launch line turns on what the plan needs to fit."""
    from solver.optimize import build_problem, solve
    from solver.optimize_json import render_result_json
    from solver.sweep.report_data import render_launch_line

    answer = render_result_json(solve(build_problem("llama3.1-8b", "dgx-h100", 8), top=2,
                                      engine="even", compare=False))
    line = {**answer, "model": "llama3.1-8b", "cluster": "dgx-h100", "gpus": 8}
    plan = answer["plans"][0]
    assert plan["memory_savers"]
    launch = render_launch_line(line, plan)
    assert all("--" + name.replace("_", "-") in launch.split() for name in plan["memory_savers"])


def test_torchtitan_eager_cross_entropy_holds_twelve_bytes_per_logit() -> None:
    """torchtitan's loss is F.cross_entropy(pred.float(), labels) (components/loss.py
    cross_entropy_loss) after `del pred` (train.py @9dec370: "need to free to before bwd to
    avoid peaking memory"): log_softmax keeps its fp32 output, and the backward adds nll_loss's
    and log_softmax's fp32 gradients, 4 + 4 + 4 B per logit while every activation is held.
    With torch.compile ([compile] components "model", "loss") the loss is compiled
    (solver.cost.memory.loss). Llama-3.1-8B, micro-batch 2 x 8192 tokens, 128,256 vocabulary:
    2.10e9 logits x 12 B = 25.2 GB."""
    eager = build_framework_profile("torchtitan").memory_options()
    compiled = build_framework_profile("torchtitan", {"fused_elementwise": True}).memory_options()
    assert eager.logits_bytes == 12.0 and eager.loss_implementation == "eager"
    assert compiled.loss_implementation == "compiled"
    assert build_framework_profile("megatron").memory_options().logits_bytes == 6.0
    assert MemoryOptions().logits_bytes == 6.0
    config = ParallelConfig(dp=8, zero=3, micro_batch=2, recompute="selective")
    logits = estimate_memory(load_model_spec("llama3.1-8b"), JobSpec(seq_len=8192,
                                                                      global_batch=16),
                             Candidates.from_configs([config]), eager).items["logits"][0]
    assert logits / 1e9 == pytest.approx(2 * 8192 * 128256 * 12 / 1e9, rel=1e-6)


# torchao float8 (tensorwise) with FSDP2's float8 all-gather: torchtitan v0.2.2
# job_config.py Float8Linear.enable_fsdp_float8_all_gather (default False), docs/float8.md:
# "cast Float8Linear.weight from high precision to float8 before FSDP all-gather".
def _torchtitan_items(fp8_all_gather: bool, **degrees: int) -> dict[str, float]:
    profile = build_framework_profile("torchtitan", {"fp8_all_gather": fp8_all_gather})
    config = ParallelConfig(micro_batch=1, recompute="full", zero=3, **degrees)
    job = JobSpec(seq_len=8192, global_batch=512, precision="fp8")
    breakdown = estimate_memory(load_model_spec("llama3.1-70b"), job,
                                Candidates.from_configs([config]), profile.memory_options())
    return {name: float(value[0]) for name, value in breakdown.items.items()}


def test_float8_all_gather_gathers_one_byte_per_weight() -> None:
    """ZeRO-3 gather buffers: (1 + prefetch) gathered layers at 1 B instead of 2, plus the
    layer's unsharded gradients (4 B): one layer of Llama-3.1-70B over tp 8 is 0.856e9 / 8
    parameters, 2 x 107.0M x 1 B = 0.214 GB less."""
    plain = _torchtitan_items(False, tp=8, dp=8)
    fp8 = _torchtitan_items(True, tp=8, dp=8)
    layer = load_model_spec("llama3.1-70b").dense_layer_params / 8
    assert plain["zero3_gather"] - fp8["zero3_gather"] == pytest.approx(2 * layer * 1.0)
    assert plain["weights"] == fp8["weights"]  # the fp32 shard is unchanged


def test_float8_all_gather_keeps_a_pipelined_stage_gathered_in_float8() -> None:
    """torchtitan under PP keeps the stage's parameters gathered (MemoryOptions.
    fsdp_unsharded_under_pp): in float8 they are 1 B each, not 2."""
    plain = _torchtitan_items(False, tp=8, pp=2, dp=4)
    fp8 = _torchtitan_items(True, tp=8, pp=2, dp=4)
    assert fp8["weights"] < plain["weights"]
    assert plain["zero3_gather"] == fp8["zero3_gather"] == 0.0  # nothing gathered apart


def test_float8_all_gather_is_refused_where_it_cannot_run() -> None:
    from click.testing import CliRunner

    from solver.cli import cli

    base = ["estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--zero", "3", "--fp8-all-gather"]
    for extra, message in (
            (["--framework", "torchtitan", "--precision", "bf16"],
             "--fp8-all-gather: torchao's float8 all-gather is for tensorwise float8"),
            (["--precision", "fp8"], "--fp8-all-gather on: Megatron gathers fp8 weights")):
        result = CliRunner().invoke(cli, base + extra)
        assert result.exit_code == 2 and message in result.output, result.output
        assert len(result.output.strip().splitlines()) == 1


def test_float8_all_gather_in_torchtitan_launch() -> None:
    """torchtitan 0.2.x's TOML takes [quantize.linear.float8] enable_fsdp_float8_all_gather
    (with precompute_float8_dynamic_scale_for_fsdp, which docs/float8.md pairs with it);
    torchtitan 0.3's float8 is rowwise with high-precision communication: a warning."""
    from click.testing import CliRunner

    from solver.cli import cli

    base = ["launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--zero", "3", "--precision", "fp8", "--format", "torchtitan", "--fp8-all-gather"]
    toml = CliRunner().invoke(cli, base + ["--target", "torchtitan@0.2"])
    assert toml.exit_code == 0, toml.output
    assert "[quantize.linear.float8]\nenable_fsdp_float8_all_gather = true\n" \
           "precompute_float8_dynamic_scale_for_fsdp = true" in toml.output
    newer = CliRunner().invoke(cli, base)
    assert newer.exit_code == 0 and "enable_fsdp_float8_all_gather" not in newer.output
    assert "no float8 all-gather" in newer.output


def test_float8_all_gather_moves_one_byte_per_layer_weight() -> None:
    """The parameter all-gather under torchao float8's FSDP all-gather: 1 B per layer weight,
    bf16 for the embedding and LM head (Llama-3.1-8B: 1.05e9 of its 8.03e9 parameters), so
    (1.05 x 2 + 6.98 x 1) / 8.03 = 1.13 B against 2."""
    from solver.catalog.clusters import load_cluster_spec
    from solver.cost.step.data_parallel import estimate_dp_collectives_s

    model_spec, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    candidates = Candidates.from_configs([ParallelConfig(dp=8, zero=3)])
    plain = build_framework_profile("torchtitan").time_constants
    fp8 = build_framework_profile("torchtitan", {"fp8_all_gather": True}).time_constants
    bf16_s = estimate_dp_collectives_s(model_spec, cluster, candidates, plain)
    fp8_s = estimate_dp_collectives_s(model_spec, cluster, candidates, fp8)
    ends = model_spec.embedding_params + model_spec.lm_head_params + model_spec.final_norm_params
    per_param = (ends * 2 + (model_spec.total_params - ends) * 1) / model_spec.total_params
    assert per_param == pytest.approx(1.13, abs=0.01)
    assert fp8_s["params_all_gather"][0] < bf16_s["params_all_gather"][0]
    # Less the NCCL latency of FSDP's 33 gathers (32 layers and the root) by ring Simple on one
    # node, 8.4 + 7 x 3.4 = 32.2 us each (solver.cost.comm.nccl_latency), the bytes scale.
    latency = 33 * 32.2e-6
    assert fp8_s["params_all_gather"][0] - latency == pytest.approx(
        (bf16_s["params_all_gather"][0] - latency) * per_param / 2, rel=0.02)
    assert fp8_s["zero3_reduce_scatter"][0] == bf16_s["zero3_reduce_scatter"][0]
