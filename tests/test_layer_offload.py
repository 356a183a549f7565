"""Megatron's layer-level CPU offloading, --cpu-offloading-num-layers (issue 17: "activation
offloading to the host (... `--cpu-offloading`)"): Transformer Engine's default scheduling
(TransformerEngine @d0067d0 docs/features/other_optimizations/cpu_offloading/cpu_offloading.rst:
"First num_layers layers are offloaded to CPU", "At most (model_layers - num_layers) sets of
activations are on GPU at any time"), which Megatron-LM @d98e8a6 runs through
transformer_block.py get_cpu_offload_context and refuses with pipeline parallelism, recompute,
fine-grained offloading and per-layer CUDA graphs (transformer_config.py __post_init__)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from solver.api import estimate
from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.memory.layer_offload import estimate_offloaded_layer_counts
from solver.cost.step.offload import estimate_layer_offload_s

LLAMA_70B = ["--model", "llama3.1-70b", "--cluster", "gb200-nvl72", "--gpus", "64",
             "--seq-len", "8192", "--global-batch", "128"]


def test_the_first_layers_are_offloaded_in_model_order() -> None:
    """DeepSeek-V3's first three layers are dense (first_k_dense_replace 3 in its config.json):
    the first 20 are 3 dense and 17 MoE; Llama's are all dense."""
    assert estimate_offloaded_layer_counts(load_model_spec("deepseek-v3"), 20).tolist() == [3, 17]
    assert estimate_offloaded_layer_counts(load_model_spec("llama3.1-70b"), 20).tolist() == [20, 0]


def test_exposed_copy_time_follows_the_documented_window() -> None:
    """g(t, c) = max(0, t - (L - N) c, N t - (L - 1) c): N = 2 of 5 hides copies up to t = 2c
    (the docs' Figure 3, "fully overlaps"); with N = L - 1 each layer waits for its copy's
    excess, N (t - c)."""
    assert estimate_layer_offload_s(2.0, 1.0, 5, 2) == 0.0
    assert estimate_layer_offload_s(2.5, 1.0, 5, 2) == pytest.approx(1.0)
    assert estimate_layer_offload_s(2.0, 1.0, 5, 4) == pytest.approx(4.0)
    assert estimate_layer_offload_s(np.array([0.5, 1.5]), np.ones(2), 5, 4).tolist() == \
        pytest.approx([0.0, 2.0])


def _estimate(layers: int, cluster: str = "gb200-nvl72"):
    features = {"cpu_offloading_num_layers": layers}
    return estimate("llama3.1-70b", cluster, 64, seq_len=8192, global_batch=128, zero=3,
                    recompute="none", features=_features(features)).plan


def _features(values):
    from solver.spec.features import FrameworkFeatures

    return FrameworkFeatures(**values)


def test_memory_falls_by_the_offloaded_layers_activations() -> None:
    """Llama-3.1-70B, s 8192, b 1, tp 1: 1.78 GB of activations a layer; 20 layers offloaded
    take 20 x 1.78 = 35.6 GB off the only stage, and 79 leave one layer's."""
    plain, twenty, most = (_estimate(n).worst_stage.activations_bytes for n in (0, 20, 79))
    per_layer = 1.7805e9
    assert plain - twenty == pytest.approx(20 * per_layer, rel=1e-3)
    assert plain - most == pytest.approx(79 * per_layer, rel=1e-3)
    # GB200's C2C hides the copies
    assert _step_s(_estimate(20)) == pytest.approx(_step_s(_estimate(0)))


def _step_s(plan) -> float:
    return plan.time.step_seconds


def test_pcie_shows_the_copies_the_window_cannot_hide() -> None:
    """On an H100's PCIe (51 GB/s measured, Azure ND H100 v5 nvbandwidth) a layer's 1.78 GB
    takes 34.9 ms: hidden behind 50 of 80 layers (50 x 34.9 < 79 x 26 ms), not behind one
    (N = 79)."""
    plain, fifty, most = (_step_s(_estimate(n, "dgx-h100")) for n in (0, 50, 79))
    assert fifty == pytest.approx(plain)
    assert most > plain + 0.1


