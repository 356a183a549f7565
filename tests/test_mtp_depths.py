"""Multi-token prediction depths (solver.spec.model: num_nextn_predict_layers, mtp_num_layers,
mtp_use_repeated_layer, mtp_loss_scaling_factor).

Sources:
- Megatron-LM (NVIDIA/Megatron-LM at d98e8a6, core 0.20; core_v0.17.0 has the same):
  megatron/core/transformer/multi_token_prediction.py MultiTokenPredictionBlock._build_layers
  ("When `mtp_use_repeated_layer=True` ... only 1 layer is created and applied mtp_num_layers
  times"), process_mtp_loss (`mtp_loss_scale = config.mtp_loss_scaling_factor /
  config.mtp_num_layers`), mtp_on_this_rank / get_mtp_num_layers_to_build (without a layout
  every MTP layer sits on the last pipeline stage); transformer_config.py
  (mtp_loss_scaling_factor = 0.1); training.py num_floating_point_operations (each depth is
  one more layer and one more logits pass: `2 * tokens * h * V * (1 + mtp_num_layers)`).
- Megatron-Bridge (NVIDIA-NeMo/Megatron-Bridge at 067f987):
  recipes/nemotronh/h100/nemotron_3_super.py and nemotron_3_ultra.py (mtp_num_layers = 2,
  mtp_use_repeated_layer = True, mtp_loss_scaling_factor = 0.3: "HF config has
  num_nextn_predict_layers=1 for the shared block; mtp_num_layers=2 controls forward-pass
  repetitions"); models/nemotronh/nemotron_h_bridge.py (a config.json without the keys:
  repeated, 0.3); models/conversion/auto_bridge.py MTP_CONFIG_FIELDS (num_nextn_predict_layers,
  mtp_num_hidden_layers, mtp_num_layers); examples/model_verification_cards/
  nemotron-3-super-120b-a12b/card.yaml (the exported checkpoint: "123,611,033,088 elements").
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from solver.catalog.clusters import load_cluster_spec
from solver.catalog.hf import model_spec_from_hf_config
from solver.catalog.zoo import load_model_spec
from solver.cli import cli
from solver.cost.candidates import Candidates
from solver.cost.memory.estimate import estimate_stage_memory
from solver.cost.memory.options import MemoryOptions
from solver.cost.step.steptime import estimate_time_terms
from solver.errors import InputError
from solver.spec import JobSpec, ParallelConfig

SUPER, DSV3 = "nemotron-3-super-120b-a12b", "deepseek-v3"
H100 = load_cluster_spec("dgx-h100")


def with_depths(name: str, depths: int, repeated: bool | None = None):
    spec = load_model_spec(name)
    update: dict[str, object] = {"mtp_num_layers": depths}
    if repeated is not None:
        update["mtp_use_repeated_layer"] = repeated
    return spec.model_copy(update=update)


def test_super_trains_two_depths_of_one_module() -> None:
    """Bridge's recipe: 2 depths, one repeated module, weight 0.3; each depth's loss is
    scaled by 0.3 / 2 = 0.15 (Megatron process_mtp_loss)."""
    spec = load_model_spec(SUPER)
    assert (spec.num_nextn_predict_layers, spec.mtp_depths, spec.mtp_modules) == (1, 2, 1)
    assert spec.mtp_loss_scale_per_depth == pytest.approx(0.15)


def test_super_checkpoint_holds_one_mtp_module() -> None:
    """Bridge's verification card: the exported Super checkpoint has 123,611,033,088 elements,
    main model plus one "*E" MTP module (attention layer and LatentMoE layer, each with its
    pre-norm, eh_proj 2h -> h, enorm, hnorm and the final norm)."""
    spec = load_model_spec(SUPER)
    assert spec.total_params + spec.mtp_params == 123_611_033_088


@pytest.mark.parametrize("depths", [1, 2, 3])
def test_repeated_module_counts_once_separate_ones_per_depth(depths: int) -> None:
    """_build_layers: repeated, one module whatever the depths; otherwise one per depth."""
    one = load_model_spec(DSV3).mtp_module_params
    assert with_depths(DSV3, depths, repeated=True).mtp_params == one
    assert with_depths(DSV3, depths, repeated=False).mtp_params == depths * one
    assert with_depths(DSV3, 0).mtp_params == 0


def test_loss_scale_defaults_to_megatrons() -> None:
    """transformer_config.py: 0.1; one depth takes all of it."""
    spec = load_model_spec(DSV3)
    assert spec.mtp_loss_scaling_factor == 0.1 and spec.mtp_loss_scale_per_depth == 0.1
    assert with_depths(DSV3, 0).mtp_loss_scale_per_depth == 0.0


def _last_stage_s(spec, config: ParallelConfig) -> float:
    job = JobSpec(seq_len=4096, global_batch=64)
    terms = estimate_time_terms(spec, H100, job, Candidates.from_configs([config]),
                                layers_only=True)
    return float(terms.last[0].sum())


@pytest.mark.parametrize("name", [SUPER, DSV3])
def test_each_depth_adds_one_layer_and_one_head_pass(name: str) -> None:
    """training.py: each depth is one more layer of the model's MoE kind and one more logits
    pass, repeated module or not: the last stage's time grows by the same step per depth."""
    config = ParallelConfig(tp=8, pp=4, dp=2, ep=8, micro_batch=1, recompute="selective")
    times = [_last_stage_s(with_depths(name, d), config) for d in range(4)]
    steps = np.diff(times)
    assert steps[0] > 0
    assert steps == pytest.approx(np.full(3, steps[0]), rel=1e-9)
    repeated = _last_stage_s(with_depths(name, 2, repeated=True), config)
    assert repeated == pytest.approx(times[2], rel=1e-12)


