"""solver.cost.serving.price: $ per million tokens from a price per GPU-hour, tokens per joule at
board power, and the board powers of the GPU catalog (datasheets)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.catalog import load_gpu_spec
from solver.cost.serving.price import estimate_dollars_per_million_tokens, estimate_tokens_per_joule


def test_worked_example_eight_h100_at_two_fifty() -> None:
    """Module docstring: 8 H100 SXM at $2.50 per GPU-hour = $20/h; at 10,000 output tokens/s
    that is 20 / 3,600 / 10,000 x 1e6 = $0.5556 per million (cost per million tokens as
    SemiAnalysis's InferenceMAX defines it: GPU-hours' cost over the tokens they produce);
    700 W each (NVIDIA H100 datasheet, H100 SXM max TDP) = 5,600 W: 1.786 tokens/J."""
    h100 = load_gpu_spec("h100-sxm")
    assert h100.power_limit_w == 700.0
    assert float(estimate_dollars_per_million_tokens(2.5 * 8, 10_000)) == pytest.approx(
        0.5556, abs=5e-5)
    assert float(estimate_tokens_per_joule(10_000, 8 * h100.power_limit_w)) == pytest.approx(
        1.7857, abs=5e-5)


@pytest.mark.parametrize(("gpu", "watts"), [
    ("a100-80gb", 400.0),  # A100 datasheet: SXM max TDP 400 W
    ("h200", 700.0),       # H200 datasheet: SXM max TDP up to 700 W
    ("b200", 1000.0),      # HGX B200 specifications: 1,000 W per GPU
    ("mi300x", 750.0),     # AMD MI300X data sheet: peak total board power 750 W
    ("l40s", 350.0),       # L40S datasheet: max power consumption 350 W
    ("h100-96gb", 500.0),  # torchtitan's Grand Teton hosts: the default 500 W power limit
])
def test_catalog_board_power_from_datasheets(gpu: str, watts: float) -> None:
    assert load_gpu_spec(gpu).power_limit_w == watts


def test_no_tokens_costs_infinitely_much() -> None:
    assert float(estimate_dollars_per_million_tokens(20.0, 0.0)) == float("inf")


@given(st.floats(0.01, 1e4), st.floats(1.0, 1e7), st.floats(1.5, 10.0))
def test_price_scales_with_dollars_and_inversely_with_tokens(dollars: float, tokens: float,
                                                             factor: float) -> None:
    base = float(estimate_dollars_per_million_tokens(dollars, tokens))
    assert float(estimate_dollars_per_million_tokens(dollars * factor, tokens)) == \
        pytest.approx(base * factor, rel=1e-12)
    assert float(estimate_dollars_per_million_tokens(dollars, tokens * factor)) == \
        pytest.approx(base / factor, rel=1e-12)
    # A million tokens at `tokens`/s take 1e6 / tokens seconds of the deployment's $/s.
    assert base == pytest.approx(dollars / 3600 * 1e6 / tokens, rel=1e-12)


@given(st.floats(1.0, 1e7), st.floats(10.0, 1e6))
def test_tokens_per_joule_times_watts_is_tokens_per_second(tokens: float, watts: float) -> None:
    assert float(estimate_tokens_per_joule(tokens, watts)) * watts == pytest.approx(tokens,
                                                                                  rel=1e-12)
