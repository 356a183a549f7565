"""What an input may hold: strict numbers, printable text and upper limits, defined once.

Every spec read from a file or built from command-line values derives from `InputSpec`
(frozen, `extra="forbid"`). On top of pydantic's own checks it refuses, field by field:

- a boolean, a string or (for an integer) a fractional float where a number is expected, and
  anything but true or false where a boolean is: pydantic's lax mode would read `true` as 1,
  "8" as 8 and 1 as true (the Hugging Face reader already refuses them, and a file should not
  mean more than it says);
- nan and infinities (`allow_inf_nan=False`), and any finite float whose magnitude lies
  outside [FLOAT_RANGE]: such values turn into inf or nan later, in the cost model;
- an integer above its field's `Limit` (a field without one: `MAX_COUNT`): sizes far beyond
  any real cluster or model are refused with the reason, before any search starts, instead of
  overflowing numpy's 64-bit integers or running a search that never ends;
- text with control characters, lone surrogates or other unprintable characters: names end up
  in emitted Python modules, shell lines and TOML files (solver.emit) and in one-line errors.

A field's limit is metadata of its annotation: `num_hidden_layers: Annotated[int, MAX_LAYERS]`.
The command-line parameter types (solver.cli.params) use the same limits.
"""

from __future__ import annotations

import errno
import json
import math
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Union

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


@dataclass(frozen=True)
class Limit:
    """The largest value a count may take, its unit and why: "at most 1,048,576 GPUs (...)"."""

    most: int
    unit: str
    why: str

    def describe(self) -> str:
        unit = f" {self.unit}" if self.unit else ""
        return f"at most {self.most:,}{unit} ({self.why})"

    def check(self, value: int) -> str | None:
        """The problem with `value`, or None when it is within the limit."""
        if value <= self.most:
            return None
        return f"{render_number(value)} is too large: {self.describe()}"


MAX_GPUS = Limit(2**20, "GPUs", "far beyond any cluster built")
MAX_LAYERS = Limit(192, "layers", "1.5 times the deepest model of the zoo, Megatron 1T's 128; "
                   "deeper ones make the layout search too slow to answer")
MAX_WIDTH = Limit(2**20, "", "far beyond any published model's widths and head counts")
MAX_VOCAB = Limit(2**24, "tokens", "far beyond any published vocabulary")
MAX_EXPERTS = Limit(2**16, "experts", "far beyond any published mixture of experts")
MAX_SEQ_LEN = Limit(2**24, "tokens", "16M tokens a sequence")
MAX_BATCH = Limit(2**24, "sequences", "16M sequences a step")
MAX_TOKENS = Limit(10**18, "tokens", "a million times the largest training runs")
MAX_MESSAGE_BYTES = Limit(2**40, "bytes", "1 TiB a message")
MAX_COUNT = Limit(2**32, "", "the largest count parplan takes")
MAX_FILE_BYTES = Limit(2**26, "bytes", "64 MiB: an input file is text of a few kB to MB")
# The counts most specs hold, as annotations.
GpuCount = Annotated[int, MAX_GPUS]
LayerCount = Annotated[int, MAX_LAYERS]
Width = Annotated[int, MAX_WIDTH]
# Magnitudes of floats in files and options (units of the fields: GiB, GB/s, TFLOP/s, us, ms,
# W, fractions): a non-zero value outside this range is a typo, and would overflow to inf or
# vanish to 0 in the cost model.
FLOAT_RANGE = (1e-6, 1e12)


def read_input_file(path: str | Path) -> bytes:
    """The bytes of an input file, at most MAX_FILE_BYTES: a device such as /dev/zero or a
    huge file is an OSError (EFBIG) like any other unreadable file, not a read that fills the
    memory."""
    with open(path, "rb") as handle:
        data = handle.read(MAX_FILE_BYTES.most + 1)
    if len(data) > MAX_FILE_BYTES.most:
        raise OSError(errno.EFBIG, f"more than {MAX_FILE_BYTES.most:,} bytes "
                                   f"({MAX_FILE_BYTES.why})")
    return data


def describe_parse_error(exc: ValueError | RecursionError) -> str:
    """What a TOML or JSON parser's ValueError or RecursionError means: an integer of more
    than 4,300 digits (Python's limit on converting text to int), or arrays nested deeper than
    the recursion limit."""
    if isinstance(exc, RecursionError):
        return "arrays or tables nested too deeply"
    return " ".join(str(exc).split(";")[0].split())