def _stage_items(spec, config: ParallelConfig, stage: int) -> dict[str, float]:
    job = JobSpec(seq_len=4096, global_batch=64)
    memory = estimate_stage_memory(spec, job, Candidates.from_configs([config]), stage,
                                   MemoryOptions())
    return {name: float(value[0]) for name, value in memory.items.items()}


def test_depths_add_activations_repeated_module_adds_no_weights() -> None:
    """Every depth keeps its own activations and logits (one forward each); a repeated module
    keeps one set of weights, gradients and optimizer state; separate modules one per depth."""
    config = ParallelConfig(tp=8, pp=4, dp=2, ep=8, micro_batch=1, recompute="selective")
    one, two_repeated, two_separate = (
        _stage_items(with_depths(SUPER, depths, repeated=repeated), config, 3)
        for depths, repeated in ((1, True), (2, True), (2, False)))
    assert two_repeated["activations"] > one["activations"]
    assert two_repeated["logits"] == pytest.approx(one["logits"] * 3 / 2, rel=1e-12)
    assert two_repeated["weights"] == pytest.approx(one["weights"], rel=1e-12)
    assert two_separate["activations"] == pytest.approx(two_repeated["activations"], rel=1e-12)
    assert two_separate["weights"] > two_repeated["weights"]


def test_mtp_sits_on_the_last_stage_only() -> None:
    """mtp_on_this_rank: without a layout every MTP layer is on the last pipeline stage."""
    config = ParallelConfig(tp=8, pp=4, dp=2, ep=8, micro_batch=1, recompute="selective")
    first = [_stage_items(with_depths(SUPER, d), config, 0) for d in (0, 2)]
    assert first[0] == pytest.approx(first[1], rel=1e-12)
    last = [_stage_items(with_depths(SUPER, d), config, 3) for d in (0, 2)]
    assert last[1]["activations"] > last[0]["activations"]


def test_layout_puts_every_depth_with_the_loss() -> None:
    result = CliRunner().invoke(cli, ["estimate", "--model", SUPER, "--cluster", "dgx-h100",
                                      "--gpus", "64", "--pp", "2", "--ep", "32", "--seq-len",
                                      "4096", "--global-batch", "64", "--json"])
    assert result.exit_code == 0, result.output
    layout = json.loads(result.output)["plans"][0]["layout"]
    assert [s["mtp_layers"] for s in layout["stages"]] == [0, 2]


