"""What a plan costs: dollars per million tokens from a price per GPU-hour, and tokens per
joule at the GPUs' board power, vectorised over plans; a serving deployment's tokens are those
it serves, a training job's those it trains on (`optimize --objective cost|energy`, where
estimate_kwh_per_million_tokens turns tokens per joule into kWh).

    $ per million output tokens = price_per_gpu_hour x num_gpus / 3,600 / output_tokens_per_s
                                  x 1e6
    $ per million input tokens  = the same with the prompt tokens the deployment takes per
                                  second (requests/s x mean prompt tokens)
    output tokens per joule     = output_tokens_per_s / (num_gpus x board_power_w)

Each price charges the whole deployment to one kind of token, as providers quote per-token
prices from a GPU-hour (the SemiAnalysis InferenceMAX charts' "cost per million tokens" is
the hourly cost of the GPUs over the tokens they produce in that hour). The energy is each GPU
at its board power limit (the catalog's power_limit_w: NVIDIA's and AMD's datasheet maximum
TDP / TBP), an upper bound on what the GPUs draw, so tokens per joule is a lower bound; host
CPUs, networking and cooling are not counted.

Worked number: 8 H100 SXM at $2.50 per GPU-hour is $20 an hour, $0.005556 a second; at
10,000 output tokens/s that is $0.556 per million output tokens; at 700 W each the GPUs draw at
most 5,600 W, 10,000 / 5,600 = 1.786 output tokens per joule.

Training at board power too: an upper bound. Measured, an 8-GPU H100 HGX node training
Llama2-13b drew at most 8.4 kW of its 10.2 kW rating (Latif et al. 2024, arXiv 2412.08602,
abstract), and compute-heavy training about 76% of it (Newkirk et al. 2025, arXiv 2506.14551,
abstract); no utilization model below it is applied here (no published curve of GPU power
against MFU that the catalog's GPUs share).
"""

from __future__ import annotations

import numpy as np

SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6


def estimate_dollars_per_million_tokens(dollars_per_hour, tokens_per_s) -> np.ndarray:
    """$ per million tokens of a deployment costing `dollars_per_hour` (price per GPU-hour x
    GPUs, summed over pools of different GPUs) and producing `tokens_per_s` (module
    docstring); inf where it produces none."""
    dollars_per_s = np.asarray(dollars_per_hour, dtype=float) / SECONDS_PER_HOUR
    rate = np.asarray(tokens_per_s, dtype=float)
    with np.errstate(divide="ignore"):
        return np.where(rate > 0, dollars_per_s * 1e6 / np.where(rate > 0, rate, 1.0), np.inf)


def estimate_tokens_per_joule(tokens_per_s, board_power_w) -> np.ndarray:
    """Tokens per joule with every GPU at its board power (`board_power_w`: the deployment's
    GPUs' board powers summed; module docstring): a lower bound."""
    return np.asarray(tokens_per_s, dtype=float) / np.asarray(board_power_w, dtype=float)


def estimate_kwh_per_million_tokens(tokens_per_s, board_power_w) -> np.ndarray:
    """kWh per million tokens with every GPU at its board power (`board_power_w` summed over
    the GPUs): 1e6 / tokens per joule / 3.6e6 J per kWh, an upper bound. Worked number: 8 H100
    SXM at 700 W (5,600 W) training 40,000 tokens/s take 1e6 x 5,600 / 40,000 = 140,000 J,
    0.0389 kWh, per million tokens."""
    return 1e6 / estimate_tokens_per_joule(tokens_per_s, board_power_w) / JOULES_PER_KWH


def estimate_energy_kwh(gpu_hours, board_power_w) -> np.ndarray:
    """kWh of `gpu_hours` at `board_power_w` a GPU: GPU-hours x W / 1,000, an upper bound
    (module docstring). Worked number: 1,000 H100 SXM GPU-hours at 700 W = 700 kWh."""
    return np.asarray(gpu_hours, dtype=float) * np.asarray(board_power_w, dtype=float) / 1000.0
