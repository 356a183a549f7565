"""Fine-tuning jobs (issue 42, item 1; solver.spec.finetune, solver.cost.layers.finetune): the
adapters' parameters, the frozen base's states, the NF4 base, the backward without weight
gradients, and the flags.

Sources pinned here:
  QLoRA paper (Dettmers et al. 2023, arXiv:2305.14314) §3 "Double Quantization": constants
    "from 32/64 = 0.5 bits per parameter to 8/64 + 32/(64 * 256) = 0.127 bits per parameter".
  torchtune docs/source/tutorials/lora_finetune.rst @bd2a0fc: Llama2-7B with LoRA on q_proj and
    v_proj at rank 8: "6742609920 total params, 4194304 trainable params".
  Megatron-Bridge docs/performance-summary.md @8f341b0, SFT Performance, LLAMA3_70B, DGX-H100:
    710 model TFLOP/s at 1,638 tokens/s a GPU (4.335e11 FLOPs a token); LoRA Performance:
    735 at 2,643 (2.78e11), the frozen base's "2/3" (training/utils/flop_utils.py).
  Megatron-Bridge peft/lora.py LoRA: dim 32, alpha 32, target_modules linear_qkv, linear_proj,
    linear_fc1, linear_fc2 (the defaults).
  torchtune README @30b8519, "Memory and training speed": Llama 3.1 8B LoRA, 16.2 GiB peak
    memory (batch 2, packed 2048, compile; recipe llama3_1/8B_lora_single_device.yaml: q_proj
    and v_proj, rank 8, alpha 16, bf16, activation checkpointing, chunked cross-entropy).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.api import estimate
from solver.catalog import load_gpu_spec, load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.kernels.efficiency import ComputeConstants, estimate_gemm_backward_s
from solver.cost.layers.finetune import (
    estimate_adapter_params,
    estimate_adapter_params_per_layer,
    estimate_dequantize_s,
    estimate_nf4_bytes_per_param,
    estimate_nf4_constant_bits,
)
from solver.cost.layers.flops import estimate_model_flops_per_token, estimate_step_flops_per_token
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.cost.memory.states import (
    estimate_frozen_weight_bytes,
    estimate_whole_model_state_bytes,
)
from solver.spec import JobSpec, ParallelConfig
from solver.spec.finetune import MEGATRON_TARGETS, PEFT_TARGETS, FinetuneSpec

GIB = 2**30
LORA = FinetuneSpec(mode="lora", lora_rank=16, lora_targets=PEFT_TARGETS)
QLORA = LORA.model_copy(update={"mode": "qlora"})


def test_nf4_double_quantization_is_the_qlora_papers_0_127_bits() -> None:
    """QLoRA §3: 8/64 + 32/(64 x 256) = 0.127 bits of constants a weight; 4.127 bits in all."""
    assert estimate_nf4_constant_bits() == pytest.approx(0.127, abs=5e-4)
    assert estimate_nf4_constant_bits(64, 1) - 8 / 64 == pytest.approx(0.5)  # fp32 absmax: 32/64
    assert estimate_nf4_bytes_per_param() == pytest.approx(4.127 / 8, abs=1e-4)


def test_adapter_count_is_torchtunes_for_llama2_7b_q_v_rank_8() -> None:
    """torchtune's tutorial: 4,194,304 trainable of 6,742,609,920 total (the base's 6,738,415,616
    and the adapters): 32 layers x 8 x (4096 + 4096) x 2."""
    model_spec = load_model_spec("llama2-7b")
    spec = FinetuneSpec(mode="lora", lora_rank=8, lora_targets=("q_proj", "v_proj"))
    adapters = estimate_adapter_params(model_spec, spec)
    assert adapters == 4_194_304
    assert model_spec.total_params + adapters == 6_742_609_920


def test_megatron_fuses_qkv_and_gate_up_into_one_adapter_each() -> None:
    """linear_qkv is one adapter of r (h + q + k + v); PEFT's q, k, v are three, each with its
    own r x h A. Llama-3.1-8B, r 32: linear_qkv 32 x (4096 + 6144) against 32 x (3 x 4096 +
    4096 + 2 x 1024); linear_fc1 32 x (4096 + 2 x 14336) against gate + up 32 x 2 x 18432."""
    model_spec = load_model_spec("llama3.1-8b")
    mega = estimate_adapter_params_per_layer(model_spec, FinetuneSpec(mode="lora"))
    peft = estimate_adapter_params_per_layer(
        model_spec, FinetuneSpec(mode="lora", lora_targets=PEFT_TARGETS))
    assert FinetuneSpec().lora_targets == MEGATRON_TARGETS
    assert mega.attention == 32 * ((4096 + 6144) + (4096 + 4096))
    assert peft.attention == 32 * (3 * 4096 + 4096 + 2 * 1024 + (4096 + 4096))
    assert mega.mlp == 32 * ((4096 + 2 * 14336) + (14336 + 4096))
    assert peft.mlp == 32 * 3 * 18432


def _states(spec: FinetuneSpec, **config) -> dict[str, float]:
    model_spec = load_model_spec("llama3.1-8b")
    job = JobSpec(seq_len=2048, global_batch=8, finetune=spec)
    candidates = Candidates.from_configs([ParallelConfig(micro_batch=2, **config)])
    items = estimate_memory(model_spec, job, candidates, MemoryOptions()).items
    return {name: float(value[0]) for name, value in items.items()}


def test_frozen_base_keeps_weights_only_and_adapters_the_training_states() -> None:
    """Llama-3.1-8B, one GPU, Megatron's 2 + 4 + 12 B: LoRA r 16 on PEFT's seven linears
    (41,943,040 adapters) keeps 8.03e9 x 2 + 4.19e7 x 2 of weights, 4.19e7 x 4 of gradients
    and 4.19e7 x 12 of optimizer state; QLoRA's weights are 1.05e9 x 2 + 6.98e9 x 0.5159 +
    4.19e7 x 2 (solver.cost.memory.states.estimate_adapter_model_states)."""
    model_spec = load_model_spec("llama3.1-8b")
    adapters = 41_943_040
    assert estimate_adapter_params(model_spec, LORA) == adapters
    lora, qlora = _states(LORA, zero=0), _states(QLORA, zero=0)
    assert lora["weights"] == pytest.approx(8_030_261_248 * 2 + adapters * 2)
    assert lora["grads"] == pytest.approx(adapters * 4)
    assert lora["optimizer"] == pytest.approx(adapters * 12)
    linears = 32 * (model_spec.attention_params_per_layer + model_spec.dense_mlp_params_per_layer)
    assert qlora["weights"] == pytest.approx((8_030_261_248 - linears) * 2
                                             + linears * estimate_nf4_bytes_per_param()
                                             + adapters * 2)
    assert qlora["weights"] / 1e9 == pytest.approx(5.786, abs=0.001)
    assert (lora["grads"], lora["optimizer"]) == (qlora["grads"], qlora["optimizer"])


def test_adapter_states_shard_like_zero_and_the_base_only_at_zero_3() -> None:
    """Over dp 8: ZeRO-1 shards the adapters' optimizer state, ZeRO-2 their gradients, ZeRO-3
    the frozen weights too (FSDP shards frozen parameters like any other)."""
    one = _states(LORA, zero=0)
    z1, z2, z3 = (_states(LORA, zero=zero, dp=8) for zero in (1, 2, 3))
    assert z1["optimizer"] == pytest.approx(one["optimizer"] / 8)
    assert z1["grads"] == pytest.approx(one["grads"]) and z2["grads"] == pytest.approx(
        one["grads"] / 8)
    assert z2["weights"] == pytest.approx(one["weights"])
    assert z3["weights"] == pytest.approx(one["weights"] / 8)


@settings(max_examples=25, deadline=None)
@given(rank=st.integers(1, 256), zero=st.integers(0, 3), dp=st.sampled_from([1, 2, 8]),
       recompute=st.sampled_from(["none", "selective", "full"]))
def test_adapters_never_need_more_than_full_training_and_nf4_never_more_than_bf16(
        rank: int, zero: int, dp: int, recompute: str) -> None:
    """For any rank, ZeRO stage and recompute: LoRA's memory <= full training's, QLoRA's <=
    LoRA's; the adapter count grows linearly with the rank."""
    lora = FinetuneSpec(mode="lora", lora_rank=rank)
    qlora = lora.model_copy(update={"mode": "qlora"})
    config = {"zero": zero, "dp": dp, "recompute": recompute}
    full, adapted, quantized = (sum(_states(spec, **config).values())
                                for spec in (FinetuneSpec(), lora, qlora))
    assert quantized <= adapted <= full
    model_spec = load_model_spec("llama3.1-8b")
    assert estimate_adapter_params(model_spec, lora) == rank * estimate_adapter_params(
        model_spec, FinetuneSpec(mode="lora", lora_rank=1))


