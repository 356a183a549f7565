"""`parplan models`, `models show`, `clusters` through click's CliRunner: exit codes, JSON
fields (DESIGN.md "Interfaces") and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.catalog import list_zoo_names
from solver.cli import cli

MODEL_JSON_FIELDS = {
    "name", "total_params", "active_params", "num_hidden_layers", "hidden_size",
    "num_attention_heads", "num_key_value_heads", "num_experts",
}


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_models_json_lists_the_zoo_with_the_interface_fields() -> None:
    result = run("models", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [r["name"] for r in rows] == list_zoo_names()
    for row in rows:
        assert MODEL_JSON_FIELDS <= row.keys()


def test_models_table_shows_every_model() -> None:
    result = run("models")
    assert result.exit_code == 0, result.output
    for name in list_zoo_names():
        assert name in result.stdout


def test_models_show_gives_a_breakdown_that_adds_up() -> None:
    result = run("models", "show", "llama3.1-8b", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    assert MODEL_JSON_FIELDS <= shown.keys()
    assert sum(shown["breakdown"].values()) == shown["total_params"]
    # Meta's model card: 8.03B parameters.
    assert shown["total_params"] == pytest.approx(8.03e9, rel=0.001)


def test_models_show_table_and_output_is_deterministic() -> None:
    first, second = run("models", "show", "llama3.1-8b"), run("models", "show", "llama3.1-8b")
    assert first.exit_code == 0
    assert first.stdout == second.stdout
    assert "lm_head" in first.stdout


def test_models_show_accepts_a_zoo_format_toml(tmp_path: Path) -> None:
    path = tmp_path / "tiny.toml"
    path.write_text(
        'name = "tiny"\nhidden_size = 64\nintermediate_size = 128\nnum_hidden_layers = 2\n'
        "num_attention_heads = 4\nvocab_size = 100\n"
    )
    result = run("models", "show", str(path), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["name"] == "tiny"


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_model_suggests_the_closest_names() -> None:
    assert_one_line_error(run("models", "show", "lama3.1-8b"), "unknown model", "llama3.1-8b")


def test_unknown_option_is_one_line() -> None:
    assert_one_line_error(run("models", "--bogus"), "--bogus")


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        ("hidden_size = [", ("not valid TOML",)),
        ('name = "x"\nhidden_size = "big"', ("hidden_size",)),
        ('name = "x"\nhiden_size = 64', ("hiden_size", "unknown field")),
        ("", ("hidden_size", "missing")),
        ("\xff\xfe", ("cannot read",)),
    ],
)
def test_malformed_toml_names_file_and_field(tmp_path: Path, content: str, needles) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content.encode("latin-1"))
    assert_one_line_error(run("models", "show", str(path)), str(path), *needles)


def test_missing_file_and_wrong_suffix(tmp_path: Path) -> None:
    assert_one_line_error(run("models", "show", str(tmp_path / "none.toml")), "cannot read")
    other = tmp_path / "model.yaml"
    other.write_text("x: 1")
    assert_one_line_error(run("models", "show", str(other)), ".toml", ".json")
