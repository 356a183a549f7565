"""How sure the cost model is (issue 36): intervals on step time, memory and serving latency,
the chance each listed plan is the fastest, and the chance a plan fits, all from the error
model fitted to the public runs (benchmarks/error_model.py writes solver/catalog/
error_model.json; nothing here is fitted).

The error of a prediction is the log of measured over predicted. For step time it is split by
what the step is made of (solver.spec.plan.TIME_PARTS), each group with its own log-normal
scale:
  compute        compute + recompute + optimizer: the GPU's kernel rates, one draw per GPU
  communication  tp, cp, ep, dp, pp, offload: one draw per kind (one link, one collective),
                 every kind with the one fitted scale (the public runs do not separate them)
  bubble         the pipeline's idle time
and a plan's own part (`plan_sigma`, independent per plan): what runs of one sweep (same
model, GPUs and source) do not share. With a step of parts c_k (fractions f_k = c_k / step),
to first order log(measured / predicted) = sum_k f_k e_k + u, so

    sigma_step = scale_category * sqrt(sum_k f_k^2 sigma_k^2 + plan_sigma^2)

(delta method; the draws of p_fastest use the full sum of log-normals). `scale_category`
widens or narrows every part for a category: dense / moe / hybrid > framework profile > GPU
generation > precision, each level shrunk to its parent by the scaled-inverse-chi^2 update
(Gelman et al., Bayesian Data Analysis 3rd ed., section 3.3): with n rows of squared
standardised errors summing to S and nu0 prior degrees of freedom,
scale^2 = (nu0 * parent^2 + S) / (nu0 + n); a category without rows takes the root mean square
of its fitted siblings' (each category one draw of how categories differ: path "parent/*").
Memory has one log-normal sigma per framework profile (same shrinkage), serving one per metric
(ttft, tpot, throughput). Errors are centred on the prediction: the error model widens it, it
does not move it (one cost model).

Worked numbers: with sigma_step 0.1 the 80% interval of a 2.0 s step is 2.0 * exp(-/+1.2816 *
0.1) = [1.759, 2.273] s; a plan at 90% of its usable memory with memory sigma 0.08 fits with
probability Phi(log(1 / 0.9) / 0.08) = Phi(1.317) = 0.906.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np

from solver.spec.calibration import CalibratedScales
from solver.spec.headroom import MemoryHeadroom
from solver.spec.model import ModelSpec

ERROR_MODEL_PATH = Path(__file__).resolve().parent.parent / "catalog" / "error_model.json"
DEFAULT_INTERVAL_LEVEL = 0.8
# The fit probability the default memory headroom is sized for (issue 39: winners sat at
# 97-99.9% of memory, where a memory sigma of 0.06-0.10 gives them 50-65%). Within the usable
# memory of no headroom a plan fits with at least one half: the error model is centred on the
# prediction.
DEFAULT_HEADROOM_FIT_PROBABILITY = 0.9
# p_fastest: draws of the shared component errors (numpy's PCG64 with this seed: the same
# answer on every run and machine).
NUM_DRAWS = 2000
DRAW_SEED = 36
# The error groups of the step (module docstring) and the TIME_PARTS each holds.
TIME_GROUPS = {"compute": ("compute", "recompute", "optimizer"),
               "communication": ("tp", "cp", "ep", "dp", "pp", "offload"),
               "bubble": ("bubble",)}
# What each communication part is called in an explanation.
PART_WORDS = {"compute": "the GPU's compute",
              "tp": "TP communication", "cp": "CP communication", "ep": "EP all-to-all",
              "dp": "DP gradient reduction", "pp": "pipeline sends", "offload": "host offload",
              "bubble": "the pipeline bubble"}
# GPU name prefixes -> generation (clusters/gpus/*.toml names).
GPU_GENERATIONS = (("gb", "blackwell"), ("b", "blackwell"), ("h", "hopper"),
                   ("a100", "ampere"), ("l40", "ada"), ("rtx-4090", "ada"), ("mi300", "cdna3"))


@dataclass(frozen=True)
class ErrorModel:
    """The fitted error model (solver/catalog/error_model.json)."""

    group_sigma: Mapping[str, float]  # TIME_GROUPS -> log-normal sigma
    plan_sigma: float
    time_scale: Mapping[str, float]  # category path ("", "megatron", "megatron/moe", ...) -> scale
    memory_sigma: Mapping[str, float]  # "" or a framework profile -> sigma
    serve_sigma: Mapping[str, float]  # ttft, tpot, throughput -> sigma


@functools.lru_cache(maxsize=None)
def load_error_model(path: Path = ERROR_MODEL_PATH) -> ErrorModel:
    """The packaged error model (read once per process, read-only)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return build_error_model(data)