# ---- config.json ----------------------------------------------------------------------------


def _hf_super() -> dict:
    from pathlib import Path

    path = Path(__file__).parent / "data" / "hf_configs" / f"{SUPER}.json"
    return json.loads(path.read_text())


def test_nemotron_h_config_takes_bridges_defaults() -> None:
    """config.json states one module; nemotron_h_bridge.py: repeated, 0.3; one depth per
    module as the conversion sets mtp_num_layers = num_nextn_predict_layers."""
    spec = model_spec_from_hf_config(_hf_super(), "super.json")
    assert (spec.num_nextn_predict_layers, spec.mtp_depths) == (1, 1)
    assert spec.mtp_use_repeated_layer and spec.mtp_loss_scaling_factor == 0.3
    assert spec.mtp_params == load_model_spec(SUPER).mtp_params


@pytest.mark.parametrize("key", ["num_nextn_predict_layers", "mtp_num_hidden_layers",
                                 "mtp_num_layers"])
def test_each_mtp_key_names_the_modules(key: str) -> None:
    """auto_bridge.py MTP_CONFIG_FIELDS: three names for one count."""
    config = _hf_super()
    del config["num_nextn_predict_layers"]
    config[key] = 2
    config["mtp_use_repeated_layer"] = False
    config["mtp_loss_scaling_factor"] = 0.5
    spec = model_spec_from_hf_config(config, "super.json")
    assert (spec.mtp_depths, spec.mtp_modules) == (2, 2)
    assert spec.mtp_loss_scaling_factor == 0.5


@pytest.mark.parametrize(("key", "value"), [("mtp_loss_scaling_factor", "high"),
                                            ("mtp_loss_scaling_factor", -1),
                                            ("mtp_use_repeated_layer", 1)])
def test_bad_mtp_keys_name_the_key(key: str, value: object) -> None:
    config = _hf_super()
    config[key] = value
    with pytest.raises(InputError, match=f"super.json: key '{key}'"):
        model_spec_from_hf_config(config, "super.json")


# ---- launch ---------------------------------------------------------------------------------


def _bridge_overrides(model: str) -> list[str]:
    result = CliRunner().invoke(cli, ["launch", "--model", model, "--cluster", "dgx-h100",
                                      "--gpus", "64", "--tp", "1", "--pp", "2", "--ep", "32",
                                      "--seq-len", "4096", "--global-batch", "1280",
                                      "--format", "bridge", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["settings"]["overrides"]


def test_bridge_gets_the_recipes_mtp() -> None:
    overrides = _bridge_overrides(SUPER)
    assert "model.mtp_num_layers=2" in overrides
    assert "model.mtp_use_repeated_layer=true" in overrides
    assert "model.mtp_loss_scaling_factor=0.3" in overrides


def test_megatron_defaults_go_out_as_defaults() -> None:
    """DeepSeek-V3: one depth, Megatron's 0.1 (Bridge's deepseek_v3 recipe states 0.1). No
    mtp_use_repeated_layer is written for it: the key is Megatron-Core 0.17's, and Bridge 0.3.1
    refuses it ("Could not override 'model.mtp_use_repeated_layer'")."""
    overrides = _bridge_overrides(DSV3)
    assert "model.mtp_num_layers=1" in overrides
    assert not any("mtp_use_repeated_layer" in item for item in overrides)
    assert "model.mtp_loss_scaling_factor=0.1" in overrides


def test_models_show_states_the_depths() -> None:
    result = CliRunner().invoke(cli, ["models", "show", SUPER, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["mtp"] == {"depths": 2, "modules": 1,
                                                "loss_scale_per_depth": pytest.approx(0.15)}
    text = CliRunner().invoke(cli, ["models", "show", SUPER]).output
    assert "1 module(s), trained at 2 depth(s) (one module repeated), loss weight 0.3" in text
