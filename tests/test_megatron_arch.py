"""Megatron arguments carry the model's rotary base, RoPE scaling and dropout (issue 39 item 7).

Sources: meta-llama/Llama-3.1-8B config.json (tests/data/hf_configs/llama3.1-8b.json):
rope_theta 500000, rope_scaling llama3 factor 8 / low 1 / high 4 / original 8192,
attention_dropout 0.0 (LlamaDecoderLayer has no residual dropout); Megatron-LM core_v0.16.1
megatron/training/arguments.py _add_network_size_args: --rotary-base (int, default 10000),
--use-rope-scaling, --rope-scaling-factor (default 8.0); rotary_pos_embedding.py
RotaryEmbedding._apply_scaling fixes low 1, high 4, original 8192; TransformerConfig
attention_dropout / hidden_dropout default 0.1. Before this change the flags had none of them,
so Megatron trained Llama 3.1 with base 10000, no scaling and dropout 0.1.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.hf import model_spec_from_hf_config
from solver.catalog.zoo import load_model_spec
from solver.emit.megatron import render_megatron
from solver.emit.megatron_model import build_rope_flags
from solver.emit.target import LaunchTarget
from test_emit_frameworks import make_target, megatron_tokens

LLAMA31_CONFIG = Path(__file__).resolve().parent / "data" / "hf_configs" / "llama3.1-8b.json"
ARCH_FLAGS = ("--rotary-base", "--use-rope-scaling", "--rope-scaling-factor",
              "--attention-dropout", "--hidden-dropout")


def arch_of(tokens: list[str]) -> dict[str, str | None]:
    """The rope and dropout flags of a token list, each with its value (None: a switch)."""
    found: dict[str, str | None] = {}
    for i, token in enumerate(tokens):
        if token in ARCH_FLAGS:
            following = tokens[i + 1] if i + 1 < len(tokens) else "--"
            found[token] = None if following.startswith("--") else following
    return found


def with_model(target: LaunchTarget, **update: object) -> LaunchTarget:
    return replace(target, model_spec=target.model_spec.model_copy(update=update))


def test_llama31_8b_rotary_base_scaling_and_dropout() -> None:
    emitted = render_megatron(make_target("llama3.1-8b", 8, tp=2))
    assert arch_of(megatron_tokens(make_target("llama3.1-8b", 8, tp=2))) == {
        "--rotary-base": "500000", "--use-rope-scaling": None, "--rope-scaling-factor": "8",
        "--attention-dropout": "0", "--hidden-dropout": "0"}
    assert not [w for w in emitted.warnings if "rope" in w or "rotary" in w]


def test_zoo_file_and_hf_config_agree_and_emit_the_same_flags() -> None:
    """The hand-written models/llama3.1-8b.toml and the imported config.json give the same
    rope and dropout fields, and so the same Megatron flags."""
    config = json.loads(LLAMA31_CONFIG.read_text())
    imported = model_spec_from_hf_config(config, "llama3.1-8b/config.json")
    zoo = load_model_spec("llama3.1-8b")
    assert imported.rope_theta == zoo.rope_theta == config["rope_theta"] == 500000.0
    assert imported.rope_scaling == zoo.rope_scaling
    table = config["rope_scaling"]
    assert zoo.rope_scaling is not None and zoo.rope_scaling.rope_type == table["rope_type"]
    for key in ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings"):
        assert getattr(zoo.rope_scaling, key) == table[key], key
    assert imported.attention_dropout == zoo.attention_dropout == config["attention_dropout"]
    target = make_target("llama3.1-8b", 8, tp=2)
    assert (megatron_tokens(with_model(target, **{
        key: getattr(imported, key) for key in
        ("rope_theta", "rope_scaling", "attention_dropout", "hidden_dropout")}))
        == megatron_tokens(target))


def test_model_without_scaling_gets_its_base_and_no_scaling() -> None:
    """Llama 2 (meta-llama/Llama-2-7b-hf config.json rope_theta 10000.0, rope_scaling null)."""
    assert arch_of(megatron_tokens(make_target("llama2-7b", 8))) == {
        "--rotary-base": "10000", "--attention-dropout": "0", "--hidden-dropout": "0"}


def test_dropout_follows_the_model() -> None:
    target = with_model(make_target("llama2-7b", 8), attention_dropout=0.1, hidden_dropout=0.05)
    found = arch_of(megatron_tokens(target))
    assert (found["--attention-dropout"], found["--hidden-dropout"]) == ("0.1", "0.05")


def test_what_megatron_cannot_express_is_a_warning() -> None:
    """gpt-oss's YaRN (factor 32) has no Megatron-LM core_v0.16 flag for a non-MLA model; a
    Llama 3 band other than Megatron's fixed 1 / 4 / 8192 is named; no rope_theta: the default
    10000 is said; a fractional base cannot go into the int flag."""
    gpt_oss = render_megatron(make_target("gpt-oss-20b", 8, ep=8))
    assert any("rope_scaling yarn (factor 32) is not in the flags" in w
               for w in gpt_oss.warnings)
    assert "--use-rope-scaling" not in gpt_oss.settings
    llama = load_model_spec("llama3.1-8b")
    assert llama.rope_scaling is not None
    wide = llama.model_copy(update={"rope_scaling": llama.rope_scaling.model_copy(
        update={"high_freq_factor": 2.0})})
    flags, warnings = build_rope_flags(wide)
    assert ("--rope-scaling-factor", "8") in flags
    assert warnings == ["rope_scaling high_freq_factor is 2 but Megatron's Llama 3 scaling "
                        "fixes it at 4: the model trains with 4"]
    flags, warnings = build_rope_flags(llama.model_copy(
        update={"rope_theta": None, "rope_scaling": None}))
    assert flags == [] and "--rotary-base default 10000" in warnings[0]
    flags, warnings = build_rope_flags(llama.model_copy(update={"rope_theta": 10000.5}))
    assert not [f for f in flags if f[0] == "--rotary-base"] and "not an integer" in warnings[0]


@settings(max_examples=30, deadline=None)
@given(theta=st.integers(min_value=1, max_value=10**9),
       factor=st.sampled_from([2.0, 8.0, 16.0, 32.0]))
def test_rope_flags_carry_the_spec_values(theta: int, factor: float) -> None:
    llama = load_model_spec("llama3.1-8b")
    assert llama.rope_scaling is not None
    spec = llama.model_copy(update={"rope_theta": float(theta), "rope_scaling":
                                    llama.rope_scaling.model_copy(update={"factor": factor})})
    flags, warnings = build_rope_flags(spec)
    assert flags == [("--rotary-base", str(theta)), ("--use-rope-scaling",),
                     ("--rope-scaling-factor", f"{factor:g}")]
    assert warnings == []


def test_bridge_overrides_carry_the_same_architecture() -> None:
    """Megatron-Bridge 0.3.1 GPTModelProvider fields (gpt_provider.py: rotary_base,
    rope_scaling, rope_scaling_factor; TransformerConfig attention_dropout, hidden_dropout):
    Llama 3.1 8B's values, as its Bridge provider Llama31ModelProvider8B has them
    (llama_provider.py: rotary_base 500_000, rope_scaling True, rope_scaling_factor 8.0)."""
    from solver.emit.bridge import build_bridge_overrides, render_bridge

    target = make_target("llama3.1-8b", 8, tp=2)
    overrides, _, _ = build_bridge_overrides(target)
    assert {key: overrides[key] for key in (
        "model.rotary_base", "model.rope_scaling", "model.rope_scaling_factor",
        "model.attention_dropout", "model.hidden_dropout")} == {
        "model.rotary_base": 500000, "model.rope_scaling": True,
        "model.rope_scaling_factor": 8, "model.attention_dropout": 0,
        "model.hidden_dropout": 0}
    assert "model.use_rope_scaling" not in overrides
    assert "model.rope_scaling=true" in render_bridge(target).text
    llama2 = build_bridge_overrides(make_target("llama2-7b", 8))[0]
    assert llama2["model.rotary_base"] == 10000 and "model.rope_scaling" not in llama2


def test_gpt2_style_dropout_keys_are_read() -> None:
    """openai-community/gpt2 config.json (tests/data/hf_configs/gpt2.json): attn_pdrop 0.1,
    resid_pdrop 0.1 are its attention and residual dropouts, Megatron's attention_dropout and
    hidden_dropout (the bias-dropout-add after attention and MLP)."""
    config = json.loads((LLAMA31_CONFIG.parent / "gpt2.json").read_text())
    spec = model_spec_from_hf_config(config, "gpt2/config.json")
    assert (spec.attention_dropout, spec.hidden_dropout) == (0.1, 0.1)
    assert spec.rope_theta is None
