"""Engine host overhead (solver.cost.serving.overhead) and the decode-attention kernel's fixed
cost (solver.cost.serving.step), each pinned to the profile or table it comes from, and how they
enter the rounds, the idle latency and the multi-step wait."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost.serving.overhead import EngineOverhead, engine_overhead
from solver.cost.serving.step import DECODE_ATTENTION_KERNEL_S, StageShape, estimate_step_compute_s
from solver.serve import ServeJob
from solver.serve.candidates import ServeCandidates
from solver.serve.load import estimate_serving_load
from solver.serve.timing import build_engine, estimate_decode_round
from solver.serve.workload import ServeLoadSpec
from test_serve_load import problem_of

ONE = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)


def with_engine(problem, **fields):
    return problem.model_copy(update={"job": problem.job.model_copy(update=fields)})


def test_vllm_v1_async_scheduling_leaves_the_measured_gap() -> None:
    """vLLM PR #11133: with the scheduler one step ahead, the gap between two decodes is
    150-170 us at batch 256 (CUDA graphs): 160 us a round, whatever the batch."""
    overhead = engine_overhead("vllm")
    assert float(overhead.exposed_s(256, 0.02)) == pytest.approx(160e-6)
    assert float(overhead.exposed_s(1, 0.005)) == pytest.approx(160e-6)


def test_vllm_v0_gap_grows_with_the_batch() -> None:
    """vLLM issue #10634 (the V0 engine with the asynchronous output processor): 5-6 ms
    between two decodes at batch 256 on Llama-2-7B: 5.5 ms there, 21.5 us per sequence."""
    overhead = engine_overhead("vllm-v0")
    assert float(overhead.exposed_s(256, 0.02)) == pytest.approx(5.5e-3)
    assert float(overhead.exposed_s(64, 0.02)) == pytest.approx(1.375e-3)


def test_multi_step_pays_the_bubble_once_per_window() -> None:
    """vLLM RFC #6854: a single-step decode leaves a ~4 ms GPU bubble, which multi-step
    scheduling pays once per n steps (0.4 ms a step at --num-scheduler-steps 10)."""
    overhead = engine_overhead("vllm-v0", num_scheduler_steps=10)
    assert overhead.steps_per_schedule == 10
    assert float(overhead.exposed_s(100, 0.01)) == pytest.approx(0.4e-3)


def test_sglang_overlap_hides_the_host_and_v03_shows_a_tenth() -> None:
    """SGLang v0.4 blog: no idle GPU time between decode batches with the overlap scheduler;
    overlapping raised throughput 1.1x, so before it the host showed a tenth of the GPU's time."""
    assert float(engine_overhead("sglang").exposed_s(500, 0.03)) == 0.0
    assert float(engine_overhead("sglang-v0.3").exposed_s(30, 0.02)) == pytest.approx(2e-3)


def test_multi_step_needs_vllm_v0() -> None:
    with pytest.raises(ValueError, match="num_scheduler_steps"):
        ServeJob(context=4096, input_len=512, output_len=128, num_scheduler_steps=8)


def test_decode_attention_kernel_floor_is_the_generation_table_median() -> None:
    """AIConfigurator's generation-attention tables (commit 095f58a), batch 1, one token of
    context, head dim 128, bf16 KV: 11.3 us (H200, vLLM 0.24.0 FA3), 11.5 us (H100, vLLM
    0.24.0 FA3), 12.4 us (A100, vLLM 0.14.0 FA2): the median is the per-layer fixed cost, and
    a decode step of one short sequence costs it once per layer."""
    assert DECODE_ATTENTION_KERNEL_S == pytest.approx(float(np.median([11.3, 11.5, 12.4])) * 1e-6)
    problem = problem_of("llama3.1-8b", 1)
    shape = StageShape(layers=np.array([32.0]), moe_layers=np.array([0.0]), tp=np.array([1]),
                       dp=np.array([1]), ep=np.array([1]), weight_bytes_per_element=2.0,
                       kv_bytes_per_token=np.array([131072.0]))
    step = estimate_step_compute_s(problem.model_spec, problem.cluster.gpu, "bf16", shape,
                                   1.0, 1.0, 0.0, 0.0)
    assert float(step.decode_attention_s[0]) == pytest.approx(32 * 11.5e-6, rel=1e-3)
    none = estimate_step_compute_s(problem.model_spec, problem.cluster.gpu, "bf16", shape,
                                   0.0, 1.0, 512.0, 512.0)
    assert float(none.decode_attention_s[0]) == 0.0


