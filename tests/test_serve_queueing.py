"""solver.cost.serving.queueing pinned to closed forms of queueing theory (Kleinrock, Queueing Systems
Vol. 1, 1975): M/M/1's mean wait rho / (mu - lam) and its exact waiting-time tail
rho exp(-(mu - lam) t), M/D/1's mean wait rho s / (2 (1 - rho)); the TPOT spread's window
variance (Eick, Massey and Whitt 1993) and feedback ratio (van Kampen's linear noise
approximation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.cost.serving.queueing import (
    estimate_feedback_variance_ratio,
    estimate_mg1_wait_s,
    estimate_tpot_variance_coefficients,
    estimate_wait_quantile_s,
)


@given(st.floats(0.05, 0.95), st.floats(0.1, 100.0))
def test_pollaczek_khinchine_gives_mm1_mean_wait(rho: float, mu: float) -> None:
    lam = rho * mu  # exponential service: E[S] = 1/mu, E[S^2] = 2/mu^2
    wait = estimate_mg1_wait_s(lam, 1.0 / mu, 2.0 / mu**2)
    assert wait == pytest.approx(rho / (mu - lam), rel=1e-12)


def test_md1_mean_wait_worked_number() -> None:
    # rho 0.5, s = 1 s: 0.5 x 1 / (2 x 0.5) = 0.5 s
    assert estimate_mg1_wait_s(0.5, 1.0, 1.0) == pytest.approx(0.5)
    assert estimate_mg1_wait_s(1.0, 1.0, 1.0) == np.inf
    assert estimate_mg1_wait_s(0.0, 1.0, 1.0) == 0.0


@given(st.floats(0.11, 0.95), st.floats(0.1, 100.0), st.sampled_from([0.5, 0.9, 0.99]))
def test_wait_quantile_is_exact_for_mm1(rho: float, mu: float, q: float) -> None:
    """M/M/1: P(W > t) = rho exp(-(mu - lam) t), so the q-quantile solves it for 1 - q."""
    lam = rho * mu
    mean = rho / (mu - lam)
    t = float(estimate_wait_quantile_s(mean, rho, q))
    if rho <= 1 - q:
        assert t == 0.0
    else:
        assert rho * math.exp(-(mu - lam) * t) == pytest.approx(1 - q, rel=1e-9)


def test_wait_quantile_worked_number() -> None:
    # M/M/1 at rho 0.8, mu 1/s: E[W] = 4 s; p90 = (4 / 0.8) ln(0.8 / 0.1) = 5 ln 8
    assert estimate_wait_quantile_s(4.0, 0.8, 0.9) == pytest.approx(5 * math.log(8))


def test_tpot_variance_coefficients_worked_numbers() -> None:
    """solver.cost.serving.queueing docstring: every request 512 + 64 tokens gives A = 64, B = 8 and
    C = 2/3 (the window average of an M/G/inf occupancy whose every service equals the window:
    Var = 2 lam T / 3)."""
    a, b, c = estimate_tpot_variance_coefficients([512], [1.0], [64], [1.0])
    assert (a, b, c) == pytest.approx((64.0, 8.0, 2.0 / 3.0))


def test_window_variance_is_the_mginf_integral() -> None:
    """C against the integral it closes: (2 / T^2) int_0^T (T - u) lam E[(S - u)+] du over
    lam E[S] (Eick, Massey and Whitt 1993), numerically, for output lengths 10, 50, 200."""
    lengths, weights = np.array([10.0, 50.0, 200.0]), np.array([0.5, 0.3, 0.2])
    _, _, c = estimate_tpot_variance_coefficients([1], [1.0], lengths, weights)
    expected = 0.0
    for window, w in zip(lengths, weights):
        u = np.linspace(0.0, window, 20001)
        tail = sum(wk * np.maximum(lk - u, 0.0) for lk, wk in zip(lengths, weights))
        integral = np.trapezoid((window - u) * tail, u)
        expected += w * 2.0 * integral / (window ** 2 * np.dot(lengths, weights))
    assert c == pytest.approx(expected, rel=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 4000), min_size=1, max_size=6))
def test_window_variance_lies_between_the_limits(lengths: list[int]) -> None:
    """An average over a window never varies more than the occupancy at one instant: C stays
    within (0, 1]."""
    weights = np.full(len(lengths), 1.0 / len(lengths))
    _, _, c = estimate_tpot_variance_coefficients([1], [1.0], lengths, weights)
    assert 0.0 < c <= 1.0 + 1e-12


def test_feedback_ratio_worked_number() -> None:
    """R(0.5) = phi(0.5) / (0.5 phi(1)) with phi(x) = 2 (x - 1 + e^-x) / x^2 (the variance of
    an Ornstein-Uhlenbeck process's average over x correlation times): 2.317; R(0) = 1."""
    assert estimate_feedback_variance_ratio(0.0) == pytest.approx(1.0)
    assert estimate_feedback_variance_ratio(0.5) == pytest.approx(2.3166, rel=1e-4)
