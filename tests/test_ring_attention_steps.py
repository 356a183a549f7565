"""The ring attention of each framework in the step time (solver.cost.comm.ring_attention through
solver.cost.layers.layer_time): which ring a profile runs, and what it does to the plans."""

from __future__ import annotations

import pytest

from solver.api import estimate
from solver.cost.step.frameworks import build_framework_profile


def test_each_framework_runs_its_ring() -> None:
    """torchtitan: PyTorch's experimental context_parallel with the all-gather rotater
    (job_config.py v0.2.2 context_parallel_rotate_method = "allgather"); Megatron-Core: Transformer
    Engine's KV P2P ring (--cp-comm-type p2p, its default)."""
    rings = {name: build_framework_profile(name).time_constants.context_parallel_ring
             for name in ("megatron", "torchtitan", "deepspeed", "generic")}
    assert rings == {"megatron": "transformer_engine", "torchtitan": "torch_allgather",
                     "deepspeed": "transformer_engine", "generic": "transformer_engine"}


def _step(framework: str = "megatron", **degrees) -> tuple[float, float]:
    plan = estimate("deepseek-v3", "hgx-h800", 2048, seq_len=4096, global_batch=15360,
                    framework=framework, pp=8, ep=8, zero=1, micro_batch=1,
                    recompute="selective", **degrees).plan
    return plan.time.step_seconds, plan.time.time_seconds["cp"]


def test_deepseek_v3_at_4k_on_h800s_splits_heads_rather_than_tokens() -> None:
    """DeepSeek-V3 on 2,048 H800s, 4,096 tokens, 15,360 sequences (its published run's batch):
    CP 2 at tp 1 beat tp 2 while its ring hid behind the whole attention core (33.69 against
    34.38 s; cp 0.07 s). Transformer Engine hides each 1.064 ms KV transfer behind one step of
    0.496 ms and merges each step (tests/test_ring_attention.py): cp 1.27 s, 34.95 s, and tp 2
    is the faster plan, as in every published DeepSeek-V3 recipe (none uses CP at 4K)."""
    cp2, cp_part = _step(tp=1, cp=2)
    tp2, _ = _step(tp=2, cp=1)
    assert tp2 < cp2
    assert cp_part == pytest.approx(1.27, abs=0.05)


def test_torchtitan_ring_costs_more_than_transformer_engine() -> None:
    """The same CP 2 plan under torchtitan's ring (the gathered KV behind the first step only,
    eager fp32 merges, the fp32 dKV) spends more in "cp" than under Transformer Engine's."""
    _, te = _step(tp=1, cp=2)
    _, torch = _step("torchtitan", tp=1, cp=2)
    assert torch > te > 0.0
