"""The serving workload: request lengths as distributions, the offered load and the SLO
percentile.

A **length distribution** is fixed (every request the same), uniform over the integers lo..hi
(as vLLM's `benchmark_serving.py --dataset-name random --random-range-ratio` draws them), or
the empirical distribution of a file of lengths (one per line). The cost model sees it as a
few weighted support points (`support`): the lengths themselves for a fixed or a short
empirical one, else the midpoints of equal-probability bins, so that means and second moments
of non-linear service times (chunked prefill, quadratic attention) are sums over the points.

The **load** is either an open arrival rate (requests per second of the whole deployment) or
a closed concurrency (that many users, each sending its next request when the last one
finishes). The **client** says how a benchmark sends them (CLIENTS): `closed` at a
concurrency (`vllm bench serve --max-concurrency N` with an unbounded rate, sglang.bench_serving
--max-concurrency, genai-perf --concurrency: synchronised waves, solver.cost.serving.closed),
`poisson` at a rate (`--request-rate`, burstiness 1) or `gamma` at a rate with `--burstiness`
k (gaps of shape k, vllm/benchmarks/serve.py get_request; solver.cost.serving.queueing).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from solver.cost.serving.queueing import gamma_arrival_scv
from solver.spec.strict import MAX_SEQ_LEN, InputSpec, read_input_file

MAX_SUPPORT_POINTS = 64  # equal-probability bins of a long distribution
MAX_LENGTHS_IN_FILE = 10_000_000
SloPercentile = Literal[50, 90, 95, 99]
Client = Literal["closed", "poisson", "gamma"]
CLIENTS = {"closed": "closed loop, synchronised waves (vllm bench serve --max-concurrency)",
           "poisson": "Poisson arrivals (vllm bench serve --request-rate)",
           "gamma": "gamma arrivals (vllm bench serve --request-rate --burstiness)"}


class LengthDistribution(InputSpec):
    """Request lengths in tokens: `kind` fixed (low = high), uniform over low..high, or
    `empirical` (`values`, sorted, each equally likely)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["fixed", "uniform", "empirical"]
    low: int = Field(gt=0, le=MAX_SEQ_LEN.most)
    high: int = Field(gt=0, le=MAX_SEQ_LEN.most)
    values: tuple[int, ...] = ()
    source: str = ""  # the file an empirical distribution came from

    @model_validator(mode="after")
    def _check(self) -> LengthDistribution:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.kind == "fixed" and self.low != self.high:
            raise ValueError("a fixed length has low = high")
        if self.kind == "empirical" and (not self.values or min(self.values) != self.low
                                         or max(self.values) != self.high):
            raise ValueError("an empirical distribution lists its values (low and high are "
                             "their extremes)")
        return self

    @classmethod
    def fixed(cls, length: int) -> LengthDistribution:
        return cls(kind="fixed", low=length, high=length)

    @property
    def maximum(self) -> int:
        return self.high

    @property
    def mean(self) -> float:
        lengths, weights = self.support()
        return float(np.dot(lengths, weights))

    def quantile(self, q: float) -> float:
        """The q-quantile (inverted CDF: the smallest length with P(X <= x) >= q)."""
        if self.kind == "fixed":
            return float(self.low)
        if self.kind == "uniform":
            count = self.high - self.low + 1
            return float(self.low + max(np.ceil(q * count) - 1, 0))
        return float(np.quantile(np.asarray(self.values), q, method="inverted_cdf"))

    def support(self) -> tuple[np.ndarray, np.ndarray]:
        """(lengths, probabilities): at most MAX_SUPPORT_POINTS points whose first moment is
        the distribution's (exact for fixed and uniform; bin means for empirical)."""
        if self.kind == "fixed":
            return np.array([float(self.low)]), np.array([1.0])
        if self.kind == "uniform":
            count = self.high - self.low + 1
            if count <= MAX_SUPPORT_POINTS:
                return np.arange(self.low, self.high + 1, dtype=float), np.full(count, 1 / count)
            edges = np.linspace(self.low - 0.5, self.high + 0.5, MAX_SUPPORT_POINTS + 1)
            mid = (edges[:-1] + edges[1:]) / 2.0
            return mid, np.full(MAX_SUPPORT_POINTS, 1.0 / MAX_SUPPORT_POINTS)
        values = np.asarray(self.values, dtype=float)
        unique, counts = np.unique(values, return_counts=True)
        if len(unique) <= MAX_SUPPORT_POINTS:
            return unique, counts / counts.sum()
        bins = np.array_split(values, MAX_SUPPORT_POINTS)
        return (np.array([b.mean() for b in bins]),
                np.array([len(b) for b in bins], dtype=float) / len(values))

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.low:,}"
        if self.kind == "uniform":
            return f"uniform {self.low:,}-{self.high:,}"
        return f"{len(self.values):,} lengths from {self.source or 'a file'} (mean {self.mean:,.0f})"


