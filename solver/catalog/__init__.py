"""Loading the zoo, the cluster catalog and Hugging Face configs into specs."""

from solver.catalog.clusters import (
    list_gpu_names,
    list_preset_names,
    load_cluster_spec,
    load_clusters,
    load_gpu_spec,
)
from solver.catalog.zoo import list_zoo_names, load_model_spec, load_zoo

__all__ = [
    "list_gpu_names",
    "list_preset_names",
    "list_zoo_names",
    "load_cluster_spec",
    "load_clusters",
    "load_gpu_spec",
    "load_model_spec",
    "load_zoo",
]
