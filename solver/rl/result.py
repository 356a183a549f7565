"""The answer of `parplan rl`: RlPlan (one placement, its pools' parallelism, the step by phase)
and RlResult (the plans best first, the explanation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from solver.rl.job import RlJob
from solver.spec import ClusterSpec, ModelSpec
from solver.spec.plan import Plan


@dataclass(frozen=True)
class RlPlan:
    """One RL plan: where each side runs, its parallelism, the step by phase (seconds), each
    phase's memory per GPU (decimal GB) and the rates."""

    placement: str
    training_gpus: int
    rollout_gpus: int
    training: Plan
    rollout: dict[str, int]
    rollout_layout: str
    offload: str
    phases: dict[str, float]
    memory_gb: dict[str, float]
    step_seconds: float
    rollout_idle_seconds: float
    training_idle_seconds: float
    generation_parts: dict[str, float]
    rollout_slots: int
    seqs_per_rank: int
    rollout_gpu_memory_utilization: float
    generated_tokens_per_second: float
    trained_tokens_per_second: float
    utilization: float


@dataclass(frozen=True)
class RlResult:
    """The answer of `parplan rl`: status (feasible: the best plans found, not proven best, as
    the splits are searched coarse to fine; infeasible: none fits), the plans best first, the
    explanation, and why each placement found nothing."""

    job: RlJob
    model_spec: ModelSpec
    cluster: ClusterSpec
    num_gpus: int
    status: str
    solve_seconds: float
    plans: tuple[RlPlan, ...]
    why: tuple[str, ...] = ()
    unplaced: dict[str, str] = field(default_factory=dict)
