"""The routed experts' eager work around the grouped GEMMs (solver.cost.layers.moe_eager), read from
Megatron-Core core_v0.17.0 megatron/core/transformer/moe/experts.py (TEGroupedMLP: linear_fc2
skip_bias_add=True, _apply_bias's per-expert `t + b * p` and torch.cat) and
megatron/core/fusions/fused_bias_geglu.py (weighted_bias_quick_geglu_impl: the clamp of both
halves at activation_func_clamp_value and their torch.cat, outside the compiled activation),
and its place in the step: gpt-oss pays it, a model without expert biases or a SwiGLU limit
does not, and `--recompute-modules moe_act` re-runs the clamp path."""

from __future__ import annotations

import numpy as np
import pytest

from solver.catalog import load_gpu_spec, load_model_spec
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.layers.moe_eager import estimate_expert_eager_s
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import JobSpec

H100_STREAM_BYTES_PER_S = 0.8 * 3350e9  # hbm_fraction x the H100 SXM's HBM3


def test_gpt_oss_worked_number() -> None:
    """The module docstring's numbers: gpt-oss-120b on an H100 at ep 8, one 4096-token
    sequence: 4096 x 8 GPUs x top-4 / 8 = 16,384 copies on 16 local experts, w = F = 2880.
    Bias: 12 x 2880 x 16,384 = 566 MB each way, with 2 x 16 + 1 and 4 x 16 kernels; clamp: 16
    and 12 bytes per F, 755 and 566 MB, 3 and 2 kernels."""
    spec, gpu, cc = load_model_spec("gpt-oss-120b"), load_gpu_spec("h100-sxm"), ComputeConstants()
    assert spec.mlp_bias and spec.swiglu_limit == 7.0
    copies = 4096 * 8 * 4 / 8
    forward, backward, redo = estimate_expert_eager_s(spec, gpu, cc, copies, 16.0, 1.0)
    bias_bytes, clamp_fwd, clamp_bwd = (x * 2880 * copies for x in (12, 16, 12))
    assert bias_bytes == pytest.approx(566e6, rel=1e-3)
    assert clamp_fwd == pytest.approx(755e6, rel=1e-3)
    kernel = cc.gemm_kernel_s
    assert float(forward) == pytest.approx(
        (bias_bytes + clamp_fwd) / H100_STREAM_BYTES_PER_S + (33 + 3) * kernel, rel=1e-9)
    assert float(backward) == pytest.approx(
        (bias_bytes + clamp_bwd) / H100_STREAM_BYTES_PER_S + (64 + 2) * kernel, rel=1e-9)
    # moe_act re-runs the clamp path (the fused activation's re-run is not charged)
    assert float(redo) == pytest.approx(clamp_fwd / H100_STREAM_BYTES_PER_S + 3 * kernel,
                                        rel=1e-9)


def test_a_model_without_expert_biases_or_limit_pays_nothing() -> None:
    spec, gpu, cc = load_model_spec("qwen3-30b-a3b"), load_gpu_spec("h100-sxm"), ComputeConstants()
    assert not spec.mlp_bias and spec.swiglu_limit is None
    for seconds in estimate_expert_eager_s(spec, gpu, cc, np.array([1e4, 4e4]), 16.0, 1.0):
        assert np.all(seconds == 0)


def _parts(model: str, constants: TimeConstants, micro_batch: float = 1.0
           ) -> dict[str, np.ndarray]:
    spec = load_model_spec(model)
    from solver.catalog import load_cluster_spec

    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=1280)
    d = {k: np.array([v]) for k, v in dict(tp=1.0, cp=1.0, ep=8.0, etp=1.0,
                                           micro_batch=micro_batch).items()}
    return estimate_layer_compute_s(spec, cluster, job, d, constants)


def test_gpt_oss_routed_parts_carry_it_in_every_layer_kind() -> None:
    """Both of gpt-oss's kinds (windowed and full attention, solver.cost.layers.blocks) route through
    the MoE parts: the eager work sits in routed / routed_bwd and moe_act is carried."""
    parts = _parts("gpt-oss-120b", TimeConstants())
    kinds = [k for k in parts if k != "dense"]
    assert len(kinds) >= 2
    for kind in kinds:
        assert float(parts[kind]["moe_act"][0]) > 0
        np.testing.assert_allclose(parts[kind]["routed"], parts["moe"]["routed"])


def test_moe_act_recompute_is_charged_under_megatrons_module_list() -> None:
    """Megatron-Bridge's gpt-oss H100 recipe recomputes ["layernorm", "moe_act"]: the step pays
    the clamp path again; with moe (the whole MoE layer) it is not paid twice. At micro-batch
    2 the re-run (0.6 ms) outlasts the host's launches of a pass (0.32 ms), which would pace
    it otherwise (solver.cost.layers.layer_time)."""
    from solver.cost.layers.layer_time import estimate_layer_terms

    spec = load_model_spec("gpt-oss-120b")
    from solver.catalog import load_cluster_spec

    cluster = load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=1280)
    d = {k: np.array([v]) for k, v in dict(tp=1, cp=1, ep=8, etp=1, micro_batch=2, pp=4, dp=16,
                                           vpp=1, zero=1, recompute=1).items()}

    def recompute_s(modules: tuple[str, ...]) -> float:
        constants = TimeConstants(recompute_modules=modules)
        terms = estimate_layer_terms(spec, cluster, job, d, constants)
        return float(terms["per_layer"][0, 1, 1])

    act = float(_parts("gpt-oss-120b", TimeConstants(), 2.0)["moe"]["moe_act"][0])
    assert act > 0.5e-3
    assert recompute_s(("layernorm", "moe_act")) == pytest.approx(
        recompute_s(("layernorm",)) + act, rel=1e-6)
    assert recompute_s(("moe", "moe_act")) == pytest.approx(recompute_s(("moe",)), rel=1e-9)
