"""Sliding-window attention from the measured window kernels (solver.cost.kernels.kernels_attention,
window.<w>.<mha|gqa> grids built from AIConfigurator's TensorRT-LLM context-attention rows with
window_size 128 at head dim 64, gpt-oss's geometry with its sinks) and its use for windowed
layers (solver.cost.layers.layer_compute._window_core, solver.cost.layers.blocks)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import framework_time_constants
from solver.cost.kernels.kernels import attention_flop, load_kernel_table, window_attention_flop
from solver.cost.kernels.kernels_attention import estimate_table_window_rate
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.step.steptime import _degrees
from solver.spec import JobSpec, ParallelConfig

# AIConfigurator 095f58a h100_sxm context_attention_perf (TRT-LLM 1.3.0rc20), bf16, head dim 64,
# batch 1, 4,096 tokens, 64 query and 64 KV heads, window_size 128.
H100_WINDOW_128_MS = 0.21407999595006308


def test_window_work_is_the_mean_keys_per_query() -> None:
    """Query i sees min(i + 1, w) keys: w - w (w - 1) / (2 s) on average (ModelSpec.context_tokens);
    at s = 4096, w = 128: 126.02 keys; a window of the whole sequence is causal attention."""
    context = 128 - 128 * 127 / (2 * 4096)
    assert window_attention_flop(1, 4096, 64, 64, 128) == pytest.approx(
        4 * 4096 * context * 64 * 64)
    assert window_attention_flop(2, 4096, 8, 128, 4096) == pytest.approx(
        attention_flop(2, 4096, 8, 128))


def test_measured_window_row_comes_back() -> None:
    """An unadjusted grid point returns the source row (0.214 ms)."""
    table = load_kernel_table("h100_sxm")
    work = window_attention_flop(1, 4096, 64, 64, 128)
    seconds = work / estimate_table_window_rate(table, 128, 1, 4096, 64, 64, 64)
    assert seconds == pytest.approx(H100_WINDOW_128_MS * 1e-3, rel=1e-9)


def test_no_window_grid_without_measurements() -> None:
    """A100's source has no window rows; no table has a 4,096-key window."""
    assert estimate_table_window_rate(load_kernel_table("a100_sxm"), 128, 1, 4096, 8, 8,
                                      64) is None
    assert estimate_table_window_rate(load_kernel_table("h100_sxm"), 4096, 1, 8192, 8, 8,
                                      64) is None


def _core(model: str, cluster: str, tp: int, micro_batch: int, seq_len: int
          ) -> dict[str, dict[str, np.ndarray]]:
    config = ParallelConfig(tp=tp, ep=8, micro_batch=micro_batch, recompute="selective")
    job = JobSpec(seq_len=seq_len, global_batch=1024)
    return estimate_layer_compute_s(load_model_spec(model), load_cluster_spec(cluster), job,
                                    _degrees(Candidates.from_configs([config])),
                                    framework_time_constants("megatron"))


def test_gpt_oss_window_layers_take_the_measured_kernel() -> None:
    """gpt-oss-120b on an H100 at 4,096 tokens: the windowed layers' core is the measured
    window kernel (0.183 ms at 64 heads, 8 KV heads; 0.199 ms in a step at the fitted 0.92),
    4.5 times what scaling full attention by the window's 6% of the work gave (0.027 ms)."""
    layer = _core("gpt-oss-120b", "dgx-h100", 1, 1, 4096)
    windowed = next(parts for name, parts in layer.items() if name.startswith("kind"))
    full = layer["moe"]
    assert float(windowed["core"][0]) == pytest.approx(0.183e-3 / 0.92, rel=0.02)
    assert float(windowed["core"][0]) > 4 * float(full["core"][0]) * 126.02 / 2048


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["dgx-h100", "dgx-b200", "gb200-nvl72", "l40s-pcie"]),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
       st.sampled_from([256, 512, 1024, 4096, 16384, 65536]))
def test_a_window_never_costs_more_than_full_attention(cluster: str, tp: int, micro_batch: int,
                                                        seq_len: int) -> None:
    layer = _core("gpt-oss-120b", cluster, tp, micro_batch, seq_len)
    windowed = next(parts for name, parts in layer.items() if name.startswith("kind"))
    for part in ("core", "core_bwd"):
        assert np.all(windowed[part] <= layer["moe"][part] * (1 + 1e-12))