def test_step_flops_match_megatron_bridges_sft_and_drop_a_third_of_the_gemms_with_lora() -> None:
    """Llama 3 70B at 4096: full training 4.331e11 FLOPs a token against Bridge's SFT row's
    710e12 / 1,638 = 4.335e11; LoRA r 32 on linear_qkv drops the layers' weight gradients
    (2 of their 6 FLOPs a weight: 80 x 1.712e9) and adds 6 a adapter weight: 2.965e11, 68% of
    full (Bridge's LoRA row, which counts attention per packed document: 735e12 / 2,643 =
    2.78e11)."""
    model_spec = load_model_spec("llama3.1-70b")
    full = estimate_model_flops_per_token(model_spec, 4096)
    assert full == pytest.approx(710e12 / 1638, rel=0.005)
    assert estimate_step_flops_per_token(model_spec, 4096, FinetuneSpec(mode="full")) == full
    lora = estimate_step_flops_per_token(
        model_spec, 4096, FinetuneSpec(mode="lora", lora_targets=("linear_qkv",)))
    assert lora == pytest.approx(2.965e11, rel=1e-3)
    assert lora / full == pytest.approx(2 / 3, abs=0.02)


@settings(max_examples=30, deadline=None)
@given(m=st.sampled_from([512, 4096, 16384]), k=st.sampled_from([1024, 8192]),
       n=st.sampled_from([16, 1024, 14336]), gpu=st.sampled_from(["h100-sxm", "rtx-4090"]))
