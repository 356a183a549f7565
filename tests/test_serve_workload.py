"""The serving workload (solver.serve.workload): length distributions from the command line
and from files, their moments and quantiles, and the one-line errors of bad input."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from solver.cli import cli
from solver.serve.workload import (
    LengthDistribution,
    ServeLoadSpec,
    parse_length_distribution,
)


def test_fixed_and_uniform() -> None:
    assert parse_length_distribution("2048", "--input-len") == LengthDistribution.fixed(2048)
    uniform = parse_length_distribution("1000-3000", "--input-len")
    assert (uniform.kind, uniform.low, uniform.high) == ("uniform", 1000, 3000)
    assert uniform.mean == pytest.approx(2000.0)
    assert uniform.quantile(0.5) == 2000.0  # the 1001st of 2001 integers
    assert uniform.quantile(0.9) == 2800.0


@given(st.integers(1, 5000), st.integers(0, 5000))
def test_uniform_support_keeps_the_mean(low: int, width: int) -> None:
    dist = LengthDistribution(kind="uniform" if width else "fixed", low=low, high=low + width)
    lengths, weights = dist.support()
    assert weights.sum() == pytest.approx(1.0)
    assert float(lengths @ weights) == pytest.approx(low + width / 2, rel=1e-12)
    assert lengths.min() >= low - 0.5 and lengths.max() <= low + width + 0.5


def test_length_file(tmp_path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("# ShareGPT-like prompts\n100\n\n300\n200  # a comment\n")
    dist = parse_length_distribution(f"@{path}", "--input-len")
    assert (dist.kind, dist.low, dist.high, dist.values) == ("empirical", 100, 300,
                                                             (100, 200, 300))
    assert dist.mean == pytest.approx(200.0)
    assert dist.quantile(0.5) == 200.0 and dist.quantile(0.9) == 300.0


def test_long_length_file_is_binned_with_its_mean(tmp_path) -> None:
    values = np.arange(1, 1001)
    path = tmp_path / "many.txt"
    path.write_text("\n".join(str(v) for v in values))
    dist = parse_length_distribution(f"@{path}", "--output-len")
    lengths, weights = dist.support()
    assert len(lengths) == 64 and float(lengths @ weights) == pytest.approx(values.mean())


@pytest.mark.parametrize(("text", "message"), [
    ("abc", "expected N, LO-HI or @FILE"),
    ("3000-1000", r"LO \(3000\) must not exceed HI \(1000\)"),
    ("0", "0 is not between 1"),
    ("1-2-3", "expected N, LO-HI or @FILE"),
])
def test_bad_lengths(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_length_distribution(text, "--input-len")


def test_bad_file_names_the_line(tmp_path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("100\n12.5\n")
    with pytest.raises(ValueError, match=r"line 2: '12.5' is not a whole number"):
        parse_length_distribution(f"@{path}", "--input-len")
    with pytest.raises(ValueError, match="cannot read the file"):
        parse_length_distribution(f"@{tmp_path / 'missing.txt'}", "--input-len")
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing\n")
    with pytest.raises(ValueError, match="holds no lengths"):
        parse_length_distribution(f"@{empty}", "--input-len")


def test_one_load_only() -> None:
    with pytest.raises(ValueError, match="not both"):
        ServeLoadSpec(request_rate=1.0, concurrency=4)


BASE = ("serve", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "8",
        "--context", "8k")


@pytest.mark.parametrize(("args", "message"), [
    (("--input-len", "5-x"), "--input-len"),
    (("--input-len", "4000-8000", "--output-len", "512"), "must not exceed --context"),
    (("--request-rate", "0"), "--request-rate"),
    (("--request-rate", "nan"), "--request-rate"),
    (("--request-rate", "2", "--concurrency", "8"), "give one load, not both"),
    (("--concurrency", "0"), "--concurrency"),
    (("--slo-percentile", "p75"), "--slo-percentile"),
    (("--input-len", "@/nonexistent/lengths.txt"), "cannot read the file"),
])
def test_cli_bad_workload_is_one_line_and_exit_2(args: tuple[str, ...], message: str) -> None:
    result = CliRunner().invoke(cli, [*BASE, *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert message in result.stderr and "Traceback" not in result.output
    assert len([line for line in lines if line.strip()]) <= 3  # click's usage + the one error