def build_error_model(data: Mapping) -> ErrorModel:
    """An ErrorModel from the JSON shape error_model.json holds (also what the fit returns)."""
    time, memory = data["time"], data["memory"]
    return ErrorModel(group_sigma=dict(time["group_sigma"]), plan_sigma=time["plan_sigma"],
                      time_scale=dict(time["scale"]), memory_sigma=dict(memory["sigma"]),
                      serve_sigma=dict(data["serve"]["sigma"]))


def gpu_generation(gpu_name: str) -> str:
    """"h100-sxm" -> "hopper", "a100-40gb" -> "ampere"; "other" for a GPU outside the table."""
    name = gpu_name.lower()
    return next((gen for prefix, gen in GPU_GENERATIONS if name.startswith(prefix)), "other")


def time_category(framework: str, arch_kind: str, gpu_name: str, precision: str
                  ) -> tuple[str, ...]:
    """The category levels of a problem, coarse to fine: ("moe", "megatron", "hopper", "fp8")."""
    return (arch_kind, framework.split("@")[0], gpu_generation(gpu_name), precision)


def lookup_scale(table: Mapping[str, float], levels: Sequence[str]) -> float:
    """The value of the deepest category path in `table` ("" is every row)."""
    value = table[""]
    for depth in range(1, len(levels) + 1):
        path = "/".join(levels[:depth])
        if path not in table:  # a category without rows: its siblings' spread, else the parent
            return table.get("/".join((*levels[:depth - 1], "*")), value)
        value = table[path]
    return value


def interval_z(level: float) -> float:
    """The standard-normal quantile of a two-sided `level` interval: 0.8 -> 1.2816."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level {level} must be between 0 and 1")
    return NormalDist().inv_cdf(0.5 + level / 2.0)


def estimate_step_sigma(error_model: ErrorModel, levels: Sequence[str],
                        parts_s: Mapping[str, np.ndarray]) -> np.ndarray:
    """sigma of log step time per plan (module docstring formula) from its TIME_PARTS seconds.
    A step all compute with compute sigma 0.06 and plan sigma 0.03 at scale 1: 0.0671."""
    step = sum(np.asarray(parts_s[p], dtype=float) for group in TIME_GROUPS.values()
               for p in group)
    step = np.where(step > 0, step, 1.0)
    variance = np.full(np.shape(step), error_model.plan_sigma ** 2)
    for group, names in TIME_GROUPS.items():
        squares = sum((np.asarray(parts_s[p], dtype=float) / step) ** 2 for p in names)
        variance = variance + squares * error_model.group_sigma[group] ** 2
    return lookup_scale(error_model.time_scale, levels) * np.sqrt(variance)


def estimate_interval(point: np.ndarray, sigma: np.ndarray, level: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The `level` interval of a log-normal around `point`: point * exp(-/+ z sigma)."""
    spread = np.exp(interval_z(level) * np.asarray(sigma, dtype=float))
    return np.asarray(point, dtype=float) / spread, np.asarray(point, dtype=float) * spread


