"""Activation offload and selective recompute together: offload moves only what a layer still
saves. Megatron's fine-grained activation offloading of expert_fc1 / moe_act is refused with
--recompute-modules moe, which wraps the whole MoE block in a checkpoint that keeps only its
input (megatron/core/transformer/transformer_config.py __post_init__, core @ d98e8a6:
"Cannot offload {...} while recomputing the entire MoE layer"); parplan refuses it too
(solver.cost.step.offload.refuse_activation_offload, rule offload_not_inside_recomputed_moe) where
it used to subtract the experts' offloaded bytes from a layer that no longer held them: a
Mixtral-8x7B MoE layer at s 4096 went to -0.28 GB, the stage to -8.3 GB.

Property: every memory item, every per-stage and per-layer term is >= 0, a layer keeps at
least its input under any recompute module set, and offloads no more than it saves, over every option combination the planner takes (recompute module
sets, activation offload, layer-level CPU offloading, eager or fused element-wise ops,
FlashAttention or not)."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_eager_memory import QK_NORM
from test_memory_properties import MODELS, problems

from solver.catalog import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.memory import ITEMS, estimate_all_stages, estimate_memory
from solver.cost.memory.activations import (
    estimate_activation_terms,
    estimate_kind_offload_bytes,
)
from solver.cost.memory.options import MemoryOptions
from solver.cost.step.offload import check_layer_offload, refuse_activation_offload
from solver.cost.layers.time_constants import TimeConstants
from solver.errors import InputError
from solver.optimize import build_problem
from solver.spec import JobSpec, ParallelConfig
from solver.spec.features import FrameworkFeatures
from solver.spec.framework import RECOMPUTE_MODULES

MIXTRAL = load_model_spec("mixtral-8x7b")  # h 4096, 32 heads (8 KV), 8 experts top-2, F_e 14336
S = 4096
SELECTIVE = ParallelConfig(tp=1, pp=1, dp=8, ep=8, micro_batch=1, recompute="selective")


def _moe_layer_bytes_per_token(modules: tuple[str, ...], offload: bool) -> float:
    job = JobSpec(seq_len=S, global_batch=64)
    options = MemoryOptions(recompute_modules=modules, activation_offload=offload)
    terms = estimate_activation_terms(MIXTRAL, job, Candidates.from_configs([SELECTIVE]), options)
    return float(terms["layer"][0, 1]) / S


def test_offload_moves_what_the_recomputed_moe_layer_still_saves() -> None:
    """Mixtral-8x7B MoE layer, bf16, tp 1, capacity factor 1.25 (2.5 routed copies a token),
    selective core_attn + moe_act, per token. Saved (activations.py, Korthikanti Table 2
    generalised): attention Q, K, V 2 x (4096 + 1024 + 1024) + projection input 2 x 4096 +
    norm and QKV inputs 4h = 36,864; MoE block 2.5 x (dispatched input and output 4h + act
    input 2F_e + fc2 input 2F_e) + norm output and MLP input 4h + router scores 4 x 8 =
    200,736; moe_act drops the fc2 inputs 2.5 x 2F_e = 71,680: 165,920 kept. The offload
    groups (fine_grained_activation_offload.py, attention.py / experts.py group_offload) move
    core_attn's saved Q, K, V (12,288: the recomputed core keeps its checkpoint's inputs),
    attn_proj's input (8,192), expert_fc1's input 2.5 x 2h (20,480) and moe_act's input
    2.5 x 2F_e (71,680: saved by its checkpoint): 112,640. Left: 53,280 B per token, 218.2 MB
    per layer at s 4096."""
    assert _moe_layer_bytes_per_token(("core_attn", "moe_act"), False) == pytest.approx(165_920)
    kept = _moe_layer_bytes_per_token(("core_attn", "moe_act"), True)
    assert kept == pytest.approx(165_920 - (12_288 + 8_192 + 20_480 + 71_680))
    assert kept == pytest.approx(53_280)
    assert kept * S / 1e6 == pytest.approx(218.2, abs=0.1)
    # moe recomputes the whole block but its input (the MoE layer's hidden states, 2h) and
    # keeps the attention's 36,864 B: 45,056 B, with nothing left inside it to offload.
    assert _moe_layer_bytes_per_token(("core_attn", "moe"), False) == pytest.approx(45_056)


def test_offload_with_the_moe_module_recomputed_is_refused_as_megatron_refuses_it() -> None:
    """`estimate` and `launch` refuse --activation-offload with --recompute-modules moe on a
    MoE model in one line naming the rule, exit 2 (estimate crashed with a traceback on -8.3 GB
    of activations for Mixtral-8x7B before, launch emitted flags Megatron rejects); a dense model offloads core_attn and attn_proj only, which Megatron takes with
    moe in the module list; without selective recompute the list is not used."""
    args = ["estimate", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", str(S),
            "--recompute", "selective", "--recompute-modules", "core_attn,moe",
            "--activation-offload"]
    moe = CliRunner().invoke(cli, [*args, "--model", "mixtral-8x7b", "--ep", "8"])
    assert moe.exit_code == 2, moe.output
    assert ("--activation-offload with --recompute selective --recompute-modules core_attn moe: "
            "offload_not_inside_recomputed_moe") in moe.output
    assert "Traceback" not in moe.output
    # launch would have emitted --recompute-modules core_attn moe with --offload-modules
    # core_attn attn_proj expert_fc1 moe_act, which Megatron's config check rejects.
    launch = CliRunner().invoke(cli, ["launch", "--format", "megatron", "--model",
                                      "mixtral-8x7b", "--ep", "8", *args[1:]])
    assert launch.exit_code == 2, launch.output
    assert "offload_not_inside_recomputed_moe" in launch.output
    dense = CliRunner().invoke(cli, [*args, "--model", "llama3.1-8b"])
    assert dense.exit_code == 0, dense.output
    assert refuse_activation_offload(MIXTRAL, ("moe",), "none") is None
    assert refuse_activation_offload(MIXTRAL, ("moe_act",), "selective") is None
    assert "offload_not_with_full_recompute" in refuse_activation_offload(MIXTRAL, (), "full")


def test_the_search_offloads_activations_only_where_megatron_does() -> None:
    """`optimize` with --recompute-modules moe and --activation-offload on a MoE model keeps
    the recompute levels the offload runs with (none); pinned to selective it is refused."""
    features = FrameworkFeatures(recompute_modules=("moe",), activation_offload=True)
    problem = build_problem("mixtral-8x7b", "dgx-h100", 64, seq_len=S, features=features)
    assert problem.pins["recompute"] == (0,)
    with pytest.raises(InputError, match="offload_not_inside_recomputed_moe"):
        build_problem("mixtral-8x7b", "dgx-h100", 64, seq_len=S, features=features,
                      pins={"recompute": (1,)})
    dense = build_problem("llama3.1-8b", "dgx-h100", 8, seq_len=S, features=features)
    assert dense.pins["recompute"] == (0, 1)


HYBRID_MODELS = [load_model_spec("qwen3-next-80b-a3b"), load_model_spec("gemma2-9b")]


@st.composite
def memory_options(draw, model_spec, config) -> MemoryOptions:
    """Any option combination the planner takes for `config`: any module set (Megatron's
    attention_core selective) or torchtitan's op level, activation offload where
    refuse_activation_offload takes it, layer-level CPU offloading where check_layer_offload
    does."""
    modules = tuple(sorted(draw(st.sets(st.sampled_from(RECOMPUTE_MODULES), min_size=1))))
    offload = draw(st.booleans())
    # torchtitan's op level has no activation offload (UNSUPPORTED in solver.cost.step.frameworks)
    selective = "attention_core" if offload else draw(st.sampled_from(["attention_core",
                                                                        "op_level"]))
    assume(not offload or refuse_activation_offload(model_spec, modules,
                                                    config.recompute) is None)
    # Layer-level CPU offloading runs at pp 1 without recompute or fine-grained offload.
    alone = config.pp == 1 and config.recompute == "none" and not offload
    layers = draw(st.integers(0, model_spec.num_hidden_layers - 1)) if alone else 0
    constants = TimeConstants().model_copy(update={"cpu_offloading_num_layers": layers,
                                                   "activation_offload": offload})
    try:
        check_layer_offload(constants, model_spec, None, (config.pp,), (config.recompute,))
    except InputError:
        assume(False)
    return MemoryOptions(
        recompute_modules=modules, selective_recompute=selective, activation_offload=offload,
        cpu_offloading_num_layers=layers, fused_elementwise=draw(st.booleans()),
        flash_attention=draw(st.booleans()), dropout=draw(st.booleans()),
        sequence_parallel=draw(st.booleans()), rmsnorm_fp32_copy=draw(st.booleans()),
        keep_stage_outputs=draw(st.booleans()), include_mtp=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_every_item_and_term_is_non_negative(data) -> None:
    model_spec, job, config = data.draw(problems(models=[*MODELS, QK_NORM, *HYBRID_MODELS]))
    _assert_non_negative(model_spec, job, config, data.draw(memory_options(model_spec, config)))


@settings(max_examples=100, deadline=None)
@given(problems(models=[m for m in [*MODELS, *HYBRID_MODELS] if m.is_moe]),
       st.sets(st.sampled_from(RECOMPUTE_MODULES), min_size=1), st.booleans())
def test_offload_with_any_module_set_is_refused_or_non_negative(problem, modules,
                                                                fused) -> None:
    """MoE models, selective recompute, activation offload, any module set: refused exactly
    where the set holds moe, every term >= 0 otherwise."""
    model_spec, job, config = problem
    config = config.model_copy(update={"recompute": "selective"})
    options = MemoryOptions(recompute_modules=tuple(sorted(modules)), activation_offload=True,
                            fused_elementwise=fused)
    refused = refuse_activation_offload(model_spec, options.recompute_modules, "selective")
    assert (refused is not None) == ("moe" in modules)
    if refused is None:
        _assert_non_negative(model_spec, job, config, options)


def _assert_non_negative(model_spec, job, config, options: MemoryOptions) -> None:
    stages = estimate_all_stages(model_spec, job, config, options)
    for name in ITEMS:
        assert np.all(np.isfinite(stages.items[name])), name
        assert np.all(stages.items[name] >= 0), (name, stages.items[name])
    assert np.all(stages.total >= 0)
    candidates = Candidates.from_configs([config])
    worst = estimate_memory(model_spec, job, candidates, options)
    for name in ITEMS:
        assert np.all(worst.items[name] >= 0), name
    terms = estimate_activation_terms(model_spec, job, candidates, options)
    for name in ("layer", "first", "last", "not_last", "working", "offload_margin"):
        assert np.all(terms[name] >= 0), (name, terms[name])
    kept = estimate_activation_terms(model_spec, job, candidates, options.model_copy(
        update={"activation_offload": False, "cpu_offloading_num_layers": 0}))
    # Without offload a layer keeps at least its input (the recompute term, input less
    # layer, is <= 0): every recompute module keeps its own input.
    assert np.all(kept["recompute"] <= 1e-9 * np.abs(kept["layer"])), kept["recompute"]
    if options.activation_offload:
        # Offload moves only what a layer saves: each kind's offloaded bytes are within what
        # the layer keeps without the offload.
        offloaded = estimate_kind_offload_bytes(model_spec, job, candidates, options)
        assert np.all(offloaded >= 0)
        assert np.all(offloaded <= kept["layer"] * (1 + 1e-12)), (offloaded, kept["layer"])
