"""Calibration profiles: build one from measurements, write and load it, apply it to a cluster.

A measurement belongs to a tier of the cluster: the innermost tier whose span holds the
measured ranks when they sit on one node (`nodes == 1`), else the innermost tier whose span
holds the nodes they sit on (`nodes x gpus_per_node` GPUs); `tier=` overrides. Applying a
profile puts its curves on the cluster's tiers (`TierSpec.curves`), so every cost function that
takes the cluster uses them (solver.cost.comm.comm); tiers without curves keep the preset numbers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from solver.calibrate.fit import DEFAULT_TOLERANCE, Measurement, fit_curve
from solver.catalog import load_cluster_spec
from solver.catalog.tomlfile import load_json, validate_spec
from solver.cost.uncertainty import model_arch_kind, time_category
from solver.errors import InputError
from solver.output_file import write_output_file
from solver.spec import ClusterSpec, ModelSpec, TierSpec
from solver.spec.calibration import (
    COLLECTIVES,
    CalibrationProfile,
    Collective,
    CalibratedScales,
    CollectiveCurve,
    select_curve,
)


@dataclass(frozen=True)
class FittedCurve:
    """A curve of the profile with where it came from (for the fit table)."""

    tier: str
    collective: Collective
    curve: CollectiveCurve


@dataclass(frozen=True)
class CurveSource:
    """Where the comm model takes one collective's bandwidth on one tier from: `measured_as`
    is the collective whose curve it uses (itself, a stand-in, or None for the preset)."""

    tier: str
    collective: Collective
    measured_as: Collective | None
    curve: CollectiveCurve | None
    preset_gb_per_s: float


def choose_tier(cluster: ClusterSpec, num_ranks: int, num_nodes: int,
                tier: str | None = None) -> TierSpec:
    """The tier a group of `num_ranks` ranks on `num_nodes` nodes measures (module docstring)."""
    if tier is not None:
        for candidate in cluster.tiers:
            if candidate.name == tier:
                return candidate
        names = ", ".join(t.name for t in cluster.tiers)
        raise InputError(f"--tier ({tier}): cluster '{cluster.name}' has the tiers {names}")
    span = num_ranks if num_nodes == 1 else num_nodes * cluster.gpus_per_node
    return cluster.tier_for_span(span)


def count_domains(cluster: ClusterSpec, tier: TierSpec, num_nodes: int) -> int:
    """Inner-tier domains a group over `num_nodes` nodes spans on `tier`: 1 on the innermost
    tier, the nodes when the tier inside is one node, else the inner domains those nodes fill."""
    index = cluster.tiers.index(tier)
    if index == 0 or num_nodes <= 1:
        return 1
    inner_span = cluster.tiers[index - 1].span_gpus
    assert inner_span is not None  # only the outermost tier has no span
    if inner_span <= cluster.gpus_per_node:
        return num_nodes
    return max(1, -(-num_nodes * cluster.gpus_per_node // inner_span))


def build_profile(cluster: ClusterSpec, measurements: Iterable[Measurement], *,
                  method: str, tier: str | None = None,
                  tolerance: float = DEFAULT_TOLERANCE) -> tuple[CalibrationProfile,
                                                                 list[FittedCurve]]:
    """Fit every measurement and file it under its tier; two measurements of one collective
    on one tier are an InputError (one log per collective and tier)."""
    tiers: dict[str, dict[Collective, CollectiveCurve]] = {}
    fitted: list[FittedCurve] = []
    for measurement in measurements:
        chosen = choose_tier(cluster, measurement.num_ranks, measurement.num_nodes, tier)
        curves = tiers.setdefault(chosen.name, {})
        if measurement.collective in curves:
            first = curves[measurement.collective].source
            raise InputError(f"{measurement.source}: {measurement.collective} on tier "
                             f"'{chosen.name}' is already measured by {first}; give one log "
                             "per collective and tier (or --tier)")
        curve = fit_curve(measurement, count_domains(cluster, chosen, measurement.num_nodes),
                          tolerance)
        curves[measurement.collective] = curve
        fitted.append(FittedCurve(tier=chosen.name, collective=measurement.collective,
                                  curve=curve))
    if not fitted:
        raise InputError("no measurement to fit")
    profile = CalibrationProfile(cluster=cluster.name, method=method, tiers=tiers)
    return profile, fitted


def render_profile_json(profile: CalibrationProfile) -> str:
    """The profile file's text (deterministic)."""
    return json.dumps(profile.model_dump(mode="json"), indent=1, ensure_ascii=False) + "\n"


