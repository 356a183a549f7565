"""QK norms cost their traffic in the step (solver.cost.layers.layer_compute): Megatron-Core's
SelfAttention applies q_layernorm and k_layernorm (TE norms) to the split query and key outside
the attention op, and the measured attention kernels (TensorRT-LLM's attention op) do not time
them either. Each reads and writes q (heads x head dim) and k (KV heads x head dim), split over
TP like the heads. Worked number: Qwen3-30B-A3B (32 heads, 4 KV heads, head dim 128;
config.json), tp 1, one 4096-token sequence: 2 x 2 B x (4096 + 512) = 18,432 B per token, at the
element-wise traffic factor 3: 226.5 MB, 0.084 ms on an H100."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import JobSpec


def test_qwen3_qk_norms_add_their_traffic() -> None:
    spec = load_model_spec("qwen3-30b-a3b")
    assert spec.qk_norm and spec.num_attention_heads == 32 and spec.kv_heads == 4
    cluster, job, constants = load_cluster_spec("dgx-h100"), JobSpec(seq_len=4096,
                                                                     global_batch=64), TimeConstants()
    d = {k: np.array([v]) for k, v in dict(tp=1.0, cp=1.0, ep=8.0, etp=1.0,
                                           micro_batch=1.0).items()}
    with_norms = estimate_layer_compute_s(spec, cluster, job, d, constants)
    without = estimate_layer_compute_s(spec.model_copy(update={"qk_norm": False}), cluster, job,
                                       d, constants)
    cc = constants.compute
    traffic = cc.elementwise_traffic_factor * 4096 * 2 * 2 * (32 * 128 + 4 * 128)
    assert traffic == pytest.approx(226.5e6, rel=1e-3)
    expected = traffic / (cc.hbm_fraction * cluster.gpu.hbm_gb_per_s * 1e9)
    assert expected == pytest.approx(0.084e-3, rel=0.01)
    for kind in ("dense", "moe"):
        added = with_norms[kind]["elementwise"] - without[kind]["elementwise"]
        assert float(added[0]) == pytest.approx(expected, rel=1e-9)
