"""Framework profiles (solver.cost.step.frameworks): each feature pinned to the framework's code or
docs, the overrides' one door, and the terms the features drive (host launches, the MoE
dispatcher, op-level selective recompute, eager element-wise ops)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import PROFILES, build_framework_profile, framework_time_constants
from solver.cost.layers.host_time import estimate_host_s
from solver.cost.layers.layer_time import (
    _domain_dedup,
    estimate_layer_terms,
    layer_degrees,
    sm_contention,
)
from solver.cost.memory.activations import estimate_layer_activation_bytes
from solver.cost.memory.options import MemoryOptions
from solver.cost.step.steptime import estimate_step_time
from solver.cost.layers.time_constants import TE_MODULE_OPS, TimeConstants
from solver.errors import InputError
from solver.spec import JobSpec, ParallelConfig
from solver.spec.features import FEATURES
from solver.spec.job import FRAMEWORKS

H100 = load_cluster_spec("dgx-h100")


def degrees(**values: object) -> dict[str, np.ndarray]:
    base = dict(tp=1, pp=1, dp=8, cp=1, ep=1, etp=1, vpp=1, zero=1, micro_batch=1, recompute=0)
    base.update(values)
    return {k: np.atleast_1d(np.asarray(v)) for k, v in base.items()}


def step(model: str, constants: TimeConstants, job: JobSpec | None = None, **config: object):
    job = job or JobSpec(seq_len=4096, global_batch=256)
    return estimate_step_time(load_model_spec(model), H100, job,
                              Candidates.from_configs([ParallelConfig(**config)]), constants)


# ---- the profiles, feature by feature --------------------------------------------------------

def test_every_framework_has_a_profile_and_framework_time_constants_is_it() -> None:
    assert set(PROFILES) == set(FRAMEWORKS)
    for name in FRAMEWORKS:
        assert framework_time_constants(name) == build_framework_profile(name).time_constants
    assert build_framework_profile("generic").time_constants == TimeConstants()


def test_megatron_profile() -> None:
    """Megatron-Core + Transformer Engine (NVIDIA/Megatron-LM d98e8a64, 2026-08):
    transformer_config.py cuda_graph_impl = "none", moe_token_dispatcher_type default
    "allgather" (the launch settings ask for alltoall, moe/README.md "Standard EP > 1 setups"),
    model_parallel_config.py tp_comm_overlap = False, overlap_moe_expert_parallel_comm = False;
    --recompute-granularity selective = core attention; TE fused norms, RoPE and SwiGLU;
    arguments.py --use-precision-aware-optimizer, --grad-reduce-in-bf16 and --fp8-param-gather
    store_true (off), --optimizer-cpu-offload store_true (off);
    transformer_config.py recompute_modules default ["core_attn"],
    fine_grained_activation_offloading = False; model_parallel_config.py
    cpu_offloading_num_layers = 0, cross_entropy_loss_fusion = False (the unfused
    vocab-parallel cross-entropy: loss eager); training states mixed (optimizer_config.py:
    main_params_dtype, exp_avg_dtype and exp_avg_sq_dtype torch.float32); router unfused
    (transformer_config.py moe_router_fusion = False); permutation unfused
    (moe_permute_fusion = False); FP8 with delayed scaling (arguments.py --fp8-recipe default
    'delayed': fp8_current_scaling off)."""
    profile = build_framework_profile("megatron")
    assert profile.features() == {
        "attention_kernel": "native", "fused_elementwise": True, "cuda_graphs": False,
        "moe_dispatcher": "alltoall", "tp_comm_overlap": False, "ep_comm_overlap": False,
        "dp_overlap": "always", "selective_recompute": "attention_core",
        "fp8_weight_copies": "transformer_engine", "precision_aware_optimizer": False,
        "grad_reduce_in_bf16": False, "fp8_param_gather": False,
        "recompute_modules": ["core_attn"], "optimizer_offload": False,
        "activation_offload": False, "fp8_all_gather": False,
        "cpu_offloading_num_layers": 0, "loss_implementation": "eager",
        "training_states": "mixed", "moe_router_fusion": False, "moe_permute_fusion": False,
        "fp8_current_scaling": False}
    assert profile.time_constants.zero3_grad_reduce_bytes == 4.0
    assert profile.time_constants.launches.per_local_expert == 2.0  # TE GroupedLinear


def test_torchtitan_profile() -> None:
    """pytorch/torchtitan: models/attention.py puts SDPBackend.CUDNN_ATTENTION first on every
    GPU since v0.2.0 (#1776; v0.1.0 ran FLASH_ATTENTION below sm100, #1196); config Compile
    enable = False; distributed/activation_checkpoint.py SelectiveAC "recomputes every second
    matmul"; expert parallelism all_to_all_single; torch._grouped_mm for the experts."""
    profile = build_framework_profile("torchtitan")
    features = profile.features()
    assert features["attention_kernel"] == "native"
    assert features["fused_elementwise"] is False
    assert features["selective_recompute"] == "op_level"
    assert features["moe_dispatcher"] == "alltoall"
    assert features["cuda_graphs"] is False
    assert profile.time_constants.launches.per_local_expert == 0.0
    assert profile.memory_options().selective_recompute == "op_level"
    assert profile.memory_options().fp8_weight_copies == "none"  # torchao float8
    compiled = build_framework_profile("torchtitan", {"fused_elementwise": True})
    assert compiled.time_constants.launches.attention < profile.time_constants.launches.attention


def test_deepspeed_profile() -> None:
    """DeepSpeed + Megatron-DeepSpeed: --use-flash-attn-v2 (the flash_attn 2 package, not
    Hopper-native); pipe/engine.py schedules the DP all-reduces itself; DeepSpeed-MoE's
    Experts.forward loops over its local experts (moe/experts.py)."""
    features = build_framework_profile("deepspeed").features()
    assert features["attention_kernel"] == "flash2"
    assert features["dp_overlap"] == "without_pipeline"
    assert features["moe_dispatcher"] == "alltoall"
    assert build_framework_profile("deepspeed").time_constants.launches.per_local_expert == 4.0


# ---- overrides: one door, project errors naming the flag ---------------------------------------

def test_overrides_change_single_features() -> None:
    profile = build_framework_profile("megatron", {"moe_dispatcher": "deepep",
                                                   "cuda_graphs": True, "tp_comm_overlap": None})
    assert profile.features()["moe_dispatcher"] == "deepep"
    assert profile.features()["cuda_graphs"] is True
    assert profile.features()["tp_comm_overlap"] is False  # None leaves the profile's value
    legacy = build_framework_profile("torchtitan", {"attention_kernel": "flash2"})
    assert (legacy.time_constants.flash_attention,
            legacy.time_constants.native_attention_kernels) == (True, False)
    assert set(FEATURES) == set(profile.features())


@pytest.mark.parametrize(("framework", "overrides", "message"), [
    ("megatron", {"moe_dispatcher": "nccl"}, "--moe-dispatcher"),
    ("megatron", {"attention_kernel": "flash9"}, "--attention-kernel"),
    ("megatron", {"host_op_s": 1.0}, "--host-op-s: not a framework feature"),
    ("deepspeed", {"moe_dispatcher": "deepep"}, "--moe-dispatcher deepep: DeepSpeed-MoE"),
    ("deepspeed", {"cuda_graphs": True}, "--cuda-graphs on"),
    ("torchtitan", {"moe_dispatcher": "allgather"}, "--moe-dispatcher allgather"),
    ("nemo", {}, "--framework nemo"),
])
def test_bad_overrides_are_input_errors_naming_the_flag(framework, overrides, message) -> None:
    with pytest.raises(InputError, match=message.replace("-", r"\-")):
        build_framework_profile(framework, overrides)


# ---- host launches: a roofline on the CPU side ------------------------------------------------

def test_host_launch_worked_number() -> None:
    """estimate_host_s docstring: Megatron, Qwen3-30B-A3B MoE layer at ep 8 (16 local
    experts), tp 1, bf16, on a DGX H100 (13.48 us per op): 96.75 ops before the token-count
    sync, 48.38 after it; a dense layer (4 + 3T) + (2 + 2T) ops, plus 4 SP collectives at tp 2.
    CUDA graphs: one TE-module-like replay for the captured block, and the MoE layer's
    dispatch and experts stay eager."""
    t = TE_MODULE_OPS
    model, job = load_model_spec("qwen3-30b-a3b"), JobSpec(seq_len=4096)
    megatron = framework_time_constants("megatron")
    after, before = estimate_host_s(model, H100, job, degrees(ep=8), megatron, is_moe=True)
    assert before[0] == pytest.approx((4 + 3 * t + t + 72 + 10) * 13.48e-6)
    assert before[0] == pytest.approx(1.304e-3, abs=1e-6)
    assert after[0] == pytest.approx((10 + 1 + 2 * t + 2 * 16) * 13.48e-6)
    assert after[0] == pytest.approx(0.652e-3, abs=1e-6)
    dense = estimate_host_s(model, H100, job, degrees(tp=2), megatron, is_moe=False)
    assert dense[0][0] == 0.0
    assert dense[1][0] == pytest.approx((4 + 3 * t + 2 + 2 * t + 4) * 13.48e-6)
    graphs = megatron.model_copy(update={"cuda_graphs": True})
    assert estimate_host_s(model, H100, job, degrees(tp=2), graphs, False)[1][0] == (
        pytest.approx(t * 13.48e-6))
    graphed = estimate_host_s(model, H100, job, degrees(ep=8), graphs, True)
    assert graphed[0][0] == pytest.approx(after[0])
    assert graphed[1][0] == pytest.approx(t * 13.48e-6)


def test_the_gpu_hides_the_launches_until_they_outlast_its_work() -> None:
    """A pass costs max(GPU, host): at the DGX H100's 13.48 us per op a published-size dense
    layer is GPU-bound (no change); at 1 ms per op it costs its ops, and CUDA graphs leave one
    replay a pass."""
    model, cluster = load_model_spec("llama3.1-8b"), H100
    job, d = JobSpec(seq_len=4096), degrees()
    none = TimeConstants(host_op_s=0.0)
    default = TimeConstants()
    slow = TimeConstants(host_op_s=1e-3)
    terms = {name: estimate_layer_terms(model, cluster, job, d, c)["per_layer"][0, 0]
             for name, c in (("none", none), ("default", default), ("slow", slow))}
    np.testing.assert_allclose(terms["default"], terms["none"])
    ops = 4 + 3 * TE_MODULE_OPS + 2 + 2 * TE_MODULE_OPS
    launches = ops * 1e-3 * (1 + 2)  # forward and backward (twice the ops)
    assert terms["slow"][0] == pytest.approx(launches)  # the compute part
    graphed = slow.model_copy(update={"cuda_graphs": True})
    with_graphs = estimate_layer_terms(model, cluster, job, d, graphed)["per_layer"][0, 0]
    assert with_graphs[0] == pytest.approx(max(terms["none"][0], 3 * TE_MODULE_OPS * 1e-3),
                                           rel=1e-6)


def test_launch_bound_micro_batches_scale_with_the_micro_batch() -> None:
    """Issue 16: small MoE micro-batches are launch-bound, so throughput rises about as fast as
    the micro-batch until the GPU work outgrows the launches; CUDA graphs flatten it for dense
    layers. Here with launches slow enough to bind (a DeepSpeed-MoE-like per-expert loop on a
    slow host): tokens/s per GPU at micro-batch 4 is > 2.5x that at micro-batch 1."""
    constants = build_framework_profile("deepspeed").time_constants.model_copy(
        update={"host_op_s": 2e-4})
    job = JobSpec(seq_len=1024, global_batch=64)
    rate = [step("qwen3-30b-a3b", constants, job, dp=8, ep=8, micro_batch=mb,
                 recompute="none").tokens_per_s_per_gpu[0] for mb in (1, 4)]
    assert rate[1] / rate[0] > 2.5
    free = constants.model_copy(update={"host_op_s": 0.0})
    gpu_bound = [step("qwen3-30b-a3b", free, job, dp=8, ep=8, micro_batch=mb,
                      recompute="none").tokens_per_s_per_gpu[0] for mb in (1, 4)]
    assert gpu_bound[1] / gpu_bound[0] < 1.5


@settings(max_examples=30, deadline=None)
# Hypothesis found: the DP overlap window took the host's launch time whole, though the layer
# hid part of it behind its TP traffic (the step fell 17.662 -> 17.652 s).
@example(launch_us=6.0, tp=8, recompute="none", framework="deepspeed", mb=8)
@given(launch_us=st.floats(0.0, 2000.0), tp=st.sampled_from([1, 2, 8]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       framework=st.sampled_from(FRAMEWORKS), mb=st.sampled_from([1, 2, 8]))
def test_launches_never_make_a_step_faster(launch_us, tp, recompute, framework, mb) -> None:
    base = framework_time_constants(framework).model_copy(update={"host_op_s": 0.0})
    slow = base.model_copy(update={"host_op_s": launch_us * 1e-6})
    kwargs = dict(tp=tp, dp=8 // tp, ep=8 // tp, micro_batch=mb, recompute=recompute)
    fast_t = step("qwen3-30b-a3b", base, **kwargs)
    slow_t = step("qwen3-30b-a3b", slow, **kwargs)
    assert slow_t.step_s[0] >= fast_t.step_s[0] * (1 - 1e-12)
    parts = [getattr(slow_t, p)[0] for p in ("compute", "recompute", "tp", "cp", "ep")]
    assert min(parts) >= 0.0


# ---- the MoE dispatcher -----------------------------------------------------------------------

def test_deepep_sends_a_token_once_per_domain() -> None:
    """_domain_dedup docstring: k = 8 over 2 domains 0.249, over 8 domains 0.656; 1 inside one
    NVLink domain (Qwen3-30B-A3B: top-8, no group limit)."""
    ep = np.array([8, 16, 64])
    factor = _domain_dedup(H100, load_model_spec("qwen3-30b-a3b"), ep, np.ones(3, dtype=int))
    np.testing.assert_allclose(factor, [1.0, 2 * (1 - 0.5 ** 8) / 8, 8 * (1 - (7 / 8) ** 8) / 8])
    assert factor[1] == pytest.approx(0.249, abs=1e-3)
    assert factor[2] == pytest.approx(0.656, abs=1e-3)


def test_dispatchers_across_and_inside_a_node() -> None:
    model, job = load_model_spec("qwen3-30b-a3b"), JobSpec(seq_len=4096)

    def ep_seconds(dispatcher: str, ep: int) -> float:
        constants = TimeConstants(moe_dispatcher=dispatcher)
        layer = estimate_layer_terms(model, H100, job, degrees(dp=32, ep=ep), constants)
        return float(layer["per_layer"][0, 1, 4])

    assert ep_seconds("deepep", 8) == pytest.approx(ep_seconds("alltoall", 8))
    assert ep_seconds("allgather", 8) == pytest.approx(ep_seconds("alltoall", 8), rel=0.02)
    assert ep_seconds("deepep", 16) < 0.4 * ep_seconds("alltoall", 16)
    # DeepEP's 20 SMs slow overlapped compute more than NCCL's 16: 20/132 / (1 - 20/132).
    assert sm_contention(H100, TimeConstants(), 20) == pytest.approx(0.1786, abs=1e-4)


def test_alltoall_dispatcher_sorts_the_received_copies_by_local_expert() -> None:
    """layer_compute._chunk_sort_s: Megatron's MoEAlltoAllTokenDispatcher re-sorts the copies a
    GPU receives by local expert and un-sorts them before the combine (token_dispatcher.py
    "Permutation 2" / "Unpermutation 2", moe_utils.sort_chunks_by_idxs) when it holds more
    than one expert; the flex (DeepEP, HybridEP) and all-gather dispatchers permute once, as
    the measured fused MoE kernel does. Qwen3-30B-A3B at ep 8 on H100: 4096 tokens x top-8 x
    h 2048 x 2 B, read and written twice, 537 MB at 0.8 x 3.35 TB/s = 0.200 ms per pass."""
    from solver.cost.layers.layer_compute import _chunk_sort_s

    model = load_model_spec("qwen3-30b-a3b")
    d = degrees(dp=8, ep=8)
    pairs = np.array([4096.0 * 8])
    sort_s = _chunk_sort_s(model, H100, d, TimeConstants(), pairs)
    assert float(sort_s[0]) == pytest.approx(4 * 32768 * 2048 * 2 / (0.8 * 3350e9))
    assert float(sort_s[0]) == pytest.approx(0.200e-3, abs=0.001e-3)
    for dispatcher in ("deepep", "hybridep", "allgather"):
        other = TimeConstants(moe_dispatcher=dispatcher)
        assert float(_chunk_sort_s(model, H100, d, other, pairs)[0]) == 0.0
    one_expert_each = degrees(dp=128, ep=128)
    assert float(_chunk_sort_s(model, H100, one_expert_each, TimeConstants(), pairs)[0]) == 0.0


# ---- recompute semantics and element-wise fusion ----------------------------------------------

def test_op_level_selective_recompute_costs_time_and_saves_memory() -> None:
    """Megatron's selective recompute (the attention core) is free under FlashAttention;
    torchtitan's op-level SAC recomputes half the GEMMs, the grouped experts and every
    element-wise op, and keeps 59,520 of Llama-3-8B's 110,720 B per token and layer
    (op_level.estimate_op_level_bytes docstring)."""
    megatron = framework_time_constants("megatron")
    op_level = megatron.model_copy(update={"selective_recompute": "op_level"})
    none = step("llama3.1-8b", megatron, recompute="none", dp=8)
    attention = step("llama3.1-8b", megatron, recompute="selective", dp=8)
    op = step("llama3.1-8b", op_level, recompute="selective", dp=8)
    full = step("llama3.1-8b", megatron, recompute="full", dp=8)
    assert attention.step_s[0] == pytest.approx(none.step_s[0])
    assert none.step_s[0] < op.step_s[0] < full.step_s[0]
    assert op.recompute[0] > 0
    model, job = load_model_spec("llama3.1-8b"), JobSpec(seq_len=8192)
    levels = Candidates.from_configs([ParallelConfig(recompute=r)
                                      for r in ("none", "selective", "full")])
    saved = estimate_layer_activation_bytes(model, job, levels,
                                            MemoryOptions(selective_recompute="op_level"))
    np.testing.assert_allclose(saved / 8192, [110_720, 59_520, 8_192])


def test_eager_elementwise_ops_move_twice_the_bytes() -> None:
    fused = TimeConstants()
    eager = fused.model_copy(update={"fused_elementwise": False, "host_op_s": 0.0})
    model, job, d = load_model_spec("llama3.1-8b"), JobSpec(seq_len=4096), degrees()
    a = estimate_layer_terms(model, H100, job, d, fused.model_copy(
        update={"host_op_s": 0.0}))["mixed_fwd"]
    b = estimate_layer_terms(model, H100, job, d, eager)["mixed_fwd"]
    assert b[0] > a[0]
    assert TimeConstants().eager_elementwise_traffic == 2.0


def test_recompute_level_is_a_layer_degree() -> None:
    """Op-level selective recompute makes a layer's time depend on the recompute level, so the
    layer terms are costed per distinct (tp, cp, ep, etp, micro_batch, recompute) there, and per
    (tp, cp, ep, etp, micro_batch) where selective recompute is free."""
    constants = framework_time_constants("torchtitan")
    model, job = load_model_spec("llama3.1-8b"), JobSpec(seq_len=4096)
    both = SimpleNamespace(**{k: np.array([v, v]) for k, v in dict(
        tp=1, pp=1, dp=8, cp=1, ep=1, etp=1, vpp=1, zero=1, micro_batch=1).items()},
        recompute=np.array([0, 1]))
    t = estimate_step_time(model, H100, job, both, constants)
    assert t.recompute[0] == 0.0 < t.recompute[1]
    assert "recompute" in layer_degrees(constants)
    assert "recompute" not in layer_degrees(framework_time_constants("megatron"))


# ---- the command line: one profile for estimate, optimize and launch ---------------------------

MOE = ["--model", "qwen3-30b-a3b", "--cluster", "dgx-h100", "--gpus", "16",
       "--seq-len", "4096", "--global-batch", "256"]


def invoke(*args: str):
    from click.testing import CliRunner

    from solver.cli import cli

    return CliRunner().invoke(cli, list(args))


def estimate_json(*flags: str) -> dict:
    import json

    result = invoke("estimate", *MOE, "--ep", "16", "--json", *flags)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_estimate_reports_the_profile_and_takes_feature_flags() -> None:
    plain = estimate_json()
    assert plain["framework"] == "megatron"
    assert plain["framework_features"]["moe_dispatcher"] == "alltoall"
    deepep = estimate_json("--moe-dispatcher", "deepep")
    assert deepep["framework_features"]["moe_dispatcher"] == "deepep"
    # EP 16 spans two 8-GPU nodes: DeepEP sends a token once per node.
    assert (deepep["plans"][0]["time_seconds"]["ep"]
            < 0.5 * plain["plans"][0]["time_seconds"]["ep"])
    titan = estimate_json("--framework", "torchtitan", "--recompute", "selective")
    assert titan["framework_features"]["selective_recompute"] == "op_level"
    assert titan["plans"][0]["time_seconds"]["recompute"] > 0
    # Op-level checkpointing keeps about half of what Megatron's selective recompute keeps.
    assert (titan["plans"][0]["memory_gb"]["activations"]
            < 0.7 * plain["plans"][0]["memory_gb"]["activations"])


def test_optimize_and_launch_take_the_same_flags() -> None:
    import json

    result = invoke("optimize", *MOE, "--json", "--top", "1", "--engine", "even",
                    "--moe-dispatcher", "hybridep", "--cuda-graphs")
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["framework_features"]["moe_dispatcher"] == "hybridep"
    assert answer["framework_features"]["cuda_graphs"] is True
    launched = invoke("launch", *MOE, "--ep", "16", "--format", "megatron",
                      "--moe-dispatcher", "hybridep", "--cuda-graphs", "--tp", "2",
                      "--tp-comm-overlap")
    assert launched.exit_code == 0, launched.output
    text = launched.output
    assert "--moe-token-dispatcher-type flex" in text
    assert "--moe-flex-dispatcher-backend hybridep" in text
    # core_v0.16.1 TransformerConfig.cuda_graph_scope (renamed cuda_graph_modules on main);
    # no mlp in a model whose every layer is MoE (__post_init__: "mlp cuda graph is only
    # supported for dense layers")
    assert "--cuda-graph-scope attn moe_router moe_preprocess" in text
    assert "--tp-comm-overlap" in text
    default = invoke("launch", *MOE, "--ep", "16", "--format", "megatron").output
    assert "--moe-token-dispatcher-type alltoall" in default
    assert "--cuda-graph-impl" not in default


@pytest.mark.parametrize(("flags", "message"), [
    (["--moe-dispatcher", "nccl"], "--moe-dispatcher"),
    (["--framework", "deepspeed", "--moe-dispatcher", "deepep"], "--moe-dispatcher deepep"),
    (["--framework", "deepspeed", "--cuda-graphs"], "--cuda-graphs on"),
    (["--selective-recompute", "layer"], "--selective-recompute"),
])
def test_bad_feature_flags_are_one_line_and_exit_2(flags, message) -> None:
    result = invoke("estimate", *MOE, *flags)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.output


def test_launch_torchtitan_writes_its_features() -> None:
    """torchtitan v0.2.x job_config.py: Compile.enable, Parallelism.expert_parallel_comm_backend
    ("standard" | "deepep"); its trainer has no CUDA-graph path."""
    import tomllib

    result = invoke("launch", *MOE, "--ep", "16", "--target", "torchtitan@0.2",
                    "--moe-dispatcher", "deepep", "--fused-elementwise")
    assert result.exit_code == 0, result.output
    parsed = tomllib.loads("\n".join(line for line in result.output.splitlines()
                                     if not line.startswith(("warning:", "note:"))))
    assert parsed["parallelism"]["expert_parallel_comm_backend"] == "deepep"
    assert parsed["compile"] == {"enable": True, "components": ["model", "loss"]}
    eager = invoke("launch", *MOE, "--ep", "16", "--target", "torchtitan@0.2").output
    assert "[compile]" not in eager and "expert_parallel_comm_backend" not in eager
