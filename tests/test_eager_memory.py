"""Eager activations (issue 43 item 3): what eager element-wise ops and an unfused attention
core keep for backward beyond fused kernels (solver.cost.memory.eager), each byte count pinned
to the code that saves it, and `--eager-elementwise` / `--attention-kernel unfused` moving
memory through the framework profile. Property: neither ever lowers memory, per stage or in
total."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_memory_properties import DENSE_GQA, DENSE_MHA_TIED, MOE_GQA, MOE_MLA, problems

from solver.api import estimate
from solver.catalog import load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import estimate_all_stages, estimate_memory
from solver.cost.memory.activations import (
    estimate_activation_terms,
    estimate_layer_activation_bytes,
)
from solver.cost.memory.eager import estimate_unfused_core_bytes
from solver.cost.memory.options import MemoryOptions
from solver.cost.step.offload import refuse_activation_offload
from solver.spec import JobSpec, ModelSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures

LLAMA31_8B = load_model_spec("llama3.1-8b")  # h 4096, 32 heads (8 KV) of 128, F 14336
GPT3_175B = ModelSpec(name="gpt3-175b", hidden_size=12288, intermediate_size=4 * 12288,
                      num_hidden_layers=96, num_attention_heads=96, vocab_size=51200,
                      mlp_type="plain", norm_type="layernorm")
QK_NORM = ModelSpec(name="qk-norm", hidden_size=2048, intermediate_size=6144,
                    num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
                    vocab_size=32000, qk_norm=True, norms_per_layer=4)
EAGER = MemoryOptions(fused_elementwise=False)
S = 8192


def layer_bytes(model_spec: ModelSpec, options: MemoryOptions, recompute: str = "none",
                seq_len: int = S, tp: int = 1, moe: bool = False) -> float:
    candidates = Candidates.from_configs([ParallelConfig(tp=tp, recompute=recompute)])
    return float(estimate_layer_activation_bytes(model_spec, JobSpec(seq_len=seq_len,
                                                                     global_batch=8),
                                                 candidates, options, moe=moe)[0])


def test_unfused_core_keeps_korthikantis_softmax_and_dropout_bytes() -> None:
    """Korthikanti et al. 2022 (arXiv 2205.05198) Table 2, fused softmax: softmax output 2as,
    dropout mask as, dropout output 2as: 5as per token with dropout (2as without, one tensor
    the PV matmul saves too). Eager, Megatron's forward_torch_softmax (fused_softmax.py,
    attention_softmax_in_fp32 True in transformer_config.py): softmax(input.float()) keeps its
    fp32 output (derivatives.yaml _softmax: result), then .bfloat16() probabilities: 6as, or
    4as + mask + dropout output = 7as. GPT-3 175B (a 96), s 2048."""
    a, s = 96, 2048
    fused, eager = MemoryOptions(), EAGER
    assert estimate_unfused_core_bytes(a, s, fused) == 2 * a * s
    assert estimate_unfused_core_bytes(a, s, fused.model_copy(update={"dropout": True})) \
        == 5 * a * s == 983_040
    assert estimate_unfused_core_bytes(a, s, eager) == 6 * a * s
    assert estimate_unfused_core_bytes(a, s, eager.model_copy(update={"dropout": True})) \
        == 7 * a * s == 1_376_256


def test_eager_llama_layer_keeps_silu_output_and_fp32_norm_copies() -> None:
    """Llama-3.1-8B, s 8192, b 1, tp 1, no recompute, FlashAttention. Eager (torchtitan
    @9dec370 models/norms.py RMSNorm: `self._norm(x.float()).type_as(x) * self.weight`; llama
    model.py FeedForward `w2(F.silu(w1(x)) * w3(x))`): each of the two RMSNorms keeps its fp32
    input copy (4 B) and its bf16 normalized input (2 B) instead of the bf16 input (2 B), +4h;
    SwiGLU keeps silu's bf16 output (derivatives.yaml mul.Tensor saves both operands), +2F
    against Megatron's fused SwiGLUFunction (fused_bias_swiglu.py saves only its input):
    2 x 4 x 4096 + 2 x 14336 = 61,440 B per token, 503.3 MB per layer. With nn.RMSNorm on
    PyTorch's CUDA _fused_rms_norm (saves input and rstd) only the 28,672 B of silu remain.
    RoPE (complex multiply by a buffer without grad: mul saves only the buffer) adds none."""
    fused = layer_bytes(LLAMA31_8B, MemoryOptions())
    assert layer_bytes(LLAMA31_8B, EAGER) - fused == pytest.approx(61_440 * S, rel=1e-12)
    assert (61_440 * S) / 1e6 == pytest.approx(503.3, abs=0.05)
    native_norm = EAGER.model_copy(update={"rmsnorm_fp32_copy": False})
    assert layer_bytes(LLAMA31_8B, native_norm) - fused == pytest.approx(28_672 * S, rel=1e-12)


def test_eager_layernorm_gelu_layer_adds_only_the_softmax() -> None:
    """LayerNorm runs native_layer_norm (saves input, mean, rstd) and GeLU saves its input
    (derivatives.yaml gelu: self) eager or fused: a GPT layer with FlashAttention keeps the
    same bytes eager; unfused, the eager softmax's fp32 output adds 4as per token without
    dropout (6as - 2as) and 2as with it (7as - 5as)."""
    assert layer_bytes(GPT3_175B, EAGER, seq_len=2048) == layer_bytes(
        GPT3_175B, MemoryOptions(), seq_len=2048)
    for dropout, extra in ((False, 4), (True, 2)):
        fused = MemoryOptions(flash_attention=False, dropout=dropout)
        eager = fused.model_copy(update={"fused_elementwise": False})
        assert layer_bytes(GPT3_175B, eager, seq_len=2048) - layer_bytes(
            GPT3_175B, fused, seq_len=2048) == pytest.approx(extra * 96 * 2048 * 2048)


def test_eager_norms_of_the_q_k_and_post_norms_are_counted() -> None:
    """Each eager RMSNorm adds 4 B per normalized element: a Qwen3-style layer's q/k norms
    (16 heads of 128 for q, 4 for k: 2560 elements) and four norms per layer (Gemma's pre- and
    post-norms: 4 x 2048), plus the silu output 2 x 6144: 4 x 2560 + 4 x 8192 + 12,288 =
    55,296 B per token."""
    extra = layer_bytes(QK_NORM, EAGER) - layer_bytes(QK_NORM, MemoryOptions())
    assert extra == pytest.approx(55_296 * S, rel=1e-12)


def test_recompute_modes_keep_or_drop_the_eager_bytes_consistently() -> None:
    """Selective (Megatron's core_attn) drops the attention core, the eager softmax with it:
    unfused and FlashAttention keep the same bytes; full keeps the layer input 2sbh alone,
    eager or not, and the eager layer's larger working set while it is recomputed; torchtitan's
    per-op SAC saves only matmul, attention and collective outputs (activation_checkpoint.py
    _save_list), so eager element-wise ops add nothing to a layer there."""
    unfused = EAGER.model_copy(update={"flash_attention": False})
    assert layer_bytes(LLAMA31_8B, unfused, "selective") == layer_bytes(
        LLAMA31_8B, EAGER, "selective")
    assert layer_bytes(LLAMA31_8B, unfused, "full") == layer_bytes(
        LLAMA31_8B, MemoryOptions(), "full") == 2 * 4096 * S
    op_level = MemoryOptions(selective_recompute="op_level")
    assert layer_bytes(LLAMA31_8B, op_level.model_copy(update={"fused_elementwise": False}),
                       "selective") == layer_bytes(LLAMA31_8B, op_level, "selective")
    candidates = Candidates.from_configs([ParallelConfig(recompute="full")])
    job = JobSpec(seq_len=S, global_batch=8)
    working = [float(estimate_activation_terms(LLAMA31_8B, job, candidates, o)["working"][0])
               for o in (MemoryOptions(), EAGER)]
    assert working[1] - working[0] == pytest.approx(61_440 * S, rel=1e-12)


def test_megatron_mlp_recompute_drops_the_eager_silu_output_too() -> None:
    """--recompute-modules mlp recomputes the dense MLP (mlp.py), so what its eager SwiGLU
    saved goes as well: eager and fused keep the same MLP interior after it (the norms,
    outside the module, stay): the difference is the two norms' 2 x 4 x 4096 B."""
    modules = {"recompute_modules": ("core_attn", "mlp")}
    fused = layer_bytes(LLAMA31_8B, MemoryOptions(**modules), "selective")
    eager = layer_bytes(LLAMA31_8B, EAGER.model_copy(update=modules), "selective")
    assert eager - fused == pytest.approx(2 * 4 * 4096 * S, rel=1e-12)


def test_the_profile_passes_its_attention_kernel_and_fusion_to_memory() -> None:
    """`--attention-kernel unfused` (TimeConstants.flash_attention False) and
    `--eager-elementwise` reach MemoryOptions; flash2 and triton store no s x s scores; a base
    that already says unfused (BLOOM's Megatron-DeepSpeed) stays unfused under DeepSpeed's
    flash2 profile; torchtitan without torch.compile runs eager."""
    for kernel, flash in (("native", True), ("flash2", True), ("triton", True),
                          ("unfused", False)):
        options = build_framework_profile("megatron", {"attention_kernel": kernel}
                                          ).memory_options()
        assert options.flash_attention is flash
    assert build_framework_profile("megatron", {"fused_elementwise": False}
                                   ).memory_options().fused_elementwise is False
    assert build_framework_profile("torchtitan").memory_options().fused_elementwise is False
    assert build_framework_profile("torchtitan", {"fused_elementwise": True}
                                   ).memory_options().fused_elementwise is True
    bloom = MemoryOptions(flash_attention=False, dropout=True)
    assert build_framework_profile("deepspeed").memory_options(bloom).flash_attention is False


def test_estimate_with_unfused_attention_reports_the_scores() -> None:
    """Through `estimate`: Llama-3.1-8B on 8 H100s, s 4096, micro-batch 1, no recompute, 32
    layers, Megatron: unfused attention adds 32 layers x (2 x 32 heads x 4096 - 4 x 32 LSE) B
    per token x 4096 tokens = 34.34 GB of activations; eager element-wise ops on top add the
    eager softmax (4 x 32 x 4096 per token) and 61,440 B per token of norms and silu per layer
    (the final norm's 4h once)."""
    common = dict(seq_len=4096, tp=1, pp=1, micro_batch=1, recompute="none")
    stage = {
        name: estimate("llama3.1-8b", "dgx-h100", 8, features=FrameworkFeatures(**f),
                       **common).plan.worst_stage.activations_bytes
        for name, f in (("flash", {}), ("unfused", {"attention_kernel": "unfused"}),
                        ("eager", {"attention_kernel": "unfused",
                                   "fused_elementwise": False}))}
    tokens = 4096
    assert stage["unfused"] - stage["flash"] == pytest.approx(
        32 * (2 * 32 * 4096 - 4 * 32) * tokens, rel=1e-9)
    assert (stage["unfused"] - stage["flash"]) / 1e9 == pytest.approx(34.34, abs=0.01)
    assert stage["eager"] - stage["unfused"] == pytest.approx(
        (32 * (4 * 32 * 4096 + 61_440) + 4 * 4096) * tokens, rel=1e-9)


MODELS = [DENSE_GQA, DENSE_MHA_TIED, MOE_GQA, MOE_MLA, QK_NORM]


@st.composite
def memory_options(draw) -> MemoryOptions:
    """The options the eager terms interact with. Activation offload is Megatron's, whose
    selective recompute is attention_core (torchtitan, op_level, has none: UNSUPPORTED in
    solver.cost.step.frameworks). Combinations Megatron refuses are left out by the test
    (solver.cost.step.offload.refuse_activation_offload)."""
    modules = draw(st.sampled_from([("core_attn",), ("core_attn", "mlp"), ("mlp",),
                                    ("core_attn", "moe_act", "shared_experts", "layernorm"),
                                    ("moe", "mla_up_proj")]))
    selective = draw(st.sampled_from(["attention_core", "op_level"]))
    return MemoryOptions(dropout=draw(st.booleans()), sequence_parallel=draw(st.booleans()),
                         selective_recompute=selective, recompute_modules=modules,
                         rmsnorm_fp32_copy=draw(st.booleans()),
                         activation_offload=selective == "attention_core" and draw(st.booleans()),
                         keep_stage_outputs=draw(st.booleans()))


@settings(max_examples=150, deadline=None)
@given(problems(models=MODELS), memory_options(), st.booleans(), st.booleans())
def test_unfused_attention_or_eager_ops_never_lower_memory(problem, options, flash,
                                                           fused) -> None:
    """From any (flash_attention, fused_elementwise), turning FlashAttention off or the
    element-wise fusion off never lowers memory: on every stage of the configuration
    (estimate_all_stages) and in the worst-stage total (estimate_memory)."""
    model_spec, job, config = problem
    # Megatron's offload runs at the recompute levels it takes (selective of the moe module
    # refused on MoE models, full refused): the planner refuses the others before memory.
    assume(not options.activation_offload or refuse_activation_offload(
        model_spec, options.recompute_modules, config.recompute) is None)
    base = options.model_copy(update={"flash_attention": flash, "fused_elementwise": fused})
    for change in ({"flash_attention": False}, {"fused_elementwise": False}):
        worse = base.model_copy(update=change)
        before = estimate_all_stages(model_spec, job, config, base)
        after = estimate_all_stages(model_spec, job, config, worse)
        for stages in (before, after):
            assert all(np.all(item >= 0) for item in stages.items.values()), stages.items
        assert not_lower(after.total, before.total), (change, before.total, after.total)
        assert not_lower(after.items["activations"], before.items["activations"]), change
        candidates = Candidates.from_configs([config])
        assert not_lower(estimate_memory(model_spec, job, candidates, worse).total,
                         estimate_memory(model_spec, job, candidates, base).total), change


def not_lower(after: np.ndarray, before: np.ndarray) -> bool:
    return bool(np.all(after - before >= -1e-12 * np.abs(before)))


def test_autograd_saves_what_the_model_counts() -> None:
    """Oracle: benchmarks/eager_saved_bytes.py runs each eager block under
    torch.autograd.graph.saved_tensors_hooks and sums what autograd saves; on the PyTorch at
    hand it equals the model's eager bytes per token (per score for the attention core): the
    x.float() RMSNorm 6h + 4, SwiGLU 8F, complex RoPE 0, the fp32 softmax 6 and 7 (8 with CPU
    dropout's bf16 noise) per score. nn.RMSNorm is checked on CUDA only, where it dispatches
    to _fused_rms_norm."""
    torch = pytest.importorskip("torch")
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "eager_saved_bytes.py"
    spec = importlib.util.spec_from_file_location("eager_saved_bytes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.measure_rows(torch)
    assert len(rows) == 6
    for name, measured, eager, _ in rows:
        if name.startswith("nn.RMSNorm") and not torch.cuda.is_available():
            continue
        assert measured == pytest.approx(eager, rel=1e-9), name


def test_estimate_says_what_the_kernels_leave_saved() -> None:
    """`estimate`'s memory assumptions name the attention kernel's and the element-wise ops'
    saved activations: torchtitan (eager without torch.compile) and Megatron with
    --attention-kernel unfused; --fused-elementwise turns the eager line off."""
    from click.testing import CliRunner

    from solver.cli import cli

    args = ["estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
            "--seq-len", "4096"]
    titan = CliRunner().invoke(cli, [*args, "--framework", "torchtitan"])
    assert titan.exit_code == 0, titan.output
    assert ("activations: fused attention keeps no s x s scores; eager element-wise ops also "
            "keep silu's output and fp32 RMSNorm copies") in titan.output
    unfused = CliRunner().invoke(cli, [*args, "--attention-kernel", "unfused"])
    assert ("activations: unfused attention keeps the s x s softmax probabilities; fused "
            "element-wise kernels") in unfused.output
    compiled = CliRunner().invoke(cli, [*args, "--framework", "torchtitan",
                                        "--fused-elementwise"])
    assert "fused element-wise kernels" in compiled.output
