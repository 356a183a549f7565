"""Queueing formulas of the serving load model (solver.serve.load), vectorised and pure.

M/G/1 mean wait (Pollaczek-Khinchine; Kleinrock, Queueing Systems Vol. 1, 1975, §5.6):
Poisson arrivals at rate lam, independent service times S with utilization rho = lam E[S] < 1:

    E[W] = lam E[S^2] / (2 (1 - rho))

M/D/1 (every S = s): E[W] = rho s / (2 (1 - rho)); M/M/1 (E[S^2] = 2 / mu^2): rho / (mu - lam).

Waiting-time percentiles: an arrival finds the server idle with probability 1 - rho (PASTA,
exact for M/G/1), otherwise it waits an exponential time whose mean makes E[W] right:

    P(W > t) = rho exp(-rho t / E[W])

This is exact for M/M/1 (P(W > t) = rho exp(-(mu - lam) t), Kleinrock §3.2) and is the
exponential heavy-traffic limit of Kingman ("On queues in heavy traffic", J. R. Stat. Soc. B
24, 1962) for general service; its q-quantile is (E[W] / rho) ln(rho / (1 - q)) when
rho > 1 - q, else 0.

Occupancy of an infinite-server stage (M/G/inf, Palm's theorem, 1943; the M/G/inf system in
Kleinrock Vol. 1):
the number of requests in a stage they all pass at once (decoding, under continuous batching
that never turns one away) is Poisson with mean lam E[T]; its quantiles use the normal
approximation mean + z_q sqrt(mean).
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np


def estimate_mg1_wait_s(rate_per_s, service_mean_s, service_second_moment_s2) -> np.ndarray:
    """Pollaczek-Khinchine mean wait (module docstring); inf where rho >= 1, 0 at rate 0.
    M/D/1 at rho 0.5, s = 1 s: 0.5 x 1 / (2 x 0.5) = 0.5 s."""
    rate = np.asarray(rate_per_s, dtype=float)
    rho = rate * np.asarray(service_mean_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = rate * np.asarray(service_second_moment_s2, dtype=float) / (2.0 * (1.0 - rho))
    return np.where(rho < 1.0, np.where(rate > 0, wait, 0.0), np.inf)


def estimate_wait_quantile_s(mean_wait_s, utilization, q: float) -> np.ndarray:
    """The q-quantile of the wait: (E[W] / rho) ln(rho / (1 - q)) where rho > 1 - q, else 0
    (module docstring). M/M/1 at rho 0.8, mu 1/s: E[W] = 4 s, p90 = 5 x ln 8 = 10.40 s."""
    rho = np.asarray(utilization, dtype=float)
    mean = np.asarray(mean_wait_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = mean / rho * np.log(rho / (1.0 - q))
    return np.where(rho >= 1.0, np.inf, np.where(rho > 1.0 - q, tail, 0.0))


def estimate_poisson_quantile(mean, q: float) -> np.ndarray:
    """The q-quantile of a Poisson count of this mean, normal approximation, at least 0:
    mean 100, q 0.9: 100 + 1.2816 x 10 = 112.8."""
    mean = np.asarray(mean, dtype=float)
    z = NormalDist().inv_cdf(q)
    return np.maximum(mean + z * np.sqrt(np.maximum(mean, 0.0)), 0.0)
