"""The model zoo: one TOML per model under models/, keys named as in HF config.json.

`load_model_spec(ref)` accepts a zoo name, a zoo-format TOML path, or a Hugging Face
`config.json` path (see solver.catalog.hf).
"""

from __future__ import annotations

from pathlib import Path

from solver.catalog.names import unknown_name_error
from solver.catalog.paths import data_dir
from solver.catalog.tomlfile import load_json, load_toml, validate_spec
from solver.errors import InputError
from solver.spec import ModelSpec


def list_zoo_names() -> list[str]:
    """Zoo model names, sorted."""
    return sorted(p.stem for p in data_dir("models").glob("*.toml"))


def load_zoo_toml(path: Path) -> ModelSpec:
    """One zoo-format TOML file; `name` defaults to the file stem."""
    data = load_toml(path)
    data.setdefault("name", path.stem)
    return validate_spec(ModelSpec, data, str(path))


def load_zoo() -> list[ModelSpec]:
    """Every zoo model, sorted by name."""
    return [load_zoo_toml(data_dir("models") / f"{n}.toml") for n in list_zoo_names()]


def load_model_spec(ref: str) -> ModelSpec:
    """A zoo name, a zoo TOML path, or a Hugging Face config.json path."""
    path = Path(ref)
    if path.suffix.lower() == ".toml":
        return load_zoo_toml(path)
    if path.suffix.lower() == ".json":
        from solver.catalog.hf import model_spec_from_hf_config

        return model_spec_from_hf_config(load_json(path), source=str(path))
    try:
        is_file = path.is_file()
    except OSError:  # a name too long for a path (ENAMETOOLONG) is not a file
        is_file = False
    if is_file:
        raise InputError(f"{ref}: model files must end in .toml (zoo format) or .json (HF config)")
    # A zoo name is one of the zoo's files, never a path (`../clusters/presets/dgx-h100`).
    known = list_zoo_names()
    if ref.lower() in known:
        return load_zoo_toml(data_dir("models") / f"{ref.lower()}.toml")
    raise unknown_name_error("model", ref, known, "see `parplan models`")
