"""Offload to the host (issue 17): optimizer offload (Megatron --optimizer-cpu-offload,
DeepSpeed ZeRO-Offload) and Megatron's fine-grained activation offloading, as memory knobs with
their step-time cost (solver.cost.step.offload), chosen by the search where they make a faster plan
fit (solver.search.module_variants), pinned by flags, emitted by launch.

Sources: the catalog's host links are datasheet rates (PCIe Gen4 x16 64 GB/s, Gen5 128 GB/s,
Gen6 256 GB/s bidirectional; NVLink-C2C 900 GB/s per GB200 superchip); host memory per GPU is
the CPUs' channels x transfer rate x 8 B over the GPUs of a node (DGX datasheets for the CPUs,
their vendors' specifications for the channels). The CPU Adam step is one fused pass over fp32
tensors (Megatron: torch.optim.AdamW(fused=True), megatron/core/optimizer/__init__.py).
Megatron's fine-grained offloading moves the saved tensors of core_attn, attn_proj, expert_fc1
and moe_act (docs/user-guide/features/fine_grained_activation_offloading.md).

Invariants (hypothesis): an offload never raises memory and never shortens the step; the
search with offloads returns the oracle's top plans over every combination of them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_model_spec
from solver.catalog.clusters import load_cluster_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.cost.memory.activations import estimate_offload_bytes
from solver.cost.step.offload import estimate_activation_offload_s, estimate_optimizer_offload_s
from solver.cost.step.steptime import estimate_step_time
from solver.optimize import build_problem, solve
from solver.search.enumerate import enumerate_feasible, fold_twins, rank
from solver.search.module_variants import offload_variant
from solver.spec import JobSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures

JOB = JobSpec(seq_len=8192, global_batch=512)


@pytest.mark.parametrize(("gpu", "per_direction"), [
    ("a100-80gb", 32.0),   # A100 datasheet "PCIe Gen4: 64GB/s"
    ("h100-sxm", 64.0),    # H100 datasheet "PCIe Gen5: 128GB/s"
    ("h200", 64.0),
    ("b200", 64.0),        # HGX B200 "PCIe Gen5: 128GB/s"
    ("b300", 128.0),       # HGX B300 "PCIe Gen6: 256GB/s"
    ("gb200", 900.0 / 2 / 2),  # NVLink-C2C 900 GB/s bidirectional, one Grace per two GPUs
])
def test_host_links_are_the_datasheets_per_direction(gpu: str, per_direction: float) -> None:
    cluster = {"a100-80gb": "dgx-a100-80gb", "h100-sxm": "dgx-h100", "h200": "dgx-h200",
               "b200": "dgx-b200", "b300": "dgx-b300", "gb200": "gb200-nvl72"}[gpu]
    assert load_cluster_spec(cluster).gpu.host_link_gb_per_s == per_direction


@pytest.mark.parametrize(("cluster", "measured"), [
    # Azure/AI-benchmarking-guide, Azure_Results/ND_*_results.md, "NV Bandwidth" (nvbandwidth
    # pinned copies, one GPU at a time): the slower of host-to-device and device-to-host.
    ("dgx-h100", min(51.0, 52.0)),   # ND H100 v5
    ("dgx-h200", min(52.0, 52.0)),   # ND H200 v5
    ("gb200-nvl72", min(201.0, 193.0)),  # ND GB200 v6
])
def test_offload_is_costed_at_the_measured_host_link(cluster: str, measured: float) -> None:
    """Issue 39 item 2: offload moves bytes at the link's measured rate, below the
    datasheet's (PCIe Gen5 64 GB/s, GB200's C2C share 225), not at the peak."""
    from solver.cost.step.offload import host_link_bytes_per_s

    spec = load_cluster_spec(cluster)
    assert spec.gpu.host_link_measured_gb_per_s == measured < spec.gpu.host_link_gb_per_s
    assert host_link_bytes_per_s(spec) == measured * 1e9
    # a GPU with no measurement in its file keeps the datasheet's rate
    b200 = load_cluster_spec("dgx-b200")
    assert b200.gpu.host_link_measured_gb_per_s is None
    assert host_link_bytes_per_s(b200) == b200.gpu.host_link_gb_per_s * 1e9


@pytest.mark.parametrize(("cluster", "sockets", "channels", "mega_transfers"), [
    ("dgx-a100-80gb", 2, 8, 3200),  # 2 x AMD EPYC 7742, DDR4-3200
    ("dgx-h100", 2, 8, 4800),       # 2 x Xeon Platinum 8480C, DDR5-4800
    ("dgx-h200", 2, 8, 4800),
    ("dgx-b200", 2, 8, 5600),       # 2 x Xeon Platinum 8570, DDR5-5600
    ("dgx-b300", 2, 8, 6400),       # 2 x Xeon 6776P, DDR5-6400
])
def test_host_memory_is_the_cpus_channels_over_the_gpus(cluster: str, sockets: int,
                                                        channels: int,
                                                        mega_transfers: int) -> None:
    spec = load_cluster_spec(cluster)
    per_node = sockets * channels * mega_transfers * 1e6 * 8 / 1e9
    assert spec.host_memory_gb_per_s == pytest.approx(per_node / spec.gpus_per_node)


def test_grace_host_memory_is_shared_by_two_gpus() -> None:
    """Grace CPU datasheet: LPDDR5X at up to 512 GB/s; a GB200 superchip has two GPUs."""
    assert load_cluster_spec("gb200-nvl72").host_memory_gb_per_s == 512.0 / 2


def _candidates(**degrees) -> Candidates:
    return Candidates.from_configs([ParallelConfig(**degrees)])


def test_optimizer_offload_step_of_llama_8b_on_a_dgx_h100() -> None:
    """The worked number of estimate_optimizer_offload_s: 8.03e9 / 8 parameters per GPU;
    Adam streams 28 B each at 76.8 GB/s (the longest of the three pipelined streams)."""
    model_spec, cluster = load_model_spec("llama3.1-8b"), load_cluster_spec("dgx-h100")
    megatron = build_framework_profile("megatron").time_constants
    assert megatron.host_optimizer_bytes_per_param == 7 * 4.0  # fused: p, g, m, v in; p, m, v out
    candidates = _candidates(dp=8, zero=1)
    seconds = estimate_optimizer_offload_s(model_spec, cluster, candidates, megatron)
    per_gpu = model_spec.total_params / 8
    assert seconds[0] == pytest.approx(per_gpu * 28 / 76.8e9, rel=0.01)
    assert seconds[0] == pytest.approx(0.366, abs=0.005)
    # DeepSpeed copies the gradients during the backward and steps, then sends the bf16
    # parameters back: host + h2d.
    deepspeed = build_framework_profile("deepspeed").time_constants
    assert deepspeed.offload_grads_during_backward
    ds = estimate_optimizer_offload_s(model_spec, cluster, candidates, deepspeed)
    # the parameters back over the H100's measured host link (51 GB/s, below)
    assert ds[0] == pytest.approx(seconds[0] + per_gpu * 2 / 51e9, rel=0.01)


def test_offloaded_optimizer_state_leaves_the_gpu_and_nothing_else_moves() -> None:
    model_spec = load_model_spec("llama3.1-8b")
    candidates = _candidates(dp=8, zero=1, micro_batch=1, recompute="selective")
    on = estimate_memory(model_spec, JOB, candidates, MemoryOptions(optimizer_offload=True))
    off = estimate_memory(model_spec, JOB, candidates, MemoryOptions())
    assert on.items["optimizer"][0] == 0.0
    assert off.items["optimizer"][0] == pytest.approx(model_spec.total_params * 12 / 8, rel=0.01)
    for name in ("weights", "grads", "activations", "logits"):
        assert on.items[name][0] == off.items[name][0]


def test_activation_offload_bytes_of_a_llama_8b_layer() -> None:
    """Q, K, V 2 x (4096 + 1024 + 1024), the projection input 2 x 4096 and the log-sum-exp
    4 x 32 B per token: 20,608 B, 168.8 MB per layer at 8,192 tokens; under selective
    recompute of core_attn the log-sum-exp is not saved, so not moved."""
    model_spec = load_model_spec("llama3.1-8b")
    for recompute, per_token in (("none", 20_608), ("selective", 20_608 - 4 * 32)):
        candidates = _candidates(micro_batch=1, recompute=recompute)
        moved = estimate_offload_bytes(model_spec, JOB, candidates, MemoryOptions(), moe=False)
        assert moved[0] == per_token * 8192


def test_activation_offload_keeps_one_layer_and_moves_the_rest() -> None:
    """A stage's activations lose the offloaded bytes of every layer of every micro-batch in
    flight but one layer's (the reload margin); full recompute offloads nothing."""
    model_spec = load_model_spec("llama3.1-8b")
    candidates = _candidates(dp=8, zero=1, micro_batch=1, recompute="selective")
    off = estimate_memory(model_spec, JOB, candidates, MemoryOptions())
    on = estimate_memory(model_spec, JOB, candidates, MemoryOptions(activation_offload=True))
    per_layer = (20_608 - 4 * 32) * 8192  # selective: no log-sum-exp (above)
    saved = off.items["activations"][0] - on.items["activations"][0]
    assert saved == pytest.approx((model_spec.num_hidden_layers - 1) * per_layer)
    full = _candidates(dp=8, zero=1, micro_batch=1, recompute="full")
    assert estimate_memory(model_spec, JOB, full, MemoryOptions(activation_offload=True)
                           ).total[0] == estimate_memory(model_spec, JOB, full).total[0]