@pytest.mark.parametrize(("extra", "message"), [
    (["--cpu-offloading-num-layers", "80"], "Megatron offloads fewer layers than the model's 80"),
    (["--cpu-offloading-num-layers", "20", "--pp", "2"], "without pipeline parallelism"),
    (["--cpu-offloading-num-layers", "20", "--recompute", "selective"],
     "does not run with activation recompute"),
    (["--cpu-offloading-num-layers", "20", "--cuda-graphs"], "per-layer CUDA graphs"),
    (["--cpu-offloading-num-layers", "20", "--activation-offload"],
     "fine-grained activation offloading"),
    (["--cpu-offloading-num-layers", "20", "--framework", "torchtitan"],
     "layer-level CPU offloading is Megatron's"),
    (["--cpu-offloading-num-layers", "-1"], "-1 is below 0"),
])
def test_bad_values_are_one_line(extra: list[str], message: str) -> None:
    args = ["estimate", *LLAMA_70B, "--zero", "3", "--recompute", "none", *extra]
    if "--recompute" in extra:
        args = ["estimate", *LLAMA_70B, "--zero", "3", *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and message in result.output


def test_estimate_prints_it_and_launch_emits_it() -> None:
    shown = CliRunner().invoke(cli, ["estimate", *LLAMA_70B, "--zero", "3", "--recompute",
                                     "none", "--cpu-offloading-num-layers", "20"])
    assert shown.exit_code == 0, shown.output
    assert "layer-level CPU offloading: the first 20 layers' activations" in shown.output
    launched = CliRunner().invoke(cli, ["launch", *LLAMA_70B, "--zero", "3", "--recompute",
                                        "none", "--cpu-offloading-num-layers", "20",
                                        "--format", "megatron"])
    assert launched.exit_code == 0, launched.output
    assert "--cpu-offloading-num-layers 20 \\" in launched.output


def test_optimize_keeps_to_the_plans_megatron_runs() -> None:
    """The pin narrows the search to pp 1 without recompute; every plan fits."""
    result = CliRunner().invoke(cli, ["optimize", *LLAMA_70B, "--cpu-offloading-num-layers",
                                      "20", "--top", "3", "--json"])
    assert result.exit_code == 0, result.output
    import json

    plans = json.loads(result.output)["plans"]
    assert plans and all(p["pp"] == 1 and p["recompute"] == "none"
                         and p["fits"] for p in plans)


@pytest.mark.parametrize("model", ["deepseek-v3", "llama3.1-8b", "qwen3-next-80b-a3b"])
def test_memory_never_rises_with_more_layers_offloaded(model: str) -> None:
    """Each offloaded layer takes its own activations off the GPU (a property over N)."""
    from solver.cost.candidates import Candidates
    from solver.cost.memory import estimate_memory
    from solver.cost.memory.options import MemoryOptions
    from solver.spec import JobSpec, ParallelConfig

    model_spec = load_model_spec(model)
    config = Candidates.from_configs([ParallelConfig(dp=64, ep=8 if model_spec.is_moe else 1,
                                                     zero=1, recompute="none")])
    totals = [estimate_memory(model_spec, JobSpec(seq_len=4096), config,
                              MemoryOptions(cpu_offloading_num_layers=n)).total[0]
              for n in range(0, model_spec.num_hidden_layers, 7)]
    assert all(later < earlier for earlier, later in zip(totals, totals[1:]))


def test_a_plan_that_does_not_fit_is_told_how_many_layers_to_offload() -> None:
    """Under the offload estimate suggests no pp or recompute change (Megatron refuses them
    with it) but the fewest layers that fit, found by bisection and checked against N - 1."""
    from solver.api import estimate_memory_total, suggest_memory_fixes
    from solver.catalog import load_cluster_spec
    from solver.cost.candidates import Candidates
    from solver.cost.memory.options import MemoryOptions
    from solver.spec import JobSpec, ParallelConfig

    model_spec, cluster = load_model_spec("llama3.1-70b"), load_cluster_spec("dgx-h100")
    job, config = JobSpec(seq_len=8192, global_batch=128), ParallelConfig(dp=64, zero=3,
                                                                           recompute="none")
    fixes = suggest_memory_fixes(model_spec, cluster, job, 64, config,
                                 MemoryOptions(cpu_offloading_num_layers=10))
    assert len(fixes) == 1 and fixes[0].startswith("--cpu-offloading-num-layers ")
    layers = int(fixes[0].split()[1])

    def total(n: int) -> float:
        return estimate_memory_total(model_spec, job, Candidates.from_configs([config]),
                                     MemoryOptions(cpu_offloading_num_layers=n))[0][0]

    assert total(layers) <= cluster.usable_memory_bytes < total(layers - 1)
