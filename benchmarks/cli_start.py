"""Start-up time of the command line (issue 15: `parplan --help` in at most 0.3 s, the median
of 10 runs): each command below run N times in a fresh interpreter, as a user runs it.

    .venv/bin/python benchmarks/cli_start.py [--runs N]

Printed: median, least and most wall seconds per command, and what `parplan --help` imports
(`python -X importtime`: the five slowest modules, cumulative). The machine's own start-up is
the first row (`python -c pass`), to read the others against.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

COMMANDS = [
    ("python -c pass", [sys.executable, "-c", "pass"]),
    ("parplan --help", [sys.executable, "-m", "solver", "--help"]),
    ("parplan optimize --help", [sys.executable, "-m", "solver", "optimize", "--help"]),
    ("parplan models", [sys.executable, "-m", "solver", "models"]),
]


def wall_seconds(argv: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def slowest_imports(argv: list[str], count: int = 5) -> list[tuple[str, float]]:
    """The `count` modules of largest cumulative import time (seconds) under -X importtime."""
    out = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], capture_output=True,
                         text=True, check=True)
    rows = []
    for line in out.stderr.splitlines():
        parts = line.removeprefix("import time:").split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((parts[2].rstrip(), int(parts[1]) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    console = Console(width=100)
    table = Table(title=f"Command-line start-up, {args.runs} runs each (wall seconds)")
    for column in ("command", "median", "least", "most"):
        table.add_column(column, justify="left" if column == "command" else "right")
    for label, argv in COMMANDS:
        times = wall_seconds(argv, args.runs)
        table.add_row(label, f"{statistics.median(times):.3f}", f"{min(times):.3f}",
                      f"{max(times):.3f}")
    table.add_row("target (issue 15): parplan --help", "<= 0.3", "", "")
    console.print(table)
    imports = Table(title="What `parplan --help` imports: the slowest, cumulative")
    imports.add_column("module")
    imports.add_column("seconds", justify="right")
    for module, seconds in slowest_imports(COMMANDS[1][1]):
        imports.add_row(module, f"{seconds:.3f}")
    console.print(imports)


if __name__ == "__main__":
    main()
