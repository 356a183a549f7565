"""Forward-only passes of an RL step (the old policy's and the reference's log-probs, a reward
model's scores, a critic's values) from the training step's own breakdown
(solver.cost.step.steptime.StepTime: its parts add up to the step).

A forward pass over the same tokens, with the same parallel layout, costs

    forward = compute / 3 + (tp + ep + pp) / 2 + (cp + bubble) / 3

    compute / 3   the backward pass is twice the forward's FLOPs (2 of 6 N per token:
                  Narayanan et al. 2021, arXiv 2104.04473, §3.5, "backward pass 2x")
    tp, ep, pp    each layer's TP collectives, MoE dispatch and combine and the pipeline's
                  activation sends run once forward and once backward (Korthikanti et al.
                  2022, arXiv 2205.05198, Table 2: the same all-gather / reduce-scatter count
                  in each direction), so half
    cp            the ring's KV exchange is hidden behind attention that is twice as long
                  backward: a third, as compute
    bubble        the fill and drain of a forward-only pipeline are its forward parts: a
                  third, as compute
    none of       recompute, activation offload, the DP gradient sync and the optimizer step
                  (no backward, no update).

Worked number: a step of compute 3.0 s, tp 0.4 s, bubble 0.3 s, dp 0.2 s and optimizer 0.1 s
gives 1.0 + 0.2 + 0.1 = 1.3 s forward.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def estimate_forward_only_s(parts: Mapping[str, np.ndarray | float]) -> np.ndarray:
    """Seconds of a forward-only pass over a training step's tokens, from that step's parts
    (StepTime.breakdown names: compute, recompute, tp, cp, ep, offload, dp, pp, bubble,
    optimizer); see the module docstring."""
    def part(name: str) -> np.ndarray:
        return np.asarray(parts.get(name, 0.0), dtype=float)

    return ((part("compute") + part("cp") + part("bubble")) / 3.0
            + (part("tp") + part("ep") + part("pp")) / 2.0)
