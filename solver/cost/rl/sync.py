"""The weight sync of an RL step and the host swaps of colocated phase switches.

Weight sync, from the training layout to the rollout engines (bf16 weights, 2 bytes per
parameter, W bytes in all):

    gather     the training ranks that shard the weights (tp x pp, and dp under ZeRO-3)
               all-gather every tensor so that each holds it whole: all_gather(W) over that
               group (verl's megatron per-tensor generator gathers each parameter over TP and
               broadcasts it over PP: verl/utils/megatron_utils.py per_tensor_generator;
               PP's broadcast moves the same (n-1)/n of W per rank as an all-gather)
    colocated  each GPU's vLLM worker then copies its own shard (W / rollout tp) from the
               gathered tensor into its weights: read and write at the HBM rate
               (vLLM load_weights; verl hybrid engine, in place: no transfer between GPUs)
    split      rank 0 of the training pool broadcasts every tensor to all rollout GPUs over
               one NCCL group (verl/experimental/one_step_off_policy/megatron_workers.py
               sync_rollout_weights: collective.broadcast(tensor, src_rank=0), verl commit
               b178a3cd): broadcast(W) over rollout GPUs + 1 ranks, whose bus factor is 1,
               then the same shard copy.

Host swaps (offload) when colocated: bytes moved to the host before the rollout and back
before training, each way at the host link's rate (solver.cost.step.offload
host_link_bytes_per_s); vLLM's own memory is released without a copy (verl sleeps the engine
at level 2 in its hybrid mode, which discards weights and KV cache: verl/workers/rollout/
vllm_rollout/vllm_async_server.py sleep(); the weights come back with the sync).

Worked number: Llama-3.1-8B (8.03e9 parameters, W = 16.06 GB) gathered over tp 2 at NVLink's
360 GB/s bus bandwidth: 16.06 x 0.5 / 360 = 22.3 ms plus latency; the shard copy at tp 1 on an
H100 (3.35 TB/s x 0.8 achieved): 2 x 16.06 / 2680 = 12.0 ms.
"""

from __future__ import annotations

import numpy as np

from solver.cost.comm.comm import GroupLink, estimate_collective_s

WEIGHT_SYNC_BYTES_PER_PARAM = 2.0  # bf16, what both verl's sync and vLLM's weights carry


def estimate_gather_s(weight_bytes: float, shard_degree, link: GroupLink) -> np.ndarray:
    """Seconds to make every tensor whole on each training rank: all_gather of `weight_bytes`
    over the `shard_degree` ranks that shard it (zero for one)."""
    return estimate_collective_s("all_gather", weight_bytes, np.asarray(shard_degree), link)


def estimate_shard_copy_s(weight_bytes: float, rollout_tp, hbm_bytes_per_s: float
                          ) -> np.ndarray:
    """Seconds for each vLLM worker to copy its shard (weight_bytes / rollout tp) into its
    weights: read once and written once at the achieved HBM rate."""
    return 2.0 * weight_bytes / np.asarray(rollout_tp, dtype=float) / hbm_bytes_per_s


def estimate_broadcast_s(weight_bytes: float, num_rollout_gpus, link: GroupLink) -> np.ndarray:
    """Seconds to broadcast every tensor from training rank 0 to the rollout GPUs (one NCCL
    group of num_rollout_gpus + 1 ranks, bus factor 1)."""
    return estimate_collective_s("broadcast", weight_bytes,
                                 np.asarray(num_rollout_gpus) + 1, link)


def estimate_host_swap_s(swapped_bytes, host_link_bytes_per_s: float) -> np.ndarray:
    """Seconds of one step's host swaps: `swapped_bytes` per GPU to the host and back, each
    way at the host link's rate. 16 GB at 51 GB/s (H100, nvbandwidth): 0.63 s."""
    return 2.0 * np.asarray(swapped_bytes, dtype=float) / host_link_bytes_per_s
