"""RL post-training plans (`parplan rl`): GRPO, PPO and DAPO steps on one cluster, colocated or
split into a rollout pool and a training pool, composed from the training search
(solver.optimize), the serving model (solver.serve, solver.cost.serving) and the RL terms of
solver.cost.rl.

    job       RlJob: the algorithm, the batch, the length distributions; the roles each
              algorithm runs (ALGORITHM_ROLES)
    rollout   the rollout engines of a pool: memory, slots and generation time
    training  the training plans of a pool and the passes of the other roles
    search    placements x training plans x offloads x rollout engines, ranked by step time
    verl      verl's Hydra overrides for a plan
"""
