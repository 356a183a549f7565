"""Step-time model: pipeline schedule pinned to Narayanan et al. 2021 and the seed, FLOP
conventions pinned to Megatron/PaLM, and invariants over random configurations."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.layers.flops import convert_mfu, estimate_model_flops_per_token
from solver.cost.step.steptime import (
    StageTimeContent,
    compose_step_time,
    estimate_step_time,
    estimate_time_terms,
)
from solver.spec import JobSpec

DEGREES = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute")


def candidates(**values: object) -> SimpleNamespace:
    base = dict(tp=1, pp=1, dp=1, cp=1, ep=1, etp=1, vpp=1, zero=1, micro_batch=1, recompute=1)
    base.update(values)
    arrays = np.broadcast_arrays(*(np.atleast_1d(np.asarray(v)) for v in base.values()))
    return SimpleNamespace(**dict(zip(base, arrays)))


def pipeline_work(t) -> np.ndarray:
    return t.compute + t.recompute + t.tp + t.cp + t.ep


def test_seed_pp_bubble_405b() -> None:
    """Seed 003, example 3: "PP bubble (PP=2, m=32) 1/32 = 3.1%". The 1F1B bubble of equal
    stages is (p-1)/(m+p-1) of the pipelined time (Narayanan et al. 2021 §2.2.1): 1/33 = 3.0%;
    the seed's (p-1)/m is the bubble relative to the ideal time, not to the step. Here the last
    stage also runs the LM head and loss, so it sets the steady state and the first stage (63
    layers, no head) fills and drains: bubble = T_first, steady = m T_last."""
    model = load_model_spec("llama3.1-405b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=8192, global_batch=512)
    t = estimate_step_time(model, cluster, job, candidates(tp=8, pp=2, dp=16))
    no_head = estimate_step_time(model, cluster, job, candidates(tp=8, pp=1, dp=32))
    m = 32
    steady = pipeline_work(t)[0]
    fraction = t.bubble / (steady + t.bubble)
    assert float(fraction[0]) == pytest.approx(1 / 33, rel=0.01)
    assert float(fraction[0]) < 1 / 33
    # T_first / T_last: the head's share of the last stage is what the bubble saves.
    assert float(t.bubble[0]) < steady / m
    assert float(t.bubble[0] / steady) == pytest.approx(1 / 32, rel=0.01)
    assert no_head.bubble[0] == 0


def test_interleaved_bubble_is_divided_by_the_virtual_stages() -> None:
    """Narayanan et al. 2021 §2.2.2: interleaving v chunks cuts the bubble to (p-1)/(v*m) of the
    ideal time; the stages are the same with or without interleaving, so the bubble is exactly
    5 times shorter with v = 5, and within the head's share of (p-1)/m of the steady state."""
    model = load_model_spec("llama3.1-70b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=8192, global_batch=128)
    t = estimate_step_time(model, cluster, job, candidates(tp=4, pp=8, dp=2, vpp=[1, 5]))
    m = 128 / 2
    assert t.bubble[0] / t.bubble[1] == pytest.approx(5.0)
    assert t.bubble[0] / pipeline_work(t)[0] == pytest.approx(7 / m, rel=0.1)
    assert t.bubble[0] / pipeline_work(t)[0] < 7 / m


def test_equal_stages_give_the_textbook_bubble() -> None:
    """compose_step_time with p equal stages: m t + (p - 1) t / v (Narayanan et al. 2021 §2.2),
    and with one slow stage: sum_i T_i + (m - 1) max_i T_i (1F1B)."""
    model = load_model_spec("llama3.1-70b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=8192, global_batch=128)
    c = candidates(tp=4, pp=4, dp=4, vpp=[1, 2])
    terms = estimate_time_terms(model, cluster, job, c)
    terms = dataclasses.replace(terms, last=terms.last * 0, per_stage=terms.per_stage * 0)
    layers = np.zeros((2, 4, 2))
    layers[:, :, 0] = 20
    content = StageTimeContent.of_stages(layers, layers * 0, np.zeros((2, 4)), np.full(2, 4))
    t = compose_step_time(terms, content)
    per_stage = 20 * terms.per_layer[:, 0].sum(axis=1)
    m = 128 / 4
    assert t.bubble == pytest.approx(3 * per_stage / np.array([1, 2]))
    assert pipeline_work(t) == pytest.approx(m * per_stage)
    slow = layers.copy()
    slow[:, 2, 0] = 23
    t = compose_step_time(terms, StageTimeContent.of_stages(
        slow, slow * 0, np.zeros((2, 4)), np.full(2, 4)))
    slowest = 23 * terms.per_layer[:, 0].sum(axis=1)
    assert float(pipeline_work(t)[0] + t.bubble[0]) == pytest.approx(
        float(3 * per_stage[0] + slowest[0] + (m - 1) * slowest[0]))


def test_pipeline_hand_off_sends_one_tp_slice_per_rank() -> None:
    """Every TP rank sends 1/tp of the hand-off activation: with sequence parallel it is
    sharded already; without it Megatron's scatter/gather optimization (Narayanan et al. 2021
    §4.1) and DeepSpeed's pipeline engine (`is_pipe_partitioned = is_model_parallel`) split it
    before the send and all-gather it over TP on arrival. BLOOM-176B, tp 4, pp 12, dp 8,
    micro-batch 2, seq 2048: 2 x 2048 x 14336 x 2 B / 4 = 29.4 MB per send on the fabric."""
    from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
    from solver.cost.step.steptime import TimeConstants

    model, cluster = load_model_spec("bloom-176b"), load_cluster_spec("dgx-a100-80gb")
    job = JobSpec(seq_len=2048, global_batch=2048)
    c = candidates(tp=4, pp=12, dp=8, micro_batch=2)
    with_sp = estimate_step_time(model, cluster, job, c)
    without = estimate_step_time(model, cluster, job, c,
                                 TimeConstants(sequence_parallel=False))
    activation = 2 * 2048 * 14336 * 2.0
    sends = 2048 / (8 * 2) * 2  # micro-batches x (activation forward, gradient backward)
    wire = estimate_collective_s("send_recv", activation / 4, 2,
                                 estimate_group_link(cluster, 4 * 8, 2))
    regather = estimate_collective_s("all_gather", activation, 4,
                                     estimate_group_link(cluster, 1, 4))
    assert with_sp.pp[0] == pytest.approx(sends * float(wire), rel=1e-12)
    assert without.pp[0] == pytest.approx(sends * float(wire + regather), rel=1e-12)


def test_model_flops_match_modelspec_and_megatron_with_noncausal_attention() -> None:
    """estimate_model_flops_per_token is ModelSpec.flops_per_token (one convention, two doors);
    converting to non-causal gives Megatron's 72 b s L h^2 (1 + s/6h + V/12hL) form."""
    model = load_model_spec("llama3.1-8b")
    ours = estimate_model_flops_per_token(model, 8192)
    assert ours == pytest.approx(model.flops_per_token(8192, causal=True), rel=1e-9)
    noncausal = convert_mfu(model, 8192, 0.5, "noncausal") / 0.5 * ours
    assert noncausal == pytest.approx(model.flops_per_token(8192, causal=False), rel=1e-9)


def test_full_recompute_costs_about_one_forward() -> None:
    """Korthikanti et al. 2022 §5: full recomputation adds a forward pass, 30-40% overhead
    (the issue quotes ~30% against selective)."""
    model = load_model_spec("llama2-70b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=256)
    t = estimate_step_time(model, cluster, job, candidates(tp=8, dp=8, recompute=[1, 2]))
    overhead = t.step_s[1] / t.step_s[0] - 1
    assert 0.2 < overhead < 0.4


def test_mfu_is_model_flops_over_peak() -> None:
    model = load_model_spec("llama3.1-8b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=8192, global_batch=128)
    t = estimate_step_time(model, cluster, job, candidates(dp=8))
    flops = estimate_model_flops_per_token(model, 8192) * t.tokens_per_s_per_gpu
    assert t.mfu[0] == pytest.approx(flops[0] / 989e12)
    assert t.tflops_per_gpu[0] == pytest.approx(flops[0] / 1e12)
    assert 0.3 < t.mfu[0] < 0.75  # notes §5.4: 53-59% for tuned dense Megatron runs on H100


def test_single_rank_axes_cost_nothing() -> None:
    model = load_model_spec("llama3.1-8b")
    cluster = load_cluster_spec("dgx-h100")
    t = estimate_step_time(model, cluster, JobSpec(), candidates())
    assert t.tp[0] == t.cp[0] == t.ep[0] == t.dp[0] == t.pp[0] == t.bubble[0] == 0.0


POWERS = st.sampled_from([1, 2, 4, 8])


@settings(max_examples=150, deadline=None)
@given(tp=POWERS, pp=POWERS, cp=st.sampled_from([1, 2]), dp=POWERS, ep=POWERS,
       vpp=st.sampled_from([1, 2]), zero=st.integers(0, 3), mb=st.sampled_from([1, 2, 4]),
       recompute=st.integers(0, 2), name=st.sampled_from(["llama3.1-70b", "mixtral-8x7b",
                                                          "deepseek-v3", "qwen3-30b-a3b"]))
def test_parts_are_non_negative_and_add_up(tp, pp, cp, dp, ep, vpp, zero, mb, recompute, name):
    model = load_model_spec(name)
    if not model.is_moe:
        ep = 1
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=512)
    t = estimate_step_time(model, cluster, job, candidates(
        tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, vpp=vpp, zero=zero, micro_batch=mb,
        recompute=recompute))
    parts = [t.compute, t.recompute, t.tp, t.cp, t.ep, t.dp, t.pp, t.bubble, t.optimizer]
    assert all(float(p[0]) >= 0 for p in parts)
    assert float(sum(parts)[0]) == pytest.approx(float(t.step_s[0]), rel=1e-12)
    assert 0 < float(t.mfu[0]) < 1


@settings(max_examples=60, deadline=None)
@given(seq=st.sampled_from([1024, 2048, 4096, 8192]), more=st.sampled_from([2, 4]),
       tp=POWERS, recompute=st.integers(0, 2))
def test_step_time_never_falls_when_the_sequence_grows(seq, more, tp, recompute):
    model = load_model_spec("llama3.1-8b")
    cluster = load_cluster_spec("dgx-h100")
    config = candidates(tp=tp, dp=8 // tp, recompute=recompute)
    short = estimate_step_time(model, cluster, JobSpec(seq_len=seq, global_batch=64), config)
    long = estimate_step_time(model, cluster, JobSpec(seq_len=seq * more, global_batch=64),
                              config)
    assert long.step_s[0] >= short.step_s[0]


# ---- unfused attention with a misaligned head dimension ---------------------------------------

def test_misaligned_unfused_attention_runs_on_the_cuda_cores() -> None:
    """Head dim 225 (h 14400 / 64 heads; 450-byte rows, not a multiple of 16) without
    FlashAttention: the attention core's full (unmasked) score FLOPs at the A100's FP32
    CUDA-core peak (19.5 TFLOP/s) x its matmul fraction (0.869). FlashAttention pads the head
    dimension and is unaffected; an aligned head dimension (224) is unaffected too."""
    from solver.cost.kernels.efficiency import ComputeConstants, estimate_attention_core_s

    gpu = load_cluster_spec("dgx-a100-80gb").gpu
    cc = ComputeConstants()
    flops = 1e12  # causal count
    flash = estimate_attention_core_s(gpu, "bf16", flops, cc)
    assert flash == pytest.approx(flops / (cc.attention_peak_fraction * 312e12))
    assert estimate_attention_core_s(gpu, "bf16", flops, cc, (225, 225)) == flash
    assert estimate_attention_core_s(gpu, "bf16", flops, cc, (224, 224), flash=False) == flash
    slow = estimate_attention_core_s(gpu, "bf16", flops, cc, (225, 225), flash=False)
    assert slow == pytest.approx(2 * flops / (0.869 * 19.5e12))
    # The value head alone misaligned is enough (P V writes rows of the value head dim).
    assert estimate_attention_core_s(gpu, "bf16", flops, cc, (224, 108),
                                     flash=False) == pytest.approx(slow)


def test_unfused_attention_streams_its_score_matrix() -> None:
    """layer_compute.UNFUSED_SCORE_BYTES: unfused attention (Megatron / Transformer Engine
    UnfusedDotProductAttention: baddbmm -> FusedScaleMaskSoftmax -> bmm) writes and reads the
    bf16 s x s scores, 8 B per score forward (S written, S read and P written, P read) and 14 B
    backward (dP written, P read for dV, P and dP read and dS written, dS read twice), and its
    backward runs the forward's two batched GEMMs twice over (nothing recomputed). BLOOM-176B
    at tp 8 on an A100 80 GB, mb 1, s 2048: 14 heads x 2048^2 = 58.7M scores per GPU, 470 MB
    forward at 0.8 x 2039 GB/s = 0.29 ms."""
    from solver.cost.kernels.efficiency import ComputeConstants, estimate_attention_core_s
    from solver.cost.layers.flops import estimate_attention_core_flops
    from solver.cost.layers.layer_compute import _attention_core
    from solver.cost.layers.time_constants import TimeConstants

    model = load_model_spec("bloom-176b")
    cluster = load_cluster_spec("dgx-a100-80gb")
    job = JobSpec(seq_len=2048)
    d = {n: np.array([v]) for n, v in dict(tp=8, cp=1, micro_batch=1).items()}
    constants = TimeConstants(flash_attention=False)
    forward, backward, measured = _attention_core(model, cluster, job, d, constants)
    assert not measured
    flops = 2048 * estimate_attention_core_flops(model, 2048) / 8
    gemms = estimate_attention_core_s(cluster.gpu, "bf16", flops, ComputeConstants(),
                                      head_dims=(model.qk_head_dim, model.value_head_dim),
                                      flash=False)
    scores = 112 / 8 * 2048**2
    bandwidth = 0.8 * cluster.gpu.hbm_gb_per_s * 1e9
    assert float(forward[0]) == pytest.approx(float(gemms) + 8 * scores / bandwidth)
    assert float(backward[0]) == pytest.approx(2 * float(gemms) + 14 * scores / bandwidth)
    assert 8 * scores / bandwidth == pytest.approx(0.29e-3, abs=0.01e-3)
    assert model.num_attention_heads == 112


def test_attention_dropout_streams_the_dropped_scores_and_their_mask() -> None:
    """layer_compute.UNFUSED_DROPOUT_BYTES: BLOOM trained with Megatron's default attention
    dropout (tr11-176B-ml README: "The default Megatron-LM dropout settings are inherited:
    --attention-dropout 0.1"), which Megatron-DeepSpeed's unfused attention applies to the
    probabilities as a torch.nn.Dropout (megatron/model/transformer.py at 541b967f): 5 B more
    per score forward (read P, write P' and a bool mask) and 5 B backward (read dP' and the
    mask, write dP). BLOOM-176B at tp 4, mb 2, s 2048: 2 x 28 x 2048^2 = 234.9M scores per
    GPU, 1.17 GB each way, 0.72 ms at 0.8 x 2039 GB/s."""
    from solver.cost.layers.layer_compute import _attention_core
    from solver.cost.layers.time_constants import TimeConstants

    model, cluster = load_model_spec("bloom-176b"), load_cluster_spec("dgx-a100-80gb")
    job = JobSpec(seq_len=2048)
    d = {n: np.array([v]) for n, v in dict(tp=4, cp=1, micro_batch=2).items()}
    plain = TimeConstants(flash_attention=False)
    dropped = plain.model_copy(update={"attention_dropout": True})
    forward, backward, _ = _attention_core(model, cluster, job, d, plain)
    forward_d, backward_d, _ = _attention_core(model, cluster, job, d, dropped)
    scores = 2 * 112 / 4 * 2048**2
    extra = 5 * scores / (0.8 * cluster.gpu.hbm_gb_per_s * 1e9)
    assert float(forward_d[0] - forward[0]) == pytest.approx(extra)
    assert float(backward_d[0] - backward[0]) == pytest.approx(extra)
    assert extra == pytest.approx(0.72e-3, abs=0.01e-3)
    # Fused kernels drop inside the kernel: the switch leaves them alone.
    flash = TimeConstants()
    assert np.array_equal(_attention_core(model, cluster, job, d, flash)[0],
                          _attention_core(model, cluster, job, d, flash.model_copy(
                              update={"attention_dropout": True}))[0])


def test_misaligned_head_dim_without_an_fp32_peak_is_an_input_error() -> None:
    from solver.cost.kernels.efficiency import ComputeConstants, estimate_attention_core_s
    from solver.errors import InputError

    gpu = load_cluster_spec("dgx-b200").gpu
    assert gpu.peak_tflops_fp32 is None
    with pytest.raises(InputError, match="peak_tflops_fp32"):
        estimate_attention_core_s(gpu, "bf16", 1e12, ComputeConstants(), (225,), flash=False)


def test_deepspeed_pipeline_engine_exposes_every_dp_collective() -> None:
    """DeepSpeed's pipeline engine runs the gradient reduction after the last backward and
    ZeRO-1's parameter all-gather after the optimizer step (pipe/engine.py, schedule.py), so
    with dp_overlap off the "dp" part is the whole volume of each stage's collectives; its bf16
    ZeRO-1 all-reduces the gradients (buffered_allreduce_fallback) instead of reduce-scattering
    them (zero1_grad_all_reduce). ZeRO-3 gathers twice and reduce-scatters once per
    micro-batch."""
    from solver.cost.step.data_parallel import estimate_dp_collectives_s
    from solver.cost.step.steptime import TimeConstants

    model, cluster = load_model_spec("llama3.1-70b"), load_cluster_spec("dgx-a100-80gb")
    job = JobSpec(seq_len=4096, global_batch=256)
    c = candidates(tp=4, pp=2, dp=8, micro_batch=2, zero=[0, 1, 2, 3])
    base = TimeConstants(dp_overlap="never")
    s = estimate_dp_collectives_s(model, cluster, c, base)
    micro = 256 / (8 * 2)
    expected = [s["grads_all_reduce"][0],
                s["grads_reduce_scatter"][1] + s["params_all_gather"][1],
                s["grads_reduce_scatter"][2] + s["params_all_gather"][2],
                micro * (2 * s["params_all_gather"][3] + s["zero3_reduce_scatter"][3])]
    np.testing.assert_allclose(estimate_step_time(model, cluster, job, c, base).dp, expected,
                               rtol=1e-12)
    all_reduce = TimeConstants(dp_overlap="never", zero1_grad_all_reduce=True)
    dp = estimate_step_time(model, cluster, job, c, all_reduce).dp
    assert dp[1] == pytest.approx(s["grads_all_reduce"][1] + s["params_all_gather"][1])
    assert dp[2] == pytest.approx(expected[2])  # ZeRO-2 still reduce-scatters
    # An all-reduce moves twice a reduce-scatter's bytes (nccl-tests bus factors 2(n-1)/n
    # against (n-1)/n; latency aside: one bucket each).
    one_bucket = estimate_dp_collectives_s(
        model, cluster, c, TimeConstants(dp_overlap="never", dp_bucket_params=1e12))
    assert one_bucket["grads_all_reduce"][1] == pytest.approx(
        2 * one_bucket["grads_reduce_scatter"][1], rel=0.01)


def test_ampere_era_attention_kernels_reach_two_thirds_of_a_hopper_peak() -> None:
    """FlashAttention-3 paper (Shah et al. 2024) §1: kernels built on Ampere's mma.sync reach
    about 2/3 of an H100's peak; 2023-era FlashAttention-1/2 and Triton attention (LLM Foundry's
    tables) are such kernels. The limit applies to Hopper GPUs only (A100's own instruction is
    mma.sync) and not to native kernels (FlashAttention-3, cuDNN), the default."""
    from solver.cost.kernels.efficiency import ComputeConstants, estimate_attention_core_s

    cc = ComputeConstants()
    for preset in ("dgx-h100", "hgx-h800", "dgx-h200"):
        gpu = load_cluster_spec(preset).gpu
        native = estimate_attention_core_s(gpu, "bf16", 1e12, cc)
        legacy = estimate_attention_core_s(gpu, "bf16", 1e12, cc, native=False)
        assert native == pytest.approx(1e12 / (cc.attention_peak_fraction * 989e12))
        assert legacy == pytest.approx(native / 0.667)
    a100 = load_cluster_spec("dgx-a100-80gb").gpu
    assert a100.legacy_mma_fraction is None
    assert (estimate_attention_core_s(a100, "bf16", 1e12, cc, native=False)
            == estimate_attention_core_s(a100, "bf16", 1e12, cc))


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["llama3.1-8b", "llama3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b"]),
       tp=st.sampled_from([1, 2, 8]), pp=st.sampled_from([1, 2, 4, 16]),
       zero=st.integers(0, 3), micro_batch=st.sampled_from([1, 2, 8]))
def test_overlap_never_costs_more_than_exposing_every_collective(model, tp, pp, zero,
                                                                   micro_batch) -> None:
    """Hiding DP traffic behind compute can only help: one layer's share stays exposed, the
    rest hides up to the compute available, and the hidden part slows compute by the SM share
    of the communication kernels (< 1), so the overlapped "dp" part is at most the volume."""
    from solver.cost.step.steptime import TimeConstants

    spec, cluster = load_model_spec(model), load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=512)
    c = candidates(tp=tp, pp=pp, dp=64 // (tp * pp) if tp * pp <= 64 else 1, zero=zero,
                   micro_batch=micro_batch)
    overlapped = estimate_step_time(spec, cluster, job, c).dp
    exposed = estimate_step_time(spec, cluster, job, c,
                                 TimeConstants(dp_overlap="never")).dp
    assert np.all(overlapped <= exposed * (1 + 1e-12))
    layers_per_stage = -(-spec.num_hidden_layers // pp)
    assert np.all(overlapped >= exposed / layers_per_stage * (1 - 1e-12))


def test_deepspeed_zero2_reduces_every_micro_batch_and_gathers_inside_the_step() -> None:
    """DeepSpeed's ZeRO-2 reduces each micro-batch's gradients (stage_1_and_2.py: "if
    self.partition_gradients or self.is_gradient_accumulation_boundary"), so with n
    micro-batches the backward side runs n times; its ZeRO 1-2 gather the updated parameters
    inside the optimizer step, so the forward side is the whole gather. With one micro-batch
    ZeRO-2 costs what ZeRO-1 does."""
    from solver.cost.step.data_parallel import estimate_dp_collectives_s
    from solver.cost.step.frameworks import framework_time_constants
    from solver.cost.layers.time_constants import TimeConstants

    model, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=256)
    deepspeed = framework_time_constants("deepspeed")
    c = candidates(tp=1, pp=1, dp=64, micro_batch=1, zero=[1, 2])  # 4 micro-batches
    s = estimate_dp_collectives_s(model, cluster, c, deepspeed)
    dp = estimate_step_time(model, cluster, job, c, deepspeed).dp
    plain = estimate_step_time(model, cluster, job, c, TimeConstants(
        params_gather_overlap=False, dp_bucket_params=deepspeed.dp_bucket_params)).dp
    # ZeRO-1 and -2 move the same bytes per sync; ZeRO-2 syncs its gradients 4 times.
    assert s["grads_reduce_scatter"][0] == s["grads_reduce_scatter"][1]
    backward_side = plain[0] - s["params_all_gather"][0]
    assert dp[0] == pytest.approx(plain[0])
    assert dp[1] == pytest.approx(4 * backward_side + s["params_all_gather"][1])
    one = candidates(tp=1, pp=1, dp=64, micro_batch=4, zero=[1, 2])
    once = estimate_step_time(model, cluster, job, one, deepspeed).dp
    assert once[1] == pytest.approx(once[0])
    # ZeRO-0: DeepSpeed all-reduces after the whole backward, the whole volume exposed.
    zero0 = candidates(tp=1, pp=1, dp=64, micro_batch=1, zero=0)
    s0 = estimate_dp_collectives_s(model, cluster, zero0, deepspeed)
    assert estimate_step_time(model, cluster, job, zero0, deepspeed).dp[0] == pytest.approx(
        s0["grads_all_reduce"][0])


def test_dp_overlap_window_is_the_layer_time_the_host_paces() -> None:
    """The DP overlap window (the average layer's forward and backward) is the layer's compute
    as its per-layer time counts it: the GPU's work and the GPU's wait for the host's launches
    (layer_time._layer_terms). Worked number (host_time.estimate_host_s): Megatron,
    Qwen3-30B-A3B's MoE layer (all its layers) at ep 8, tp 1 issues 145.1 ops at a DGX H100's
    13.48 us, 1.956 ms forward and 3.91 ms backward. At 256 tokens the GPU's forward is
    shorter: the window is longer than the GPU's work, by the wait; at 16,384 tokens it is the
    GPU's."""

    from solver.cost.layers.layer_compute import estimate_backward_s, estimate_forward_s
    from solver.cost.layers.layer_compute_kept import estimate_framework_compute_s
    from solver.cost.layers.layer_time import STAGE_PARTS, estimate_layer_terms
    from solver.cost.layers.time_constants import TimeConstants

    model, cluster, constants = (load_model_spec("qwen3-30b-a3b"),
                                 load_cluster_spec("dgx-h100"), TimeConstants())
    d = {k: np.array([v]) for k, v in dict(tp=1, pp=1, dp=8, cp=1, ep=8, etp=1, vpp=1, zero=1,
                                            micro_batch=1, recompute=0).items()}
    compute = STAGE_PARTS.index("compute")
    host_fwd = 1.956e-3
    for seq_len, host_binds in ((256, True), (16384, False)):
        job = JobSpec(seq_len=seq_len, global_batch=64)
        moe = estimate_framework_compute_s(model, cluster, job, d, constants)["moe"]
        gpu = estimate_forward_s(moe)[0] + estimate_backward_s(moe)[0]
        terms = estimate_layer_terms(model, cluster, job, d, constants)
        window = terms["mixed_fwd"][0] + terms["mixed_bwd"][0]
        assert window == pytest.approx(terms["per_layer"][0, 1, compute], rel=1e-12)
        assert (window > gpu * (1 + 1e-9)) == host_binds
        assert estimate_forward_s(moe)[0] < host_fwd if host_binds else \
            estimate_forward_s(moe)[0] > host_fwd


@settings(max_examples=60, deadline=None)
@given(model_name=st.sampled_from(["nemotron-h-56b", "qwen3-next-80b-a3b", "deepseek-v3",
                                   "gemma3-27b", "llama3.1-70b", "nemotron-3-super-120b-a12b"]),
       pp=st.sampled_from([1, 2, 3, 4, 6, 8, 16]), vpp=st.sampled_from([1, 2, 3]),
       recompute=st.sampled_from(["none", "selective", "full"]), slots=st.booleans())
def test_even_content_keeps_the_stages_that_may_be_slowest(model_name: str, pp: int, vpp: int,
                                                           recompute: str, slots: bool) -> None:
    """The even split's stage content keeps only the stages no other stage dominates
    (solver.cost.step.stage_content): its step time is the one of the same even split given stage by
    stage (estimate_layout_step_time, one row per pipeline rank), breakdown included."""
    from solver.cost.candidates import Candidates
    from solver.cost.memory import MemoryOptions
    from solver.cost.memory.layout import build_default_layout
    from solver.cost.step.steptime import estimate_layout_step_time
    from solver.spec import ParallelConfig

    model = load_model_spec(model_name)
    assume(model.num_hidden_layers >= pp * vpp and (vpp == 1 or pp > 1))
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=256)
    config = ParallelConfig(tp=8, pp=pp, vpp=vpp, dp=1, zero=1, recompute=recompute)
    options = MemoryOptions(account_for_embedding_in_pipeline_split=slots)
    even = estimate_step_time(model, cluster, job, Candidates.from_configs([config]),
                              embedding_slots=slots)
    staged = estimate_layout_step_time(model, cluster, job, [config],
                                       [build_default_layout(model, config, options)])
    for name in ("step_s", "bubble", "compute", "recompute", "tp", "ep"):
        assert getattr(even, name)[0] == pytest.approx(getattr(staged, name)[0], rel=1e-12)
