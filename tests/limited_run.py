"""Running `python -m solver` in a child process under resource limits (issue 37's adversarial
tests): an address-space cap (RLIMIT_AS), so a command whose memory grows without bound fails
instead of filling the machine; a file-size cap (RLIMIT_FSIZE: a write past it fails with
EFBIG, CPython ignores SIGXFSZ), which stands for a full disk; and stdout sent to a path
(/dev/full), a pipe whose reader is gone, or closed."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEMORY_LIMIT_BYTES = 2**30  # `optimize` of llama3.2-1b on 8 GPUs runs within 1 GiB
TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Finished:
    returncode: int
    stderr: str


def run_limited(*args: object, cwd: Path, stdout: str = "null", file_bytes: int | None = None,
                memory_bytes: int = MEMORY_LIMIT_BYTES, timeout_s: float = TIMEOUT_S) -> Finished:
    """`parplan ARGS` with the limits above. stdout: "null", "pipe-closed" (a pipe whose read
    end is closed before the command starts), "closed" (fd 1 closed) or a path."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
        if file_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
        if stdout == "closed":
            os.close(1)

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    command = [sys.executable, "-m", "solver", *(str(a) for a in args)]
    read_end = None
    if stdout == "pipe-closed":
        read_end, target = os.pipe()
        os.close(read_end)
    elif stdout in ("null", "closed"):
        target = os.open(os.devnull, os.O_WRONLY)
    else:
        target = os.open(stdout, os.O_WRONLY)
    try:
        done = subprocess.run(command, stdout=target, stderr=subprocess.PIPE, cwd=cwd, env=env,
                              preexec_fn=limit, timeout=timeout_s, check=False)
    finally:
        os.close(target)
    return Finished(done.returncode, done.stderr.decode("utf-8", "replace"))


def assert_one_line(finished: Finished, *needles: str) -> str:
    """Exit 2 and one `error:` line on stderr holding `needles`, no traceback; the line."""
    lines = finished.stderr.strip().splitlines()
    assert finished.returncode == 2 and len(lines) == 1, (finished.returncode,
                                                           finished.stderr[-3000:])
    assert lines[0].startswith("error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
