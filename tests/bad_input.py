"""What the generated bad-input tests share (tests/test_bad_input_generated.py,
tests/test_bad_flags_generated.py): the values nothing may hold, the base arguments of each
command, and running one case through click's CliRunner under a time limit, checking that it is
answered with exit status 2 and one stderr line that names the file, field or flag."""

from __future__ import annotations

import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import CliRunner
from hypothesis import HealthCheck, settings

from solver.cli import cli

ROOT = Path(__file__).resolve().parent.parent
NCCL_LOG = ROOT / "tests" / "data" / "nccl" / "nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt"
TRAINING_LOG = ROOT / "tests" / "data" / "training_logs" / "megatron_bridge_mtp.log"
LIMIT_S = 20.0  # per case; bad input fails in milliseconds, the controls in a second
GENERATED = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture,
                                            HealthCheck.too_slow])

# Values no numeric field may hold, as TOML text; those the TOML reader itself refuses name
# only the file (`PARSE_ERRORS`), the others the file and the field.
PARSE_ERRORS = ("9" * 5000, "[" * 5000 + "]" * 5000)
BAD_INTEGER_TOML = ("true", "false", '"8"', "nan", "inf", "-inf", "1e999", "0.5", str(10**30),
                    "[8]", "{ a = 8 }", "-8", *PARSE_ERRORS)
BAD_FLOAT_TOML = ("true", '"80"', "nan", "inf", "-inf", "1e999", "1e300", "1e-300", "-1.0",
                  "[1.0]", *PARSE_ERRORS)
# The same as JSON values (NaN and Infinity are what Python's json writes and reads).
BAD_INTEGER_JSON = (True, False, "8", math.nan, math.inf, 0.5, 10**30, [8], {"a": 8}, -8, None)
BAD_FLOAT_JSON = (True, "80", math.nan, math.inf, -math.inf, 1e300, 1e-300, -1.0, [1.0])
# Values no numeric flag takes (an integer flag also refuses 0.5 and -1: every one starts at
# 0 or 1 or is checked by its spec).
BAD_FLAG_VALUES = ("nan", "inf", "-inf", "1e999", "true", "abc", "", str(10**30), "9" * 5000)
BAD_INTEGER_FLAG_VALUES = (*BAD_FLAG_VALUES, "0.5", "-1")

# Issue 37: names that must stay text. A model id an engine's argparse would read as an option
# (refused by the spec); markup of rich ([/x] raised, [link=...] linked), HTML that Plotly and
# Markdown would render, and spreadsheet formulas (shown as written, neutralised in summary.csv).
OPTION_LIKE_NAMES = ("--trust-remote-code", "-O3", "--model=x", "--", "-", "-h", "--help")
MARKUP_NAMES = ("[/x]", "[link=https://evil.example]x", "[bold]x[/bold]", "[/]",
                '<a href="https://evil.example">x</a>', "<img src=x onerror=alert(1)>",
                '=HYPERLINK("https://evil.example","x")', "+1", "@SUM(1)", "x½²", "a|b",
                "[x](https://evil.example)")
# Optional fields of a results line the report shows, with values they cannot hold
# (solver.sweep.result_line): (field, plan-level?, bad values).
BAD_OPTIONAL_RESULT_FIELDS = (
    ("why", False, (5, "text", [1], math.nan, {"a": "b"})),
    ("rules", False, ([1], {"a": 1}, "text")),
    ("optimality_gap", False, ("x", math.nan, math.inf, -1.0, [0.0], True)),
    ("memory_headroom", False, (5, [1], True)),
    ("usable_memory_gb", True, ("x", math.nan, math.inf, -1.0, True, [1.0])),
    ("time_seconds", True, ([1.0], 5, {"compute": math.nan}, {"compute": "x"},
                            {"compute": -1.0}, {"compute": math.inf})),
    ("equivalent", True, ("x", [5], [{"recompute": 5}], [{}])),
    ("layout", True, ("x", 5, [1], {"syntax": 5})),
    ("memory_savers", True, ("abc", [5], 5, ["model=x"])),
    ("offloads", True, ("optimizer", [5], ["format=vllm"])),
    ("recompute_modules", True, (5, "core_attn", [None])),
)

# What a command needs besides the flag under test (its required options, valid and cheap).
BASE_ARGS = {
    "optimize": ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8", "--json"],
    "estimate": ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8", "--json"],
    "launch": ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8"],
    "serve": ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8", "--context",
              "8k", "--json"],
    "rl": ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8",
           "--prompts-per-step", "16", "--response-len", "64-256", "--json"],
    "sweep": ["--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8", "--jobs", "1",
              "-q"],
    "calibrate nccl-tests": [str(NCCL_LOG), "--cluster", "dgx-h100"],
    "calibrate run": ["--cluster", "dgx-h100"],
    "calibrate training-log": [str(TRAINING_LOG), "--model", "llama3.2-1b", "--cluster",
                               "dgx-h100", "--gpus", "8"],
    # A bad flag value stops click before the file is read (-o is added where it is used).
    "report": ["results.jsonl"],
}


class Hang(Exception):
    """A case that ran past LIMIT_S."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    if not hasattr(signal, "setitimer"):  # pragma: no cover - Windows
        yield
        return

    def expire(*_: object) -> None:
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def invoke(*args: object):
    with time_limit(LIMIT_S):
        result = CliRunner().invoke(cli, [str(a) for a in args])
    assert not isinstance(result.exception, Hang), f"hang: {args}"
    return result


def assert_one_line_error(result, *needles: str) -> None:
    """Exit 2, one stderr line that names `needles`, no traceback."""
    assert "Traceback" not in result.output, result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"unhandled {type(result.exception).__name__}") \
            from result.exception
    assert result.exit_code == 2, result.output[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[:2000]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0][:2000])


def assert_ok(result) -> None:
    assert result.exit_code == 0, result.output[-2000:]


