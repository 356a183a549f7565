"""benchmarks/recipe_check.py on a few of its rows (issue 17): a published recipe fits in the
tool under the memory features it states, and the tool's cheapest fit of its configuration is
no slower than the recipe's own choice. Rows (benchmarks/data/recipes.jsonl, each naming its
Megatron-Bridge config): DeepSeek-V3 on 1024 H100s with --recompute-modules mla_up_proj mlp,
on 256 B200s with mla_up_proj; Qwen3-30B-A3B on 8 B200s; Llama 3 8B on 8 H100s in fp8 with
full recompute of some layers; torchtitan's Llama 3 8B train config (64 A100s, FSDP,
op-level selective checkpointing)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from recipe_check import check_recipe, load_recipes, summarize  # noqa: E402

ROWS = ("dsv3-h100", "dsv3-b200", "qwen3-30b-b200-bf16", "llama3-8b-h100-fp8",
        "torchtitan-llama3-8b")


@pytest.fixture(scope="module")
def verdicts() -> dict:
    recipes = {r["id"]: r for r in load_recipes()}
    return {name: check_recipe(recipes[name]) for name in ROWS}


def test_every_recipe_names_its_source() -> None:
    for recipe in load_recipes():
        if recipe.get("framework") == "torchtitan":
            assert recipe["source"].startswith("pytorch/torchtitan@")
            assert "train_configs/" in recipe["source"]
        else:
            assert recipe["source"].startswith("NVIDIA-NeMo/Megatron-Bridge@")
            assert "scripts/performance/configs/" in recipe["source"]


@pytest.mark.parametrize("name", ROWS)
def test_recipe_fits_and_the_tool_is_no_slower(verdicts: dict, name: str) -> None:
    verdict = verdicts[name]
    assert verdict.own is not None, f"{name}: the recipe's own choice does not fit"
    assert verdict.own.fits and verdict.cheapest.fits
    assert verdict.passes, f"{name}: ratio {verdict.ratio}"
    # The recipe's pinned degrees are kept; only the memory knobs move.
    for degree in ("tp", "pp", "cp", "ep", "vpp", "micro_batch"):
        assert getattr(verdict.cheapest.config, degree) == verdict.recipe[degree]


def test_deepseek_on_h100_needs_a_module_set_not_full_recompute(verdicts: dict) -> None:
    """The H100 recipe recomputes mla_up_proj and mlp; the tool's cheapest fit is a module set
    too (with the free moe_act and layernorm), not full recompute."""
    cheapest = verdicts["dsv3-h100"].cheapest
    assert cheapest.config.recompute == "selective"
    assert "mla_up_proj" in cheapest.recompute_modules


def test_summary_counts(verdicts: dict) -> None:
    summary = summarize(list(verdicts.values()))
    assert summary["num_recipes"] == len(ROWS)
    assert summary["num_passes"] == len(ROWS)
