"""Memory headroom: GPU memory a plan must leave free, given as a share of the GPU's memory
(`10%`, `0.1`) or in decimal GB (`4GB`), or by default (`auto`) the margin the memory model's
own error asks for: the share a plan must stay under to fit with at least 90% probability
under the framework's memory sigma (solver.cost.uncertainty.build_error_headroom: 1 -
exp(-sigma * 1.2816), 9.0% at Megatron's 0.0739); `0` turns it off. The usable capacity is the
GPU's memory minus the headroom: every "fits" of training and serving reads it
(MemoryHeadroom.usable_bytes), nothing else; `rule` states it in the output.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field

from solver.errors import InputError

GB = 1e9
# What --memory-headroom takes, for the error message.
HEADROOM_FORMS = "auto, a share like 10% or 0.1, or decimal GB like 4GB"
# The value of --memory-headroom that asks for the error model's margin (the default).
AUTO = "auto"


class MemoryHeadroom(BaseModel):
    """A share of the GPU's memory (`fraction`) or a number of bytes kept free; both 0: none.
    The error model's margin (`auto`) also carries the fit probability it is sized for, the
    memory sigma and the framework profile whose sigma it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    fraction: float = Field(default=0.0, ge=0.0, lt=1.0)
    bytes: float = Field(default=0.0, ge=0.0, le=1e15)
    fit_probability: float | None = Field(default=None, ge=0.5, lt=1.0)
    memory_sigma: float | None = Field(default=None, gt=0.0)
    profile: str = ""

    @property
    def is_error_margin(self) -> bool:
        """Whether this is the memory model's error margin (`auto`), not a margin a user set."""
        return self.fit_probability is not None

    def usable_bytes(self, capacity_bytes: float) -> float:
        """What a plan may use of a GPU of `capacity_bytes`: 80 GiB (85.9 GB) less 10% is
        77.3 GB, less 4GB is 81.9 GB."""
        return capacity_bytes * (1.0 - self.fraction) - self.bytes

    def fit_target_bytes(self, capacity_bytes: float) -> float:
        """The memory a plan must truly fit, against which its fit probability is taken: the
        GPU's whole memory under the error margin (the margin is the doubt about the
        prediction, not memory the plan may not use), the usable memory under a user's
        margin (a profiler, a second process)."""
        return capacity_bytes if self.is_error_margin else self.usable_bytes(capacity_bytes)

    def label(self) -> str:
        """"10%", "4 GB", "9.0%" (the error margin, to 0.1%), or "" without headroom."""
        if self.is_error_margin:
            return f"{100 * self.fraction:.1f}%"
        if self.fraction:
            return f"{100 * self.fraction:g}%"
        return f"{self.bytes / GB:g} GB" if self.bytes else ""

    def setting(self) -> str:
        """What --memory-headroom reproduces it: "auto" for the error margin, else the label
        ("" without headroom: `0`)."""
        return AUTO if self.is_error_margin else self.label()

    def rule(self, capacity_bytes: float) -> str:
        """The fit rule in one sentence, for the output: "headroom 9.0% (7.7 GB): plans must
        fit with >= 90% probability under the memory model's error (sigma 0.074 for
        megatron); --memory-headroom 0 turns it off"."""
        kept = f"{(capacity_bytes - self.usable_bytes(capacity_bytes)) / GB:.1f} GB"
        if self.is_error_margin:
            return (f"headroom {self.label()} ({kept}): plans must fit with >= "
                    f"{self.fit_probability:.0%} probability under the memory model's error "
                    f"(sigma {self.memory_sigma:.3f} for {self.profile}); --memory-headroom 0 "
                    "turns it off")
        if self.label():
            return f"headroom {self.label()} ({kept}), as --memory-headroom sets it"
        return ("no headroom (--memory-headroom 0): plans may fill the GPU's memory; one that "
                "fills it fits with 50% probability under the memory model's error")

    def describe(self, capacity_bytes: float) -> str:
        """The capacity as shown: "85.9 GB", or "85.9 GB - 10% headroom = 77.3 GB"."""
        shown = f"{capacity_bytes / GB:.1f} GB"
        if not self.label():
            return shown
        return (f"{shown} - {self.label()} headroom = "
                f"{self.usable_bytes(capacity_bytes) / GB:.1f} GB")


def parse_memory_headroom(text: str) -> MemoryHeadroom | None:
    """`10%`, `0.1` (a share below 1) or `4GB` / `4 GB` (decimal GB); `auto`: None, the
    default, the error model's margin (built where the framework is known:
    solver.cost.uncertainty.resolve_memory_headroom); anything else is an InputError naming
    the value and the forms."""
    cleaned = str(text).strip().lower().replace(" ", "")
    if cleaned == AUTO:
        return None
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
