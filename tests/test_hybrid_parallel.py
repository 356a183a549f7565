"""How the frameworks build and split models with block patterns: Megatron's flags for windows
and gated DeltaNet, its Mamba hybrid over pipeline stages (solver.emit.megatron_hybrid), and
context parallelism of Mamba-2 and gated DeltaNet (solver.search.constraints
block_cp_constraints and megatron_linear_attention_no_cp, solver.cost.layers.blocks
estimate_mixer_cp_s)."""

from __future__ import annotations

import json
import shlex

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.clusters import load_cluster_spec
from solver.catalog.zoo import load_model_spec
from solver.cli import cli
from solver.cost.layers.blocks import estimate_mixer_cp_s
from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.emit.megatron_hybrid import (
    layer_symbols,
    mamba_stack_split_flags,
    render_layer_pattern,
)
from solver.search.constraints import block_cp_constraints
from solver.spec.blocks import render_pattern

# ---- Megatron's flags for windows and gated DeltaNet -------------------------------------------


def eval_pattern(text: str) -> list[int]:
    """What Megatron's arguments.py makes of a list expression (_eval_pattern: eval)."""
    return list(eval(text, {"__builtins__": {}}))  # noqa: S307 - our own rendered text


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1), min_size=1, max_size=130))
def test_layer_patterns_render_as_megatron_evaluates_them(pattern: list[int]) -> None:
    assert eval_pattern(render_layer_pattern(pattern)) == pattern


def test_layer_pattern_examples() -> None:
    assert render_layer_pattern([0] * 3 + [1] * 58) == "([0]*3+[1]*58)"  # DeepSeek-V3
    assert render_layer_pattern([1, 1, 1, 0] * 12) == "([1]*3+[0]*1)*12"  # Qwen3-Next


def test_windows_go_out_as_megatron_bridge_converts_them() -> None:
    """gpt-oss-20b (config.json sliding_window 128, alternating): TE's (127, 0), which
    Megatron-Bridge's mcore_to_hf_window_size turns back into 128; 1 marks a sliding layer."""
    spec = load_model_spec("gpt-oss-20b")
    flags, _ = launch_flags("--tp", "2", "--ep", "8", model="gpt-oss-20b")
    left, right = (int(x) for x in flags["--window-size"].strip("()").split(","))
    assert (left + 1, right) == (spec.sliding_window, 0)
    assert eval_pattern(flags["--window-attn-skip-freq"]) == [
        int(mixer == "sliding_attention") for mixer in spec.layer_mixers]


def test_gated_deltanet_goes_out_as_megatrons_experimental_variant() -> None:
    spec = load_model_spec("qwen3-next-80b-a3b")
    flags, _ = launch_flags("--tp", "2", "--ep", "8", model="qwen3-next-80b-a3b")
    assert flags["--experimental-attention-variant"] == "gated_delta_net"
    assert eval_pattern(flags["--linear-attention-freq"]) == [
        int(mixer == "linear_attention") for mixer in spec.layer_mixers]
    assert (flags["--linear-num-key-heads"], flags["--linear-num-value-heads"]) == ("16", "32")
    assert "--attention-output-gate" in flags


def test_interleaved_moe_and_chunked_attention() -> None:
    """Llama 4 Maverick: MoE on every other layer (--moe-layer-freq from the pattern); at
    16384 tokens its 8192-token chunks matter and Megatron-Core cannot build them: warned."""
    spec = load_model_spec("llama4-maverick")
    flags, output = launch_flags("--tp", "8", "--ep", "2", model="llama4-maverick",
                                 seq_len=16384)
    assert eval_pattern(flags["--moe-layer-freq"]) == [
        int(mlp == "moe") for mlp in spec.layer_mlps]
    assert "no chunked attention" in output
    # Its top-1 router: a sigmoid score on the expert's input, which Megatron-Core's check
    # for top-1 softmax routers lets through.
    assert flags["--moe-router-score-function"] == "sigmoid"
    assert "--moe-apply-probs-on-input" in flags


# ---- Megatron's Mamba hybrid over pipeline stages ------------------------------------------------


