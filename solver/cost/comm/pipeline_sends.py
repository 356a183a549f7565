"""Pipeline-parallel sends: what the hand-off of activations and gradients between pipeline
stages adds to a step, as each framework's schedule issues it (PipelineSends).

One transfer moves a micro-batch's hand-off (b s / cp x h in bf16) between neighbouring stages.
Each TP rank sends its 1/tp slice: with sequence parallel the activation is sharded already;
without it, Megatron's scatter/gather optimization (Narayanan et al. 2021 §4.1) and DeepSpeed's
pipeline engine (is_pipe_partitioned = is_model_parallel) split it before the send and
all-gather it over TP (NVLink) on arrival. How many transfers a step waits for:

  batched     Megatron-Core's 1F1B (schedules.py forward_backward_pipelining_without_
              interleaving): each steady-state step batches the activation sent downstream with
              the gradient received from there (send_forward_recv_backward, one
              batch_isend_irecv), and the gradient sent upstream with the activation received
              (send_backward_recv_forward): two transfers per micro-batch and model chunk, all
              on the critical path.
  overlapped  Megatron-Core's interleaved schedule with overlap_p2p_comm, Megatron-LM's default
              (arguments.py `--no-overlap-p2p-communication` store_false; it forces the switch
              off without interleaving) and Megatron-Bridge's whenever vp > 1
              (training/comm_overlap.py _get_model_comm_overlap_cfgs: "PP overlap",
              overlap_p2p_comm = True, batch_p2p_comm = False; v0.2.0-v0.5.0 and 25.09
              e4bb622): in the steady state each send is an isend/irecv waited on only before
              the pass that needs it, so it runs behind the other direction's pass
              (core_v0.8.0-0.15.0 forward_backward_pipelining_with_interleaving); the
              warm-up's forwards wait on each transfer before the next forward and the
              cool-down's backwards send blocking (overlap_p2p_comm_warmup_flush, off by
              default, is set by neither). Exposed: the first rank's W = min(2 (pp - 1) +
              (v - 1) pp, m v) warm-up forwards and as many cool-down backwards
              (num_warmup_microbatches, the longest warm-up). Without interleaving: batched.
  sequential  DeepSpeed's pipeline engine (runtime/pipe/schedule.py TrainSchedule, p2p.py:
              blocking dist.send / dist.recv, v0.5-0.6): a forward step receives the
              activation from the previous stage and then sends the gradient back to it, a
              backward step sends the activation to the next stage and then receives the
              gradient from it, one after the other, each a rendezvous with the neighbour
              (the GPU stream waits for the NCCL send / receive to complete). A stage between
              two others waits for four transfers per micro-batch, a stage with one neighbour
              (pp = 2) for two; an event simulation of TrainSchedule's instruction lists with
              rendezvous sends gives 4.0-4.3 transfers per micro-batch at pp 3-24 (and the
              1F1B compute time exactly). The all-gather over TP follows each receive: two per
              micro-batch.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.spec import ClusterSpec, JobSpec, ModelSpec

PipelineSends = Literal["batched", "overlapped", "sequential"]
BF16_BYTES = 2.0


def estimate_exposed_transfers(schedule: PipelineSends, pp: np.ndarray, vpp: np.ndarray,
                               num_micro: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(transfers, TP re-gathers) per step on the critical path under `schedule` (module
    docstring), for micro-batches of one pipeline; zero without pipelining.

    Worked numbers: Llama-3-70B at pp 8, vpp 5, m = 128 micro-batches: batched 2 x 128 x 5 =
    1,280 transfers, overlapped 2 x min(2 x 7 + 4 x 8, 640) = 92 (7.2%); BLOOM at pp 12, m =
    128: sequential 4 x 128 = 512 transfers and 256 re-gathers, batched 256 and 256."""
    pp, vpp, num_micro = (np.asarray(x, dtype=float) for x in (pp, vpp, num_micro))
    chunks = num_micro * vpp
    piped = pp > 1
    batched = np.where(piped, 2.0 * chunks, 0.0)
    if schedule == "batched":
        return batched, batched
    if schedule == "overlapped":
        warm_up = np.minimum(2.0 * (pp - 1.0) + (vpp - 1.0) * pp, chunks)
        overlapped = np.where(piped, 2.0 * warm_up, 0.0)
        exposed = np.where(vpp > 1, overlapped, batched)
        return exposed, exposed
    neighbours = np.where(pp > 2, 2.0, 1.0)
    return np.where(piped, 2.0 * neighbours * chunks, 0.0), batched


def estimate_pipeline_sends_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                              d: dict[str, np.ndarray], num_micro: np.ndarray,
                              schedule: PipelineSends, sequence_parallel: bool) -> np.ndarray:
    """Seconds per step the pipeline hand-offs expose (module docstring): the transfers and
    TP re-gathers estimate_exposed_transfers counts, each transfer a send/recv of the 1/tp
    slice between neighbouring stages (stride tp cp dp), each re-gather (without sequence
    parallel) an all-gather of the whole hand-off over TP.

    Worked number: Llama-3-70B (h 8192) at tp 4, pp 8, dp 2, vpp 5, 8,192-token sequences on
    DGX H100 nodes (PP neighbours 8 ranks apart, on the 40 GB/s fabric): 134 MB / 4 = 33.6 MB,
    0.885 ms a transfer with its latency; batched 1,280 of them, 1.13 s a step, overlapped 92,
    0.081 s."""
    tp, pp, dp, cp, vpp = (d[n] for n in ("tp", "pp", "dp", "cp", "vpp"))
    activation_bytes = d["micro_batch"] * job.seq_len / cp * model_spec.hidden_size * BF16_BYTES
    pairs = np.where(pp > 1, 2, 1)
    transfer = estimate_collective_s("send_recv", activation_bytes / tp, pairs,
                                     estimate_group_link(cluster, tp * cp * dp, pairs))
    regather = 0.0
    if not sequence_parallel:
        regather = estimate_collective_s("all_gather", activation_bytes, tp,
                                         estimate_group_link(cluster, 1, tp))
    transfers, regathers = estimate_exposed_transfers(schedule, pp, vpp, num_micro)
    return transfers * transfer + regathers * regather
