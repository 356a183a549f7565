"""Writing an output file whole or not at all (issue 37): the text goes to a temporary file in
the same folder, is fsync'd, and is renamed over the target, so a full disk, a kill or an
unwritable folder leaves the file that was there (or none), never a part of one.

A target that exists and is not a regular file (/dev/stdout, a FIFO, /dev/full) is written in
place: renaming over it would replace the device. Any OSError is one InputError naming the flag
and the path.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from solver.errors import InputError


def write_output_file(path: str | Path, text: str, flag: str = "-o") -> None:
    """`text` (UTF-8) into `path`, whole or not at all (module docstring)."""
    path = Path(path)
    data = text.encode("utf-8")
    try:
        try:
            existing = os.stat(path)
        except FileNotFoundError:
            existing = None
        if existing is not None and not stat.S_ISREG(existing.st_mode):
            with open(path, "wb") as handle:
                handle.write(data)
            return
        mode = stat.S_IMODE(existing.st_mode) if existing is not None else _default_mode()
        _replace(path, data, mode)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write it ({exc.strerror or exc})") from None


def _replace(path: Path, data: bytes, mode: int) -> None:
    descriptor, temporary = tempfile.mkstemp(prefix=".parplan-", suffix=".tmp",
                                             dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _default_mode() -> int:
    """The mode open() would give a new file: 0o666 less the umask (mkstemp's is 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