def test_backward_without_weight_gradient_is_cheaper(m: int, k: int, n: int, gpu: str) -> None:
    """A frozen weight's backward (the dgrad alone) never costs more than dgrad + wgrad, on the
    measured tables (H100) and on the datasheet roofline (RTX 4090, half of it exactly)."""
    spec, cc = load_gpu_spec(gpu), ComputeConstants()
    both = estimate_gemm_backward_s(spec, "bf16", m, k, n, cc)
    dgrad = estimate_gemm_backward_s(spec, "bf16", m, k, n, cc, weight_gradient=False)
    assert 0 < dgrad <= both
    if gpu == "rtx-4090":
        assert dgrad == pytest.approx(both / 2)


def test_dequantize_streams_nf4_in_and_bf16_out_each_pass() -> None:
    """A Llama-3.1-70B layer's 855.6e6 linear weights on an H100 (3.35 TB/s at the HBM fraction):
    855.6e6 x 2.5159 B each pass; nothing without an NF4 base."""
    model_spec = load_model_spec("llama3.1-70b")
    gpu, cc = load_gpu_spec("h100-sxm"), ComputeConstants()
    weights = model_spec.attention_params_per_layer + model_spec.dense_mlp_params_per_layer
    assert weights == pytest.approx(855.6e6, rel=1e-3)
    seconds = float(estimate_dequantize_s(gpu, weights, QLORA, cc))
    assert seconds == pytest.approx(weights * 2.5159 / (cc.hbm_fraction * gpu.hbm_gb_per_s * 1e9),
                                    rel=1e-4)
    assert float(estimate_dequantize_s(gpu, weights, LORA, cc)) == 0.0


def test_lora_step_is_faster_than_full_and_qlora_pays_the_dequantization() -> None:
    """Llama-3.1-8B on one H100, full recompute: LoRA skips the weight-gradient GEMMs and the
    optimizer step of the base; QLoRA adds its dequantization (forward, input gradient and the
    recomputed forward) to LoRA's step."""
    common = dict(seq_len=2048, global_batch=8, micro_batch=2, zero=0, recompute="full")
    steps = {mode: estimate("llama3.1-8b", "dgx-h100", 1, framework="generic",
                            finetune=FinetuneSpec(
        mode=mode, lora_rank=16, lora_targets=PEFT_TARGETS), **common).plan.time
        for mode in ("full", "lora", "qlora")}
    assert steps["lora"].step_seconds < steps["full"].step_seconds
    assert steps["qlora"].step_seconds > steps["lora"].step_seconds
    assert steps["lora"].time_seconds["optimizer"] < 0.01 * steps["full"].time_seconds["optimizer"]


