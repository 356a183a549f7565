"""The logits and the loss by implementation (issue 43, item 2; solver.cost.memory.loss):
each implementation's bytes pinned to its source, the term placed on the last stage, the
framework profiles' defaults and refusals, the flag through the CLI and the launch files, and
the property that a fused or chunked loss never raises memory (hypothesis)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from test_launch_frameworks import make_target
from test_memory_properties import MODELS, problems

from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import PROFILES, UNSUPPORTED, build_framework_profile
from solver.cost.memory import estimate_all_stages, estimate_memory
from solver.cost.memory.loss import estimate_liger_chunk_rows, estimate_logits_bytes
from solver.cost.memory.options import MemoryOptions
from solver.emit.bridge import build_bridge_overrides
from solver.emit.megatron import render_megatron
from solver.emit.torchtitan import build_torchtitan_config
from solver.errors import InputError
from solver.spec import JobSpec, ParallelConfig
from solver.spec.framework import LOSS_IMPLEMENTATIONS

LLAMA_8B = load_model_spec("llama3.1-8b")
JOB_8K = JobSpec(seq_len=8192, global_batch=8)
ONE_GPU = Candidates.from_configs([ParallelConfig(micro_batch=1)])
LOGITS_8K = 8192 * 128256  # Llama 3's 128,256-entry vocabulary, one 8K sequence


def logits_bytes(implementation: str, framework: str = "generic", model_spec=LLAMA_8B,
                 job: JobSpec = JOB_8K, candidates: Candidates = ONE_GPU) -> np.ndarray:
    options = build_framework_profile(framework).memory_options().model_copy(
        update={"loss_implementation": implementation})
    return estimate_logits_bytes(model_spec, job, candidates, options)


def supported(framework: str) -> list[str]:
    refused = UNSUPPORTED.get(framework, {})
    return [v for v in LOSS_IMPLEMENTATIONS if ("loss_implementation", v) not in refused]


def test_eager_loss_of_llama3_8b_at_8k_is_the_issues_12_6_gb() -> None:
    """Issue 43: "The 12.6 GB logits term of Llama 3 8B at 8K is right for an eager loss" --
    torchtitan's F.cross_entropy(pred.float()) after `del pred`, 12 B per logit
    (frameworks.EAGER_CROSS_ENTROPY_LOGITS_BYTES); Megatron's vocab-parallel cross-entropy
    keeps the fp32 copy beside the bf16 logits, 6 B (theoretical_memory_usage)."""
    assert logits_bytes("eager", "torchtitan")[0] / 1e9 == pytest.approx(12.6, abs=0.05)
    assert logits_bytes("eager", "megatron")[0] == pytest.approx(LOGITS_8K * 6.0)


def test_chunked_loss_saves_what_torchtitan_996_measured() -> None:
    """torchtitan #996 (commit e23bb707, 2025-03-24): Llama3-8B (llama3_8b.toml: batch 1,
    seq_len 8192, tp 1, compile off, `del pred` before the backward), the eager loss replaced by
    chunked_cross_entropy_loss (8 chunks, each F.cross_entropy(chunk.float())): "memory:
    49.58GiB" -> "42.26GiB", 7.32 GiB less. The model: 12 B -> 4 + 8/8 = 5 B per logit, 7 B x
    1.05e9 logits = 6.85 GiB (6% under the measurement; the rest of the peak is unchanged)."""
    saved = logits_bytes("eager", "torchtitan")[0] - logits_bytes("chunked", "torchtitan")[0]
    assert logits_bytes("chunked")[0] == pytest.approx(LOGITS_8K * 5.0)
    assert saved / 2**30 == pytest.approx(49.58 - 42.26, rel=0.07)


def test_compiled_loss_keeps_the_bf16_logits_and_their_gradient() -> None:
    """torch.compile of F.cross_entropy(pred.float()) (torchtitan build_cross_entropy_loss):
    the bf16 logits saved and the bf16 gradient, 4 B per logit -- below the eager chunked loss,
    as torchtitan #1033 measured ("compiled saved more memory than chunked loss ever could"),
    and the same bytes as flash-attn's fused CrossEntropyLoss that LLM Foundry runs
    (benchmarks/known_to_run.py LLM_FOUNDRY_LOGITS_BYTES)."""
    assert logits_bytes("compiled")[0] == pytest.approx(LOGITS_8K * 4.0)
    assert logits_bytes("compiled")[0] < logits_bytes("chunked")[0]


def test_fused_loss_holds_the_bf16_logits_and_the_heads_input_gradient() -> None:
    """Transformer Engine's parallel cross-entropy (Megatron-Bridge's recipes,
    cross_entropy_fusion_impl "te") writes the gradient into the bf16 logits in place
    (triton/cross_entropy.py cross_entropy_backward_kernel): 2 B per logit, the known-to-run
    rows' MEGATRON_BRIDGE_LOGITS_BYTES; the LM head's backward then adds its input's gradient,
    8192 x 4096 x 2 B = 67 MB."""
    assert logits_bytes("fused")[0] == pytest.approx(LOGITS_8K * 2.0 + 8192 * 4096 * 2.0)


def test_liger_chunk_rows_follow_its_own_example() -> None:
    """liger_kernel/ops/fused_linear_cross_entropy.py fused_linear_cross_entropy_forward:
    "BT = 4096*4, V = 32000, H = 4096 ==> inc_factor = 8, chunk_size = 2048"; Llama 3 8B at 8K:
    inc_factor 32, 256 rows; never more rows than tokens."""
    assert estimate_liger_chunk_rows(np.array([4096.0 * 4]), 4096, 32000.0)[0] == 2048
    assert estimate_liger_chunk_rows(np.array([8192.0]), 4096, 128256.0)[0] == 256
    assert estimate_liger_chunk_rows(np.array([100.0]), 8192, 4096.0)[0] == 100


def test_fused_linear_loss_never_holds_the_full_logits() -> None:
    """Liger's fused linear cross-entropy: one 256-row chunk of bf16 logits (its gradient
    written in place) and the head's input gradient (grad_input = zeros_like(_input)):
    65.7 + 67.1 MB = 0.133 GB, against 12.6 GB eager."""
    expected = 256 * 128256 * 2.0 + 8192 * 4096 * 2.0
    assert logits_bytes("fused_linear")[0] == pytest.approx(expected)
    assert expected / 1e9 == pytest.approx(0.133, abs=0.001)


def test_every_output_head_holds_its_own_logits() -> None:
    """DeepSeek-V3's MTP module computes a second loss on the last stage: twice the term."""
    deepseek = load_model_spec("deepseek-v3")
    one = MemoryOptions(loss_implementation="fused_linear", include_mtp=False)
    both = one.model_copy(update={"include_mtp": True})
    job = JobSpec(seq_len=4096, global_batch=8)
    assert estimate_logits_bytes(deepseek, job, ONE_GPU, both)[0] == pytest.approx(
        2 * estimate_logits_bytes(deepseek, job, ONE_GPU, one)[0])


