"""Model states by parameter kind (solver.cost.memory.states): the dense parameters' and the
routed experts' add up to the whole (the CP-SAT memory tables keep them apart)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.memory import MemoryOptions
from solver.cost.memory.layout import estimate_stage_layout
from solver.cost.memory.states import estimate_model_states, estimate_stage_params
from solver.spec import JobSpec, ParallelConfig


@pytest.mark.parametrize("model", ["deepseek-v3", "mixtral-8x7b", "llama3.1-8b"])
def test_model_states_of_dense_and_expert_parameters_add_up(model: str) -> None:
    """The CP-SAT tables count the dense parameters' states and the routed experts' apart (they
    shard over different groups); together they are the whole, fp8 weight copies included."""
    model_spec = load_model_spec(model)
    experts = 8 if model_spec.is_moe else 1
    candidates = Candidates.from_configs([
        ParallelConfig(tp=2, pp=4, dp=8, cp=1, ep=experts, zero=zero, micro_batch=1)
        for zero in (0, 1, 2, 3)])
    options = MemoryOptions()
    for precision in ("bf16", "fp8"):
        job = JobSpec(precision=precision)
        layout = estimate_stage_layout(model_spec, job, candidates, np.zeros(4, dtype=np.int64),
                                       options.account_for_embedding_in_pipeline_split)
        params = estimate_stage_params(model_spec, candidates, layout, options)
        whole = estimate_model_states(job, candidates, params, options)
        dense = estimate_model_states(job, candidates, params, options, ("dense",))
        expert = estimate_model_states(job, candidates, params, options, ("expert",))
        for item in whole:
            np.testing.assert_allclose(dense[item] + expert[item], whole[item], rtol=1e-12)
        assert np.all(expert["weights"] > 0) == model_spec.is_moe