def test_moe_layers_offload_the_expert_inputs_too() -> None:
    """expert_fc1 (k copies x capacity 1.25 of the h-wide input) and moe_act (2 F_e per copy)
    on top of the attention's bytes."""
    model_spec = load_model_spec("mixtral-8x7b")
    candidates = _candidates(micro_batch=1, recompute="none")
    options = MemoryOptions()
    dense = estimate_offload_bytes(model_spec, JOB, candidates, options, moe=False)[0]
    moe = estimate_offload_bytes(model_spec, JOB, candidates, options, moe=True)[0]
    copies = 2 * 1.25
    assert moe - dense == pytest.approx(8192 * copies * (2 * 4096 + 2 * 14336))


def test_exposed_transfer_is_what_the_layer_compute_cannot_hide() -> None:
    """max(0, b / link - forward) + max(0, b / link - backward), forward one third of the
    layer's compute: 1 GB at the H100's measured 51 GB/s is 19.6 ms each way."""
    cluster = load_cluster_spec("dgx-h100")
    transfer = 1e9 / 51e9
    hidden = estimate_activation_offload_s(np.array([1e9]), np.array([3 * transfer]), cluster)
    assert hidden[0] == 0.0
    compute = np.array([0.009])  # forward 3 ms, backward 6 ms
    shown = estimate_activation_offload_s(np.array([1e9]), compute, cluster)
    assert shown[0] == pytest.approx((transfer - 0.003) + (transfer - 0.006))


