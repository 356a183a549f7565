"""solver.cost.queueing pinned to closed forms of queueing theory (Kleinrock, Queueing Systems
Vol. 1, 1975): M/M/1's mean wait rho / (mu - lam) and its exact waiting-time tail
rho exp(-(mu - lam) t), M/D/1's mean wait rho s / (2 (1 - rho)), and Poisson quantiles."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.cost.queueing import (
    estimate_mg1_wait_s,
    estimate_poisson_quantile,
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


def test_poisson_quantile_normal_approximation() -> None:
    assert estimate_poisson_quantile(100.0, 0.9) == pytest.approx(100 + 1.2815516 * 10, rel=1e-6)
    assert estimate_poisson_quantile(100.0, 0.5) == pytest.approx(100.0)
    assert estimate_poisson_quantile(0.0, 0.9) == 0.0