class DuplicateKeyError(ValueError):
    """A JSON object that names one key twice (module docstring of parse_json)."""


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            shown = key.encode("unicode_escape", "backslashreplace").decode("ascii")
            raise DuplicateKeyError(f"key '{shown}' appears twice in one object (a JSON "
                                    "reader would keep the last silently)")
        seen[key] = value
    return seen


def parse_json(text: str | bytes) -> Any:
    """JSON text as Python values, refusing an object that names a key twice: Python's json
    (like most readers) keeps the last value, so a hand-edited file could mean something
    other than what its first key says (RFC 8259 section 4: names "SHOULD be unique").
    Raises json.JSONDecodeError, DuplicateKeyError (both ValueErrors) or RecursionError."""
    return json.loads(text, object_pairs_hook=_refuse_duplicate_keys)


def render_number(value: int | float) -> str:
    """A number for an error line: an integer of more than 30 digits by its size only
    (str() refuses integers of more than 4,300 digits)."""
    if isinstance(value, int) and value.bit_length() > 100:
        return f"a {int(value.bit_length() * 0.30103) + 1}-digit number"
    return f"{value:,}" if isinstance(value, int) else f"{value:g}"


def find_unprintable(text: str) -> str | None:
    """The first character of `text` that is not printable, escaped ('\\n', '\\x7f'), or None."""
    for char in text:
        if not char.isprintable():
            return char.encode("unicode_escape", "backslashreplace").decode("ascii")
    return None


@dataclass(frozen=True)
class _FieldKinds:
    """What a field's annotation accepts: the plain types and its limit, if any."""

    types: frozenset[type]
    limit: Limit | None

    @property
    def is_number(self) -> bool:
        return bool(self.types & {int, float}) and bool not in self.types

    @property
    def is_integer(self) -> bool:
        return int in self.types and float not in self.types


def _field_kinds(annotation: Any, metadata: list[Any]) -> _FieldKinds:
    found: set[type] = set()
    limits = [item for item in metadata if isinstance(item, Limit)]

    def walk(node: Any) -> None:
        origin = typing.get_origin(node)
        if origin is Annotated:
            base, *extra = typing.get_args(node)
            limits.extend(item for item in extra if isinstance(item, Limit))
            walk(base)
        elif origin in (Union, types.UnionType):
            for arg in typing.get_args(node):
                walk(arg)
        elif isinstance(node, type) and origin is None:
            found.add(node)

    walk(annotation)
    return _FieldKinds(frozenset(found), limits[0] if limits else None)


def check_input_value(value: Any, kinds: _FieldKinds) -> str | None:
    """The problem with one field's value (module docstring), or None."""
    if kinds.is_number:
        return _check_number(value, kinds)
    if bool in kinds.types and not isinstance(value, bool) and not kinds.types & {str, int}:
        if value is not None or type(None) not in kinds.types:
            return "must be true or false"
    if str in kinds.types and isinstance(value, str):
        bad = find_unprintable(value)
        if bad is not None:
            return f"must hold printable characters only (found '{bad}')"
    return None


def _check_number(value: Any, kinds: _FieldKinds) -> str | None:
    if isinstance(value, bool):
        return f"must be a number, not {str(value).lower()}"
    if isinstance(value, str):
        return "must be a number, not a string"
    if isinstance(value, int) and kinds.is_integer:
        return (kinds.limit or MAX_COUNT).check(abs(value))
    if isinstance(value, float) and kinds.is_integer and math.isfinite(value) \
            and not value.is_integer():
        return f"must be an integer, not {value:g}"
    if isinstance(value, (int, float)):
        if isinstance(value, int) and value.bit_length() > 64:
            return f"{render_number(value)} is too large"
        low, high = FLOAT_RANGE
        if value and math.isfinite(value) and not low <= abs(value) <= high:
            return (f"{render_number(value)} is outside what it can be (0, or a magnitude "
                    f"between {low:g} and {high:g})")
    return None


class InputSpec(BaseModel):
    """Base of the specs read from files and options: strict numbers, finite floats, limits,
    printable text (module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    input_kinds: ClassVar[dict[str, _FieldKinds]] = {}

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.input_kinds = {name: _field_kinds(info.annotation, info.metadata)
                           for name, info in cls.model_fields.items()}

    @field_validator("*", mode="before")
    @classmethod
    def _check_input(cls, value: Any, info: ValidationInfo) -> Any:
        kinds = cls.input_kinds.get(info.field_name or "")
        problem = check_input_value(value, kinds) if kinds is not None else None
        if problem is not None:
            raise ValueError(problem)
        return value
