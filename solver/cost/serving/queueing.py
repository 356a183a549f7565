"""Queueing formulas of the serving load model (solver.cost.serving.load), vectorised and pure.

M/G/1 mean wait (Pollaczek-Khinchine; Kleinrock, Queueing Systems Vol. 1, 1975, §5.6):
Poisson arrivals at rate lam, independent service times S with utilization rho = lam E[S] < 1:

    E[W] = lam E[S^2] / (2 (1 - rho))

M/D/1 (every S = s): E[W] = rho s / (2 (1 - rho)); M/M/1 (E[S^2] = 2 / mu^2): rho / (mu - lam).

Bursty (gamma) arrivals, GI/G/1: `vllm bench serve --burstiness k` draws the gaps between
requests from a gamma distribution of shape k and scale 1 / (rate k) (vllm/benchmarks/serve.py
get_request): mean 1 / rate, squared coefficient of variation c_a^2 = 1 / k (k = 1: Poisson).
The mean wait is Kingman's heavy-traffic approximation in the Allen-Cunneen form, which is
Pollaczek-Khinchine's exactly at c_a^2 = 1 (Allen, Probability, Statistics and Queueing
Theory, 1990, §6.4; Kingman 1962 below):

    E[W] = E[W_M/G/1] (c_a^2 + c_s^2) / (1 + c_s^2),   c_s^2 = E[S^2] / E[S]^2 - 1

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
that never turns one away) is Poisson with mean lam E[T].

A request's TPOT is the mean of its own rounds, so it sees the others averaged over its decode
window of O rounds, not at one instant. Each other request adds to the window's total time
what its prefill costs if it arrives inside the window (c_p I) and c_d per round of its decode
the window overlaps; arrivals are Poisson, so by Campbell's theorem (Kingman, Poisson
Processes, 1993, §3.2: Var sum_j g(t_j) = lam int E[g(t)^2] dt) the window total's variance,
over O^2, is the variance of the request's TPOT:

    Var(TPOT) = m (A c_p^2 + B c_p c_d + C c_d^2),   m = lam tau E[O'] (requests decoding)

    A = E[I^2] / (O E[O'])
    B = 2 E[I] E[h(O', O)] / (O^2 E[O']),  h = int_0^O min(O', u) du
    C = f(O) = 2 / (O^2 E[O']) E[O O' a - (O + O') a^2 / 2 + a^3 / 3],  a = min(O, O')

C alone is the decode population's part: the M/G/inf occupancy averaged over the window, 2/3
of the Poisson variance when every O' equals O, -> 1 for a window much shorter than O' (its
covariance lam E[(S - u)+]: Eick, Massey and Whitt, "The physics of the M_t/G/inf queue",
Operations Research 41(4), 1993). A, B, C average over the tagged request's O (weights w_k),
and the percentile is the normal one with that variance.

Under load the rounds slow as the population grows, and a slower round keeps every request
decoding longer: the fluid balance d = lam E[O] tau(d) has the loop gain g = d tau'(d) / tau(d).
In the linear noise approximation (van Kampen, Stochastic Processes in Physics and Chemistry,
1992, ch. X) the population is an Ornstein-Uhlenbeck process whose stationary variance grows
by 1 / (1 - g) and whose correlation time E[O] tau grows by the same factor; the variance of
its average over a window of x correlation times is phi(x) = 2 (x - 1 + exp(-x)) / x^2 of the
stationary one. The window of one mean request is x = 1 at g = 0 and 1 - g under load, so the
variance above is multiplied by

    R(g) = phi(1 - g) / ((1 - g) phi(1))      (1 at g = 0; 2.317 at g = 0.5)
"""

from __future__ import annotations


import numpy as np


