"""The cluster catalog: GPU types in clusters/gpus/, presets in clusters/presets/.

A preset names its GPU (`gpu = "h100-sxm"`) or embeds a `[gpu]` table; `load_cluster_spec`
accepts a preset name or a cluster TOML path.
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import ValidationError

from solver.catalog.names import unknown_name_error
from solver.catalog.paths import data_dir
from solver.catalog.tomlfile import load_toml, validate_spec
from solver.errors import InputError, format_validation_error
from solver.spec import ClusterSpec, GpuSpec


def list_gpu_names() -> list[str]:
    return sorted(p.stem for p in (data_dir("clusters") / "gpus").glob("*.toml"))


def list_preset_names() -> list[str]:
    return sorted(p.stem for p in (data_dir("clusters") / "presets").glob("*.toml"))


def load_gpu_spec(name: str) -> GpuSpec:
    """A GPU of the catalog by name."""
    known = list_gpu_names()
    # A name is looked up in the listing, never joined into a path ("../presets/x" is unknown).
    if name.lower() not in known:
        raise unknown_name_error("gpu", name, known, "see `parplan clusters`")
    path = data_dir("clusters") / "gpus" / f"{name.lower()}.toml"
    stat = path.stat()
    return _load_gpu_file(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=256)
def _load_gpu_file(path: str, mtime_ns: int, size: int) -> GpuSpec:
    """One GPU file, read once per version of it (GpuSpec is frozen: the copy is shared);
    infeasible problems look up every GPU of the catalog for their fixes."""
    data = load_toml(Path(path))
    data.setdefault("name", Path(path).stem)
    return validate_spec(GpuSpec, data, path)


def load_cluster_toml(path: Path) -> ClusterSpec:
    """One cluster file; a string `gpu` is looked up in the GPU catalog."""
    data = load_toml(path)
    data.setdefault("name", path.stem)
    gpu = data.get("gpu")
    if isinstance(gpu, str):
        try:
            data["gpu"] = load_gpu_spec(gpu).model_dump()
        except InputError as exc:
            raise InputError(f"{path}: field 'gpu': {exc}") from None
    return validate_spec(ClusterSpec, data, str(path))


def load_clusters() -> list[ClusterSpec]:
    """Every preset, sorted by name."""
    folder = data_dir("clusters") / "presets"
    return [load_cluster_toml(folder / f"{n}.toml") for n in list_preset_names()]


def load_cluster_spec(ref: str, gpus_per_node: int | None = None) -> ClusterSpec:
    """A preset name or a cluster TOML path, optionally with another node size."""
    path = Path(ref)
    if path.suffix.lower() == ".toml":
        cluster = load_cluster_toml(path)
    else:
        known = list_preset_names()
        if ref.lower() not in known:
            raise unknown_name_error("cluster", ref, known, "see `parplan clusters`")
        cluster = load_cluster_toml(data_dir("clusters") / "presets" / f"{ref.lower()}.toml")
    if gpus_per_node is None or gpus_per_node == cluster.gpus_per_node:
        return cluster
    if gpus_per_node <= 0:
        raise InputError(f"--gpus-per-node: must be positive, got {gpus_per_node}")
    try:
        return cluster.with_gpus_per_node(gpus_per_node)
    except ValidationError as exc:
        raise InputError(format_validation_error(f"--gpus-per-node {gpus_per_node}", exc)) from None
