"""Pipeline sends as each framework's schedule exposes them (issue 34; solver.cost.
pipeline_sends): Megatron-Core's interleaved schedule with overlap_p2p_comm (Megatron-LM
arguments.py `--no-overlap-p2p-communication` store_false; Megatron-Bridge training/
comm_overlap.py "PP overlap" whenever vp > 1) hides its steady-state sends; DeepSpeed's
pipeline engine (runtime/pipe/schedule.py TrainSchedule, p2p.py blocking dist.send /
dist.recv, v0.5-0.6) waits for four transfers per micro-batch on a stage between two others,
which an event simulation of TrainSchedule's own instruction lists checks."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.cost.step.frameworks import framework_time_constants
from solver.cost.comm.pipeline_sends import estimate_exposed_transfers, estimate_pipeline_sends_s
from solver.spec import JobSpec


def degrees(**values: object) -> dict[str, np.ndarray]:
    base = dict(tp=1, pp=1, dp=1, cp=1, ep=1, etp=1, vpp=1, zero=1, micro_batch=1, recompute=0)
    base.update(values)
    return {k: np.atleast_1d(np.asarray(v)) for k, v in base.items()}


def train_schedule(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """DeepSpeed's TrainSchedule.steps() (v0.6.0) for one stage, flattened to its sends,
    receives and passes (loads, the last step's reductions and the optimizer left out)."""
    commands, previous = [], -1
    for step in range(2 * (micro_batches + stages - 1)):
        forward = (step % 2) == (stage % 2)
        if step % 2 == 0 and forward:
            micro_batch = step // 2 - stage // 2
        elif forward:
            micro_batch = (step - 1) // 2 - stage // 2
        elif step % 2 == 0:
            micro_batch = step // 2 - stages + (stage + 1) // 2
        else:
            micro_batch = (step - 1) // 2 - stages + 1 + stage // 2

        def valid(k: int) -> bool:
            return 0 <= k < micro_batches

        if forward and stage > 0:
            commands += [("recv_act", micro_batch)] * valid(micro_batch)
            commands += [("send_grad", previous)] * valid(previous)
        if not forward and stage < stages - 1:
            commands += [("send_act", previous)] * valid(previous)
            commands += [("recv_grad", micro_batch)] * valid(micro_batch)
        commands += [("F" if forward else "B", micro_batch)] * valid(micro_batch)
        previous = micro_batch
    return commands


PARTNER = {"send_act": (1, "recv_act"), "recv_act": (-1, "send_act"),
           "send_grad": (-1, "recv_grad"), "recv_grad": (1, "send_grad")}


def simulate_train_schedule(stages: int, micro_batches: int, forward_s: float,
                            backward_s: float, transfer_s: float) -> float:
    """Seconds of TrainSchedule with every send a rendezvous: a send and its receive start when
    both stages reach them and take `transfer_s`; passes take their time."""
    programs = [train_schedule(s, stages, micro_batches) for s in range(stages)]
    counters, clocks = [0] * stages, [0.0] * stages
    while any(c < len(p) for c, p in zip(counters, programs)):
        moved = False
        for s in range(stages):
            while counters[s] < len(programs[s]):
                op, micro_batch = programs[s][counters[s]]
                if op in ("F", "B"):
                    clocks[s] += forward_s if op == "F" else backward_s
                    counters[s] += 1
                    moved = True
                    continue
                offset, expected = PARTNER[op]
                peer = s + offset
                if programs[peer][counters[peer]:counters[peer] + 1] != [(expected, micro_batch)]:
                    break
                clocks[s] = clocks[peer] = max(clocks[s], clocks[peer]) + transfer_s
                counters[s] += 1
                counters[peer] += 1
                moved = True
        assert moved, "the schedule deadlocked"
    return max(clocks)


@pytest.mark.parametrize("stages", [3, 4, 6, 12])
def test_deepspeed_waits_for_four_transfers_per_micro_batch_between_two_stages(stages) -> None:
    """The simulated TrainSchedule costs the 1F1B time exactly, (m + p - 1)(F + B), without
    transfers, and 4.0-4.2 transfers per micro-batch with them (a few more in the fill);
    estimate_exposed_transfers counts 4 m."""
    m, forward, backward, transfer = 64, 1.0, 3.0, 0.01
    ideal = simulate_train_schedule(stages, m, forward, backward, 0.0)
    assert ideal == pytest.approx((m + stages - 1) * (forward + backward))
    with_sends = simulate_train_schedule(stages, m, forward, backward, transfer)
    per_micro_batch = (with_sends - ideal) / transfer / m
    assert 3.9 <= per_micro_batch <= 4.3
    transfers, regathers = estimate_exposed_transfers("sequential", stages, 1, m)
    assert float(transfers[()]) == 4 * m and float(regathers[()]) == 2 * m


def test_deepspeed_with_two_stages_waits_for_two_transfers() -> None:
    """A stage with one neighbour receives and sends once each way: the batched count."""
    ideal = simulate_train_schedule(2, 64, 1.0, 3.0, 0.0)
    with_sends = simulate_train_schedule(2, 64, 1.0, 3.0, 0.01)
    assert (with_sends - ideal) / 0.01 / 64 == pytest.approx(2.0)
    assert np.array_equal(estimate_exposed_transfers("sequential", 2, 1, 64),
                          estimate_exposed_transfers("batched", 2, 1, 64))


def test_megatron_interleaving_exposes_only_the_warm_up_and_cool_down_sends() -> None:
    """Llama-3-70B at pp 8, vpp 5 (Megatron-Bridge's H100 recipe), 128 micro-batches: the first
    rank's warm-up is 2 x 7 + 4 x 8 = 46 chunk forwards of 640, so 92 of the 1,280 transfers
    stay exposed (7.2%); without interleaving overlap_p2p_comm is off (batched)."""
    transfers, regathers = estimate_exposed_transfers("overlapped", 8, 5, 128)
    assert float(transfers[()]) == 92 and float(regathers[()]) == 92
    assert float(estimate_exposed_transfers("batched", 8, 5, 128)[0][()]) == 1280
    assert np.array_equal(estimate_exposed_transfers("overlapped", 8, 1, 128),
                          estimate_exposed_transfers("batched", 8, 1, 128))
    # A batch shorter than the warm-up: every chunk pass waits (pp 4, vpp 2, 4 micro-batches).
    assert float(estimate_exposed_transfers("overlapped", 4, 2, 4)[0][()]) == 2 * 8
    assert float(estimate_exposed_transfers("sequential", 1, 1, 64)[0][()]) == 0.0


def test_llama3_70b_sends_worked_number() -> None:
    """Llama-3-70B (h 8192) at tp 4, pp 8, dp 2, vpp 5, 8,192-token sequences on DGX H100
    nodes: a 134 MB hand-off, 33.6 MB per TP rank over the 40 GB/s fabric, 0.885 ms a
    transfer with its latency; 1.13 s a step batched, 0.081 s overlapped."""
    model, cluster = load_model_spec("llama3.1-70b"), load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=8192, global_batch=256)
    d = degrees(tp=4, pp=8, dp=2, vpp=5)
    num_micro = np.array([128.0])
    transfer = estimate_collective_s("send_recv", 8192 * 8192 * 2.0 / 4, 2,
                                     estimate_group_link(cluster, 8, 2))
    assert float(transfer) == pytest.approx(0.885e-3, abs=0.005e-3)
    batched = estimate_pipeline_sends_s(model, cluster, job, d, num_micro, "batched", True)
    overlapped = estimate_pipeline_sends_s(model, cluster, job, d, num_micro, "overlapped",
                                           True)
    assert float(batched[0]) == pytest.approx(1280 * float(transfer))
    assert float(batched[0]) == pytest.approx(1.13, abs=0.01)
    assert float(overlapped[0]) == pytest.approx(92 * float(transfer))
    assert float(overlapped[0]) == pytest.approx(0.081, abs=0.001)


def test_profiles_name_their_schedules() -> None:
    """Megatron overlaps (interleaved), DeepSpeed sends one after the other, torchtitan and the
    generic profile keep the batched count."""
    assert framework_time_constants("megatron").pipeline_sends == "overlapped"
    assert framework_time_constants("deepspeed").pipeline_sends == "sequential"
    assert framework_time_constants("torchtitan").pipeline_sends == "batched"
    assert framework_time_constants("generic").pipeline_sends == "batched"