def test_decode_attention_tracks_the_generation_table() -> None:
    """Against AIConfigurator's h200_sxm vLLM 0.24.0 FA3 rows (16 query / 2 KV heads of 128,
    Llama-3.1-70B at tp 4; per layer): batch 64 at 1,023 tokens 30.2 us, batch 128 at 511
    tokens 34.3 us, batch 8 at 8,191 tokens 30.6 us. The fixed cost plus streaming at 0.8 of
    4.8 TB/s lands within 20% of each."""
    from solver.catalog import load_gpu_spec

    gpu = load_gpu_spec("h200")
    kv_per_token_layer = 2 * 2 * 128 * 2.0
    shape = StageShape(layers=np.array([1.0]), moe_layers=np.array([0.0]), tp=np.array([4]),
                       dp=np.array([1]), ep=np.array([1]), weight_bytes_per_element=2.0,
                       kv_bytes_per_token=np.array([kv_per_token_layer]))
    for batch, context, measured_us in ((64, 1024, 30.2), (128, 512, 34.3), (8, 8192, 30.6)):
        step = estimate_step_compute_s(problem_of("llama3.1-70b", 4).model_spec, gpu, "bf16",
                                       shape, float(batch), float(context), 0.0, 0.0)
        assert float(step.decode_attention_s[0]) * 1e6 == pytest.approx(measured_us, rel=0.2)


def test_host_time_is_a_part_of_the_round() -> None:
    """The round's parts add up with the host's, and the engine choice moves only that part."""
    base = problem_of("llama3.1-8b", 1)
    v0 = with_engine(base, engine="vllm-v0")
    rounds = {name: estimate_decode_round(p, build_engine(p, ONE), 64.0)
              for name, p in (("vllm", base), ("vllm-v0", v0))}
    assert float(rounds["vllm"].host_s[0]) == pytest.approx(160e-6)
    assert float(rounds["vllm-v0"].host_s[0]) == pytest.approx(64 * 5.5e-3 / 256)
    assert np.allclose(rounds["vllm"].gpu_s, rounds["vllm-v0"].gpu_s)
    assert sum(rounds["vllm-v0"].parts_ms(0).values()) * 1e-3 == pytest.approx(
        float(rounds["vllm-v0"].total_s[0]))


def test_multi_step_window_adds_to_the_wait_for_a_prompt() -> None:
    """Under multi-step scheduling a prompt joins when the n committed rounds end: the mean
    TTFT under load grows by up to (n - 1) / 2 rounds (the busy share times the residual),
    plus the prompts that arrive over the longer window and ride in its round."""
    base = with_engine(problem_of("llama3.1-8b", 1, request_rate=4.0), engine="vllm-v0")
    multi = with_engine(base, num_scheduler_steps=10)
    one, ten = (estimate_serving_load(p, ONE).point for p in (base, multi))
    assert float(ten.ttft_mean_s[0]) > float(one.ttft_mean_s[0])
    extra = float(ten.ttft_mean_s[0] - one.ttft_mean_s[0])
    tau = float(ten.tpot_mean_s[0])
    assert 0.5 * tau < extra < 10 * tau


@settings(max_examples=20, deadline=None)
@given(st.floats(0.0, 1e-3), st.floats(0.0, 1e-4), st.floats(0.0, 0.5), st.integers(1, 16),
       st.floats(0.0, 512.0), st.floats(0.0, 512.0), st.floats(1e-3, 0.1))
def test_host_time_never_falls_with_more_sequences(step: float, per_seq: float, share: float,
                                                   n: int, d: float, more: float,
                                                   gpu: float) -> None:
    overhead = EngineOverhead(step_s=step, per_seq_s=per_seq, gpu_fraction=share,
                              steps_per_schedule=n)
    assert overhead.exposed_s(d + more, gpu) >= overhead.exposed_s(d, gpu) >= 0.0