def write_profile(profile: CalibrationProfile, path: str | Path) -> None:
    write_output_file(path, render_profile_json(profile))


def load_profile(path: str | Path) -> CalibrationProfile:
    """A profile file; any problem is one InputError line naming the file."""
    source = f"--calibration ({path})"
    try:
        data = load_json(Path(path))
    except InputError as exc:
        raise InputError(f"{source}: {str(exc).removeprefix(f'{path}: ')}") from None
    return validate_spec(CalibrationProfile, data, source)


def apply_profile(cluster: ClusterSpec, profile: CalibrationProfile,
                  source: str = "profile") -> ClusterSpec:
    """The cluster with the profile's curves on its tiers; the profile must be for it."""
    if profile.cluster != cluster.name:
        raise InputError(f"--calibration ({source}): the profile was fitted for cluster "
                         f"'{profile.cluster}', not '{cluster.name}'; run `parplan calibrate` "
                         f"with --cluster {cluster.name}")
    names = [t.name for t in cluster.tiers]
    for tier in profile.tiers:
        if tier not in names:
            raise InputError(f"--calibration ({source}): tier '{tier}' is not a tier of "
                             f"cluster '{cluster.name}' ({', '.join(names)})")
    tiers = tuple(
        t.model_copy(update={"curves": dict(profile.tiers[t.name])})
        if profile.tiers.get(t.name) else t
        for t in cluster.tiers
    )
    return cluster.model_copy(update={"tiers": tiers})


def describe_sources(cluster: ClusterSpec) -> list[CurveSource]:
    """For every tier and collective, whether the comm model uses a measured curve."""
    sources = []
    for tier in cluster.tiers:
        for collective in COLLECTIVES:
            chosen = select_curve(tier.curves, collective)
            sources.append(CurveSource(
                tier=tier.name, collective=collective,
                measured_as=None if chosen is None else chosen[0],
                curve=None if chosen is None else chosen[1],
                preset_gb_per_s=tier.bandwidth_gb_per_s,
            ))
    return sources


def load_calibrated_cluster(ref: str, gpus_per_node: int | None = None,
                            calibration: str | None = None) -> ClusterSpec:
    """`--cluster` (with `--gpus-per-node`), with the `--calibration` profile applied if given:
    what every planning command evaluates."""
    cluster = load_cluster_spec(ref, gpus_per_node)
    if calibration is None:
        return cluster
    return apply_profile(cluster, load_profile(calibration), calibration)


def select_profile_scales(calibration: str | None, framework: str, model_spec: ModelSpec,
                          gpu_name: str, precision: str) -> CalibratedScales | None:
    """The `--calibration` profile's scales (`calibrate training-log`) for a framework profile
    the problem's error-model category (solver.cost.uncertainty.time_category) and model; None
    without a profile or without scales for them (solver.spec.calibration: a run of another
    model is not used)."""
    if calibration is None:
        return None
    levels = time_category(framework, model_arch_kind(model_spec), gpu_name, precision)
    return load_profile(calibration).find_scales(framework.split("@")[0], "/".join(levels),
                                                 model_spec.name)


def replace_profile_scales(profile: CalibrationProfile | None, cluster: str,
                           scales: CalibratedScales) -> CalibrationProfile:
    """`profile` (or a new one for `cluster`) with `scales` in place of its scales of the same
    framework, category and model; its curves kept."""
    if profile is None:
        return CalibrationProfile(cluster=cluster, method="training-log", scales=(scales,))
    key = (scales.framework, scales.category, scales.model)
    others = tuple(s for s in profile.scales if (s.framework, s.category, s.model) != key)
    return profile.model_copy(update={"scales": (*others, scales)})