@settings(max_examples=30, deadline=None)
@given(model=st.sampled_from(["llama3.1-8b", "mixtral-8x7b", "qwen3-30b-a3b"]),
       tp=st.sampled_from([1, 2, 4]), pp=st.sampled_from([1, 2]),
       zero=st.integers(0, 3), micro_batch=st.sampled_from([1, 2]),
       recompute=st.sampled_from(["none", "selective"]),
       offloads=st.sets(st.sampled_from(["optimizer_offload", "activation_offload"]),
                        min_size=1))
def test_an_offload_never_raises_memory_nor_shortens_the_step(model, tp, pp, zero, micro_batch,
                                                              recompute, offloads) -> None:
    model_spec = load_model_spec(model)
    cluster = load_cluster_spec("dgx-h100")
    candidates = _candidates(tp=tp, pp=pp, dp=8 // tp, zero=zero, micro_batch=micro_batch,
                             recompute=recompute)
    plain = build_framework_profile("megatron")
    offloaded = build_framework_profile("megatron", {name: True for name in offloads})
    job = JobSpec(seq_len=4096, global_batch=64)
    assert estimate_memory(model_spec, job, candidates, offloaded.memory_options()).total[0] \
        <= estimate_memory(model_spec, job, candidates, plain.memory_options()).total[0]
    slow = estimate_step_time(model_spec, cluster, job, candidates, offloaded.time_constants)
    fast = estimate_step_time(model_spec, cluster, job, candidates, plain.time_constants)
    assert slow.step_s[0] >= fast.step_s[0]