def test_load_spec_carries_the_engine() -> None:
    """The serving load of an overlap-scheduled SGLang engine is at least vLLM's (no exposed
    host time against 160 us a round)."""
    base = problem_of("llama3.1-8b", 1, request_rate=2.0)
    sglang = with_engine(base, engine="sglang")
    assert isinstance(base.job.load, ServeLoadSpec)
    a, b = (estimate_serving_load(p, ONE).point for p in (base, sglang))
    assert float(b.tpot_mean_s[0]) < float(a.tpot_mean_s[0])


def test_an_overlapping_scheduler_adds_the_round_it_has_built() -> None:
    """vLLM PR #19970 / SGLang v0.4: the scheduler builds round k + 1 while round k runs, so a
    prompt waits one more round when the engine is busy: the mean TTFT grows by busy x tau,
    its quantile by at most tau, TPOT not at all."""
    from dataclasses import replace

    from solver.cost.serving.load import estimate_load_point, interpolate_curve
    from solver.serve.load import estimate_load_curves

    problem = with_engine(problem_of("llama3.1-8b", 1, request_rate=4.0), engine="sglang")
    curves = estimate_load_curves(problem, ONE)
    assert curves.lag_rounds == 1
    rate = np.array([4.0])
    lagged, plain = (estimate_load_point(c, rate) for c in (curves, replace(curves, lag_rounds=0)))
    tau = interpolate_curve(curves, curves.round_s, lagged.decoding)
    extra = float(lagged.ttft_mean_s[0] - plain.ttft_mean_s[0])
    assert 0.0 < extra <= float(tau[0]) * (1 + 1e-9)
    assert 0.0 < float(lagged.ttft_s[0] - plain.ttft_s[0]) <= float(tau[0]) * (1 + 1e-6)
    assert float(lagged.tpot_s[0]) == float(plain.tpot_s[0])


def test_vllm_v0_with_pipeline_stages_processes_outputs_in_step() -> None:
    """vLLM V0 turns its asynchronous output processor off under pipeline parallelism
    ("Async output processing can not be enabled with pipeline parallel"), so RFC #6913's
    _process_model_outputs shows: 0.2 ms at batch 1, 3.4 ms at batch 32 (Llama-3-70B on
    4 x H100), on top of the V0 gap; nothing changes at pp 1 or for the other engines."""
    overhead = engine_overhead("vllm-v0")
    one = float(overhead.exposed_s(32, 0.02, pp=1))
    two = float(overhead.exposed_s(32, 0.02, pp=2))
    assert two - one == pytest.approx(3.4e-3)
    assert float(overhead.exposed_s(1, 0.02, pp=2) - overhead.exposed_s(1, 0.02)) == \
        pytest.approx(0.2e-3)
    vllm = engine_overhead("vllm")
    assert float(vllm.exposed_s(32, 0.02, pp=2)) == float(vllm.exposed_s(32, 0.02, pp=1))


def test_decode_attention_kernel_only_in_attention_layers() -> None:
    """A block-pattern model pays the decode-attention kernel's fixed cost only in its
    softmax-attention layers (Nemotron-H's Mamba-2 layers have none)."""
    from solver.catalog import load_model_spec

    model = load_model_spec("nemotron-h-8b")
    assert 0 < model.num_attention_layers < model.num_hidden_layers
    problem = problem_of("llama3.1-8b", 1)
    layers = float(model.num_hidden_layers)
    shape = StageShape(layers=np.array([layers]), moe_layers=np.array([0.0]), tp=np.array([1]),
                       dp=np.array([1]), ep=np.array([1]), weight_bytes_per_element=2.0,
                       kv_bytes_per_token=np.array([0.0]))
    step = estimate_step_compute_s(model, problem.cluster.gpu, "bf16", shape, 1.0, 1.0, 0.0, 0.0)
    assert float(step.decode_attention_s[0]) == pytest.approx(
        model.num_attention_layers * DECODE_ATTENTION_KERNEL_S)