def mamba_stack_v0_16(num_layers: int, pp: int, first: int | None, last: int | None
                      ) -> list[int]:
    """The layers each rank builds, as core_v0.16.1 megatron/core/ssm/mamba_block.py
    MambaStack._select_layers_for_pipeline_parallel picks them (the reference this file
    checks the emitter against; validate_args and TransformerConfig refuse the splits whose
    divisions leave a remainder)."""
    if first is None and last is None:
        assert num_layers % pp == 0
        return [num_layers // pp] * pp
    ends = [n for n in (first, last) if n is not None]
    middle_stages = pp - len(ends)
    middle = num_layers - sum(ends)
    assert middle_stages == 0 or middle % middle_stages == 0
    share = middle // middle_stages if middle_stages else 0
    counts = [share] * pp
    if first is not None:
        counts[0] = first
    if last is not None:
        counts[-1] = last
    return counts


def select_pipeline_segment(pattern: str, pp: int, rank: int, vp_stage: int) -> str:
    """core_v0.17.0 mamba_hybrid_layer_allocation.py select_pipeline_segment: segment
    vp_stage x pp + rank of the `|`-separated pattern."""
    segments = pattern.split("|")
    assert len(segments) % pp == 0
    return segments[vp_stage * pp + rank]


def launch_flags(*args: str, model: str = "nemotron-h-8b", seq_len: int = 4096
                 ) -> tuple[dict[str, str], str]:
    result = CliRunner().invoke(cli, ["launch", "--model", model, "--cluster", "dgx-h100",
                                      "--gpus", "16", "--seq-len", str(seq_len),
                                      "--global-batch", "64", "--format", "megatron", *args])
    assert result.exit_code == 0, result.output
    body = "\n".join(line for line in result.stdout.splitlines() if not line.startswith("#"))
    tokens = shlex.split(body.replace("\\\n", " "))
    flags: dict[str, str] = {}
    for i, token in enumerate(tokens):
        if token.startswith("--"):
            value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith(
                "--") else ""
            flags[token] = value
    return flags, result.output


def test_even_split_goes_out_as_megatron_0_16_builds_it() -> None:
    """Nemotron-H-8B (52 layers) on pp 4: 13 a rank, MambaStack's own split: the plain
    pattern, no split flag, no layout flag."""
    flags, _ = launch_flags("--pp", "4", "--tp", "2")
    nemotron = load_model_spec("nemotron-h-8b")
    assert flags["--hybrid-override-pattern"] == render_pattern(nemotron.layer_mixers,
                                                                nemotron.layer_mlps)
    assert "--hybrid-layer-pattern" not in flags
    assert "--pipeline-model-parallel-layout" not in flags
    assert "--decoder-first-pipeline-num-layers" not in flags


def test_first_and_last_rank_split_uses_megatrons_uneven_flags() -> None:
    flags, _ = launch_flags("--pp", "4", "--tp", "2", "--layout", "Et*10|t*16|t*16|t*10L")
    assert flags["--decoder-first-pipeline-num-layers"] == "10"
    assert flags["--decoder-last-pipeline-num-layers"] == "10"
    assert mamba_stack_v0_16(52, 4, 10, 10) == [10, 16, 16, 10]
    assert "--hybrid-layer-pattern" not in flags


@pytest.mark.parametrize(("pp", "vpp", "layout", "counts"), [
    (4, 1, "Et*14|t*12|t*13|t*13L", [14, 12, 13, 13]),
    (2, 2, "Et*12|t*14|t*14|t*12L", [12, 14, 14, 12]),
])
def test_other_splits_go_out_as_pattern_segments(pp: int, vpp: int, layout: str,
                                                 counts: list[int]) -> None:
    """Splits core_v0.16 cannot build (uneven middle ranks, virtual stages): the pattern cut
    into the planned segments, which core_v0.17's select_pipeline_segment hands each rank and
    virtual stage exactly as planned, with a note naming the version."""
    flags, output = launch_flags("--pp", str(pp), "--vpp", str(vpp), "--tp", "2", "--layout",
                                 layout)
    segmented = flags["--hybrid-layer-pattern"]
    spec = load_model_spec("nemotron-h-8b")
    assert segmented.replace("|", "") == render_pattern(spec.layer_mixers, spec.layer_mlps)
    symbols = layer_symbols(spec)
    start = 0
    for v, count in enumerate(counts):
        rank, chunk = v % pp, v // pp
        assert select_pipeline_segment(segmented, pp, rank, chunk) == "".join(
            symbols[start:start + count])
        start += count
    assert "--hybrid-override-pattern" not in flags
    assert "--pipeline-model-parallel-layout" not in flags
    assert "0.17" in output


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(min_value=2, max_value=8), data=st.data())
def test_split_flags_build_exactly_the_planned_layers(pp: int, data: st.DataObject) -> None:
    """Whatever split the flags claim core_v0.16 builds, its MambaStack builds exactly; and
    every split it can build (even, first and/or last rank) is recognised."""
    num_layers = data.draw(st.integers(min_value=pp, max_value=120))
    cuts = sorted(data.draw(st.lists(st.integers(min_value=1, max_value=num_layers - 1),
                                     min_size=pp - 1, max_size=pp - 1, unique=True)))
    layers = [b - a for a, b in zip([0, *cuts], [*cuts, num_layers])]
    flags = mamba_stack_split_flags(layers, pp, 1)
    if flags is not None:
        given_flags = dict(flags)
        first = given_flags.get("--decoder-first-pipeline-num-layers")
        last = given_flags.get("--decoder-last-pipeline-num-layers")
        assert mamba_stack_v0_16(num_layers, pp, first and int(first),
                                 last and int(last)) == layers
    middle = layers[1:-1]
    if len(set(middle)) <= 1 and (not middle or (num_layers - layers[0] - layers[-1])
                                  % len(middle) == 0):
        assert flags is not None
    assert mamba_stack_split_flags(layers, pp, 2) is None  # no virtual stages in v0.16


