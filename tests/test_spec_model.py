"""ModelSpec arithmetic pinned to published formulas, and its validation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.tomlfile import validate_spec
from solver.errors import InputError
from solver.spec import ModelSpec


def gpt_like(h: int, layers: int, heads: int, vocab: int, **extra: object) -> ModelSpec:
    """A GPT-style block (plain 4h MLP, MHA) without biases, so counts equal 12*L*h^2 + ..."""
    return ModelSpec(
        name="gpt-like",
        hidden_size=h,
        intermediate_size=4 * h,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        vocab_size=vocab,
        mlp_type="plain",
        norm_type="layernorm",
        tie_word_embeddings=True,
        **extra,
    )


def test_flops_per_token_equals_narayanan_eq3_for_gpt3() -> None:
    """Narayanan et al. 2021 (arXiv 2104.04473) §5.1: F = 72 B s L h^2 (1 + s/(6h) + V/(12 h L))
    per iteration, non-causal attention, no recompute. GPT-3 175B: h=12288, L=96, V=51200,
    s=2048. Per token that is 1.0764e12 FLOPs; our count differs only by the biases-free
    block's layer norms (excluded from GEMMs), so it must match to 1e-9."""
    h, layers, vocab, s = 12288, 96, 51200, 2048
    spec = gpt_like(h, layers, 96, vocab)
    expected = 72 * s * layers * h**2 * (1 + s / (6 * h) + vocab / (12 * h * layers)) / s
    assert expected == pytest.approx(1.0764e12, rel=1e-3)
    assert spec.flops_per_token(s, causal=False) == pytest.approx(expected, rel=1e-9)


def test_causal_attention_halves_only_the_attention_term() -> None:
    """PaLM (arXiv 2204.02311) App. B: 6N + 12*L*H*Q*T per token counts the full s^2;
    causal masking halves the attention part only."""
    spec = gpt_like(4096, 32, 32, 50257)
    s = 8192
    attention_full = 12 * 32 * 4096 * s
    diff = spec.flops_per_token(s, causal=False) - spec.flops_per_token(s, causal=True)
    assert diff == pytest.approx(attention_full / 2, rel=1e-12)


def test_gpt3_parameter_count_matches_kaplan_formula() -> None:
    """Kaplan et al. 2020 / Narayanan 2021: P = 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)) for a
    GPT block with biases, LayerNorm and learned positions. GPT-3: 174.6B (published "175B")."""
    h, layers, vocab, s = 12288, 96, 50257, 2048
    spec = gpt_like(
        h, layers, 96, vocab, qkv_bias=True, o_bias=True, mlp_bias=True,
        position_embedding_type="learned", max_position_embeddings=s,
    )
    kaplan = 12 * layers * h**2 * (1 + 13 / (12 * h) + (vocab + s) / (12 * layers * h))
    # Kaplan's 13h per layer = 9h biases + 4h LayerNorm; the final LayerNorm (2h) is extra.
    assert spec.total_params == pytest.approx(kaplan + 2 * h, rel=1e-12)
    assert spec.total_params == pytest.approx(175e9, rel=0.01)


def test_moe_active_params_count_top_k_experts() -> None:
    """Mixtral 8x7B (arXiv 2401.04088 §2): 46.7B total, 12.9B active (2 of 8 experts)."""
    spec = ModelSpec(
        name="mixtral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, num_experts=8,
        num_experts_per_tok=2, moe_intermediate_size=14336,
    )
    assert spec.total_params == pytest.approx(46.7e9, rel=0.005)
    assert spec.active_params == pytest.approx(12.9e9, rel=0.005)
    per_expert = 3 * 4096 * 14336
    assert spec.total_params - spec.active_params == 32 * 6 * per_expert


def test_first_k_dense_and_layer_frequency() -> None:
    spec = ModelSpec(
        name="m", hidden_size=64, intermediate_size=128, num_hidden_layers=10,
        num_attention_heads=4, vocab_size=100, num_experts=4, num_experts_per_tok=1,
        moe_intermediate_size=32, first_k_dense_layers=3, moe_layer_freq=2,
    )
    assert spec.num_moe_layers == 3  # layers 4, 6, 8
    assert spec.num_dense_layers == 7
    assert sum(spec.breakdown().values()) == spec.total_params


BAD_MODELS = [
    ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"hidden_size": 66}, "give head_dim"),
    ({"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 8}, "between 1"),
    ({"num_experts": 8, "num_experts_per_tok": 2}, "moe_intermediate_size"),
    ({"num_experts_per_tok": 2}, "num_experts > 0"),
    ({"kv_lora_rank": 512}, "multi-head latent attention"),
    ({"q_lora_rank": 64}, "q_lora_rank"),
    ({"hidden_size": -1}, "hidden_size"),
    ({"hiden_size": 10}, "hiden_size"),
    ({"mlp_type": "swiglu"}, "mlp_type"),
    ({"num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 8,
      "first_k_dense_layers": 8}, "no MoE layer"),
]


@pytest.mark.parametrize(("change", "needle"), BAD_MODELS)
def test_bad_model_fields_give_one_line_naming_the_problem(change: dict, needle: str) -> None:
    data = {
        "name": "m", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 8,
        "num_attention_heads": 4, "vocab_size": 100, **change,
    }
    with pytest.raises(InputError) as info:
        validate_spec(ModelSpec, data, "models/m.toml")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("models/m.toml: field ")
    assert needle in message


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=6,
)
field_names = st.sampled_from(sorted(ModelSpec.model_fields)) | st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(field_names, json_values, max_size=12))
def test_arbitrary_dicts_raise_only_input_error(data: dict) -> None:
    try:
        spec = validate_spec(ModelSpec, data, "x.toml")
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert spec.total_params > 0
    assert spec.active_params <= spec.total_params


@settings(max_examples=200, deadline=None)
@given(
    h_per_head=st.integers(1, 64), heads=st.integers(1, 16), kv_div=st.integers(1, 4),
    layers=st.integers(1, 12), experts=st.integers(0, 16), top_k=st.integers(1, 4),
    first_dense=st.integers(0, 3), freq=st.integers(1, 3), shared=st.integers(0, 2),
)
def test_breakdown_adds_up_and_active_never_exceeds_total(
    h_per_head: int, heads: int, kv_div: int, layers: int, experts: int, top_k: int,
    first_dense: int, freq: int, shared: int,
) -> None:
    kv = heads // kv_div if heads % kv_div == 0 else heads
    moe = {}
    if experts and first_dense < layers:
        moe = dict(num_experts=experts, num_experts_per_tok=min(top_k, experts),
                   moe_intermediate_size=16, first_k_dense_layers=first_dense,
                   moe_layer_freq=freq, num_shared_experts=shared)
    try:
        spec = ModelSpec(
            name="p", hidden_size=h_per_head * heads, intermediate_size=32,
            num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
            vocab_size=50, **moe,
        )
    except ValueError:
        return  # e.g. the frequency leaves no MoE layer: refused, checked above
    assert sum(spec.breakdown().values()) == spec.total_params
    assert 0 < spec.active_params <= spec.total_params
    assert spec.matmul_params_active > 0