def estimate_fit_probability(total_bytes: np.ndarray, usable_bytes: np.ndarray,
                             sigma: float) -> np.ndarray:
    """P(measured <= usable) with log(measured / predicted) ~ N(0, sigma):
    Phi(log(usable / total) / sigma). 90% of usable at sigma 0.08: 0.906."""
    total = np.asarray(total_bytes, dtype=float)
    usable = np.asarray(usable_bytes, dtype=float)
    ratio = np.log(np.maximum(usable, 1.0) / np.maximum(total, 1.0)) / sigma
    cdf = np.vectorize(NormalDist().cdf, otypes=[float])
    return cdf(ratio)


def usable_share_for_fit_probability(probability: float, sigma: float) -> float:
    """The share of the usable memory a plan's predicted total may reach to fit with at least
    `probability`: exp(-sigma * Phi^-1(p)); 0.5 -> 1 (today's rule), 0.9 at sigma 0.08 ->
    exp(-0.08 * 1.2816) = 0.9026."""
    return math.exp(-sigma * NormalDist().inv_cdf(probability))


def memory_sigma(error_model: ErrorModel, framework: str) -> float:
    """The memory error sigma of a framework profile (its parent's without rows)."""
    return lookup_scale(error_model.memory_sigma, (framework.split("@")[0],))


# The units that draw their own error: the compute group as one (one GPU), each communication
# kind, the bubble.
UNIT_GROUP = {"compute": "compute", **{p: "communication" for p in TIME_GROUPS["communication"]},
              "bubble": "bubble"}


