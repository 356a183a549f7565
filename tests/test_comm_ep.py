"""Expert-parallel all-to-all exposure under Megatron's EP A2A overlap (solver.cost.comm.comm_ep):
the three phases of megatron-core 0.16.1 model_chunk_schedule_plan.py
TransformerLayerSchedulePlan.run (combine_bwd | attn_fwd, dispatch_fwd -> dispatch_bwd |
mlp_bwd -> mlp_fwd, combine_fwd | attn_bwd)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.cost.comm.comm_ep import estimate_ep_exposed_s, estimate_merged_experts_phase_s

MS = 1e-3


def test_worked_number() -> None:
    """c = 1 ms (2 ms of forward EP), attention 0.8 / 1.6 ms, experts 2 / 4 ms: only the
    backward's combine outlasts the forward attention beside it, by 0.2 ms."""
    exposed = estimate_ep_exposed_s(2 * MS, 2.0, True, 0.0, (0.8 * MS, 1.6 * MS),
                                    (2 * MS, 4 * MS))
    assert float(exposed) == pytest.approx(0.2 * MS)
    # SM contention slows the compute stream by its share of the hidden 3.8 ms.
    with_sms = estimate_ep_exposed_s(2 * MS, 2.0, True, 0.1, (0.8 * MS, 1.6 * MS),
                                     (2 * MS, 4 * MS))
    assert float(with_sms) == pytest.approx(0.2 * MS + 0.1 * 3.8 * MS)


def test_without_overlap_and_beyond_the_merged_pair_everything_waits() -> None:
    """No overlap: every pass waits. A recompute pass (beyond the merged forward and backward)
    pairs with nothing; a lone module recompute pass likewise."""
    args = ((0.8 * MS, 1.6 * MS), (2 * MS, 4 * MS))
    assert float(estimate_ep_exposed_s(2 * MS, 2.0, False, 0.1, *args)) == pytest.approx(4 * MS)
    pair = float(estimate_ep_exposed_s(2 * MS, 2.0, True, 0.0, *args))
    assert float(estimate_ep_exposed_s(2 * MS, 3.0, True, 0.0, *args)) == pytest.approx(
        pair + 2 * MS)
    assert float(estimate_ep_exposed_s(2 * MS, 1.0, True, 0.0, *args)) == pytest.approx(2 * MS)


positive = st.floats(0.0, 10.0)


@given(positive, positive, positive, positive, positive, st.floats(0.0, 1.0))
def test_phases_hide_less_than_the_pooled_layer_and_never_add(ep_fwd: float, attn_fwd: float,
                                                             attn_bwd: float, mlp_fwd: float,
                                                             mlp_bwd: float,
                                                             contention: float) -> None:
    """Sum of the phases' excesses >= the excess over the pooled compute (the previous
    model), and never more than no overlap at all."""
    exposed = float(estimate_ep_exposed_s(np.float64(ep_fwd), 2.0, True, contention,
                                          (attn_fwd, attn_bwd), (mlp_fwd, mlp_bwd)))
    pooled = max(2 * ep_fwd - (attn_fwd + attn_bwd + mlp_fwd + mlp_bwd), 0.0)
    assert exposed >= pooled * (1 - 1e-12) - 1e-12
    assert exposed <= 2 * ep_fwd * (1 + 1e-12) + 1e-12


def test_the_forward_experts_wait_for_their_dispatch() -> None:
    """The middle phase of TransformerLayerSchedulePlan.run (megatron-core 0.16.1
    model_chunk_schedule_plan.py: moe_dispatch.forward, then mlp.backward, mlp.backward_dw,
    moe_dispatch.backward, mlp.forward) with the weight gradient delayed (Megatron-Bridge
    overrides.py _set_moe_a2a_overlap_overrides: delay_wgrad_compute = True): c = 1.5 ms,
    forward experts 2 ms, backward 1 ms (0.5 data + 0.5 weight gradient). The forward's
    experts start when their 1.5 ms dispatch lands, 0.5 ms after the backward's 1 ms, and end
    at 3.5 ms: 0.5 ms exposed, where the phase's 3 ms of traffic against 3 ms of pooled
    compute hid it all. With the backward 2 ms and the forward 1 ms nothing waits."""
    assert float(estimate_merged_experts_phase_s(1.5 * MS, 2 * MS, 1 * MS)) == pytest.approx(
        3.5 * MS)
    assert float(estimate_merged_experts_phase_s(1.5 * MS, 1 * MS, 2 * MS)) == pytest.approx(
        3 * MS)
    # The backward's dispatch waits for the data gradient: c = 1 ms, backward 4 ms (2 + 2),
    # forward 0.1 ms: dispatch_bwd runs 2-3 ms, the forward's experts 4-4.1 ms.
    assert float(estimate_merged_experts_phase_s(1 * MS, 0.1 * MS, 4 * MS)) == pytest.approx(
        4.1 * MS)
    big_attention = (10 * MS, 10 * MS)
    exposed = estimate_ep_exposed_s(3 * MS, 2.0, True, 0.0, big_attention, (2 * MS, 1 * MS))
    assert float(exposed) == pytest.approx(0.5 * MS)


@given(positive, positive, positive)
def test_the_middle_phase_is_at_least_either_stream(one: float, mlp_fwd: float,
                                                    mlp_bwd: float) -> None:
    """The phase lasts at least its compute stream and at least its two all-to-alls."""
    phase = float(estimate_merged_experts_phase_s(one, mlp_fwd, mlp_bwd))
    assert phase >= (mlp_fwd + mlp_bwd) * (1 - 1e-12) - 1e-12
    assert phase >= 2 * one * (1 - 1e-12) - 1e-12
