"""DP traffic, gradient accumulation and the optimizer step (solver.cost.step.data_parallel): pinned
to hand arithmetic with the nccl-tests factors."""

from __future__ import annotations

import pytest

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.step.data_parallel import (
    estimate_dp_collectives_s,
    estimate_grad_accumulation_s,
    estimate_optimizer_s,
)
from solver.cost.candidates import Candidates
from solver.cost.step.steptime import TimeConstants
from solver.spec import ParallelConfig

CONSTANTS = TimeConstants()


def candidates(**degrees: int) -> Candidates:
    """One configuration: degree 1, no ZeRO and no recomputation unless given."""
    return Candidates.from_configs([ParallelConfig(**({"zero": 0, "recompute": "none"}
                                                      | degrees))])


def test_llama_8b_gradient_all_reduce_on_one_node() -> None:
    """nccl-tests PERFORMANCE.md: bytes x 2(n-1)/n / busbw, plus NCCL's latency per call
    (solver.cost.comm.nccl_latency, tuning.cc). One stage of Llama-3.1-8B (8,030,261,248 parameters)
    with fp32 gradients over dp = 8 on a DGX H100 (NVLink tier: 360 GB/s bus bandwidth):
    ZeRO-0 under FSDP frameworks is torch DDP, 1,226 buckets of 25 MiB; ring LL128 on one node
    (14 + 14 x 1.9 = 40.6 us a call) beats Simple (56 us): 1,226 x 40.6 us + 2 x 7/8 x 32.12 GB
    / (0.92 x 360 GB/s) = 0.2195 s (a 25 MiB ring all-reduce at a 260 GB/s bus bandwidth, about
    what nccl-tests measures there on H100, takes 1,226 x 176 us = 0.216 s). ZeRO 1-2 move the
    same bytes per FSDP unit (33: 32 layers and the root) by ring Simple (8.4 + 7 x 3.4 = 32.2 us,
    beating LL128's 27.3 us and 8% less bandwidth): the reduce-scatter half of the bytes, the
    bf16 all-gather a quarter."""
    model_spec, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    got = estimate_dp_collectives_s(model_spec, cluster, candidates(dp=8), CONSTANTS)
    grads = 8_030_261_248 * 4.0
    assert got["grads_all_reduce"][0] == pytest.approx(
        1226 * 40.6e-6 + 2 * 7 / 8 * grads / (0.92 * 360e9), rel=1e-6)
    assert got["grads_reduce_scatter"][0] == pytest.approx(
        33 * 32.2e-6 + 7 / 8 * grads / 360e9, rel=1e-6)
    assert got["params_all_gather"][0] == pytest.approx(
        33 * 32.2e-6 + 7 / 8 * grads / 2 / 360e9, rel=1e-6)


def test_optimizer_streams_thirty_bytes_per_local_parameter() -> None:
    """Adam reads param, grad, m, v in fp32 and writes param, m, v and the bf16 copy: 30 B per
    parameter; 8.03e9 x 30 B / (0.8 x 3,350 GB/s) = 0.0899 s without ZeRO, 1/8 of it with
    ZeRO-1 over dp = 8."""
    model_spec, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    plain = estimate_optimizer_s(model_spec, cluster, candidates(dp=8), CONSTANTS)
    sharded = estimate_optimizer_s(model_spec, cluster, candidates(dp=8, zero=1), CONSTANTS)
    assert plain[0] == pytest.approx(8_030_261_248 * 30 / (0.8 * 3350e9), rel=1e-6)
    assert sharded[0] == pytest.approx(plain[0] / 8, rel=1e-12)


def test_deepspeed_bf16_gradient_accumulation_per_micro_batch() -> None:
    """DeepSpeed's BF16_Optimizer (runtime/bf16_optimizer.py, built for BLOOM) runs
    `hp.grad.data.add_(lp.grad.data.to(float32))` after every micro-batch's backward in the
    pipeline engine: 2 + 4 + 4 + 4 + 4 = 18 B per parameter. BLOOM-176B at tp 4, pp 12: the
    first stage holds 6 of 70 layers (6 x 2.4665e9) and the 250,880 x 14,336 embedding, 4.60e9
    per GPU: 82.8 GB, 0.0507 s on an A100 (2,039 GB/s at 80%). Megatron fuses the accumulation
    into the GEMM: the default, 0 B, costs nothing."""
    model_spec, cluster = load_model_spec("bloom-176b"), load_cluster_spec("dgx-a100-80gb")
    c = candidates(tp=4, pp=12, dp=8)
    per_gpu = (6 * (12 * 14336**2 + 13 * 14336) + 250880 * 14336) / 4
    deepspeed = CONSTANTS.model_copy(update={"grad_accumulation_bytes_per_param": 18.0})
    seconds = estimate_grad_accumulation_s(model_spec, cluster, c, deepspeed)
    assert seconds[0] == pytest.approx(per_gpu * 18 / (0.8 * 2039e9), rel=1e-3)
    assert seconds[0] == pytest.approx(0.0507, abs=5e-4)
    assert estimate_grad_accumulation_s(model_spec, cluster, c, CONSTANTS)[0] == 0.0

