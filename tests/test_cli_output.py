"""The CLI's tables read like a tool's: numbers to the precision they carry (three significant
figures, so never "312.00" or "80.00"), memory in decimal GB everywhere and labelled so, "does
not fit" and "infeasible" in red on a terminal and plain in a file, and the per-stage table
within 100 columns off a terminal (short labels, spelled out below it) with nothing cut."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from solver.cli import cli

ESTIMATE_70B = ["estimate", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "64",
                "--tp", "4", "--pp", "4", "--zero", "3"]
NUMBER = re.compile(r"\d[\d,]*\.\d+")
RED = "\x1b[1;31m"


def run(args: list[str], **env: str) -> str:
    result = CliRunner().invoke(cli, args, env=env or None)
    assert result.exit_code == 0, result.output
    return result.output


def _significant(number: str) -> int:
    return len(number.replace(",", "").replace(".", "").lstrip("0"))


@pytest.mark.parametrize("args", [
    ["clusters"],
    ESTIMATE_70B + ["--per-stage"],
    ["optimize", "--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8", "--top", "3"],
])
def test_table_numbers_carry_three_significant_figures(args: list[str]) -> None:
    """Cells that hold a number (a tier's "313.6 GB/s" in a text cell is the data file's)."""
    rows = [line for line in run(args).splitlines() if line.startswith(("│", " "))]
    cells = [cell.strip() for line in rows  # boxed tables, or compact ones (space-separated)
             for cell in (line.split("│") if "│" in line else line.split())]
    numbers = [c.rstrip("%") for c in cells if NUMBER.fullmatch(c.rstrip("%"))]
    assert numbers, "the tables hold decimals"
    assert [n for n in numbers if _significant(n) > 3] == []


def test_clusters_memory_is_decimal_gb() -> None:
    """An 80 GiB A100 is 85.9 decimal GB, the unit every plan's memory is printed in."""
    output = run(["clusters"])
    assert "memory GB" in output and "GiB" not in output
    row = next(line for line in output.splitlines() if "dgx-a100-80gb" in line)
    assert " 85.9 " in row and " 312 " in row


def test_per_stage_fits_100_columns_off_a_terminal() -> None:
    output = run(ESTIMATE_70B + ["--per-stage"])
    lines = output.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("memory per GPU by")))
    table = lines[start:start + 9]
    assert max(len(line.rstrip()) for line in table) <= 100
    assert "…" not in output
    header = next(line for line in table if "stage" in line and "weights" in line)
    assert "gathered" in header and "optimizer" in header  # ZeRO 3 gathers the layers
    assert ("optimizer: optimizer state; logits: logits + cross-entropy; gathered: ZeRO-3 "
            "gathered layers") in output.replace("\n", " ")


def test_stage_columns_every_stage_leaves_at_zero_are_dropped() -> None:
    """Without ZeRO 3 no layers are gathered: that column goes."""
    output = run(ESTIMATE_70B[:-2] + ["--zero", "1", "--per-stage"])
    header = next(line for line in output.splitlines() if "stage" in line and "weights" in line)
    assert "gathered" not in header and "ZeRO-3" not in header


def test_does_not_fit_is_red_on_a_terminal_only() -> None:
    args = ["estimate", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
            "--tp", "8"]
    plain = run(args)
    assert "does not fit" in plain and "\x1b[" not in plain
    coloured = run(args, FORCE_COLOR="1")  # rich treats the output as a colour terminal
    line = next(line for line in coloured.splitlines() if "does not fit" in line)
    assert line.startswith(RED)


def test_infeasible_is_red_on_a_terminal_only() -> None:
    # (Offloading the optimizer to the host makes it fit: tests/test_offload.py.)
    args = ["optimize", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
            "--no-optimizer-offload", "--no-activation-offload"]
    plain = run(args)
    assert "infeasible" in plain and "\x1b[" not in plain
    coloured = run(args, FORCE_COLOR="1")
    line = next(line for line in coloured.splitlines() if "cannot hold together" in line)
    assert line.startswith(RED + "infeasible")


def test_no_color_turns_the_red_off() -> None:
    args = ["estimate", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "8",
            "--tp", "8"]
    output = run(args, FORCE_COLOR="1", NO_COLOR="1")
    line = next(line for line in output.splitlines() if "does not fit" in line)
    assert "31m" not in line
