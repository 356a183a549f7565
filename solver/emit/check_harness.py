"""What every `launch --validate` check (solver.emit.check_*) runs on: the verdict
(Validation, Rejected) and the ways a framework's own code is called, quietly, with its
refusal turned into Rejected; solver.emit.validate picks the check for a format.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib import metadata

INSTALL_HINT = "pip install 'parplan[frameworks]'"


class Rejected(Exception):
    """The framework refused the file: `check` is what refused it, the message its own."""

    def __init__(self, check: str, message: str) -> None:
        super().__init__(message)
        self.check = check
        self.message = " ".join(message.split()) or "no message"


@dataclass
class Validation:
    """What a check ran and what it left unchecked (each "what (why)")."""

    name: str
    accepted: list[str] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)
    rejected: Rejected | None = None

    def render(self) -> str:
        """One line: rejected, accepted (and what was not checked), or only not checked."""
        if self.rejected is not None:
            return f"{self.name}: rejected by {self.rejected.check}: {self.rejected.message}"
        parts = []
        if self.accepted:
            parts.append("accepted by " + "; ".join(self.accepted))
        if self.unchecked:
            parts.append("not checked: " + "; ".join(self.unchecked))
        return f"{self.name}: " + ". ".join(parts)


def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (pip name), None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def require_version(validation: Validation, distribution: str, wanted: str, what: str) -> bool:
    """Whether `distribution` is installed at version `wanted` (a release prefix, "0.19" or
    "core_v0.16" for 0.16.x); otherwise says so in `validation` as `what` left unchecked."""
    found = installed_version(distribution)
    prefix = wanted.removeprefix("core_v")
    if found is None:
        validation.unchecked.append(f"{what} ({distribution} is not installed: {INSTALL_HINT})")
        return False
    if found != prefix and not found.startswith(prefix + "."):
        validation.unchecked.append(f"{what} ({distribution} {found} is installed; the file is "
                                    f"for {prefix})")
        return False
    return True


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Run framework code with its prints and log lines caught (they would land in the
    emitted text on stdout); yields what they wrote."""
    caught = io.StringIO()
    with contextlib.redirect_stdout(caught), contextlib.redirect_stderr(caught):
        yield caught


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """Environment variables set for the duration of a check, then restored."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def run_parser(check: str, parse: Callable[[], object]) -> object:
    """Run an argparse / tyro parser: its usage error (SystemExit, message on stderr) becomes
    Rejected with the message's error lines."""
    with quiet() as caught:
        try:
            return parse()
        except SystemExit as exc:
            if exc.code in (0, None):
                raise Rejected(check, "the parser exited without parsing") from None
            raise Rejected(check, error_lines(caught.getvalue())) from None


def run_check(check: str, run: Callable[[], object]) -> object:
    """Run one framework check quietly: whatever it raises is its refusal (the framework's
    own checks are asserts, ValueErrors, pydantic errors ...)."""
    with quiet():
        try:
            return run()
        except Rejected:
            raise
        except Exception as exc:  # the framework's own message is the answer
            raise Rejected(check, str(exc) or exc.__class__.__name__) from None


def error_lines(text: str) -> str:
    """The lines of a parser's error output that say what is wrong: argparse's "error:" line,
    else the text of tyro's box without usage lines and help pointers."""
    errors = [line.strip() for line in text.splitlines() if ": error: " in line]
    if errors:
        return " ".join(errors)
    kept = []
    for line in text.splitlines():
        line = line.strip(" │╭╮╰╯─┃━").strip()
        if not line or line.startswith(("usage:", "For full helptext", "in ", "─", "-" * 5)):
            continue
        kept.append(line)
    return " ".join(kept[:6])