def test_the_logits_sit_on_the_last_stage_only() -> None:
    """The loss runs on the last pipeline stage, once per micro-batch (its buffers are freed
    by the head's backward before the next micro-batch's loss): stage 0 of pp 2 holds none,
    stage 1 holds the term once, whatever the micro-batches in flight."""
    config = ParallelConfig(pp=2, micro_batch=1)
    for implementation in LOSS_IMPLEMENTATIONS:
        options = MemoryOptions(loss_implementation=implementation)
        stages = estimate_all_stages(LLAMA_8B, JOB_8K, config, options)
        expected = estimate_logits_bytes(LLAMA_8B, JOB_8K, Candidates.from_configs([config]),
                                         options)[0]
        assert stages.items["logits"][0] == 0.0
        assert stages.items["logits"][1] == pytest.approx(expected)


def test_profiles_default_to_their_frameworks_loss() -> None:
    """Megatron: cross_entropy_loss_fusion = False (model_parallel_config.py, core_v0.12 to
    core_v0.19); torchtitan: eager without [compile], compiled with it (components "loss");
    Megatron-DeepSpeed and the generic profile: eager. A flag overrides the profile."""
    for framework in PROFILES:
        assert build_framework_profile(framework).features()["loss_implementation"] == "eager"
    compiled = build_framework_profile("torchtitan", {"fused_elementwise": True})
    assert compiled.memory_options().loss_implementation == "compiled"
    pinned = build_framework_profile("torchtitan", {"fused_elementwise": True,
                                                    "loss_implementation": "eager"})
    assert pinned.memory_options().loss_implementation == "eager"
    liger = build_framework_profile("generic", {"loss_implementation": "fused_linear"})
    assert liger.features()["loss_implementation"] == "fused_linear"


