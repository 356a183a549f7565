"""Numbers printed to the precision they carry (solver.spec.figures.format_significant): at most
three significant figures, no trailing zeros ("80", not "80.00"; a log's "0.01" not "0.0100"),
never an exponent."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.spec.figures import format_significant


@pytest.mark.parametrize(("value", "text"), [
    (80.0, "80"), (85.5, "85.5"), (57.666, "57.7"), (0.016437, "0.0164"), (0.99999, "1"),
    (999.6, "1000"), (4.0, "4"), (123456.0, "123,456"), (0.0, "0"), (0.01, "0.01"),
    (0.32, "0.32"), (-2.345, "-2.35"), (12345.0, "12,345"), (100.04, "100"),
])
def test_examples(value: float, text: str) -> None:
    assert format_significant(value) == text


@given(st.floats(min_value=1e-6, max_value=1e9, allow_nan=False))
def test_three_significant_figures_without_an_exponent(value: float) -> None:
    text = format_significant(value)
    assert "e" not in text
    assert float(text.replace(",", "")) == pytest.approx(value, rel=5e-3)
    digits = text.replace(",", "").replace(".", "").lstrip("0")
    # Integers of four or more digits keep them all (1,234 is not written 1,230).
    assert len(digits) <= 3 or "." not in text
    assert not ("." in text and text.endswith("0"))
