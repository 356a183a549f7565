"""solver.runtime: the allocator settings the entry points apply (glibc's mallopt)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")
def test_tune_allocator_applies_under_glibc_and_can_repeat() -> None:
    # A fresh interpreter, so that this test process keeps its own allocator settings.
    code = ("from solver.runtime import tune_allocator; "
            "print(tune_allocator(), tune_allocator())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["True", "True"]


@pytest.mark.skipif(sys.platform.startswith("linux"), reason="the no-op path of other systems")
def test_tune_allocator_changes_nothing_elsewhere() -> None:
    from solver.runtime import tune_allocator

    assert tune_allocator() is False
