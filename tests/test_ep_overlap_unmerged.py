"""The EP all-to-all overlap merges a chunk's forward with another's backward only in the
steady state (solver.cost.comm.comm_ep.estimate_unmerged_share): Megatron-Core's
combined_1f1b_schedule_for_no_pipelining runs the first forward and the last backward alone,
and the interleaved schedule's warm-up forwards, (pp - 1) 2 + (v - 1) pp plus the one extra the
overlap schedules (schedules.py get_pp_rank_microbatches, core_v0.15.0-0.17.0), and as many
cool-down backwards run unmerged, each exposing its dispatch and combine in full."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.comm.comm_ep import estimate_unmerged_share
from solver.cost.layers.layer_time import STAGE_PARTS
from solver.cost.step.steptime import TimeConstants, estimate_step_time, estimate_time_terms
from solver.spec import JobSpec, ParallelConfig

EP = STAGE_PARTS.index("ep")
# Megatron-Bridge's H100 Qwen3-235B-A22B recipe (tp 2, pp 8, vpp 4, ep 32 on 256 GPUs).
QWEN3_235B = ParallelConfig(tp=2, pp=8, dp=16, ep=32, vpp=4)


def test_qwen3_235b_interleaved_warm_up() -> None:
    """pp 8, vpp 4: the first rank's 2 x 7 + 3 x 8 + 1 = 39 warm-up forwards of 128 x 4 chunk
    passes at a 2,048-sequence batch (dp 16), 7.6%; of 512 x 4 at 8,192, 1.9%."""
    share = estimate_unmerged_share(np.array([8, 8]), np.array([4, 4]), np.array([128, 512]))
    assert share.tolist() == pytest.approx([39 / 512, 39 / 2048])
    assert share[0] == pytest.approx(0.0762, abs=1e-4)


def test_without_pipelining_one_pass_each_way() -> None:
    """One micro-batch's forward and another's backward run alone: 1 / m."""
    assert float(estimate_unmerged_share(np.array([1]), np.array([1]), np.array([64]))[0]) == (
        pytest.approx(1 / 64))


@settings(max_examples=60, deadline=None)
@given(pp=st.integers(1, 16), vpp=st.integers(1, 8), num_micro=st.integers(1, 4096))
def test_a_share_of_the_passes(pp: int, vpp: int, num_micro: int) -> None:
    """Between 0 and 1 (every pass unmerged when the warm-up covers the step), and never more
    with more micro-batches."""
    share = float(estimate_unmerged_share(np.array([pp]), np.array([vpp]),
                                          np.array([num_micro]))[0])
    more = float(estimate_unmerged_share(np.array([pp]), np.array([vpp]),
                                         np.array([2 * num_micro]))[0])
    assert 0.0 < share <= 1.0 and more <= share


def _terms(overlap: bool, layers_only: bool, global_batch: int = 2048):
    model = load_model_spec("qwen3-235b-a22b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=global_batch, precision="fp8")
    return estimate_time_terms(model, cluster, job, Candidates.from_configs([QWEN3_235B]),
                               TimeConstants(ep_comm_overlap=overlap, tp_comm_overlap=False),
                               layers_only=layers_only)


def test_the_unmerged_passes_expose_what_the_overlap_hid() -> None:
    """Qwen3-235B-A22B on 256 H100s at 2,048 sequences: a MoE layer's EP term grows by 7.6% of
    what the overlap hides of its forward and backward all-to-alls (the unmerged pairs'
    exposure, 2 x forward EP, over the merged pair's)."""
    merged = _terms(True, True).per_layer[0, 1, EP]
    full = _terms(True, False).per_layer[0, 1, EP]
    plain = _terms(False, False).per_layer[0, 1, EP]
    assert full - merged == pytest.approx(39 / 512 * (plain - merged))
    assert merged < full < plain
    assert _terms(False, True).per_layer[0, 1, EP] == pytest.approx(plain)


def test_the_layers_only_bound_stays_below() -> None:
    """The search's first pass (layers_only) leaves the term out: it only adds."""
    model = load_model_spec("qwen3-235b-a22b")
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=2048, precision="fp8")
    candidates = Candidates.from_configs([QWEN3_235B])
    constants = TimeConstants(ep_comm_overlap=True)
    bound = estimate_step_time(model, cluster, job, candidates, constants,
                               terms=estimate_time_terms(model, cluster, job, candidates,
                                                         constants, layers_only=True))
    full = estimate_step_time(model, cluster, job, candidates, constants)
    assert float(bound.step_s[0]) < float(full.step_s[0])
