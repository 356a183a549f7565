"""One RL step from its phases (seconds, arrays over plans), synchronous or off-policy.

    colocated  the same GPUs generate, score, train and sync in turn, and swap to the host
               what the plan offloads: step = generation + log-probs + training + sync + swaps.
               Off-policy steps gain nothing here (no second pool to overlap with).
    split      a rollout pool generates while the training pool waits, then trains while the
               rollout pool waits, then the weights go over (both pools take part):
               step = generation + log-probs + training + sync (synchronous);
               off by k >= 1 steps the pools overlap, the rollout generating step n + 1 with
               the weights of step n while step n trains:
               step = max(generation, log-probs + training) + sync.

Source: verl's one-step-off-policy page (docs/advance/one_step_off.md, verl commit b178a3cd):
"colocate sync: step ≈ gen + old_log_prob + update_actor; one-step-overlap async: step ≈
wait_prev_gen + old_log_prob + update_actor", wait_prev_gen being what generation has left
once training ends. Deeper off-policy (k > 1) adds buffering, not overlap: with fixed phase
times the step is the same as k = 1.

Worked number (that page's Megatron rows, Qwen2.5-Math-7B DAPO): generation 162 s, old
log-prob 119 s, update 344 s: 625 s synchronous; overlapped, max(162, 463) = 463 s plus the
sync.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RlStep:
    """Seconds of the step and the time each pool waits (arrays over plans)."""

    step_s: np.ndarray
    rollout_idle_s: np.ndarray
    training_idle_s: np.ndarray


def compose_rl_step(split, async_steps: int, generation_s, log_probs_s, training_s,
                    sync_s, host_swap_s) -> RlStep:
    """The step of each plan (module docstring); `split` is True where the pools are apart.
    A colocated plan has one pool, which never waits for the other (idle 0)."""
    split = np.asarray(split, dtype=bool)
    generation = np.asarray(generation_s, dtype=float)
    trainer = np.asarray(log_probs_s, dtype=float) + np.asarray(training_s, dtype=float)
    sync = np.asarray(sync_s, dtype=float)
    swaps = np.asarray(host_swap_s, dtype=float)
    together = generation + trainer + sync + swaps
    apart = (np.maximum(generation, trainer) if async_steps >= 1 else generation + trainer) + sync
    step = np.where(split, apart, together)
    zero = np.zeros_like(step)
    return RlStep(step_s=step,
                  rollout_idle_s=np.where(split, step - generation - sync, zero),
                  training_idle_s=np.where(split, step - trainer - sync, zero))
