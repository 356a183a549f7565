"""Group-limited routing (ModelSpec.n_group, topk_group; HF DeepSeek config names): DeepSeek-V3
(arXiv 2412.19437 §2.1.2, "node-limited routing ... each token will be sent to at most M
nodes", M = 4; config.json n_group 8, topk_group 4) confines a token's experts to its best 4 of
8 expert groups, so DeepEP / HybridEP, which send a token once per NVLink domain it reaches,
send fewer copies across domains (solver.cost.layers.layer_time.reached_domains)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.layers.layer_time import reached_domains
from solver.cost.step.steptime import TimeConstants, estimate_step_time
from solver.spec import JobSpec


def test_deepseek_v3_reaches_at_most_four_of_eight_nodes() -> None:
    """EP 64 on 8 nodes of 8 H100s, one group of 32 experts per node: the 8 copies land in the
    4 chosen groups, 4 (1 - (3/4)^8) = 3.60 nodes on average, against 8 (1 - (7/8)^8) = 5.25
    without the limit."""
    spec = load_model_spec("deepseek-v3")
    assert (spec.n_group, spec.topk_group, spec.num_experts_per_tok) == (8, 4, 8)
    assert float(reached_domains(np.array([8.0]), 8, 8, 4)[0]) == pytest.approx(
        4 * (1 - 0.75 ** 8))
    assert float(reached_domains(np.array([8.0]), 8)[0]) == pytest.approx(8 * (1 - 0.875 ** 8))
    assert load_model_spec("qwen3-30b-a3b").n_group == 1


def test_a_group_per_domain_reads_the_same_both_ways() -> None:
    """One group per domain is the edge of both cases (at most one group per domain, and g = 1
    group per domain): the hypergeometric sum and the spread formula agree."""
    exact = float(reached_domains(np.array([8.0]), 8, 8, 4)[0])
    near = float(reached_domains(np.array([8.0 * (1 + 1e-9)]), 8, 8, 4)[0])
    assert near == pytest.approx(exact, rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(log_domains=st.integers(0, 6), log_groups=st.integers(1, 4), k=st.integers(1, 16),
       data=st.data())
def test_a_group_limit_never_reaches_more_domains(log_domains: int, log_groups: int, k: int,
                                                  data) -> None:
    domains, n_group = float(2 ** log_domains), 2 ** log_groups
    topk_group = data.draw(st.integers(1, n_group))
    limited = float(reached_domains(np.array([domains]), k, n_group, topk_group)[0])
    free = float(reached_domains(np.array([domains]), k)[0])
    assert 1.0 - 1e-9 <= limited <= free + 1e-9
    assert limited <= min(domains, k) + 1e-9
    more = float(reached_domains(np.array([2 * domains]), k, n_group, topk_group)[0])
    assert more >= limited - 1e-9


def test_deepep_sends_less_for_deepseek_v3_across_nodes() -> None:
    """DeepSeek-V3 with DeepEP over 64 H100s (ep 64, 8 nodes): the EP seconds fall with the
    group limit; an all-to-all dispatcher sends every copy either way."""
    spec = load_model_spec("deepseek-v3")
    unlimited = spec.model_copy(update={"n_group": 1, "topk_group": 1})
    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=1024, precision="fp8")
    degrees = dataclasses.make_dataclass("C", ["tp", "pp", "dp", "cp", "ep", "etp", "vpp",
                                               "zero", "micro_batch", "recompute"])
    candidates = degrees(*(np.array([v]) for v in (1, 16, 64, 1, 64, 1, 1, 1, 1, 2)))

    def ep_s(model, dispatcher: str) -> float:
        constants = TimeConstants(moe_dispatcher=dispatcher)
        return float(estimate_step_time(model, cluster, job, candidates, constants).ep[0])

    assert ep_s(spec, "deepep") < 0.8 * ep_s(unlimited, "deepep")
    assert ep_s(spec, "alltoall") == pytest.approx(ep_s(unlimited, "alltoall"))


def test_groups_must_divide_the_experts() -> None:
    spec = load_model_spec("deepseek-v3")
    with pytest.raises(ValidationError, match="n_group"):
        type(spec).model_validate({**spec.model_dump(), "n_group": 7})
    with pytest.raises(ValidationError, match="topk_group"):
        type(spec).model_validate({**spec.model_dump(), "topk_group": 9})
