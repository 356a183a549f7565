"""Memory headroom: GPU memory a plan must leave free (for allocator fragmentation spikes, a
profiler, a second process), given as a share of the GPU's memory (`10%`, `0.1`) or in decimal
GB (`4GB`). The usable capacity is the GPU's memory minus the headroom: every "fits" of
training and serving reads it (MemoryHeadroom.usable_bytes), nothing else.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field

from solver.errors import InputError

GB = 1e9
# What --memory-headroom takes, for the error message.
HEADROOM_FORMS = "a share like 10% or 0.1, or decimal GB like 4GB"


class MemoryHeadroom(BaseModel):
    """A share of the GPU's memory (`fraction`) or a number of bytes kept free; both 0: none."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    bytes: float = Field(default=0.0, ge=0.0, le=1e15)

    def usable_bytes(self, capacity_bytes: float) -> float:
        """What a plan may use of a GPU of `capacity_bytes`: 80 GiB (85.9 GB) less 10% is
        77.3 GB, less 4GB is 81.9 GB."""
        return capacity_bytes * (1.0 - self.fraction) - self.bytes

    def label(self) -> str:
        """"10%", "4 GB", or "" without headroom."""
        if self.fraction:
            return f"{100 * self.fraction:g}%"
        return f"{self.bytes / GB:g} GB" if self.bytes else ""

    def describe(self, capacity_bytes: float) -> str:
        """The capacity as shown: "85.9 GB", or "85.9 GB - 10% headroom = 77.3 GB"."""
        shown = f"{capacity_bytes / GB:.1f} GB"
        if not self.label():
            return shown
        return (f"{shown} - {self.label()} headroom = "
                f"{self.usable_bytes(capacity_bytes) / GB:.1f} GB")


def parse_memory_headroom(text: str) -> MemoryHeadroom:
    """`10%`, `0.1` (a share below 1) or `4GB` / `4 GB` (decimal GB); anything else is an
    InputError naming the value and the forms."""
    cleaned = str(text).strip().lower().replace(" ", "")
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)(%|gb)?", cleaned)
    if match is None:
        raise InputError(f"--memory-headroom {text!r}: not {HEADROOM_FORMS}")
    value, unit = float(match.group(1)), match.group(2)
    if not math.isfinite(value):
        raise InputError(f"--memory-headroom {text!r}: not {HEADROOM_FORMS}")
    if unit == "gb":
        if value > 1e6:
            raise InputError(f"--memory-headroom {text!r}: more than any GPU's memory")
        return MemoryHeadroom(bytes=value * GB)
    fraction = value / 100 if unit == "%" else value
    if fraction >= 1:
        hint = " (for GB, write 4GB)" if unit is None else ""
        raise InputError(f"--memory-headroom {text!r}: a share must be below 100%{hint}")
    return MemoryHeadroom(fraction=fraction)


def check_headroom_leaves_memory(headroom: MemoryHeadroom, capacity_bytes: float) -> None:
    """An InputError when the headroom leaves nothing of a GPU of `capacity_bytes`."""
    if headroom.usable_bytes(capacity_bytes) <= 0:
        raise InputError(f"--memory-headroom {headroom.label()}: leaves nothing of the GPU's "
                         f"{capacity_bytes / GB:.1f} GB")
