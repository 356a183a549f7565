"""RL post-training (GRPO, PPO, DAPO): the terms a step adds to the training and serving models.

    generation  a rollout on one inference engine: prefill, decode while prompts wait for a
                slot, and the tail whose batch shrinks as responses finish
    passes      forward-only passes (old-policy, reference, reward and value log-probs) from a
                training step's own breakdown
    sync        the weight sync from the training layout to the rollout engines, and the host
                swaps of colocated phase switches
    step        the phases composed into one RL step, synchronous or off-policy
"""
