"""Low-precision training states (issue 43, item 4; solver.cost.step.training_states): pure bf16 and
8-bit Adam, each a named choice (--training-states) with its memory, its optimizer-step bytes,
and a launch setting or a one-line refusal per framework.

Sources pinned here:
  bitsandbytes/optim/optimizer.py Optimizer2State.init_state: state1, state2 torch.uint8; with
    block_wise, absmax1 and absmax2 torch.float32 of n // 256 (+1) blocks.
  bitsandbytes docs, "8-bit optimizers": "75% less GPU memory" of the optimizer states.
  torchtune docs tutorials/memory_optimizations.rst, "Model Precision": bfloat16 "uses 2 bytes
    per model and optimizer parameter"; pure bf16 = 2 + 2 + 2 + 2 = 8 B per parameter.
  Megatron dist_optimizer.md: mixed precision 18 B per parameter (2 + 4 + 12).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver.api import check_parallel_config, load_problem_specs
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.step.data_parallel import estimate_optimizer_s
from solver.cost.step.frameworks import build_framework_profile, offload_ladder
from solver.cost.memory import estimate_memory
from solver.cost.memory.options import MemoryOptions
from solver.cost.step.training_states import (
    ADAM8BIT_MOMENT_BYTES,
    estimate_optimizer_step_bytes,
    estimate_training_state_options,
)
from solver.emit.deepspeed import build_deepspeed_config
from solver.emit.layout import build_rank_layout
from solver.emit.megatron import render_megatron
from solver.emit.target import LaunchTarget
from solver.errors import InputError
from solver.spec import JobSpec, ModelSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures

LOW_STATES = ("pure_bf16", "adam8bit", "pure_bf16_adam8bit")
# Where each framework takes them (solver.cost.step.frameworks.UNSUPPORTED).
TAKEN = {"generic": LOW_STATES, "deepspeed": LOW_STATES, "megatron": (), "torchtitan": ()}


def _bytes_per_param(options: MemoryOptions) -> float:
    return options.param_bytes + options.grad_bytes + options.optimizer_bytes


def test_8bit_moment_is_one_byte_plus_an_fp32_absmax_per_256() -> None:
    """bitsandbytes' block-wise state: 1 B + 4 B / 256 per element and moment; two moments
    2.03 B against fp32 Adam's 8 B: 74.6% less, the docs' "75% less"."""
    assert ADAM8BIT_MOMENT_BYTES == 1.0 + 4.0 / 256 == 1.015625
    assert 1.0 - 2 * ADAM8BIT_MOMENT_BYTES / 8.0 == pytest.approx(0.746, abs=1e-3)


@pytest.mark.parametrize("states, expected", [
    ("mixed", 18.0),                   # Megatron dist_optimizer.md: 2 + 4 + 12
    ("pure_bf16", 8.0),                # torchtune: 2 B per model and optimizer parameter
    ("adam8bit", 2 + 4 + 4 + 2.03125),  # fp32 master 4 + 8-bit m and v
    ("pure_bf16_adam8bit", 2 + 2 + 2.03125),
])
def test_bytes_per_parameter(states: str, expected: float) -> None:
    base = MemoryOptions()
    options = base.model_copy(update=estimate_training_state_options(states, base))
    assert _bytes_per_param(options) == pytest.approx(expected)


def test_deepspeed_pure_bf16_keeps_a_bf16_master_copy() -> None:
    """DeepSpeed's bf16_master_weights_and_grads clones the rank's partition in bf16
    (stage_1_and_2.py weights_partition ... .clone().to(master_weights_and_grads_dtype)):
    2 + 2 + (2 + 4) = 10 B per parameter unsharded, its step 14 + 2 B."""
    profile = build_framework_profile("deepspeed", {"training_states": "pure_bf16"})
    assert _bytes_per_param(profile.memory_options()) == pytest.approx(10.0)
    assert estimate_optimizer_step_bytes("pure_bf16", 30.0, bf16_master_copy=True) == 16.0
    generic = build_framework_profile("generic", {"training_states": "pure_bf16"})
    assert _bytes_per_param(generic.memory_options()) == pytest.approx(8.0)


def test_pure_bf16_llama_8b_under_zero3_holds_8_bytes_per_parameter_over_dp() -> None:
    """Llama-3.1-8B, dp 8, ZeRO-3, the generic (PyTorch FSDP) profile: pure bf16 holds
    8 x P / 8 of weights, gradients and optimizer state per GPU (8.03 GB); FSDP's mixed
    precision 16 x P / 8 (fp32 shard as master, fp32 gradients, fp32 moments)."""
    model_spec, _, job = load_problem_specs("llama3.1-8b", "dgx-h100", seq_len=4096,
                                            global_batch=64)
    config = ParallelConfig(dp=8, zero=3)
    states = {}
    for name in ("mixed", "pure_bf16"):
        options = build_framework_profile("generic", {"training_states": name}).memory_options()
        items = estimate_memory(model_spec, job, Candidates.from_configs([config]),
                                options).items
        states[name] = sum(float(items[k][0]) for k in ("weights", "grads", "optimizer"))
    params = model_spec.total_params
    assert states["pure_bf16"] == pytest.approx(8 * params / 8, rel=1e-3)
    assert states["mixed"] == pytest.approx(16 * params / 8, rel=1e-3)


@pytest.mark.parametrize("states, per_param", [
    ("mixed", 30.0), ("pure_bf16", 14.0), ("adam8bit", 30 - 16 + 4 * 1.015625),
    ("pure_bf16_adam8bit", 14 - 8 + 4 * 1.015625)])
def test_optimizer_step_streams_fewer_bytes(states: str, per_param: float) -> None:
    """The optimizer step is HBM traffic (data_parallel.estimate_optimizer_s): torch AdamW over
    bf16 reads p, g, m, v and writes p, m, v (7 x 2 B); 8-bit moments read and write 1.016 B
    each instead of 4. Its seconds scale with those bytes."""
    assert estimate_optimizer_step_bytes(states, 30.0) == pytest.approx(per_param)
    model_spec, cluster, _ = load_problem_specs("llama3.1-8b", "dgx-h100")
    candidates = Candidates.from_configs([ParallelConfig(dp=8)])
    seconds = {name: float(estimate_optimizer_s(
        model_spec, cluster, candidates,
        build_framework_profile("generic", {"training_states": name}).time_constants)[0])
        for name in ("mixed", states)}
    assert seconds[states] == pytest.approx(seconds["mixed"] * per_param / 30.0)


def test_pure_bf16_reduces_gradients_in_bf16() -> None:
    constants = build_framework_profile("generic", {"training_states": "pure_bf16"}
                                        ).time_constants
    assert constants.grad_reduce_bytes == constants.zero3_grad_reduce_bytes == 2.0
    assert build_framework_profile("generic").time_constants.grad_reduce_bytes == 4.0


def test_the_choice_is_a_visible_feature_off_by_default() -> None:
    for framework in TAKEN:
        assert build_framework_profile(framework).features()["training_states"] == "mixed"
    profile = build_framework_profile("generic", {"training_states": "adam8bit"})
    assert profile.features()["training_states"] == "adam8bit"


@pytest.mark.parametrize("framework", sorted(TAKEN))
@pytest.mark.parametrize("states", LOW_STATES)
def test_frameworks_take_or_refuse_in_one_line(framework: str, states: str) -> None:
    if states in TAKEN[framework]:
        build_framework_profile(framework, {"training_states": states})
        return
    with pytest.raises(InputError) as error:
        build_framework_profile(framework, {"training_states": states})
    assert str(error.value).startswith(f"--training-states {states}: ")
    assert "\n" not in str(error.value)


def test_cli_refusal_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--training-states",
                                      "pure_bf16"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "Megatron keeps main parameters in fp32 or fp16" in result.output


@pytest.mark.parametrize("features, precision", [
    ({"training_states": "adam8bit", "precision_aware_optimizer": True}, "bf16"),
    ({"training_states": "adam8bit", "optimizer_offload": True}, "bf16"),
    ({"training_states": "pure_bf16"}, "fp8"),
])
def test_combinations_that_keep_fp32_states_are_refused(features, precision) -> None:
    args = ["estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--framework", "deepspeed" if "optimizer_offload" in features else "generic",
            "--zero", "1", "--precision", precision]
    for name, value in features.items():
        flag = "--" + name.replace("_", "-")
        args += [flag] if value is True else [flag, value]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: --training-states ")
    assert len(result.output.strip().splitlines()) == 1


def test_the_search_does_not_offload_8bit_states() -> None:
    """DeepSpeed's ZeRO-Offload steps with DeepSpeedCPUAdam over fp32 states: the search's
    offload ladder leaves it out under 8-bit Adam."""
    assert "optimizer_offload" in offload_ladder("deepspeed")
    assert "optimizer_offload" not in offload_ladder(
        "deepspeed", FrameworkFeatures(training_states="adam8bit"))


def _target(states: str, zero: int = 1) -> LaunchTarget:
    """Llama-3.1-8B on 8 GPUs with the generic profile's constants for `states` (what an
    emitter must take or refuse whatever profile planned it)."""
    model_spec, cluster_spec, job = load_problem_specs("llama3.1-8b", "dgx-h100",
                                                       global_batch=64)
    config = ParallelConfig(dp=8, zero=zero)
    constants = build_framework_profile("generic", {"training_states": states}).time_constants
    return LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job, config=config,
                        layout=build_rank_layout(config, False), time_constants=constants)


def test_deepspeed_launch_takes_a_client_8bit_optimizer() -> None:
    config, _, notes = build_deepspeed_config(_target("adam8bit"))
    assert config["zero_allow_untested_optimizer"] is True
    assert any("bitsandbytes.optim.AdamW8bit" in note for note in notes)
    mixed, _, _ = build_deepspeed_config(_target("mixed"))
    assert "zero_allow_untested_optimizer" not in mixed
    assert mixed["bf16"] == {"enabled": True}


def test_deepspeed_launch_writes_bf16_master_weights_from_zero_1() -> None:
    """ds_config bf16.bf16_master_weights_and_grads (+ bf16_optimizer_states for DeepSpeed's
    own Adam); its engine refuses them without ZeRO, and so does the launch, in one line."""
    config, _, _ = build_deepspeed_config(_target("pure_bf16"))
    assert config["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True,
                              "bf16_optimizer_states": True}
    both, _, _ = build_deepspeed_config(_target("pure_bf16_adam8bit", zero=2))
    assert both["bf16"] == {"enabled": True, "bf16_master_weights_and_grads": True}
    assert both["zero_allow_untested_optimizer"] is True
    with pytest.raises(InputError, match=r"not --zero 0 \[deepspeed_bf16_master_needs_zero\]"):
        build_deepspeed_config(_target("pure_bf16", zero=0))


def test_deepspeed_search_keeps_pure_bf16_off_zero_0() -> None:
    from solver.optimize import build_problem, solve

    problem = build_problem("llama3.2-1b", "dgx-h100", 8, seq_len=2048, global_batch=64,
                            framework="deepspeed", pins={"zero": (0,)},
                            features=FrameworkFeatures(training_states="pure_bf16"))
    result = solve(problem)
    assert result.status == "infeasible"
    assert "deepspeed_bf16_master_needs_zero" in result.conflicts


def test_megatron_launch_refuses_rather_than_writes() -> None:
    with pytest.raises(InputError, match="--training-states adam8bit: Megatron"):
        render_megatron(_target("adam8bit"))


def test_estimate_json_names_the_choice() -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--framework", "generic",
                                      "--zero", "3", "--training-states",
                                      "pure_bf16_adam8bit", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["framework_features"]["training_states"] == "pure_bf16_adam8bit"


# Property: no choice ever raises memory over the framework's mixed-precision Adam.
SMALL = ModelSpec(name="dense-gqa", hidden_size=2048, intermediate_size=5632,
                  num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                  vocab_size=32000)
SMALL_MOE = ModelSpec(name="moe-gqa", hidden_size=2048, intermediate_size=6144,
                      num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=8,
                      vocab_size=32000, num_experts=16, num_experts_per_tok=2,
                      moe_intermediate_size=1408)
powers = st.sampled_from


@settings(max_examples=120, deadline=None)
@given(model_spec=st.sampled_from([SMALL, SMALL_MOE]),
       framework=st.sampled_from(["generic", "deepspeed"]),
       states=st.sampled_from(LOW_STATES), tp=powers([1, 2]), pp=powers([1, 2]),
       dp=powers([1, 2, 4]), ep=powers([1, 2]), zero=st.integers(0, 3),
       micro_batch=powers([1, 2]), recompute=st.sampled_from(["none", "selective", "full"]),
       precision=st.sampled_from(["bf16", "fp8"]), fp32_grad_partition=st.booleans())
def test_low_precision_states_never_raise_memory(model_spec, framework, states, tp, pp, dp, ep,
                                                 zero, micro_batch, recompute, precision,
                                                 fp32_grad_partition) -> None:
    """Every stage item, and the total, is at most the mixed-precision one under the same
    framework, degrees and precision (DeepSpeed's ZeRO-1/2 16 B optimizer partition too)."""
    assume(states in TAKEN[framework])
    assume(precision == "bf16" or not states.startswith("pure"))
    config = ParallelConfig(tp=tp, pp=pp, dp=dp, ep=ep if model_spec.is_moe else 1, zero=zero,
                            micro_batch=micro_batch, recompute=recompute)
    job = JobSpec(seq_len=2048, global_batch=64, precision=precision)
    try:
        check_parallel_config(model_spec, job, config.num_gpus, config)
    except InputError:
        assume(False)
    # DeepSpeed ZeRO-1/2's partition holds fp32 gradients too (MemoryOptions.optimizer_bytes 16).
    base = MemoryOptions(optimizer_bytes=16.0 if fp32_grad_partition else 12.0)
    candidates = Candidates.from_configs([config])
    breakdowns = {}
    for name in ("mixed", states):
        options = build_framework_profile(framework, {"training_states": name}
                                          ).memory_options(base)
        breakdowns[name] = estimate_memory(model_spec, job, candidates, options)
    low, mixed = breakdowns[states], breakdowns["mixed"]
    assert float(low.total[0]) <= float(mixed.total[0]) * (1 + 1e-12)
    for item in ("weights", "grads", "optimizer"):
        assert float(low.items[item][0]) <= float(mixed.items[item][0]) * (1 + 1e-12) + 1e-6
    assert np.all(low.items["optimizer"] < mixed.items["optimizer"])


def test_text_headings_name_the_choice_and_stay_quiet_by_default() -> None:
    args = ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8", "--framework",
            "generic"]
    runner = CliRunner()
    for command in (["estimate"], ["optimize", "--top", "1"]):
        low = runner.invoke(cli, [*command, *args, "--training-states", "adam8bit"])
        assert low.exit_code == 0, low.output
        # (optimize's heading goes on with the memory headroom: "; plans fit ...")
        assert ", adam8bit training states" in low.output.splitlines()[0]
        mixed = runner.invoke(cli, [*command, *args])
        assert "training states" not in mixed.output.splitlines()[0]
