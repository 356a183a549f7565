"""estimate_plans: many plans in one vectorised call give, plan by plan, what the cost model
gives for each configuration alone (every stage's memory, the step time)."""

from __future__ import annotations

import numpy as np
import pytest

from solver.api import estimate_plans
from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.memory import estimate_all_stages
from solver.cost.step.steptime import estimate_step_time
from solver.spec import JobSpec, ParallelConfig


@pytest.mark.parametrize("model", ["deepseek-v3", "llama3.1-70b"])
def test_batched_plans_equal_one_at_a_time(model: str) -> None:
    model_spec, cluster = load_model_spec(model), load_cluster_spec("dgx-h100")
    job = JobSpec()
    configs = [ParallelConfig(tp=8, pp=4, dp=16, vpp=2, zero=1),
               ParallelConfig(tp=4, pp=1, dp=64, cp=2, zero=3, micro_batch=2),
               ParallelConfig(tp=2, pp=16, dp=8, cp=2, recompute="full")]
    if model_spec.is_moe:
        configs = [c.model_copy(update={"ep": 8}) for c in configs]
    plans = estimate_plans(model_spec, cluster, job, configs)
    assert [p.config for p in plans] == configs
    for plan, config in zip(plans, configs):
        stages = estimate_all_stages(model_spec, job, config)
        np.testing.assert_allclose([s.total_bytes for s in plan.stages], stages.total,
                                   rtol=1e-12)
        step = estimate_step_time(model_spec, cluster, job, Candidates.from_configs([config]))
        assert plan.time.step_seconds == pytest.approx(float(step.step_s[0]), rel=1e-12)
    assert estimate_plans(model_spec, cluster, job, []) == ()