def error_units(parts_s: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The seconds of each unit (UNIT_GROUP) from the TIME_PARTS seconds."""
    units = {"compute": sum(np.asarray(parts_s[p], dtype=float) for p in TIME_GROUPS["compute"])}
    for name in (*TIME_GROUPS["communication"], "bubble"):
        units[name] = np.asarray(parts_s[name], dtype=float)
    return units


def estimate_calibrated_step(scales: CalibratedScales, parts_s: Mapping[str, np.ndarray]
                             ) -> tuple[np.ndarray, np.ndarray]:
    """The step and its log sigma under a calibration's posterior (solver.calibrate.scales):
    step = sum_k c_k exp(mean_k), sigma^2 = g' P g + plan_sigma^2 with g_k = c_k exp(mean_k)
    / step, over the units of estimate_fastest_odds (the compute group one draw, where
    estimate_step_sigma's delta method takes compute, recompute and optimizer apart). A step
    all compute at mean log(1.06) is 1.06 times longer, with sigma sqrt(P_cc + plan^2)."""
    units = error_units(parts_s)
    weighted = (np.stack([units[u] for u in scales.units], axis=-1)
                * np.exp(np.array(scales.log_mean)))
    step = weighted.sum(axis=-1)
    g = weighted / np.where(step > 0, step, 1.0)[..., None]
    variance = np.einsum("pk,kl,pl->p", np.atleast_2d(g), np.array(scales.log_covariance),
                         np.atleast_2d(g)).reshape(np.shape(step))
    return step, np.sqrt(np.maximum(variance, 0.0) + scales.plan_sigma ** 2)


@dataclass(frozen=True)
class FastestOdds:
    """p_fastest per listed plan (best first), whether each is tied with the best within the
    model's error, and for the first plan the part whose error would change the winner."""

    p_fastest: np.ndarray
    tied_with_best: np.ndarray
    flip_part: str | None  # a UNIT_GROUP name
    flip_change: float  # the fractional change of that part (+0.2: 20% slower)
    flip_plan: int  # the index of the plan that then wins


def estimate_fastest_odds(error_model: ErrorModel, levels: Sequence[str],
                          parts_s: Mapping[str, np.ndarray], level: float,
                          num_draws: int = NUM_DRAWS, seed: int = DRAW_SEED) -> FastestOdds:
    """Monte Carlo over the shared errors: every plan on this cluster draws the same error per
    part (one draw for the compute group, one per communication kind, one for the bubble), and
    its own plan error; p_fastest is the share of draws in which a plan has the least step
    (the first listed of equals), so it sums to 1 over the listed plans. A plan is tied with
    the first when it beats it in at least (1 - level) / 2 of the draws. The winner changes
    where a part of the first plan grows by x: x = (step_j - step_0) / (c_0 - c_j) for the
    plan j that it overtakes first; the part named is the one whose change is likeliest under
    its own error (the smallest |log(1 + x)| / sigma)."""
    scale = lookup_scale(error_model.time_scale, levels)
    units = error_units(parts_s)
    names = list(units)
    sigmas = np.array([scale * error_model.group_sigma[UNIT_GROUP[name]] for name in names])
    parts = np.stack([units[name] for name in names], axis=1)  # (P, K)
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal((num_draws, len(names))) * sigmas
    own = rng.standard_normal((num_draws, parts.shape[0])) * scale * error_model.plan_sigma
    return _draw_fastest_odds(parts, names, shared, own, sigmas, level)


def estimate_calibrated_fastest_odds(scales: CalibratedScales, parts_s: Mapping[str, np.ndarray],
                                     level: float, num_draws: int = NUM_DRAWS,
                                     seed: int = DRAW_SEED) -> FastestOdds:
    """estimate_fastest_odds under a calibration's posterior (solver.calibrate.scales): the
    units' log errors drawn from N(log_mean, log_covariance) (a symmetric square root of the
    covariance times standard normals; a posterior correlates the units one run measured
    together), the plan's own from N(0, plan_sigma^2); the flip is judged on the calibrated
    unit times with each unit's posterior sd. With mean 0 and a diagonal covariance it is
    estimate_fastest_odds draw for draw. Plans are compared as listed: rank them by the
    calibrated step first (solver.calibrate.scales.rank_calibrated)."""
    units = error_units(parts_s)
    names = list(scales.units)
    mean = np.array(scales.log_mean)
    covariance = np.array(scales.log_covariance)
    values, vectors = np.linalg.eigh(covariance)
    root = vectors @ np.diag(np.sqrt(np.clip(values, 0.0, None))) @ vectors.T
    parts = np.stack([units[name] for name in names], axis=1)
    rng = np.random.default_rng(seed)
    shared = rng.standard_normal((num_draws, len(names))) @ root.T
    own = rng.standard_normal((num_draws, parts.shape[0])) * scales.plan_sigma
    sigmas = np.sqrt(np.clip(np.diag(covariance), 0.0, None))
    # exp(mean + e) c = exp(e) (c exp(mean)): the calibrated unit times, drawn around.
    return _draw_fastest_odds(parts * np.exp(mean), names, shared, own, sigmas, level)


def _draw_fastest_odds(parts: np.ndarray, names: Sequence[str], shared: np.ndarray,
                       own: np.ndarray, sigmas: np.ndarray, level: float) -> FastestOdds:
    """p_fastest, ties and flip from drawn log errors: `shared` (D, K) of the units around
    their times `parts` (P, K), `own` (D, P) of each plan; `sigmas`: each unit's sd."""
    num_plans = parts.shape[0]
    drawn = np.exp(shared) @ parts.T * np.exp(own)  # (D, P)
    winners = np.argmin(drawn, axis=1)
    p_fastest = np.bincount(winners, minlength=num_plans) / len(drawn)
    beats_first = (drawn < drawn[:, [0]]).mean(axis=0)
    tied = beats_first >= (1.0 - level) / 2.0
    tied[0] = True
    flip = _winner_flip(parts, names, sigmas)
    return FastestOdds(p_fastest=p_fastest, tied_with_best=tied, flip_part=flip[0],
                       flip_change=flip[1], flip_plan=flip[2])


def _winner_flip(parts: np.ndarray, names: Sequence[str], sigmas: np.ndarray
                 ) -> tuple[str | None, float, int]:
    """(part, fractional change, plan that wins) of the likeliest single-part change that
    makes another plan faster than the first; (None, 0, 0) with one plan or none possible."""
    steps = parts.sum(axis=1)
    best: tuple[float, str | None, float, int] = (math.inf, None, 0.0, 0)
    for k, name in enumerate(names):
        delta = parts[0, k] - parts[1:, k]  # how much faster the first grows per unit change
        gap = steps[1:] - steps[0]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            change = np.where(delta != 0, gap / delta, np.inf)
        # A change of x > -1 (a part cannot shrink below nothing) that makes plan j win.
        valid = np.isfinite(change) & (change > -1.0) & (gap >= 0)
        if not valid.any() or sigmas[k] == 0:
            continue
        likeliness = np.where(valid, np.abs(np.log1p(np.where(valid, change, 0.0))), np.inf)
        j = int(np.argmin(likeliness / sigmas[k]))
        score = likeliness[j] / sigmas[k]
        if score < best[0]:
            best = (score, name, float(change[j]), j + 1)
    return best[1], best[2], best[3]


def describe_flip(odds: FastestOdds) -> str | None:
    """"if EP all-to-all is 20% slower than modelled, plan 2 wins" (None without one)."""
    if odds.flip_part is None:
        return None
    way = "slower" if odds.flip_change > 0 else "faster"
    return (f"if {PART_WORDS[odds.flip_part]} is {abs(odds.flip_change):.0%} {way} than "
            f"modelled, plan {odds.flip_plan + 1} wins")


def estimate_serve_interval(error_model: ErrorModel, metric: str, point: np.ndarray,
                            level: float) -> tuple[np.ndarray, np.ndarray]:
    """The `level` interval of a serving metric (ttft, tpot, throughput) around `point`."""
    sigma = error_model.serve_sigma.get(metric, error_model.serve_sigma[""])
    return estimate_interval(point, np.full(np.shape(point), sigma), level)


def model_arch_kind(model_spec: ModelSpec) -> str:
    """"hybrid" (some Mamba or linear-attention layers), "moe" or "dense": the error model's
    categories (benchmarks/published.py ARCH_KINDS)."""
    if set(model_spec.layer_types or ()) & {"mamba", "linear_attention"}:
        return "hybrid"
    return "moe" if model_spec.is_moe else "dense"


def build_error_headroom(error_model: ErrorModel, framework: str,
                         probability: float = DEFAULT_HEADROOM_FIT_PROBABILITY) -> MemoryHeadroom:
    """The default memory headroom (`--memory-headroom auto`): the share of the GPU's memory a
    plan must leave free to fit with at least `probability` under the framework's memory
    sigma, 1 - exp(-sigma * Phi^-1(p)) (usable_share_for_fit_probability). Megatron's sigma
    0.0739 at 90%: 1 - exp(-0.0739 * 1.2816) = 9.04%, 7.7 of an H100's 85.5 GB."""
    if not 0.5 <= probability < 1.0:
        raise ValueError(f"fit probability {probability} must be in [0.5, 1)")
    sigma = memory_sigma(error_model, framework)
    return MemoryHeadroom(fraction=1.0 - usable_share_for_fit_probability(probability, sigma),
                          fit_probability=probability, memory_sigma=sigma,
                          profile=framework.split("@")[0])


def resolve_memory_headroom(given: MemoryHeadroom | None, framework: str,
                            probability: float | None = None) -> MemoryHeadroom:
    """The headroom a planning command uses: the one --memory-headroom gives, else (None,
    `auto`) the error model's margin for `framework` at `probability` (--min-fit-probability;
    DEFAULT_HEADROOM_FIT_PROBABILITY when None; build_error_headroom). A given headroom with a
    probability is a caller's error (solver.cli.shared_flags.check_fit_flags refuses it)."""
    if given is not None:
        assert probability is None, "--memory-headroom and --min-fit-probability together"
        return given
    return build_error_headroom(load_error_model(), framework,
                                DEFAULT_HEADROOM_FIT_PROBABILITY if probability is None
                                else probability)