def test_dp_reduces_only_the_adapters_gradients() -> None:
    """Llama-3.1-8B over 8 GPUs at ZeRO-1: the data-parallel time of LoRA is a sliver of full
    training's (41.9M adapter gradients against 8.03e9)."""
    common = dict(seq_len=4096, global_batch=64, micro_batch=1, zero=1)
    full = estimate("llama3.1-8b", "dgx-h100", 8, **common).plan.time
    lora = estimate("llama3.1-8b", "dgx-h100", 8, finetune=LORA, **common).plan.time
    assert full.time_seconds["dp"] > 0
    assert lora.time_seconds["dp"] < 0.05 * full.time_seconds["dp"]


def test_fit_check_counts_the_frozen_base_and_adapters() -> None:
    """The explanation's fit check (estimate_whole_model_state_bytes): Llama-3.1-70B at 18 B a
    parameter needs 1,270 GB; with LoRA r 32 on linear_qkv 70.6e9 x 2 + 4.72e7 x 18 = 142 GB;
    with QLoRA 40.4 GB."""
    model_spec = load_model_spec("llama3.1-70b")
    options = MemoryOptions()
    spec = FinetuneSpec(mode="lora", lora_targets=("linear_qkv",))
    full = estimate_whole_model_state_bytes(model_spec, JobSpec(), options)
    lora = estimate_whole_model_state_bytes(model_spec, JobSpec(finetune=spec), options)
    qlora = estimate_whole_model_state_bytes(
        model_spec, JobSpec(finetune=spec.model_copy(update={"mode": "qlora"})), options)
    assert full / 1e9 == pytest.approx(1270, rel=0.01)
    assert lora / 1e9 == pytest.approx(142, rel=0.01)
    assert qlora / 1e9 == pytest.approx(40.4, rel=0.01)


def test_estimate_lora_8b_on_one_h100_matches_torchtunes_peak_within_10_percent() -> None:
    """Done-when (issue 42): torchtune's Llama 3.1 8B LoRA row (16.2 GiB peak memory active: the
    allocated view, which does not depend on the GPU) estimated on one H100 with the recipe's
    settings (pure bf16, compiled model, activation checkpointing, CEWithChunkedOutputLoss
    compiled per chunk: benchmarks/memory_public.py's torchtune mapping): within 10%
    (+8.3% today)."""
    options = MemoryOptions(logits_fp32_from_model=False, loss_chunks_compiled=True)
    spec = FinetuneSpec(mode="lora", lora_rank=8, lora_alpha=16,
                        lora_targets=("q_proj", "v_proj"), packed_sequences=True)
    result = estimate("llama3.1-8b", "dgx-h100", 1, seq_len=2048, global_batch=2,
                      micro_batch=2, zero=0, recompute="full", framework="generic",
                      features={"training_states": "pure_bf16", "loss_implementation": "chunked",
                                "fused_elementwise": True}, options=options, finetune=spec)
    allocated = result.plan.stages[0].allocated_bytes
    assert allocated / (16.2 * GIB) - 1 == pytest.approx(0.083, abs=0.01)
    assert abs(allocated / (16.2 * GIB) - 1) <= 0.10