def _own_seconds(variant, candidates: Candidates) -> np.ndarray:
    """The step time of each candidate (even split) under the shortest prefix of the problem's
    memory savers with which it fits: what the plan is launched and timed with (issue 35)."""
    from solver.ranked_plans import saver_constants, saver_levels

    levels = saver_levels(variant)
    seconds = np.full(len(candidates.tp), np.nan)
    for position, (savers, options) in enumerate(levels):
        total = estimate_memory(variant.model_spec, variant.job, candidates, options).total
        step = estimate_step_time(variant.model_spec, variant.cluster, variant.job, candidates,
                                  saver_constants(variant, savers)).step_s
        chosen = np.isnan(seconds) & ((total <= variant.cluster.usable_memory_bytes)
                                      | (position == len(levels) - 1))
        seconds[chosen] = step[chosen]
    return seconds


def _oracle_top(problem, top: int) -> list[tuple]:
    """Every combination of the problem's offloads enumerated apart (the plain oracle),
    each plan timed with the memory savers it needs (_own_seconds), ranked by time, then fewer offloads, then memory; the same configuration offloading again
    dropped (no module sets here: the flag fixes the modules)."""
    rows: list[tuple] = []
    for offloads in ((), ("optimizer_offload",), ("activation_offload",),
                     ("optimizer_offload", "activation_offload")):
        if not set(offloads) <= set(problem.offloads):
            continue
        variant = offload_variant(problem, offloads) if offloads else problem.model_copy(
            update={"offloads": ()})
        if variant is None:
            continue
        feasible = enumerate_feasible(variant)
        if len(feasible) == 0:
            continue
        ranked = fold_twins(rank(variant, feasible), 2 * top)
        own = _own_seconds(variant, ranked.candidates)
        for i, config in enumerate(ranked.candidates.to_configs()):
            rows.append((round(float(own[i]), 9), len(offloads), config, offloads))
    rows.sort(key=lambda row: row[:2])
    seen, answer = set(), []
    for seconds, _, config, offloads in rows:
        if config in seen and offloads:
            continue
        seen.add(config)
        answer.append((seconds, offloads))
    return answer[:top]


@settings(max_examples=8, deadline=None)
@given(model=st.sampled_from(["llama3.1-8b", "mixtral-8x7b", "llama3.1-70b"]),
       cluster=st.sampled_from(["dgx-a100-40gb", "dgx-h100"]),
       gpus=st.sampled_from([8, 16]), seq_len=st.sampled_from([4096, 8192]))
def test_the_search_with_offloads_is_the_oracles_top(model, cluster, gpus, seq_len) -> None:
    """The top plans are the oracle's over every combination of the offloads."""
    problem = build_problem(model, cluster, gpus, seq_len=seq_len, global_batch=64,
                            features=FrameworkFeatures(recompute_modules=("core_attn",)))
    assert problem.offloads == ("optimizer_offload", "activation_offload")
    result = solve(problem, top=3, engine="even", compare=False)
    expected = _oracle_top(problem, 3)
    got = [(round(p.time.step_seconds, 9), p.offloads) for p in result.plans]
    assert [seconds for seconds, _ in got] == pytest.approx([s for s, _ in expected], rel=1e-9)
    assert [offloads for _, offloads in got] == [offloads for _, offloads in expected]