def estimate_mg1_wait_s(rate_per_s, service_mean_s, service_second_moment_s2) -> np.ndarray:
    """Pollaczek-Khinchine mean wait (module docstring); inf where rho >= 1, 0 at rate 0.
    M/D/1 at rho 0.5, s = 1 s: 0.5 x 1 / (2 x 0.5) = 0.5 s."""
    rate = np.asarray(rate_per_s, dtype=float)
    rho = rate * np.asarray(service_mean_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        wait = rate * np.asarray(service_second_moment_s2, dtype=float) / (2.0 * (1.0 - rho))
    return np.where(rho < 1.0, np.where(rate > 0, wait, 0.0), np.inf)


def estimate_gig1_wait_s(rate_per_s, service_mean_s, service_second_moment_s2,
                         arrival_scv) -> np.ndarray:
    """The mean wait under arrivals whose gaps have squared coefficient of variation
    `arrival_scv` (module docstring: Allen-Cunneen), Pollaczek-Khinchine's at 1. M/D/1 at
    rho 0.5, s = 1 s (0.5 s) under gamma gaps of burstiness 0.5 (c_a^2 = 2):
    0.5 x (2 + 0) / (1 + 0) = 1.0 s; evenly spaced arrivals (c_a^2 = 0) of constant work
    never wait."""
    mean = np.asarray(service_mean_s, dtype=float)
    second = np.asarray(service_second_moment_s2, dtype=float)
    wait = estimate_mg1_wait_s(rate_per_s, mean, second)
    safe = np.where(mean > 0, mean, 1.0)
    service_scv = np.where(mean > 0, np.maximum(second / safe ** 2 - 1.0, 0.0), 0.0)
    factor = (np.asarray(arrival_scv, dtype=float) + service_scv) / (1.0 + service_scv)
    return np.where(np.isfinite(wait), wait * factor, wait)


def gamma_arrival_scv(burstiness: float) -> float:
    """c_a^2 of vLLM's gamma gaps of shape `burstiness` (module docstring): 1 / k; 0 for an
    infinite burstiness (vLLM's constant gaps)."""
    return 0.0 if burstiness == float("inf") else 1.0 / burstiness


def estimate_wait_quantile_s(mean_wait_s, utilization, q: float) -> np.ndarray:
    """The q-quantile of the wait: (E[W] / rho) ln(rho / (1 - q)) where rho > 1 - q, else 0
    (module docstring). M/M/1 at rho 0.8, mu 1/s: E[W] = 4 s, p90 = 5 x ln 8 = 10.40 s."""
    rho = np.asarray(utilization, dtype=float)
    mean = np.asarray(mean_wait_s, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        tail = mean / rho * np.log(rho / (1.0 - q))
    return np.where(rho >= 1.0, np.inf, np.where(rho > 1.0 - q, tail, 0.0))


def estimate_tpot_variance_coefficients(input_lengths, input_weights, output_lengths,
                                        output_weights) -> tuple[float, float, float]:
    """(A, B, C) of the TPOT variance (module docstring), averaged over the output lengths.
    Every request 512 + 64 tokens: A = 512^2 / 64^2 = 64, B = 2 x 512 x 64^2/2 / 64^3 = 8,
    C = 2/3."""
    i_len = np.asarray(input_lengths, dtype=float)
    i_w = np.asarray(input_weights, dtype=float)
    o_len = np.asarray(output_lengths, dtype=float)
    o_w = np.asarray(output_weights, dtype=float)
    mean_out = float(np.dot(o_len, o_w))
    window = o_len[:, None]
    other = o_len[None, :]
    a = np.minimum(window, other)
    overlap = window * other * a - (window + other) * a ** 2 / 2.0 + a ** 3 / 3.0
    c = 2.0 * (overlap @ o_w) / (o_len ** 2 * mean_out)
    h = np.where(other < window, other * window - other ** 2 / 2.0, window ** 2 / 2.0) @ o_w
    b = 2.0 * float(np.dot(i_len, i_w)) * h / (o_len ** 2 * mean_out)
    a_coef = float(np.dot(i_len ** 2, i_w)) / (o_len * mean_out)
    return float(a_coef @ o_w), float(b @ o_w), float(c @ o_w)


def estimate_feedback_variance_ratio(gain) -> np.ndarray:
    """R(g) of the module docstring: how much the slower rounds of a larger population widen
    the TPOT spread; g 0.5: phi(0.5) / (0.5 phi(1)) = 0.8522 / (0.5 x 0.7358) = 2.317."""
    g = np.clip(np.asarray(gain, dtype=float), 0.0, 0.99)

    def phi(x):
        return 2.0 * (x - 1.0 + np.exp(-x)) / x ** 2

    return phi(1.0 - g) / ((1.0 - g) * phi(1.0))
