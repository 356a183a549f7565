"""fp8 parameters (issue 17: "fp8 parameters (--fp8-param-gather)"): below bf16, Megatron with
--fp8-param-gather builds the model under Transformer Engine's fp8_model_init (pretrain_gpt.py
model_provider: build_model_context = fp8_model_init), so every GEMM weight is a quantised
tensor (row-wise data and its column-wise copy) with no bf16 weight beside it; the fp32 master
stays with the distributed optimizer, which Megatron requires for it. Megatron-Bridge's fp8
current-scaling and MXFP8 mixed-precision recipes turn it on (megatron/bridge/training/
mixed_precision.py bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed:
fp8_param_gather = True).

Invariant: at fp8 with fp8 parameters a GEMM weight holds 2 B (1 B row-wise, 1 B column-wise),
as many as its bf16 weight at bf16, so the weights equal the bf16 run's from ZeRO-1 on; without
the distributed optimizer (ZeRO-0) nothing changes.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import build_framework_profile, memory_saver_ladder
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.cost.memory.states import estimate_fp8_param_saved_bytes_per_param
from solver.spec import JobSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures


@pytest.mark.parametrize(("precision", "expected"), [
    ("bf16", 0.0), ("fp8", 2.0), ("mxfp8", 2.0),
    # NVFP4 quantises every decoder layer under Megatron's defaults (solver.cost.kernels.precision)
    ("nvfp4", 2.0)])
def test_saved_bytes_per_gemm_weight(precision: str, expected: float) -> None:
    on = MemoryOptions(fp8_params=True)
    assert estimate_fp8_param_saved_bytes_per_param(precision, on) == pytest.approx(expected)
    assert estimate_fp8_param_saved_bytes_per_param(precision, MemoryOptions()) == 0.0
    # torchao float8 keeps bf16 parameters and casts on the fly: nothing to replace
    titan = MemoryOptions(fp8_params=True, fp8_weight_copies="none")
    assert estimate_fp8_param_saved_bytes_per_param(precision, titan) == 0.0


def _weights(precision: str, fp8_params: bool, **degrees: int) -> float:
    config = ParallelConfig(micro_batch=1, recompute="full", **degrees)
    breakdown = estimate_memory(load_model_spec("llama3.1-70b"),
                                JobSpec(seq_len=8192, global_batch=128, precision=precision),
                                Candidates.from_configs([config]),
                                MemoryOptions(fp8_params=fp8_params))
    return float(breakdown.items["weights"][0])


@settings(max_examples=20, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4, 8]),
       zero=st.sampled_from([1, 2, 3]))
def test_fp8_parameters_hold_what_bf16_weights_hold(tp: int, pp: int, zero: int) -> None:
    dp = 64 // (tp * pp)
    degrees = dict(tp=tp, pp=pp, dp=dp, zero=zero)
    bf16 = _weights("bf16", False, **degrees)
    assert _weights("fp8", True, **degrees) == pytest.approx(bf16, rel=1e-12)
    assert _weights("fp8", False, **degrees) > bf16


def test_zero_0_keeps_the_bf16_weights() -> None:
    """Megatron takes --fp8-param-gather only with its distributed optimizer."""
    degrees = dict(tp=4, pp=8, dp=2, zero=0)
    assert _weights("fp8", True, **degrees) == _weights("fp8", False, **degrees)


def test_megatron_profile_and_saver_ladder() -> None:
    """The flag turns MemoryOptions.fp8_params on under Megatron only; the search may turn it
    on below bf16 with Transformer Engine's weights, last of the savers."""
    on = {"fp8_param_gather": True}
    assert build_framework_profile("megatron", on).memory_options().fp8_params
    assert not build_framework_profile("torchtitan", on).memory_options().fp8_params
    assert memory_saver_ladder("megatron", precision="fp8")[-1] == "fp8_param_gather"
    assert "fp8_param_gather" not in memory_saver_ladder("megatron", precision="bf16")
    assert "fp8_param_gather" not in memory_saver_ladder(
        "megatron", FrameworkFeatures(fp8_weight_copies="none"), precision="fp8")


def test_launch_emits_fp8_param_gather_with_the_distributed_optimizer() -> None:
    args = ["launch", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "64",
            "--precision", "fp8", "--tp", "4", "--pp", "8", "--format", "megatron",
            "--fp8-param-gather"]
    emitted = CliRunner().invoke(cli, [*args, "--zero", "1"])
    assert emitted.exit_code == 0, emitted.output
    assert "--fp8-param-gather" in emitted.output
    plain = CliRunner().invoke(cli, [*args, "--zero", "0"])
    assert plain.exit_code == 0, plain.output
    assert "--fp8-param-gather" not in plain.output
