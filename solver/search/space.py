"""The search space: one planning problem and the domain of each decision variable.

Decision variables (DESIGN.md): tp, cp, pp, dp (their product is the GPU count), ep, etp
(carved out of tp*cp*dp for the expert layers), vpp (virtual stages per pipeline stage), zero
(0-3), micro_batch, recompute (0 none, 1 selective, 2 full). Sequence parallelism is on
whenever tp > 1. A domain lists every value a variable may take before constraints.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from solver.cost.memory import MemoryOptions
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ClusterSpec, JobSpec, ModelSpec
from solver.spec.job import Framework

# solver.spec.job.PARALLEL_FIELDS in the search's order (it breaks ties between equal plans in
# this order).
VARIABLES = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute")
Objective = Literal["time", "memory"]


class Problem(BaseModel):
    """One planning problem: what to train, on what, under which framework and pins.

    `pins` maps a variable to the values it may take (e.g. {"tp": (8,), "pp": (1, 2, 4)});
    recompute values are codes 0/1/2.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    model_spec: ModelSpec
    cluster: ClusterSpec
    job: JobSpec
    num_gpus: int = Field(gt=0)
    framework: Framework = "megatron"
    objective: Objective = "time"
    pins: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    allow_tp_across_nodes: bool = False
    memory_options: MemoryOptions = MemoryOptions()
    time_constants: TimeConstants = TimeConstants()
    # Memory savers (solver.cost.step.frameworks.MEMORY_SAVERS) a plan may turn on where it needs
    # them: memory_options has them all on (the search admits what fits with them),
    # time_constants has them off (an upper bound on the step time); solver.optimize gives each
    # plan the shortest prefix that fits.
    memory_savers: tuple[str, ...] = ()
    # Megatron's selective recompute module sets the search tries, cheapest first
    # (solver.cost.step.recompute_modules): time_constants and memory_options hold the first; each
    # other is searched apart with recompute pinned to selective (solver.search.module_variants).
    recompute_module_sets: tuple[tuple[str, ...], ...] = ()
    # Offloads to the host (solver.spec.framework.OFFLOADS) the search may turn on: each
    # combination is searched apart with the first module set (solver.search.module_variants).
    offloads: tuple[str, ...] = ()


def divisors(n: int) -> tuple[int, ...]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def variable_domains(problem: Problem) -> dict[str, tuple[int, ...]]:
    """Every value each variable may take before constraints (pins are constraints too, so
    that an infeasible pin can be named in the explanation)."""
    n = problem.num_gpus
    model_spec = problem.model_spec
    gpu_divisors = divisors(n)
    experts = model_spec.num_experts
    domains = {
        "tp": gpu_divisors,
        "cp": gpu_divisors,
        "pp": tuple(d for d in gpu_divisors if d <= model_spec.num_hidden_layers),
        "dp": gpu_divisors,
        "ep": divisors(math.gcd(experts, n)) if experts else (1,),
        "etp": gpu_divisors if experts else (1,),
        # Virtual stages that split the layers evenly, alone or with the embedding and the
        # loss in slots of their own (the layout program places the layers of any other).
        "vpp": tuple(sorted(set(divisors(model_spec.num_hidden_layers))
                            | set(divisors(model_spec.num_hidden_layers + 2))
                            | set(problem.pins.get("vpp", ())))),
        "zero": (0, 1, 2, 3),
        "micro_batch": divisors(problem.job.global_batch),
        "recompute": (0, 1, 2),
    }
    return domains
