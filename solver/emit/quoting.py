"""Quoting text for the artefacts `parplan launch` writes, so that a name stays a name.

A model or cluster name comes from a file the user may not have written (a downloaded
config.json, its folder's name). Inside an emitted Python module, TOML file or shell line it
must stay inert: a name holding three double quotes and a newline must not end the docstring
of an emitted module, a newline must not end a TOML comment, a DEL character must not make
the TOML unparsable. Shell tokens go through
`shlex.quote` and JSON through `json.dumps` (solver.emit.megatron, vllm, deepspeed, groups);
the two writers that put names into text of their own use these functions.
"""

from __future__ import annotations

from collections.abc import Iterable


def _escape(text: str, quotes: Iterable[str], escape_char) -> str:
    """`text` with backslashes and `quotes` backslash-escaped and every unprintable character
    (control characters, DEL, lone surrogates, line and paragraph separators) replaced by
    `escape_char(char)`."""
    quoted = set(quotes) | {"\\"}
    return "".join("\\" + char if char in quoted
                   else char if char.isprintable()
                   else escape_char(char) for char in text)


def _python_escape(char: str) -> str:
    return char.encode("unicode_escape", "backslashreplace").decode("ascii")


def render_python_text(text: str) -> str:
    """`text` for the inside of a Python string literal or docstring delimited by double or
    single quotes (one or three): it cannot close the literal, and compiles to a string
    showing the same name."""
    return _escape(text, '"\'', _python_escape)


def render_comment_text(text: str) -> str:
    """`text` for one line of a comment (TOML, shell, Python): printable characters only, so
    it cannot end the line; unprintable characters appear as Python-style escapes."""
    return "".join(char if char.isprintable() else _python_escape(char) for char in text)


def _toml_escape(char: str) -> str:
    code = ord(char)
    if 0xD800 <= code <= 0xDFFF:  # a lone surrogate has no TOML (or UTF-8) spelling
        return "\\uFFFD"
    return f"\\u{code:04X}" if code <= 0xFFFF else f"\\U{code:08X}"


def render_toml_value(value: object) -> str:
    """A TOML value: a basic string (escaped as TOML's spec allows), a boolean, a number, or an
    array of those."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + _escape(value, '"', _toml_escape) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(render_toml_value(item) for item in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"no TOML value for {type(value).__name__}")