def test_mixtral_on_eight_a100_40gb_fits_only_by_offloading() -> None:
    """Found by hypothesis: no configuration of Mixtral 8x7B (46.7B parameters) fits eight
    40 GB A100s at 2K tokens without offload; the optimizer state on the host makes room."""
    problem = build_problem("mixtral-8x7b", "dgx-a100-40gb", 8, seq_len=2048, global_batch=64)
    plain = problem.model_copy(update={"offloads": ()})
    assert len(enumerate_feasible(plain)) == 0
    result = solve(problem, top=1, engine="even", compare=False)
    assert result.status == "optimal" and "optimizer_offload" in result.plans[0].offloads


def _run(*args: str):
    return CliRunner().invoke(cli, list(args))


COMMON = ("--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8")


@pytest.mark.parametrize(("flags", "message"), [
    (("--cluster", "hgx-h800", "--optimizer-offload"),
     "--optimizer-offload: cluster 'hgx-h800' has no host_memory_gb_per_s"),
    (("--activation-offload", "--recompute", "full"),
     "--activation-offload with --recompute full"),
    (("--framework", "torchtitan", "--optimizer-offload"),
     "--optimizer-offload on: torchtitan offloads parameters, gradients and optimizer"),
    (("--framework", "deepspeed", "--activation-offload"),
     "--activation-offload on: DeepSpeed offloads activation checkpoints"),
    (("--framework", "deepspeed", "--optimizer-offload", "--zero", "0"),
     "--optimizer-offload with --zero 0"),
])
def test_offloads_that_cannot_run_are_refused_in_one_line(flags, message) -> None:
    result = _run("estimate", *COMMON, *flags)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_estimate_prints_the_offload_assumptions() -> None:
    off = _run("estimate", *COMMON)
    assert "optimizer offload: off (--optimizer-offload)" in off.output
    assert "activation offload: off (--activation-offload)" in off.output
    on = _run("estimate", *COMMON, "--zero", "1", "--optimizer-offload", "--activation-offload")
    assert "optimizer offload: on: fp32 master and Adam moments in host memory" in on.output
    assert "activation offload: on: core_attn, attn_proj, expert_fc1 and moe_act" in on.output


def test_launch_emits_the_offload_flags() -> None:
    """Megatron: --optimizer-cpu-offload needs the precision-aware optimizer's code path
    (arguments.py asserts it); --overlap-cpu-optimizer-d2h-h2d as the docs recommend;
    fine-grained offloading of the modules the cost model moves, with NVTE_CPU_OFFLOAD_V1=1.
    DeepSpeed: zero_optimization.offload_optimizer.device "cpu"."""
    megatron = _run("launch", *COMMON, "--zero", "1", "--format", "megatron",
                    "--optimizer-offload", "--activation-offload")
    assert megatron.exit_code == 0, megatron.output
    for flag in ("--optimizer-cpu-offload", "--optimizer-offload-fraction 1.0",
                 "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer",
                 "--fine-grained-activation-offloading", "--offload-modules core_attn attn_proj"):
        assert flag in megatron.output
    assert "NVTE_CPU_OFFLOAD_V1=1" in megatron.output
    deepspeed = _run("launch", *COMMON, "--zero", "1", "--format", "deepspeed",
                     "--optimizer-offload")
    assert deepspeed.exit_code == 0, deepspeed.output
    assert '"offload_optimizer"' in deepspeed.output and '"device": "cpu"' in deepspeed.output


