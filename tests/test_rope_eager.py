"""A YaRN model's RoPE under Megatron-Core (solver.cost.layers.rope_eager): YaRN's attention factor
(solver.spec.rope; transformers _compute_yarn_parameters, Megatron-Core
_yarn_get_concentration_factor), Megatron-Core's fallback from the fused RoPE to eager ops when
that factor is not 1 (core_r0.15.0-0.18.0 megatron/core/models/common/embeddings/rope_utils.py:
"mscale=... is not supported by TE's fused RoPE. Using unfused implementation."), what those
ops cost beyond the fused kernel, and where the layer pays it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from solver.catalog import load_cluster_spec, load_gpu_spec, load_model_spec
from solver.catalog.hf import model_spec_from_hf_config
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.step.frameworks import framework_time_constants
from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.layers.rope_eager import estimate_eager_rope_s
from solver.cost.layers.time_constants import TimeConstants
from solver.errors import InputError
from solver.spec import JobSpec
from solver.spec.rope import RopeScaling

H100_STREAM_BYTES_PER_S = 0.8 * 3350e9  # hbm_fraction x the H100 SXM's HBM3
GPT_OSS_CONFIG = Path(__file__).resolve().parent / "data" / "hf_configs" / "gpt-oss-20b.json"


def test_yarn_attention_factor() -> None:
    """gpt-oss (factor 32, no mscale): 0.1 ln 32 + 1 = 1.3466; DeepSeek-V3's table (factor 40,
    mscale = mscale_all_dim = 1): 1; a stated attention_factor is taken as is; no stretch
    (factor 1): 1."""
    assert RopeScaling(factor=32.0).yarn_attention_factor == pytest.approx(1.3466, abs=1e-4)
    assert RopeScaling(factor=32.0).yarn_attention_factor == 0.1 * math.log(32.0) + 1.0
    deepseek = RopeScaling(factor=40.0, mscale=1.0, mscale_all_dim=1.0)
    assert deepseek.yarn_attention_factor == 1.0
    assert RopeScaling(factor=40.0, mscale=1.0, mscale_all_dim=0.5).yarn_attention_factor == (
        pytest.approx((0.1 * math.log(40.0) + 1.0) / (0.05 * math.log(40.0) + 1.0)))
    assert RopeScaling(factor=32.0, attention_factor=1.2).yarn_attention_factor == 1.2
    assert RopeScaling(factor=1.0).yarn_attention_factor == 1.0


def test_zoo_and_hf_import_agree_on_gpt_oss_rope() -> None:
    """Both roads read config.json's rope_scaling: the zoo's gpt-oss files and the import of
    gpt-oss-20b's config give the same table and factor; models without YaRN have 1."""
    imported = model_spec_from_hf_config(json.loads(GPT_OSS_CONFIG.read_text()), "x.json")
    for name in ("gpt-oss-20b", "gpt-oss-120b"):
        zoo = load_model_spec(name)
        assert zoo.rope_scaling == imported.rope_scaling
        assert zoo.rope_attention_factor == pytest.approx(1.3466, abs=1e-4)
    for name in ("qwen3-30b-a3b", "llama3.1-8b", "deepseek-v3"):
        assert load_model_spec(name).rope_attention_factor == 1.0


