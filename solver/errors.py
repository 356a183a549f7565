"""Project errors: what a user can cause.

`InputError` is raised for bad input (an unknown name, a malformed file, an impossible number).
Its message is one line naming the file or option, the field, and what is wrong. The CLI turns
every `ParplanError` into that line on stderr and exit status 2, in one place (`solver.cli`).
`assert` is kept for the project's own invariants.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic only where a spec is validated: `parplan --help` needs none
    from pydantic import ValidationError


class ParplanError(Exception):
    """Base of every error a user can cause; the message is shown as is."""


class InputError(ParplanError):
    """Bad input: the message names the source, the field and the problem."""


def render_one_line(message: str) -> str:
    """`message` as one printable line: runs of whitespace become one space, and any other
    character that is not printable (a control character, a lone surrogate) its escape, so a
    name read from a file cannot break the line or the terminal."""
    text = " ".join(message.split())
    if text.isprintable():
        return text
    return "".join(char if char.isprintable()
                   else char.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for char in text)


def format_validation_error(source: str, err: ValidationError) -> str:
    """One line for a pydantic error: `source: field 'x': problem` (first problem, plus a count)."""
    problems = err.errors(include_url=False)
    # A misspelt key also shows up as a missing one; name the misspelling first.
    problems.sort(key=lambda p: p["type"] != "extra_forbidden")
    first = problems[0]
    location = ".".join(str(part) for part in first["loc"]) or "(top level)"
    location = location.encode("unicode_escape").decode("ascii")  # a key may hold a newline
    message = " ".join(first["msg"].split())
    message = message.removeprefix("Value error, ")
    if first["type"] == "extra_forbidden":
        message = "unknown field (check the spelling against the documented keys)"
    elif first["type"] == "missing":
        message = "required field is missing"
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"{source}: field '{location}': {message}{more}"
