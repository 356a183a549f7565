"""The results file of a sweep: JSON Lines, one line per problem, appended as problems finish.

Crash safety: a line is written whole (`json + "\\n"`), flushed and fsync'd before the next one,
by one process (an exclusive lock keeps a second sweep off the file). A kill -9 can therefore
leave at most one torn line, the last, and it is the only line without a trailing newline:
`open_results` cuts it off before appending, so its problem is solved again and no line is
duplicated or lost. `read_results` (the report) skips it without touching the file.

Both read the file line by line and check each line (solver.sweep.result_line): a damaged or
hand-edited line is one error naming the file, the line and the field. A results file is a
regular file: a device such as /dev/full or /dev/zero would be read without end.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import IO, Any

from solver.errors import InputError
from solver.sweep.problems import key_of_line
from solver.sweep.result_line import parse_result_line


def _parse_lines(path: Path, handle: IO[bytes]) -> tuple[list[dict[str, Any]], bool]:
    """The complete lines from the handle's position on, each checked, and whether a torn last
    line (one without its newline) was skipped."""
    lines = []
    for number, raw in enumerate(handle, start=1):
        if not raw.endswith(b"\n"):
            return lines, True
        if raw.strip():
            lines.append(parse_result_line(raw, f"{path}:{number}"))
    return lines, False


def _check_regular(handle: IO[bytes], what: str) -> None:
    if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
        handle.close()
        raise InputError(f"{what}: not a regular file (a results file is read back line by "
                         "line)")


def read_results(path: str | Path) -> tuple[list[dict[str, Any]], bool]:
    """The complete lines of a results file, and whether a torn last line was skipped."""
    path = Path(path)
    try:
        handle = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the results file ({exc.strerror})") from None
    _check_regular(handle, str(path))
    try:
        with handle:
            return _parse_lines(path, handle)
    except OSError as exc:  # a regular file that fails to read (/proc/self/mem: EIO)
        raise InputError(f"{path}: cannot read the results file ({exc.strerror})") from None


class ResultsFile:
    """A results file open for appending: the lines already there (after cutting a torn last
    line off), and `append`, which makes each new line durable before returning."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._handle: IO[bytes] = open(self.path, "a+b")  # noqa: SIM115 (closed by close)
        except OSError as exc:
            raise InputError(f"-o {self.path}: cannot open the results file "
                             f"({exc.strerror})") from None
        _check_regular(self._handle, f"-o {self.path}")
        try:
            _lock(self._handle, self.path)
            self.num_torn_bytes = self._cut_torn_line()
            self._handle.seek(0)
            self.lines = _parse_lines(self.path, self._handle)[0]
        except BaseException:
            self._handle.close()
            raise

    def _cut_torn_line(self) -> int:
        handle = self._handle
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return 0
        handle.seek(0)
        keep = handle.read().rfind(b"\n") + 1
        handle.truncate(keep)
        os.fsync(handle.fileno())
        return size - keep

    @property
    def done_keys(self) -> set[tuple[Any, ...]]:
        return {key_of_line(line) for line in self.lines}

    def check_settings(self, settings: dict[str, Any]) -> None:
        """Refuse to mix solve settings (written on every line) in one file: its lines would
        not be comparable."""
        for line in self.lines:
            theirs = {name: line.get(name) for name in settings}
            if theirs != settings:
                shown = ", ".join(f"{k} {v}" for k, v in theirs.items())
                raise InputError(f"-o {self.path}: its lines were solved with {shown}; resume "
                                 "with the same settings or write to another file")

    def append(self, line: dict[str, Any]) -> None:
        """Write one line whole, flush it and fsync it."""
        text = json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        try:
            self._handle.write(text.encode("utf-8") + b"\n")
            self._handle.flush()
            os.fsync(self._handle.fileno())
        except OSError as exc:
            raise InputError(f"-o {self.path}: cannot write the results file "
                             f"({exc.strerror})") from None

    def close(self) -> None:
        self._handle.close()

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _lock(handle: IO[bytes], path: Path) -> None:
    """An exclusive POSIX record lock (elsewhere, none). Unlike flock, it belongs to this
    process alone: worker processes forked later do not hold it, and it goes when we do."""
    try:
        import fcntl
    except ImportError:  # Windows: one sweep per file is up to the user
        return
    try:
        fcntl.lockf(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise InputError(f"-o {path}: another sweep is writing this file") from None
