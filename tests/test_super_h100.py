"""Nemotron 3 Super on H100s: the runs NVIDIA verified, and the one it did not.

Source: Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge at 067f987)
examples/model_verification_cards/nemotron-3-super-120b-a12b/card.yaml and the recipes it runs,
src/megatron/bridge/recipes/nemotronh/h100/nemotron_3_super.py:
- pretrain, H100, verified 2026-08-03 (_nemotron_3_super_pretrain_64gpu_h100_bf16_config):
  64 H100s, TP1/PP2/CP1/EP32/ETP1, sequence 4096, GBS/MBS 1280/1, HybridEP, selective
  recompute of layernorm, moe_act, moe and core_attn, precision-aware optimizer (bf16 moments
  and main gradients), gradients reduced in bf16, no DP overlap: "Peak device memory is
  58.079 GiB allocated and 70.336 GiB reserved"; 29,368.690 ms a step.
- sft_long_context, H100, verified 2026-07-24 (nemotron_3_super_sft_16gpu_h100_bf16_32k_config):
  16 H100s, TP1/PP8/CP2/EP2, sequence 32768, GBS/MBS 2/1, 12 layers a stage and 4 on the last
  (num_layers_in_last_pipeline_stage), full recompute, the whole optimizer offloaded.
- nemotron_3_super_pretrain_16gpu_h100_bf16_config (TP8/EP16, sequence 8192): not verified on
  H100; the card runs it on 16 GB200s only, with full recompute and 40% of the optimizer state
  offloaded.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from solver.catalog.zoo import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.memory.activations import (
    estimate_activation_terms,
    estimate_kind_activation_bytes,
    estimate_layer_activation_bytes,
)
from solver.cost.memory.options import MemoryOptions
from solver.spec import JobSpec, ParallelConfig

SUPER = "nemotron-3-super-120b-a12b"
GIB = 2**30
# Megatron's allocator peak counts what the memory model allocates: everything but the CUDA
# context, NCCL's buffers and the allocator's fragmentation.


def estimate_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["estimate", "--model", SUPER, "--cluster", "dgx-h100",
                                      "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["plans"][0]


PRETRAIN_64 = ["--gpus", "64", "--pp", "2", "--ep", "32", "--seq-len", "4096",
               "--global-batch", "1280", "--recompute", "selective",
               "--recompute-modules", "layernorm,moe_act,moe,core_attn",
               "--precision-aware-optimizer", "--grad-reduce-in-bf16",
               "--moe-dispatcher", "hybridep", "--dp-overlap", "never"]


def test_the_verified_64_gpu_pretraining_fits() -> None:
    """It ran: the estimate fits it (136 GB before one-block MoE layers took the module
    recompute), and its allocated bytes come within 15% of the measured peak: 54.8 GB on the
    last stage (51.5 on the first) against 58.079 GiB = 62.4 GB, 12% under (the estimate
    does not know what; the run pads each expert's tokens to 1.10x capacity)."""
    plan = estimate_json(*PRETRAIN_64)
    assert plan["fits"]
    allocated_gb = max(stage["memory_gb"]["total"] - sum(
        stage["other_gb"][name] for name in ("cuda_context", "nccl", "fragmentation"))
        for stage in plan["stages"])
    assert allocated_gb == pytest.approx(58.079 * GIB / 1e9, rel=0.15)


def test_the_verified_16_gpu_long_context_sft_fits() -> None:
    plan = estimate_json("--gpus", "16", "--pp", "8", "--cp", "2", "--ep", "2", "--seq-len",
                         "32768", "--global-batch", "2", "--recompute", "full",
                         "--optimizer-offload", "--precision-aware-optimizer",
                         "--grad-reduce-in-bf16",
                         "--layout", "Et*12|t*12|t*12|t*12|t*12|t*12|t*12|t*4,m*2,L")
    assert plan["fits"]


@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_the_16_gpu_tp8_recipe_does_not_fit_h100s(recompute: str) -> None:
    """TP8/EP16 leaves each GPU 32 of the 512 experts of all 40 MoE layers, sharded over no
    data-parallel replica (expert dp = 16 / 16): about 7e9 expert parameters a GPU, 70 GB at
    the recipe's 10 B a parameter (bf16 weights and gradients, bf16 moments, a master copy)
    before any activation: no H100 holds it without offloading the optimizer, which is how
    NVIDIA runs this recipe (16 GB200s, 40% offloaded)."""
    plan = estimate_json("--gpus", "16", "--tp", "8", "--ep", "16", "--seq-len", "8192",
                         "--global-batch", "1024", "--recompute", recompute,
                         "--precision-aware-optimizer", "--grad-reduce-in-bf16")
    assert not plan["fits"]
    memory = plan["memory_gb"]
    assert memory["weights"] + memory["grads"] > 34  # bf16 weights and gradients alone


# ---- one-block MoE layers under Megatron's module recompute --------------------------------


def _kinds(options: MemoryOptions) -> np.ndarray:
    spec = load_model_spec(SUPER)
    job = JobSpec(seq_len=4096, global_batch=64)
    config = ParallelConfig(tp=1, pp=2, dp=32, ep=32, micro_batch=1, recompute="selective")
    return estimate_activation_terms(spec, job, Candidates.from_configs([config]),
                                     options)["layer"][0]


def test_module_recompute_reaches_one_block_moe_layers() -> None:
    """Megatron's recompute of the MoE layer ("moe") keeps its input only: a LatentMoE
    one-block layer of Super saves 2h = 8,192 B a token (33.6 MB at 4096 tokens), where it
    saved its 22 latent copies (and more) before."""
    spec = load_model_spec(SUPER)
    moe_only = spec.block_kinds.index(("none", "moe"))
    plain = _kinds(MemoryOptions())
    recomputed = _kinds(MemoryOptions(recompute_modules=("core_attn", "moe")))
    assert recomputed[moe_only] == pytest.approx(4096 * 2 * spec.hidden_size)
    assert plain[moe_only] > 30 * recomputed[moe_only]


@pytest.mark.parametrize("modules", [("moe_act",), ("layernorm",), ("moe",),
                                     ("moe_act", "layernorm", "shared_experts")])
def test_one_block_moe_layer_drops_what_a_plain_moe_layer_drops(modules: tuple) -> None:
    """The module drop is one rule for both kinds: the attention + MoE layer and the MoE-only
    layer lose the same bytes."""
    spec = load_model_spec(SUPER)
    job = JobSpec(seq_len=4096, global_batch=64)
    candidates = Candidates.from_configs([ParallelConfig(
        tp=2, pp=1, dp=32, ep=32, micro_batch=1, recompute="selective")])
    moe_only = spec.block_kinds.index(("none", "moe"))
    saved = {}
    for name, options in (("base", MemoryOptions()),
                          ("modules", MemoryOptions(recompute_modules=("core_attn", *modules)))):
        plain = estimate_layer_activation_bytes(spec, job, candidates, options, moe=True)
        dense = estimate_layer_activation_bytes(spec, job, candidates, options, moe=False)
        kind = estimate_kind_activation_bytes(spec, job, candidates, options, moe_only,
                                              (dense, plain))
        saved[name] = (float(plain[0]), float(kind[0]))
    drop_plain = saved["base"][0] - saved["modules"][0]
    drop_kind = saved["base"][1] - saved["modules"][1]
    assert drop_kind > 0
    assert drop_kind == pytest.approx(drop_plain, rel=1e-12)