def test_cli_estimate_takes_the_finetune_flags() -> None:
    """The same job through the CLI (its chunked loss uncompiled: no flag compiles it) gives the
    finetune object and the same weights."""
    result = CliRunner().invoke(cli, [
        "estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1",
        "--seq-len", "2048", "--global-batch", "2", "--micro-batch", "2", "--zero", "0",
        "--recompute", "full", "--framework", "generic", "--training-states", "pure_bf16",
        "--loss-implementation", "chunked", "--finetune", "lora", "--lora-rank", "8",
        "--lora-alpha", "16", "--lora-targets", "q_proj,v_proj", "--packed-sequences", "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["finetune"] == {
        "mode": "lora", "label": "LoRA r8 a16 (q_proj,v_proj), packed", "packed_sequences": True,
        "lora_rank": 8, "lora_alpha": 16.0, "lora_targets": ["q_proj", "v_proj"],
        "base_weights": "bf16"}
    assert answer["plans"][0]["memory_gb"]["weights"] == pytest.approx(
        (8_030_261_248 + 32 * 8 * ((4096 + 4096) + (4096 + 1024))) * 2 / 1e9, abs=1e-3)


def test_text_output_labels_the_finetune_mode() -> None:
    result = CliRunner().invoke(cli, [
        "estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "1",
        "--framework", "generic", "--finetune", "qlora", "--lora-rank", "16"])
    assert result.exit_code == 0, result.output
    assert "QLoRA r16 a32 (linear_qkv,linear_proj,linear_fc1,linear_fc2)" in result.output
    assert "base frozen, the layers' linears in NF4" in result.output


@pytest.mark.parametrize("args, words", [
    (["--lora-rank", "8"], "--lora-rank: adapters need --finetune lora or qlora"),
    (["--finetune", "qlora"], "--finetune qlora with --framework megatron"),
    (["--finetune", "qlora", "--framework", "generic", "--precision", "fp8"],
     "--precision fp8 does not apply"),
    (["--finetune", "lora", "--lora-targets", "q_proj,linear_fc1"], "mixes PEFT and"),
    (["--finetune", "lora", "--lora-targets", "wq"], "wq: choose from"),
    (["--finetune", "lora", "--model", "mixtral-8x7b"], "has routed experts"),
])
def test_bad_finetune_flags_are_one_line_exit_2(args: list[str], words: str) -> None:
    base = ["estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8"]
    if "--model" in args:
        base = base[:1] + base[3:]
    result = CliRunner().invoke(cli, base + args)
    assert result.exit_code == 2, result.output
    assert words in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_optimize_plans_lora_with_the_label_and_a_json_object() -> None:
    """optimize --finetune lora: the heading names it, the fit check counts the frozen base, and
    --json has the finetune object."""
    args = ["optimize", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--seq-len", "4096", "--global-batch", "64", "--finetune", "lora", "--top", "2",
            "--time-limit", "5"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "LoRA r32 a32" in text.output and "frozen parameters (bf16)" in text.output
    answer = json.loads(CliRunner().invoke(cli, args + ["--json"]).output)
    assert answer["finetune"]["lora_targets"] == list(MEGATRON_TARGETS)
    assert answer["plans"][0]["fits"]


def test_pretraining_outputs_have_no_finetune_object() -> None:
    """Pretraining's JSON is unchanged: no finetune key (golden files stay as they were)."""
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.2-1b", "--cluster",
                                      "dgx-h100", "--gpus", "1", "--json"])
    assert result.exit_code == 0
    assert "finetune" not in json.loads(result.output)


def test_frozen_dp_time_and_memory_are_arrays_per_candidate() -> None:
    """The cost functions stay vectorised with adapters: several candidates at once give the
    same numbers as one at a time."""
    model_spec = load_model_spec("llama3.1-8b")
    job = JobSpec(seq_len=2048, global_batch=16, finetune=LORA)
    configs = [ParallelConfig(zero=z, dp=8, micro_batch=1) for z in (0, 1, 3)]
    together = estimate_memory(model_spec, job, Candidates.from_configs(configs),
                               MemoryOptions()).items["weights"]
    apart = [float(estimate_memory(model_spec, job, Candidates.from_configs([c]),
                                   MemoryOptions()).items["weights"][0]) for c in configs]
    assert np.allclose(together, apart)


def test_a_finetune_plan_file_reestimates_as_finetune_and_launch_refuses_it(tmp_path) -> None:
    """optimize --json of a LoRA job carries its finetune object; estimate --plan re-estimates
    the plan as LoRA (not silently as pretraining), and launch refuses it in one line: it writes
    no adapter settings yet."""
    runner = CliRunner()
    answer = runner.invoke(cli, ["optimize", "--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                 "--gpus", "8", "--seq-len", "4096", "--global-batch", "64",
                                 "--finetune", "lora", "--lora-rank", "16", "--top", "1",
                                 "--time-limit", "5", "--json"])
    assert answer.exit_code == 0, answer.output
    path = tmp_path / "plan.json"
    path.write_text(answer.output)
    again = runner.invoke(cli, ["estimate", "--plan", str(path), "--json"])
    assert again.exit_code == 0, again.output
    estimated = json.loads(again.output)
    assert estimated["finetune"]["lora_rank"] == 16
    planned = json.loads(answer.output)["plans"][0]["memory_gb"]["total"]
    assert estimated["plans"][0]["memory_gb"]["total"] == pytest.approx(planned, rel=1e-6)
    launch = runner.invoke(cli, ["launch", "--plan", str(path), "--format", "megatron",
                                 "-o", str(tmp_path / "out")])
    assert launch.exit_code == 2
    assert "launch writes no adapter settings for --format megatron" in launch.output
    bad = tmp_path / "bad.json"
    bad.write_text(answer.output.replace('"lora_rank": 16', '"lora_rank": -1'))
    broken = runner.invoke(cli, ["estimate", "--plan", str(bad)])
    assert broken.exit_code == 2 and "field 'finetune'" in broken.output