@pytest.mark.parametrize("value, problem", [
    ("yarn", "key 'rope_scaling': must be an object or null"),
    ({"rope_type": "yarn"}, "key 'rope_scaling': a YaRN table needs its 'factor'"),
    ({"rope_type": "yarn", "factor": "32"}, "'rope_scaling.factor': must be a number"),
    ({"rope_type": "yarn", "factor": -32.0}, "'rope_scaling.factor'"),
])
def test_a_bad_rope_scaling_is_one_error_naming_it(value: object, problem: str) -> None:
    config = {**json.loads(GPT_OSS_CONFIG.read_text()), "rope_scaling": value}
    with pytest.raises(InputError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        model_spec_from_hf_config(config, "x.json")


def test_other_rope_types_and_older_type_key() -> None:
    """YaRN and Llama 3's tables are read, others not; DeepSeek-era configs name it `type`.
    Llama 3's scaling stretches frequencies only: attention factor 1 (transformers
    modeling_rope_utils._compute_llama3_parameters returns attention_factor 1.0)."""
    config = json.loads(GPT_OSS_CONFIG.read_text())
    llama3 = {**config, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    spec = model_spec_from_hf_config(llama3, "x.json")
    assert spec.rope_scaling is not None and spec.rope_scaling.rope_type == "llama3"
    assert spec.rope_attention_factor == 1.0
    dynamic = {**config, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}
    assert model_spec_from_hf_config(dynamic, "x.json").rope_scaling is None
    older = {**config, "rope_scaling": {"type": "yarn", "factor": 40.0, "mscale": 1.0,
                                        "mscale_all_dim": 1.0}}
    assert model_spec_from_hf_config(older, "x.json").rope_attention_factor == 1.0


def test_gpt_oss_worked_number() -> None:
    """The module docstring's numbers: gpt-oss-120b, H100, tp 1, one 4096-token sequence:
    E = 4096 x (64 + 8) x 64 = 18,874,368 elements of q and k; forward 20 E = 377.5 MB and
    2 x 11 kernels, 0.328 ms; backward 24 E = 453.0 MB and 2 x 6 kernels, 0.271 ms."""
    spec, gpu, cc = load_model_spec("gpt-oss-120b"), load_gpu_spec("h100-sxm"), ComputeConstants()
    elements = 4096 * (64 + 8) * 64
    assert elements == 18_874_368
    forward, backward = estimate_eager_rope_s(spec, gpu, cc, 4096.0, 1.0, True)
    assert float(forward) == pytest.approx(
        20 * elements / H100_STREAM_BYTES_PER_S + 22 * cc.gemm_kernel_s, rel=1e-9)
    assert float(backward) == pytest.approx(
        24 * elements / H100_STREAM_BYTES_PER_S + 12 * cc.gemm_kernel_s, rel=1e-9)
    assert float(forward) == pytest.approx(0.328e-3, abs=1e-6)
    assert float(backward) == pytest.approx(0.271e-3, abs=1e-6)


def test_heads_split_over_tp_kv_heads_at_least_one() -> None:
    """At tp 16 a GPU rotates 4 query heads and one (replicated) KV head."""
    spec, gpu, cc = load_model_spec("gpt-oss-120b"), load_gpu_spec("h100-sxm"), ComputeConstants()
    one = np.asarray(estimate_eager_rope_s(spec, gpu, cc, 4096.0, 1.0, True))
    sixteen = np.asarray(estimate_eager_rope_s(spec, gpu, cc, 4096.0, 16.0, True))
    kernels = np.array([22.0, 12.0]) * cc.gemm_kernel_s
    np.testing.assert_allclose(sixteen - kernels, (one - kernels) * (4 + 1) / (64 + 8),
                               rtol=1e-12)


def test_who_pays_nothing() -> None:
    """No YaRN factor (Qwen3), a factor of 1 (DeepSeek's table), or a framework whose fused
    RoPE is not Megatron-Core's (scaled_rope_eager off: torchtitan, DeepSpeed, generic)."""
    gpu, cc = load_gpu_spec("h100-sxm"), ComputeConstants()
    gpt_oss = load_model_spec("gpt-oss-120b")
    unit = gpt_oss.model_copy(update={"rope_scaling": RopeScaling(
        factor=40.0, mscale=1.0, mscale_all_dim=1.0)})
    for spec, on in ((load_model_spec("qwen3-30b-a3b"), True), (unit, True), (gpt_oss, False)):
        for seconds in estimate_eager_rope_s(spec, gpu, cc, np.array([4096.0, 8192.0]),
                                             np.array([1.0, 2.0]), on):
            assert np.all(seconds == 0)
    assert framework_time_constants("megatron").scaled_rope_eager
    for framework in ("torchtitan", "deepspeed", "generic"):
        assert not framework_time_constants(framework).scaled_rope_eager


def test_every_gpt_oss_layer_kind_pays_it_in_its_attention_gemms() -> None:
    """gpt-oss's windowed and full-attention MoE kinds (solver.cost.layers.blocks) both carry it in
    gemm / gemm_bwd, the attention block's part; nothing else moves."""
    spec, cluster = load_model_spec("gpt-oss-120b"), load_cluster_spec("dgx-h100")
    job = JobSpec(seq_len=4096, global_batch=1280)
    d = {k: np.array([v]) for k, v in dict(tp=1.0, cp=1.0, ep=8.0, etp=1.0,
                                           micro_batch=1.0).items()}
    on = estimate_layer_compute_s(spec, cluster, job, d, TimeConstants(scaled_rope_eager=True))
    off = estimate_layer_compute_s(spec, cluster, job, d, TimeConstants())
    forward, backward = estimate_eager_rope_s(spec, cluster.gpu, ComputeConstants(), 4096.0,
                                              1.0, True)
    kinds = [kind for kind in on if kind != "dense"]
    assert len(kinds) >= 2
    for kind in kinds:
        for part, value in on[kind].items():
            extra = {"gemm": forward, "gemm_bwd": backward}.get(part, 0.0)
            np.testing.assert_allclose(value, off[kind][part] + extra, rtol=1e-12,
                                       err_msg=f"{kind} {part}")