# ---- context parallelism of the recurrent mixers -------------------------------------------------


def mamba_context_parallel_accepts(heads: int, groups: int, tp: int, cp: int) -> bool:
    """The asserts of core_v0.16.1 megatron/core/ssm/mamba_context_parallel.py
    MambaContextParallel.__init__ (after MambaMixer's nheads % tp and ngroups % tp)."""
    if cp == 1:
        return True
    local_heads, local_groups = heads // tp, groups // tp
    if local_heads % cp:
        return False
    if local_groups < cp:
        return cp % local_groups == 0
    return local_groups % cp == 0


@pytest.mark.parametrize("name", ["nemotron-h-8b", "nemotron-3-nano-30b-a3b"])
def test_cp_rule_is_megatrons_mamba_context_parallel(name: str) -> None:
    spec = load_model_spec(name)
    (rule,) = block_cp_constraints(spec)
    assert rule.name == "cp_splits_mamba_heads"
    tps = [t for t in (1, 2, 4, 8) if spec.n_groups % t == 0]
    grid = np.array([(tp, cp) for tp in tps for cp in range(1, 33)])
    allowed = rule.check({"tp": grid[:, 0], "cp": grid[:, 1]})
    for (tp, cp), ok in zip(grid, allowed):
        assert ok == mamba_context_parallel_accepts(spec.mamba_num_heads, spec.n_groups,
                                                    tp, cp), (tp, cp)


def test_cp_rule_for_gated_deltanet_needs_whole_key_heads() -> None:
    """Qwen3-Next: 16 key heads (32 value heads): core_v0.18.0 gated_delta_net.py splits the
    key and value heads of a TP rank over cp."""
    (rule,) = block_cp_constraints(load_model_spec("qwen3-next-80b-a3b"))
    assert rule.name == "cp_splits_linear_heads"
    tp, cp = np.array([1, 4, 4, 2, 8]), np.array([16, 4, 8, 3, 2])
    assert rule.check({"tp": tp, "cp": cp}).tolist() == [True, True, False, False, True]
    assert block_cp_constraints(load_model_spec("llama3.1-8b")) == []


