"""Expert compute that does not grow with expert parallelism (issue 34, item 1).

The fused-MoE grids stop at 16,384 tokens of the EP group. Looking a larger group up at the
edge while keeping its local expert count charged the whole work at a kernel with fewer rows
per expert, so at fixed work per GPU the rate fell as ep grew (DeepSeek-V3 on GB200 in MXFP8:
about 2,065 TFLOP/s at ep 8, 416 at ep 64). solver.cost.kernels.kernels_moe.estimate_table_moe_s now keeps
the work per GPU: the best kernel on the line of constant work with no more rows per expert,
on grids made monotone in rows per expert and local experts. These are its invariants,
checked on every packaged table, listed and unlisted shapes, forward and backward, and in the
step-time model (training) and the engine-step model (serving).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import list_zoo_names, load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.step.frameworks import framework_time_constants
from solver.cost.kernels.kernels import list_kernel_tables, load_kernel_table, moe_flop
from solver.cost.kernels.kernels_moe import estimate_table_moe_backward_s, estimate_table_moe_s
from solver.cost.serving.step import StageShape, estimate_step_compute_s
from solver.cost.step.steptime import estimate_step_time
from solver.spec import JobSpec, ParallelConfig

REL = 1e-9  # float rounding of the line's samples
TABLES = [name for name in list_kernel_tables()
          if any(g.startswith("moe.") for g in load_kernel_table(name).grids)]
# (hidden, inter, topk, experts, gated): listed shapes (DeepSeek-V3, Qwen3-30B-A3B) and
# shapes the tables lack (gpt-oss-120b; Mixtral 8x7B; Qwen3-235B-A22B; a 160-expert
# DeepSeek-V2, whose ep values are not powers of two).
SHAPES = [(7168, 2048, 8, 256, True), (2048, 768, 8, 128, True), (2880, 2880, 4, 128, True),
          (4096, 14336, 2, 8, True), (4096, 1536, 8, 128, True), (5120, 1536, 6, 160, True)]


def _dtypes(table) -> list[str]:
    return sorted({g.split(".")[1] for g in table.grids if g.startswith("moe.")})


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@settings(max_examples=60, deadline=None)
@given(table_name=st.sampled_from(TABLES), shape=st.sampled_from(SHAPES),
       copies_per_gpu=st.floats(64.0, 400_000.0), etp=st.sampled_from([1, 2, 4]),
       data=st.data())
def test_expert_seconds_never_grow_with_ep_at_fixed_copies_per_gpu(
        table_name, shape, copies_per_gpu, etp, data) -> None:
    """At fixed tokens x top-k per GPU (the EP group's tokens over ep), forward and backward
    seconds never grow as ep grows over the divisors of the expert count."""
    table = load_kernel_table(table_name)
    hidden, inter, topk, experts, gated = shape
    dtype = data.draw(st.sampled_from(_dtypes(table)))
    eps = np.array(_divisors(experts), dtype=float)
    tokens = copies_per_gpu / topk * eps
    kwargs = dict(hidden=hidden, inter=inter, topk=topk, experts=experts, gated=gated,
                  tokens=tokens, etp=etp, ep=eps)
    for estimate in (estimate_table_moe_s, estimate_table_moe_backward_s):
        seconds = estimate(table, dtype, **kwargs)
        if seconds is None:
            continue
        assert np.all(seconds > 0)
        assert np.all(seconds[1:] <= seconds[:-1] * (1 + REL)), (estimate.__name__, seconds)


@settings(max_examples=60, deadline=None)
@given(table_name=st.sampled_from(TABLES), shape=st.sampled_from(SHAPES),
       etp=st.sampled_from([1, 2, 8]), data=st.data())
def test_expert_rate_never_falls_as_rows_per_expert_grow(table_name, shape, etp, data) -> None:
    """At fixed local experts (fixed ep), the fused kernel's rate (work / seconds) never falls
    as the rows per expert grow, through the grid and beyond its token edge."""
    table = load_kernel_table(table_name)
    hidden, inter, topk, experts, gated = shape
    dtype = data.draw(st.sampled_from(_dtypes(table)))
    ep = data.draw(st.sampled_from(_divisors(experts)))
    tokens = np.geomspace(256.0, 2_000_000.0, 97)
    seconds = estimate_table_moe_s(table, dtype, hidden=hidden, inter=inter, topk=topk,
                                   experts=experts, gated=gated, tokens=tokens, etp=etp, ep=ep)
    if seconds is None:
        return
    rate = moe_flop(tokens, etp, ep, hidden, inter, topk, gated) / seconds
    assert np.all(rate[1:] >= rate[:-1] * (1 - REL)), rate


def test_grid_points_below_the_edge_keep_the_measured_rate_or_better() -> None:
    """Inside the grid a kernel is never charged more than its own measured latency (the
    monotone envelope only raises rates, and a point raised takes a kernel it contains)."""
    table = load_kernel_table("gb200")
    grid = table.grids["moe.fp8_block.gated.7168x2048x8x256"]
    tokens, etp, ep = np.meshgrid(*[s.astype(float) for s in grid.sizes], indexing="ij")
    seconds = estimate_table_moe_s(table, "fp8_block", hidden=7168, inter=2048, topk=8,
                                   experts=256, gated=True, tokens=tokens, etp=etp, ep=ep)
    assert np.all(seconds <= grid.latency_s * (1 + REL))


def test_deepseek_v3_expert_rate_beyond_the_edge_on_gb200() -> None:
    """The worked number of estimate_table_moe_s: GB200 fp8_block, DeepSeek-V3's experts
    (7168 x 2048, top-8 of 256; deepseek-ai/DeepSeek-V3 config.json), 4,096 tokens per GPU:
    at ep 8 to 64 the EP group's 32,768-262,144 tokens run at the grid's 16,384 tokens at ep 4
    (512 rows on each of 64 experts), 1,962 TFLOP/s (AIConfigurator's measured row; the
    clamped lookup gave 1,765 at ep 8 and 853 at ep 64)."""
    table = load_kernel_table("gb200")
    eps = np.array([8.0, 16.0, 32.0, 64.0])
    tokens = 4096.0 * eps
    seconds = estimate_table_moe_s(table, "fp8_block", hidden=7168, inter=2048, topk=8,
                                   experts=256, gated=True, tokens=tokens, etp=1, ep=eps)
    rate = moe_flop(tokens, 1, eps, 7168, 2048, 8, True) / seconds / 1e12
    assert rate == pytest.approx([1962.2] * 4, abs=0.5)
    grid = table.grids["moe.fp8_block.gated.7168x2048x8x256"]
    measured = float(np.exp(grid.log_rate[-1, 0, 2])) / 1e12  # 16,384 tokens, etp 1, ep 4
    assert measured == pytest.approx(1962.2, abs=0.5)


def _compute_over_ep(model_name: str, cluster: str, precision: str, eps: list[int],
                     seq_len: int = 4096, pp: int = 1, host_free: bool = True) -> np.ndarray:
    model_spec = load_model_spec(model_name)
    cluster_spec = load_cluster_spec(cluster)
    dp = max(eps)
    job = JobSpec(seq_len=seq_len, global_batch=dp * 8, precision=precision)
    configs = [ParallelConfig(tp=1, pp=pp, dp=dp, ep=ep, micro_batch=1, recompute="full",
                              zero=1) for ep in eps]
    # `host_free`: the GPU's compute alone, since the host's wait, booked in compute, hides
    # behind slow EP traffic at some ep and not at others (host_time.estimate_host_wait_s).
    constants = framework_time_constants("megatron")
    if host_free:
        constants = constants.model_copy(update={"host_op_s": 0.0})
    estimate = estimate_step_time(model_spec, cluster_spec, job,
                                  Candidates.from_configs(configs), constants)
    return np.asarray(estimate.compute)


def test_issue_command_compute_does_not_grow_from_ep_8_to_32() -> None:
    """The issue's command: DeepSeek-V3 on 256 GB200s, tp 1, pp 8, mb 1, MXFP8, full
    recompute: compute was 4.05, 4.39 and 5.09 s at ep 8, 16 and 32. With the host's wait
    (Grace, 37 us an op; fewer local experts, fewer ops after the token-count sync) it falls
    too, and the GPU's own compute is the same at each."""
    compute = _compute_over_ep("deepseek-v3", "gb200-nvl72", "mxfp8", [8, 16, 32], pp=8,
                               host_free=False)
    assert np.all(np.diff(compute) <= 1e-9 * compute[:-1]), compute
    compute = _compute_over_ep("deepseek-v3", "gb200-nvl72", "mxfp8", [8, 16, 32], pp=8)
    assert np.all(np.diff(compute) <= 1e-9 * compute[:-1]), compute


MOE_ZOO = [name for name in list_zoo_names() if load_model_spec(name).is_moe]


@pytest.mark.parametrize("model_name", MOE_ZOO)
@pytest.mark.parametrize("cluster", ["dgx-h100", "gb200-nvl72"])
def test_every_zoo_moe_model_compute_does_not_grow_with_ep(model_name: str, cluster: str
                                                          ) -> None:
    """Every MoE model of the zoo, from ep 1 to its largest legal ep (the divisors of its
    expert count), at fixed work per GPU (tp 1, one 4,096-token sequence per micro-batch):
    the compute part of the step never grows."""
    experts = load_model_spec(model_name).num_experts
    compute = _compute_over_ep(model_name, cluster, "bf16", _divisors(experts))
    assert np.all(np.diff(compute) <= 1e-9 * compute[:-1]), compute


@pytest.mark.parametrize("model_name", ["deepseek-v3", "qwen3-30b-a3b", "gpt-oss-120b"])
def test_serving_expert_seconds_never_grow_with_ep(model_name: str) -> None:
    """Serving (solver.cost.serving.step): one engine step of a fixed batch per GPU, the EP group
    growing with dp: the routed experts' seconds never grow with ep."""
    model_spec = load_model_spec(model_name)
    gpu = load_cluster_spec("dgx-h100").gpu
    eps = np.array(_divisors(model_spec.num_experts)[:9], dtype=float)
    ones = np.ones_like(eps)
    shape = StageShape(layers=ones * model_spec.num_hidden_layers,
                       moe_layers=ones * model_spec.num_moe_layers, tp=ones, dp=eps, ep=eps,
                       weight_bytes_per_element=2.0, kv_bytes_per_token=ones * 1e5)
    for decode, prefill in ((64.0, 0.0), (256.0, 4096.0), (0.0, 16384.0)):
        step = estimate_step_compute_s(model_spec, gpu, "bf16", shape, decode * ones,
                                       2048.0 * ones, prefill * ones, 2048.0 * ones,
                                       ComputeConstants())
        assert np.all(np.diff(step.experts_s) <= 1e-9 * step.experts_s[:-1]), step.experts_s
