"""Zoo-format files: any bytes at all give a spec or the project's one-line InputError."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.zoo import load_model_spec
from solver.errors import InputError

TOML_LINES = st.sampled_from([
    'name = "m"', "hidden_size = 64", "hidden_size = -3", "intermediate_size = 128",
    "num_hidden_layers = 2", "num_attention_heads = 4", "num_attention_heads = 0",
    "vocab_size = 100", 'mlp_type = "plain"', "num_experts = 4", "num_experts_per_tok = 2",
    "moe_intermediate_size = 8", "[extra]", "x = [1, 2", "tie_word_embeddings = 1",
    "head_dim = 1.5", 'num_key_value_heads = "2"', "kv_lora_rank = 8",
])


def check_file(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "m.toml"
        path.write_bytes(content)
        try:
            spec = load_model_spec(str(path))
        except InputError as exc:
            assert "\n" not in str(exc) and str(path) in str(exc)
            return
        assert spec.total_params > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(TOML_LINES, max_size=12))
def test_toml_made_of_plausible_lines_never_crashes(lines: list[str]) -> None:
    check_file("\n".join(lines).encode())


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_never_crash(content: bytes) -> None:
    check_file(content)


def test_python_dash_m_solver_runs_the_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "solver", "--help"], capture_output=True,
                         text=True, check=True)
    assert "models" in out.stdout and "clusters" in out.stdout


def test_json_with_a_huge_integer_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    try:
        load_model_spec(str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and "not valid JSON" in str(exc)
    else:
        raise AssertionError("expected an InputError")


def test_deeply_nested_json_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 100000 + "]" * 100000)
    try:
        load_model_spec(str(path))
    except InputError as exc:
        assert "\n" not in str(exc)
    else:
        raise AssertionError("expected an InputError")