@pytest.mark.parametrize("framework,value", [("megatron", "chunked"),
                                             ("megatron", "fused_linear"),
                                             ("megatron", "compiled"),
                                             ("torchtitan", "fused"),
                                             ("deepspeed", "fused_linear")])
def test_a_loss_the_framework_lacks_is_refused(framework: str, value: str) -> None:
    with pytest.raises(InputError, match=f"--loss-implementation {value}: "):
        build_framework_profile(framework, {"loss_implementation": value})


@settings(max_examples=120, deadline=None)
@given(problems(models=MODELS), st.sampled_from(sorted(PROFILES)))
def test_a_fused_or_chunked_loss_never_raises_memory(problem, framework: str) -> None:
    """Against each loss the framework runs: fused and fused_linear never hold more than any
    other, fused_linear never more than fused, chunked never more than eager -- the logits term
    and the worst stage's total alike. (Chunked is not below compiled: torchtitan #1033.)"""
    model_spec, job, config = problem
    candidates = Candidates.from_configs([config])
    base = build_framework_profile(framework).memory_options()
    values = supported(framework)
    terms, totals = {}, {}
    for value in values:
        options = base.model_copy(update={"loss_implementation": value})
        terms[value] = estimate_logits_bytes(model_spec, job, candidates, options)[0]
        totals[value] = estimate_memory(model_spec, job, candidates, options).total[0]
    below = [("fused", other) for other in values if other not in ("fused", "fused_linear")] + \
        [("fused_linear", other) for other in values if other != "fused_linear"] + \
        [("chunked", "eager")]
    for low, high in below:
        if low in values and high in values:
            assert terms[low] <= terms[high] * (1 + 1e-12), (low, high)
            assert totals[low] <= totals[high] * (1 + 1e-12), (low, high)


def test_the_flag_reaches_the_estimate_and_its_json() -> None:
    """`--loss-implementation fused_linear` (generic): the JSON's framework features name it,
    and the last stage's logits item is Liger's 0.13 GB, not eager's 6.3 GB."""
    args = ["estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--seq-len", "8192", "--global-batch", "8", "--micro-batch", "1", "--zero", "3",
            "--framework", "generic", "--json"]
    eager = CliRunner().invoke(cli, args)
    fused = CliRunner().invoke(cli, [*args, "--loss-implementation", "fused_linear"])
    assert eager.exit_code == 0 and fused.exit_code == 0, (eager.output, fused.output)
    answers = [json.loads(r.stdout) for r in (eager, fused)]
    assert [a["framework_features"]["loss_implementation"] for a in answers] == [
        "eager", "fused_linear"]
    logits = [a["plans"][0]["stages"][-1]["other_gb"]["logits"] for a in answers]
    assert logits[0] == pytest.approx(LOGITS_8K * 6.0 / 1e9, abs=0.01)
    assert logits[1] == pytest.approx(0.13, abs=0.01)
    text = CliRunner().invoke(cli, args[:-1] + ["--loss-implementation", "fused_linear"])
    assert "loss: fused with the LM head" in text.stdout


def test_a_refused_loss_is_one_line_exit_2() -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--loss-implementation",
                                      "chunked"])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "--loss-implementation chunked: Megatron-Core has no chunked loss" in result.output


def test_launch_files_ask_for_the_plans_loss() -> None:
    """Megatron core_v0.16: --cross-entropy-loss-fusion --cross-entropy-fusion-impl te for the
    fused loss, nothing for eager; Megatron-Bridge writes the fusion off unless fused (its
    GPTModelProvider turns it on); torchtitan compiles the loss ([compile] components "loss")
    exactly when the loss is compiled."""
    plan = dict(model="llama3.1-8b", cluster="dgx-h100", num_gpus=8, tp=2)
    fused = make_target(**plan, features={"loss_implementation": "fused"})
    eager = make_target(**plan)
    assert "--cross-entropy-fusion-impl te" in render_megatron(fused).text
    assert "--cross-entropy-loss-fusion" not in render_megatron(eager).text
    overrides = [build_bridge_overrides(t)[0] for t in (eager, fused)]
    assert [o["model.cross_entropy_loss_fusion"] for o in overrides] == [False, True]
    assert overrides[1]["model.cross_entropy_fusion_impl"] == "te"
    for features, components in [({}, None),
                                 ({"fused_elementwise": True}, ["model", "loss"]),
                                 ({"loss_implementation": "compiled"}, ["loss"]),
                                 ({"fused_elementwise": True, "loss_implementation": "eager"},
                                  ["model"])]:
        constants = build_framework_profile("torchtitan", features).time_constants
        target = replace(eager, time_constants=constants)
        sections, _, _ = build_torchtitan_config(target)
        assert sections.get("compile", {}).get("components") == components, features


