"""Frozen pydantic specs: the project's data vocabulary (imports nothing above it)."""

from solver.spec.calibration import CalibrationProfile, Collective, CollectiveCurve
from solver.spec.hardware import ClusterSpec, GpuSpec, TierSpec
from solver.spec.job import RECOMPUTE_LEVELS, JobSpec, ParallelConfig
from solver.spec.layout import PipelineLayout, VirtualStage
from solver.spec.model import ModelSpec

__all__ = [
    "RECOMPUTE_LEVELS",
    "CalibrationProfile",
    "Collective",
    "CollectiveCurve",
    "ClusterSpec",
    "GpuSpec",
    "JobSpec",
    "ModelSpec",
    "ParallelConfig",
    "PipelineLayout",
    "TierSpec",
    "VirtualStage",
]
