"""The results file of a sweep: JSON Lines, one line per problem, appended as problems finish.

Crash safety: a line is written whole (`json + "\\n"`), flushed and fsync'd before the next one,
by one process (an exclusive lock keeps a second sweep off the file). A kill -9 can therefore
leave at most one torn line, the last, and it is the only line without a trailing newline.

Nothing is changed before the file is known to be ours: every complete line is read and
checked first (solver.sweep.result_line), so a file that is not a results file (a config, a
.gz, a text without its last newline) is refused byte-identical, and a file is ours only if it
holds at least one results line. Then a last line without its newline is either complete JSON
(a results line that lost only its newline: kept, and checked like the others) or torn (a
prefix of a line, never valid JSON): `ResultsFile` cuts it off, and its problem is solved
again, just before its first new line (a refused resume changes nothing); `read_results`
(the report) skips it without touching the file.

Limits: a results file is a regular file (a device such as /dev/full or /dev/zero would be read
without end) of at most MAX_RESULTS_BYTES, each line at most MAX_LINE_BYTES, both checked before
the bytes are read: the report and the resume hold every line in memory.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from solver.errors import InputError
from solver.spec.strict import Limit
from solver.sweep.problems import key_of_line
from solver.sweep.result_line import parse_result_line

# A line is about 8 kB with 5 plans (llama3.2-1b on 8 H100, the default --top) and 150 kB with
# 100, the most --top keeps.
MAX_LINE_BYTES = Limit(2**22, "bytes", "4 MiB a line; a line of 100 plans is about 150 kB")
MAX_RESULTS_BYTES = Limit(2**30, "bytes", "1 GiB, about 130,000 problems of 5 plans: the "
                                          "report and a resumed sweep hold every line in memory")


@dataclass(frozen=True)
class _Contents:
    """The checked complete lines of a results file, and its last line when that has no
    newline: `tail` its bytes, `tail_offset` where it starts, `tail_line` its checked object
    when it is complete JSON (None: torn)."""

    lines: list[dict[str, Any]]
    size: int
    tail: bytes = b""
    tail_offset: int = 0
    tail_line: dict[str, Any] | None = None


def _read_contents(where: str, handle: IO[bytes]) -> _Contents:
    """Every line of the handle's file, from its start, checked (module docstring)."""
    size = os.fstat(handle.fileno()).st_size
    if size > MAX_RESULTS_BYTES.most:
        raise InputError(f"{where}: a results file of {size:,} bytes is too large: "
                         f"{MAX_RESULTS_BYTES.describe()}")
    handle.seek(0)
    lines: list[dict[str, Any]] = []
    offset = 0
    for number in range(1, size + 2):
        raw = handle.readline(MAX_LINE_BYTES.most + 1)
        if len(raw) > MAX_LINE_BYTES.most:
            raise InputError(f"{where}:{number}: the line is too long: "
                             f"{MAX_LINE_BYTES.describe()}")
        if not raw.endswith(b"\n"):
            tail_line = _parse_tail(raw, f"{where}:{number}") if raw else None
            return _Contents(lines, size, raw, offset, tail_line)
        if raw.strip():
            lines.append(parse_result_line(raw, f"{where}:{number}"))
        offset += len(raw)
    return _Contents(lines, size)  # the file grew while it was read: the rest is not ours


def _parse_tail(raw: bytes, source: str) -> dict[str, Any] | None:
    """A last line without its newline: its checked object when it is complete JSON, None
    when it is torn (a prefix of a JSON object is never valid JSON)."""
    try:
        json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return parse_result_line(raw, source)


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
            contents = _read_contents(str(path), handle)
    except OSError as exc:  # a read error (EIO) after the open
        raise InputError(f"{path}: cannot read the results file ({exc.strerror})") from None
    if contents.tail_line is not None:
        return [*contents.lines, contents.tail_line], False
    return contents.lines, bool(contents.tail)


class ResultsFile:
    """A results file open for appending: the lines already there (a complete last line
    without its newline included), and `append`, which makes each new line durable before
    returning. The file is not changed until the first `append` (module docstring)."""

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
            contents = _read_contents(f"-o {self.path}", self._handle)
        except OSError as exc:
            self._handle.close()
            raise InputError(f"-o {self.path}: cannot read the results file "
                             f"({exc.strerror})") from None
        except InputError as exc:
            self._handle.close()
            raise InputError(f"{exc} (the file is left as it was: resume only a results "
                             "file of parplan sweep, or write to another file)") from None
        except BaseException:
            self._handle.close()
            raise
        self.lines = contents.lines
        self._repair = b""  # what the first append writes before its line
        self._cut_at: int | None = None
        self.num_torn_bytes = 0
        if contents.tail_line is not None:
            self.lines.append(contents.tail_line)
            self._repair = b"\n"
        elif contents.tail:
            self.num_torn_bytes, self._cut_at = len(contents.tail), contents.tail_offset
        if not self.lines and contents.size:
            self._handle.close()
            raise InputError(f"-o {self.path}: not a results file (it holds no complete "
                             "results line); the file is left as it was: write to another "
                             "file, or remove it if a killed sweep left it")

    @property
    def done_keys(self) -> set[tuple[Any, ...]]:
        return {key_of_line(line) for line in self.lines}

    def check_settings(self, settings: dict[str, Any],
                       absent: dict[str, Any] | None = None) -> None:
        """Refuse to mix solve settings (written on every line) in one file: its lines would
        not be comparable. `absent`: the value a setting had on lines written before it was
        (a line without it was solved under that value)."""
        absent = absent or {}
        for line in self.lines:
            theirs = {name: line.get(name, absent.get(name)) for name in settings}
            if theirs != settings:
                shown = ", ".join(f"{k} {v}" for k, v in theirs.items())
                raise InputError(f"-o {self.path}: its lines were solved with {shown}; resume "
                                 "with the same settings or write to another file")

    def append(self, line: dict[str, Any]) -> None:
        """Write one line whole and fsync it (the first one after cutting a torn last line
        off, or after the newline a complete last line lacked). The bytes go to the file
        descriptor, not through a buffer, and a write that fails (a full disk) is cut back
        off: a failed append leaves the file as it was, not a torn line."""
        text = json.dumps(line, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        data = memoryview(self._repair + text.encode("utf-8") + b"\n")
        descriptor = self._handle.fileno()
        try:
            if self._cut_at is not None:
                os.ftruncate(descriptor, self._cut_at)
                self._cut_at = None
            start = os.fstat(descriptor).st_size
            try:
                while data:
                    data = data[os.write(descriptor, data):]
                os.fsync(descriptor)
            except OSError:
                os.ftruncate(descriptor, start)
                raise
        except OSError as exc:
            raise InputError(f"-o {self.path}: cannot write the results file "
                             f"({exc.strerror})") from None
        self._repair = b""

    def close(self) -> None:
        self._handle.close()  # nothing is buffered: the lines went to the descriptor

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
