"""Inference planning for vLLM: serving memory (weights at the serving precision, KV cache,
activations, reserves), decode and prefill time, and the TP / PP / DP / EP that serve a target.

    job          ServeJob, ServeConstants (with sources), ServeProblem, vLLM's batch defaults
    candidates   ServeCandidates: degree arrays
    memory       the problem's per-GPU memory and KV capacity (solver.cost.serving.memory)
    timing       the candidates as engines the cost model times (solver.cost.serving.round)
    load         the load model's inputs and per-plan load (solver.cost.serving.load)
    disagg       prefill and decode pools against the best aggregated plan
    pareto       the tokens/s/user against tokens/s/GPU front
    estimate     one evaluation: batch under the TPOT SLO, latency, throughput
    constraints  vLLM's rules and the targets as named Constraints
    enumerate    the exhaustive oracle (the engine: the space is divisor tuples of N)
    explain      the seed's decision tree, the runner-up, conflicts and fixes
    plan         ServePlan and the vLLM command line
    solve        solve_serving: the answer of `parplan serve`
"""

from solver.serve.job import ServeConstants, ServeJob, ServeProblem
from solver.serve.solve import ServeResult, solve_serving

__all__ = ["ServeConstants", "ServeJob", "ServeProblem", "ServeResult", "solve_serving"]
