"""Reading TOML and JSON files into frozen specs, with one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from solver.errors import InputError, format_validation_error
from solver.spec.strict import describe_parse_error, parse_json, read_input_file

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

SpecT = TypeVar("SpecT", bound=BaseModel)


def _read_text(path: Path) -> str:
    try:
        return read_input_file(path).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read file ({exc.__class__.__name__}: {exc})") from None


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error names the file and the line."""
    text = _read_text(path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not valid TOML: {describe_parse_error(exc)}") from None


def load_json(path: Path) -> Any:
    """Parse a JSON file; a syntax error names the file and the line."""
    text = _read_text(path)
    try:
        return parse_json(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{path}: not valid JSON: {describe_parse_error(exc)}") from None


def validate_spec(spec_type: type[SpecT], data: Any, source: str) -> SpecT:
    """Build a frozen spec from parsed data; any problem becomes one InputError line."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a table of fields, got {type(data).__name__}")
    try:
        return spec_type.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(source, exc)) from None
