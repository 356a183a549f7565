"""A layer's compute by part under the framework's element-wise fusion, kept per solve.

solver.cost.layers.layer_compute gives each layer kind's forward and backward seconds by part; under a
framework that runs element-wise ops eagerly (no fusion), they move
TimeConstants.eager_elementwise_traffic times the fused kernels' traffic. The search asks for
the same degree tuples in every phase and in every module-set and offload search beside a
problem; the compute reads neither what selective recompute re-runs nor the offloads, so one
kept copy (solver.cost.row_memo) serves them all.
"""

from __future__ import annotations

import numpy as np

from solver.cost.layers.layer_compute import estimate_layer_compute_s
from solver.cost.row_memo import RowMemo
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ClusterSpec, JobSpec, ModelSpec

# What a layer's time (and the LM head's) depends on; also the recompute level under op-level
# selective recompute (solver.cost.layers.layer_time.layer_degrees).
LAYER_DEGREES = ("tp", "cp", "ep", "etp", "micro_batch")


def estimate_framework_compute_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                                 d: dict[str, np.ndarray], constants: TimeConstants
                                 ) -> dict[str, dict[str, np.ndarray]]:
    """estimate_layer_compute_s under the framework's element-wise fusion: eager ATen ops move
    TimeConstants.eager_elementwise_traffic times the fused kernels' traffic."""
    layer = estimate_layer_compute_s(model_spec, cluster, job, d, constants)
    if constants.fused_elementwise:
        return layer
    factor = constants.eager_elementwise_traffic
    return {kind: {**parts, "elementwise": factor * parts["elementwise"]}
            for kind, parts in layer.items()}


# The layer compute of recent problems (module docstring).
_COMPUTE = RowMemo(keep=4)


def kept_compute_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                   d: dict[str, np.ndarray], constants: TimeConstants
                   ) -> dict[str, dict[str, np.ndarray]]:
    """estimate_framework_compute_s of `d`, its rows taken from _COMPUTE where worked out
    before."""
    key = constants.model_copy(update={"recompute_modules": (),
                                       "selective_recompute": "attention_core",
                                       "optimizer_offload": False, "activation_offload": False})
    flat = _COMPUTE.rows((model_spec, cluster, job), key, d, LAYER_DEGREES, lambda rows: {
        (kind, part): value for kind, parts in estimate_framework_compute_s(
            model_spec, cluster, job, rows, constants).items() for part, value in parts.items()})
    layer: dict[str, dict[str, np.ndarray]] = {}
    for (kind, part), value in flat.items():
        layer.setdefault(kind, {})[part] = value
    return layer