def test_optimize_names_the_offloads_and_launch_plan_turns_them_on(tmp_path) -> None:
    """Mixtral 8x7B on eight 40 GB A100s fits only by offloading (above): the plan names its
    offloads, and `launch --plan` emits them."""
    args = ("--model", "mixtral-8x7b", "--cluster", "dgx-a100-40gb", "--gpus", "8",
            "--seq-len", "2048", "--global-batch", "64")
    answer = _run("optimize", *args, "--top", "1", "--json", "--engine", "even")
    assert answer.exit_code == 0, answer.output
    plan = json.loads(answer.output)["plans"][0]
    assert "optimizer_offload" in plan["offloads"]
    path = tmp_path / "plan.json"
    path.write_text(answer.output)
    launched = _run("launch", "--plan", str(path), "--format", "megatron")
    assert launched.exit_code == 0, launched.output
    assert "--optimizer-cpu-offload" in launched.output
    table = _run("optimize", *args, "--top", "1", "--engine", "even")
    assert "offloads to the host: #1 --optimizer-offload" in table.output


def _oracle_over_module_sets(problem, top: int) -> list[tuple]:
    """Every (module set, offloads) pair enumerated apart, each plan timed with the memory
    savers it needs (_own_seconds), and ranked by time, then fewer
    offloads, then memory; a configuration offloading where it ranked before dropped."""
    from solver.search.module_variants import module_variant

    rows: list[tuple] = []
    for index, modules in enumerate(problem.recompute_module_sets):
        base = problem.model_copy(update={"recompute_module_sets": (), "offloads": ()}) \
            if index == 0 else module_variant(problem, modules)
        if base is None:
            continue
        for offloads in ((), ("optimizer_offload",), ("activation_offload",),
                         ("optimizer_offload", "activation_offload")):
            variant = offload_variant(base, offloads) if offloads else base
            if variant is None:
                continue
            feasible = enumerate_feasible(variant)
            if len(feasible) == 0:
                continue
            ranked = rank(variant, feasible)
            own = _own_seconds(variant, ranked.candidates)
            for i, config in enumerate(ranked.candidates.to_configs()):
                named = modules if config.recompute == "selective" else ()
                rows.append((round(float(own[i]), 9), len(offloads),
                             float(ranked.memory_bytes[i]), config, named, offloads))
    rows.sort(key=lambda row: row[:3])
    seen, answer = set(), []
    for seconds, _, _, config, modules, offloads in rows:
        if config in seen and offloads:
            continue
        seen.add(config)
        answer.append((seconds, modules, offloads))
    return answer[:top]


@pytest.mark.parametrize(("model", "cluster", "gpus"), [("deepseek-v2-lite", "dgx-a100-40gb", 8),
                                                        ("deepseek-v2-lite", "dgx-h100", 8)])
def test_offloads_under_every_module_set_are_the_oracles_top(model, cluster, gpus) -> None:
    """The top plans are the oracle's over every (module set, offloads) pair: an offload
    under a later module set is searched too (DeepSeek-V2-Lite: four module sets)."""
    problem = build_problem(model, cluster, gpus, seq_len=8192, global_batch=64)
    assert len(problem.recompute_module_sets) > 1 and len(problem.offloads) == 2
    result = solve(problem, top=3, engine="even", compare=False)
    expected = _oracle_over_module_sets(problem, 3)
    got = [(round(p.time.step_seconds, 9), p.recompute_modules or (), p.offloads)
           for p in result.plans]
    assert [seconds for seconds, _, _ in got] == pytest.approx(
        [seconds for seconds, _, _ in expected], rel=1e-9)
    assert [offloads for _, _, offloads in got] == [offloads for _, _, offloads in expected]


def test_a_hidden_offload_names_the_link_it_hides_at_not_0_s() -> None:
    """Issue 39 item 2: Llama-3.1-8B on 8 H100s offloads activations whose copies hide behind
    the layers' compute; the explanation says so with the host link's measured rate (51 GB/s,
    Azure ND H100 v5 nvbandwidth) instead of "they add 0 s to the step"."""
    result = CliRunner().invoke(cli, ["optimize", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "8"])
    assert result.exit_code == 0, result.output
    line = next(text for text in result.output.splitlines() if "offloads: --" in text)
    assert "their copies at the host link's 51 GB/s measured hide behind the layers' " \
           "compute: no step time shows" in line, line
    assert " 0 s" not in result.output
