"""Nemotron-H configs as the newer transformers NemotronHConfig writes them
(models/nemotron_h/configuration_nemotron_h.py): the list `layers_block_type` instead of
`hybrid_override_pattern` (_pattern_to_list: M linear_attention, E moe, * full_attention,
- mlp; remap_legacy_layer_types: mamba, attention), the depth taken from the list, and
LatentMoE (`moe_latent_size`, Nemotron 3 Super and Ultra) read as the experts' width."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solver.catalog.hf import model_spec_from_hf_config
from solver.errors import InputError

CONFIG = Path(__file__).resolve().parent / "data" / "hf_configs" / "nemotron-3-nano-30b-a3b.json"
NAMES = {"M": "linear_attention", "E": "moe", "*": "full_attention", "-": "mlp"}
LEGACY = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}


def as_block_list(names: dict[str, str], **update: object) -> dict:
    config = json.loads(CONFIG.read_text(encoding="utf-8"))
    pattern = config.pop("hybrid_override_pattern")
    config.pop("num_hidden_layers")
    return {**config, "layers_block_type": [names[letter] for letter in pattern], **update}


@pytest.mark.parametrize("names", [NAMES, LEGACY], ids=["current", "legacy"])
def test_layers_block_type_reads_as_the_pattern(names: dict[str, str]) -> None:
    pattern = model_spec_from_hf_config(json.loads(CONFIG.read_text(encoding="utf-8")), "p")
    listed = model_spec_from_hf_config(as_block_list(names), "l")
    assert listed.breakdown() == pattern.breakdown()
    assert (listed.layer_mixers, listed.layer_mlps) == (pattern.layer_mixers, pattern.layer_mlps)


def test_the_list_sets_the_depth() -> None:
    """num_hidden_layers is deprecated there: a stale value is ignored, as HF does."""
    spec = model_spec_from_hf_config(as_block_list(NAMES, num_hidden_layers=3), "l")
    assert spec.num_hidden_layers == 52


@pytest.mark.parametrize(("update", "problem"), [
    ({"moe_latent_size": 0}, "key 'moe_latent_size'"),
    ({"layers_block_type": ["mamba", "conv"]}, "key 'layers_block_type': entries must be"),
    ({"layers_block_type": []}, "key 'layers_block_type': must list at least one layer"),
])
def test_what_cannot_be_read_is_one_line_naming_the_key(update: dict, problem: str) -> None:
    with pytest.raises(InputError) as caught:
        model_spec_from_hf_config(as_block_list(NAMES, **update), "super.json")
    assert problem in str(caught.value) and str(caught.value).startswith("super.json: ")


def test_a_null_latent_size_is_plain_moe() -> None:
    spec = model_spec_from_hf_config(as_block_list(NAMES, moe_latent_size=None), "l")
    assert spec.num_experts == 128
    assert spec.moe_latent_size is None and spec.moe_token_width == spec.hidden_size


def test_a_latent_size_moves_the_experts_to_it() -> None:
    """transformers NemotronHMoE: with moe_latent_size the experts are NemotronHMLP(
    hidden_size=moe_latent_size) between fc1_latent_proj (h -> latent) and fc2_latent_proj
    (latent -> h); router and shared expert stay at h."""
    plain = model_spec_from_hf_config(as_block_list(NAMES), "p")
    latent = model_spec_from_hf_config(as_block_list(NAMES, moe_latent_size=512), "l")
    h, width = plain.hidden_size, plain.moe_intermediate_size
    assert plain.expert_params == 2 * h * width
    assert latent.expert_params == 2 * 512 * width
    assert latent.latent_projection_params_per_layer == 2 * h * 512
    assert latent.router_params_per_layer == plain.router_params_per_layer
    assert latent.shared_expert_params_per_layer == plain.shared_expert_params_per_layer
