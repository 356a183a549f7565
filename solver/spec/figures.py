"""Numbers printed to the precision they carry: at most three significant figures (85.5, not
85.50; 0.0164, not 0.02), trailing zeros dropped (80, not 80.00; a log's 0.01 stays 0.01),
never in exponent form, with thousands separators past 9,999. One function for every printed
figure of the CLI, the report and the explanations.
"""

from __future__ import annotations

import math


def format_significant(value: float, digits: int = 3) -> str:
    """`value` to at most `digits` significant figures: 57.666 -> 57.7, 0.016437 -> 0.0164,
    85.5 -> 85.5, 80.0 -> 80, 0.01 -> 0.01, 123456 -> 123,456 (integral digits are never
    dropped)."""
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits}g}")  # 0.99999 -> 1.0: the decade after rounding
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    if decimals == 0:
        return f"{round(value):,}" if abs(value) >= 1e4 else f"{round(value)}"
    return f"{rounded:.{decimals}f}".rstrip("0").rstrip(".")
