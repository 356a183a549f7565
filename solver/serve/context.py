"""The context `parplan serve` plans for when --context is not given: vLLM's --max-model-len
defaults to the model's length (max_position_embeddings; vllm/config/model.py
_get_and_verify_max_len), and vLLM refuses to start when the KV cache cannot hold one sequence
of it. So the default is the model's length where some plan the rules allow holds one such
sequence, else the longest context any of them holds (an integer bisection: a longer context
never takes less KV cache); the answer says which (ServeJob.context_source).
"""

from __future__ import annotations

from solver.serve.constraints import build_serve_constraints, is_hard
from solver.serve.enumerate import enumerate_serving
from solver.serve.job import ServeProblem
from solver.serve.memory import estimate_serving_memory


def _fits(problem: ServeProblem, context: int) -> bool:
    """Some plan the model's rules, the pins and the placement allow holds a `context`-token
    sequence beside its weights."""
    job = problem.job.model_copy(update={"context": context, "input_len": 1, "output_len": 1,
                                         "input_lengths": None, "output_lengths": None})
    trial = problem.model_copy(update={"job": job})
    rules = [c for c in build_serve_constraints(trial)
             if is_hard(c) or c.name.startswith("pin_") or c.name in ("tp_within_nvlink",
                                                                      "pp_across_nodes")]
    candidates = enumerate_serving(trial, rules)
    return len(candidates) > 0 and bool(estimate_serving_memory(trial, candidates).fits.any())


def fit_default_context(problem: ServeProblem, shortest: int = 2) -> tuple[int, str]:
    """(context, source): the model's max_position_embeddings ("model") where a plan holds it,
    else the longest context of at least `shortest` tokens that one does ("fits"); the
    model's length again if not even `shortest` fits (the plan's memory rule then says so)."""
    longest = problem.model_spec.max_position_embeddings
    if _fits(problem, longest) or not _fits(problem, min(shortest, longest)):
        return longest, "model"
    low, high = min(shortest, longest), longest  # low fits, high does not
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if _fits(problem, middle) else (low, middle)
    return low, "fits"