def _bridge_launch(*args: str):
    return CliRunner().invoke(cli, ["launch", "--model", "llama3.1-8b", "--cluster", "dgx-h100",
                                    "--gpus", "8", "--format", "megatron-bridge", *args])


def test_bridge_launch_writes_the_peft_recipe_and_its_lora_settings() -> None:
    """Megatron-Bridge 0.3.1's run_recipe.py takes `<model>_peft_config` for LoRA and
    `<model>_sft_config` for full SFT (recipes/llama/llama3.py llama31_8b_peft_config,
    llama31_8b_sft_config); the plan's rank, alpha and modules go on its LoRA (peft/lora.py
    LoRA.dim, alpha, target_modules)."""
    lora = _bridge_launch("--finetune", "lora", "--lora-rank", "16", "--lora-alpha", "32",
                          "--lora-targets", "linear_qkv,linear_proj")
    assert lora.exit_code == 0, lora.output
    assert "--recipe llama31_8b_peft_config" in lora.output
    assert "peft.dim=16" in lora.output and "peft.alpha=32" in lora.output
    assert "'peft.target_modules=[linear_qkv,linear_proj]'" in lora.output
    full = _bridge_launch("--finetune", "full")
    assert full.exit_code == 0, full.output
    assert "--recipe llama31_8b_sft_config" in full.output and "peft." not in full.output


@pytest.mark.parametrize("args, words", [
    (["--finetune", "lora", "--lora-targets", "q_proj,v_proj"],
     "Megatron-Bridge's LoRA names its modules linear_qkv"),
    (["--finetune", "lora", "--model", "llama2-13b"], "has no SFT or PEFT recipe for llama2-13b"),
])
def test_bridge_launch_refuses_what_its_peft_cannot_run(args: list[str], words: str) -> None:
    result = _bridge_launch(*args)
    assert result.exit_code == 2, result.output
    assert words in result.output


def test_qlora_explanation_counts_nf4_weights_for_the_minimum_tp() -> None:
    """Llama-3.1-70B's bf16 weights (141.1 GB) need tp 3 by the rule of thumb (70% of an H100's
    85.5 GB); its QLoRA base (39.5 GB: NF4 layers, bf16 embedding and head) needs none."""
    model_spec = load_model_spec("llama3.1-70b")
    qlora = JobSpec(finetune=FinetuneSpec(mode="qlora"))
    assert estimate_frozen_weight_bytes(model_spec, JobSpec(), MemoryOptions()) / 1e9 == \
        pytest.approx(141.1, abs=0.05)
    assert estimate_frozen_weight_bytes(model_spec, qlora, MemoryOptions()) / 1e9 == \
        pytest.approx(39.5, abs=0.05)
    result = CliRunner().invoke(cli, [
        "optimize", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "1",
        "--seq-len", "2048", "--global-batch", "16", "--finetune", "qlora", "--framework",
        "generic", "--top", "1", "--time-limit", "5"])
    assert result.exit_code == 0, result.output
    assert "2. minimum TP (NF4 layer weights in 70% of a GPU): 1" in result.output


BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
COMMIT_URL = re.compile(r"^https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+$")


def _load_benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_finetune_accuracy_rows_are_cited_and_meet_issue_42s_bounds(monkeypatch) -> None:
    """benchmarks/finetune_accuracy.py (issue 42, item 2): at least 20 published rows, each a
    number of a file pinned to a commit with its table, row and recipe; nothing fitted. Today:
    memory 5 rows at a median 8.9% (target 10%), tokens/s 15 rows at 11.5% (target 15%)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = _load_benchmark("finetune_accuracy")
    rows = bench.load_rows()
    assert len(rows) >= 20 and len({row["id"] for row in rows}) == len(rows)
    for row in rows:
        assert COMMIT_URL.match(row["source_url"]) and COMMIT_URL.match(row["config_url"])
        assert row["source_locator"] and row["measured"] > 0
    summary = bench.summarize(rows)
    assert len(summary["rows"]) >= 20
    assert summary["memory"]["median_abs_error"] == pytest.approx(0.089, abs=0.005)
    assert summary["time"]["median_abs_error"] == pytest.approx(0.115, abs=0.005)
    assert summary["memory"]["meets_target"] and summary["time"]["meets_target"]