def test_megatron_refuses_context_parallel_gated_deltanet() -> None:
    """Megatron-Core 0.16's gated DeltaNet has no CP ("TODO: support CP"): pinned to cp 2 the
    Megatron problem has no plan and names the rule; without the framework's rules it has."""
    common = ["optimize", "--model", "qwen3-next-80b-a3b", "--cluster", "dgx-h100", "--gpus",
              "32", "--seq-len", "8192", "--global-batch", "64", "--cp", "2", "--top", "1",
              "--time-limit", "2", "--json"]
    result = CliRunner().invoke(cli, [*common, "--framework", "megatron"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["status"] == "infeasible"
    assert "megatron_linear_attention_no_cp" in answer["conflicts"]
    generic = json.loads(CliRunner().invoke(cli, [*common, "--framework", "generic"]).output)
    assert generic["status"] != "infeasible"
    # Launched anyway (pinned degrees), the Megatron file says which version it needs.
    _, output = launch_flags("--tp", "2", "--cp", "2", "--ep", "4", model="qwen3-next-80b-a3b",
                             seq_len=8192)
    assert "without context parallelism" in output


@pytest.mark.parametrize(("name", "mixer", "width"), [
    # z, x, B, C, dt in, y out: 3 x 8192 + 2 x 8 x 128 + 128
    ("nemotron-h-8b", "mamba", 26_752),
    # q, k (2 x 2048), v, z (2 x 4096), beta, alpha (2 x 32) in, the norm's output (4096) out
    ("qwen3-next-80b-a3b", "linear_attention", 16_448),
])
def test_cp_all_to_alls_move_what_megatron_moves(name: str, mixer: str, width: int) -> None:
    spec, cluster = load_model_spec(name), load_cluster_spec("dgx-h100")
    d = {"tp": np.array([2.0, 2.0]), "cp": np.array([1.0, 4.0])}
    rows = np.array([8192.0, 8192.0])
    seconds = estimate_mixer_cp_s(spec, cluster, d, mixer, rows)
    link = estimate_group_link(cluster, d["tp"], d["cp"], all_to_all=True)
    expected = estimate_collective_s("all_to_all", rows / d["tp"] * width * 2.0, d["cp"], link)
    assert seconds[0] == 0.0 and seconds[1] == expected[1] > 0


# Flags the block patterns add, each checked in NVIDIA/Megatron-LM: TransformerConfig fields
# that ArgumentGroupFactory turns into flags (core_v0.16.1 transformer_config.py:
# is_hybrid_model, mamba_state_dim, mamba_head_dim, mamba_num_groups, mamba_num_heads,
# experimental_attention_variant, linear_conv_kernel_dim, linear_key_head_dim,
# linear_value_head_dim, linear_num_key_heads, linear_num_value_heads,
# attention_output_gate), arguments.py's own (core_v0.16.1: --window-size,
# --window-attn-skip-freq, --linear-attention-freq, --hybrid-override-pattern) and core_v0.17.0's
# --hybrid-layer-pattern.
BLOCK_FLAGS = {
    "--is-hybrid-model", "--mamba-state-dim", "--mamba-head-dim", "--mamba-num-groups",
    "--mamba-num-heads", "--experimental-attention-variant", "--linear-conv-kernel-dim",
    "--linear-key-head-dim", "--linear-value-head-dim", "--linear-num-key-heads",
    "--linear-num-value-heads", "--attention-output-gate", "--window-size",
    "--window-attn-skip-freq", "--linear-attention-freq", "--hybrid-override-pattern",
    "--hybrid-layer-pattern",
    # top-1 routers (TransformerConfig moe_router_pre_softmax, moe_apply_probs_on_input)
    "--moe-router-pre-softmax", "--moe-apply-probs-on-input",
    # LatentMoE: TransformerConfig.moe_latent_size, a flag through arguments.py's
    # ArgumentGroupFactory(TransformerConfig) (core_v0.16.1; asserted at arguments.py:1269)
    "--moe-latent-size",
    # Nemotron-H's squared-ReLU MLPs (core_v0.16.1 arguments.py _add_network_size_args)
    "--squared-relu",
}


@pytest.mark.parametrize(("model", "args"), [
    ("nemotron-3-nano-30b-a3b", ["--tp", "2", "--pp", "2", "--ep", "4"]),
    ("nemotron-h-8b", ["--pp", "2", "--vpp", "2"]),
    ("qwen3-next-80b-a3b", ["--tp", "2", "--ep", "8"]),
    ("gpt-oss-20b", ["--tp", "2", "--ep", "8"]),
    ("llama4-maverick", ["--tp", "8", "--ep", "2"]),
])
def test_block_flags_exist_in_megatron_lm(model: str, args: list[str]) -> None:
    from test_emit_frameworks import MEGATRON_LM_FLAGS

    flags, _ = launch_flags(*args, model=model, seq_len=8192)
    assert set(flags) <= MEGATRON_LM_FLAGS | BLOCK_FLAGS, set(flags) - MEGATRON_LM_FLAGS


@pytest.mark.parametrize(("model", "degrees"), [
    ("qwen3-next-80b-a3b", {"tp": 2, "ep": 8}),
    ("gpt-oss-20b", {"tp": 2, "ep": 8}),
    ("nemotron-h-8b", {"tp": 2, "pp": 2}),
    ("nemotron-3-nano-30b-a3b", {"tp": 2, "ep": 8}),
    ("llama4-maverick", {"tp": 8, "ep": 2}),
    ("llama4-scout", {"tp": 8, "ep": 2}),
])
def test_megatron_core_accepts_the_block_flags(model: str, degrees: dict) -> None:
    """The flags fed to megatron-core 0.16's TransformerConfig (solver.emit.validate; the
    frameworks extra, which .ci/run installs): windows, gated DeltaNet, Mamba sizes and
    Llama 4's top-1 router pass its __post_init__ checks."""
    from test_launch_frameworks import make_target, need

    from solver.emit.formats import render_launch
    from solver.emit.validate import validate_emitted

    need("megatron", "core_v0.16")
    target = make_target(model, "dgx-h100", 16, global_batch=64, **degrees)
    line = validate_emitted("megatron", target, render_launch("megatron", target))
    assert line.startswith("megatron@core_v0.16: accepted by "), line