class ServeLoadSpec(InputSpec):
    """The offered load: `request_rate` (requests/s of the deployment, Poisson arrivals) or
    `concurrency` (closed loop: users of the deployment), never both; and the percentile at
    which TTFT and TPOT must meet the SLO limits."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_rate: float | None = Field(default=None, gt=0)
    concurrency: int | None = Field(default=None, gt=0, le=MAX_SEQ_LEN.most)
    slo_percentile: SloPercentile = 90
    # None: closed at a concurrency, poisson at a rate. burstiness: gamma's shape k.
    client: Client | None = None
    burstiness: float | None = Field(default=None, gt=0, le=1e6)

    @model_validator(mode="after")
    def _one_load(self) -> ServeLoadSpec:
        if self.request_rate is not None and self.concurrency is not None:
            raise ValueError("give a request rate or a concurrency, not both")
        if self.client == "closed" and self.request_rate is not None:
            raise ValueError("client closed runs a concurrency (--concurrency), not a "
                             "request rate")
        if self.client in ("poisson", "gamma") and self.concurrency is not None:
            raise ValueError(f"client {self.client} sends a request rate (--request-rate), "
                             "not a concurrency")
        if self.client is not None and self.kind == "none":
            raise ValueError(f"client {self.client} needs a load (a request rate or a "
                             "concurrency)")
        if self.burstiness is not None and self.client != "gamma":
            raise ValueError(f"burstiness ({self.burstiness:g}) is the gamma client's; "
                             f"client is {self.client or 'not given'}")
        return self

    @property
    def client_name(self) -> str | None:
        """The client that sends the load (None without a load)."""
        if self.kind == "none":
            return None
        return self.client or ("closed" if self.kind == "concurrency" else "poisson")

    @property
    def arrival_scv(self) -> float:
        """c_a^2 of the open loop's gaps: 1 / burstiness for gamma (1 if not given, vLLM's
        default), 1 for Poisson (solver.cost.serving.queueing.gamma_arrival_scv)."""
        if self.client_name != "gamma":
            return 1.0
        return gamma_arrival_scv(1.0 if self.burstiness is None else self.burstiness)

    @property
    def quantile(self) -> float:
        return self.slo_percentile / 100.0

    @property
    def kind(self) -> str:
        if self.request_rate is not None:
            return "rate"
        return "concurrency" if self.concurrency is not None else "none"


def parse_length_distribution(text: str, flag: str) -> LengthDistribution:
    """`N` (fixed), `LO-HI` (uniform) or `@FILE` (one length per line; blank lines and `#`
    comments skipped). Raises ValueError with a one-line reason naming `flag`."""
    text = text.strip()
    if text.startswith("@"):
        return load_length_file(Path(text[1:]), flag)
    parts = text.split("-")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected N, LO-HI or @FILE") from None
    if len(numbers) not in (1, 2):
        raise ValueError(f"{flag} {text!r}: expected N, LO-HI or @FILE")
    low, high = numbers[0], numbers[-1]
    for n in numbers:
        if not 1 <= n <= MAX_SEQ_LEN.most:
            raise ValueError(f"{flag} {text!r}: {n} is not between 1 and {MAX_SEQ_LEN.most:,} "
                             "tokens")
    if low > high:
        raise ValueError(f"{flag} {text!r}: LO ({low}) must not exceed HI ({high})")
    if low == high:
        return LengthDistribution.fixed(low)
    return LengthDistribution(kind="uniform", low=low, high=high)


def load_length_file(path: Path, flag: str) -> LengthDistribution:
    """An empirical distribution from a file of lengths (see parse_length_distribution)."""
    where = f"{flag} @{path}"
    try:  # at most MAX_FILE_BYTES: `@/dev/zero` is refused, not read without end
        lines = read_input_file(path).decode("utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise ValueError(f"{where}: cannot read the file ({reason})") from None
    values = []
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        # isdigit() alone holds superscripts ('²') that int() refuses.
        whole = text.isascii() and text.isdigit() and len(text) <= 20
        if not whole or not 1 <= int(text) <= MAX_SEQ_LEN.most:
            raise ValueError(f"{where}: line {number}: {text[:40]!r} is not a whole number of "
                             f"tokens between 1 and {MAX_SEQ_LEN.most:,}")
        values.append(int(text))
        if len(values) > MAX_LENGTHS_IN_FILE:
            raise ValueError(f"{where}: more than {MAX_LENGTHS_IN_FILE:,} lengths")
    if not values:
        raise ValueError(f"{where}: the file holds no lengths")
    values.sort()
    if values[0] == values[-1]:
        return LengthDistribution.fixed(values[0])
    return LengthDistribution(kind="empirical", low=values[0], high=values[-1],
                              values=tuple(values), source=path.name)