def torchtune_loss_bytes(implementation: str, **flags: bool) -> float:
    options = MemoryOptions(loss_implementation=implementation, **flags)
    return float(estimate_logits_bytes(LLAMA_8B, JOB_8K, ONE_GPU, options)[0])


def test_fp32_logits_from_the_model_double_the_compiled_loss() -> None:
    """torchtune's decoder returns `self.output(h).float()` (modules/transformer.py @1814feb,
    TransformerDecoder.forward; `F.linear(h, tok_embeddings.weight).float()` when tied) and
    compile_loss compiles the whole CEWithChunkedOutputLoss-less loss (training/_compile.py):
    the compiled cross-entropy saves its fp32 input and writes an fp32 gradient, 4 + 4 = 8 B
    per logit against 2 + 2 = 4 B from bf16 logits: 8.41 GB for Llama 3 8B at 8K."""
    assert torchtune_loss_bytes("compiled", logits_fp32_from_model=True) == pytest.approx(
        LOGITS_8K * 8.0)
    assert torchtune_loss_bytes("compiled", logits_fp32_from_model=True) / 1e9 == \
        pytest.approx(8.41, abs=0.01)
    assert torchtune_loss_bytes("compiled") == pytest.approx(LOGITS_8K * 4.0)
    # The eager loss's bytes are logits_bytes' (MemoryOptions docstring), unchanged by it.
    assert torchtune_loss_bytes("eager", logits_fp32_from_model=True) == \
        torchtune_loss_bytes("eager")


def test_compiled_chunks_keep_bf16_chunks_and_one_chunks_gradient() -> None:
    """torchtune compile_loss compiles CEWithChunkedOutputLoss.compute_cross_entropy, each
    chunk's `F.cross_entropy(logits.float(), ...)`, not the chunking (training/_compile.py
    @1814feb; ce_chunked_output_loss.py, num_output_chunks = 8): 2 + 2/8 = 2.25 B per logit
    against the eager chunks' 4 + 8/8 = 5 B: 2.36 GB for Llama 3 8B at 8K."""
    assert torchtune_loss_bytes("chunked", loss_chunks_compiled=True) == pytest.approx(
        LOGITS_8K * 2.25)
    assert torchtune_loss_bytes("chunked") == pytest.approx(LOGITS_8K * 5.0)


@settings(max_examples=60, deadline=None)
@given(problems(models=MODELS), st.sampled_from(["eager", "compiled", "chunked", "fused",
                                                 "fused_linear"]))
def test_fp32_logits_never_lower_and_compiled_chunks_never_raise(problem, value: str) -> None:
    """Property: handing the loss fp32 logits never lowers the logits term or the worst
    stage's total; compiling the chunks never raises them; the chunked loss stays at or below
    the eager one with either switch."""
    model_spec, job, config = problem
    candidates = Candidates.from_configs([config])

    def both(implementation: str, **flags: bool) -> tuple[float, float]:
        options = MemoryOptions(loss_implementation=implementation, **flags)
        return (float(estimate_logits_bytes(model_spec, job, candidates, options)[0]),
                float(estimate_memory(model_spec, job, candidates, options).total[0]))

    plain, fp32 = both(value), both(value, logits_fp32_from_model=True)
    compiled_chunks = both(value, loss_chunks_compiled=True)
    for low, high in ((plain, fp32), (compiled_chunks, plain)):
        assert low[0] <= high[0] * (1 + 1e-12) and low[1] <= high[1] * (1 + 1e-12)
    for flags in ({}, {"logits_fp32_from_model": True}, {"loss_chunks_compiled": True}):
        assert both("chunked", **flags)[0] <= both("eager", **flags)[0] * (1 + 1e-12)
