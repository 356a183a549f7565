"""Fix advice from the search itself (issue 39 item 3): the changes after which a problem has a
plan, each checked by the search's own feasibility test (fits_with_offloads), cheapest first:
lift a pin, the fewest GPUs (every whole-node count from the request up, not doubling), a
count that splits evenly, a global batch, a GPU with more memory, TP across nodes, no framework
rule. `optimize` and `sweep` give them for an infeasible problem, `estimate` for a plan that
does not fit (solver.estimate_fixes), all in these words.

The issue's examples: DeepSeek-V3 on 8 H100 was told "--gpus 128" (8 doubled until the even
split fit without offloads) where 40 fit with the optimizer offloaded; `estimate` of Llama 3.1
70B at tp 8 pp 1 on 8 H100 was told "add GPUs" where `optimize --tp 8 --pp 1` fits them.
"""

from __future__ import annotations

from itertools import combinations

from solver.catalog import list_gpu_names, load_gpu_spec
from solver.search.constraints import MEMORY_CONSTRAINT
from solver.search.feasible import any_feasible
from solver.search.module_variants import offload_variant
from solver.search.space import Problem
from solver.spec import ClusterSpec

# The GPU counts first tried above the request: it times 2, 4, ..., 1024 (as before issue 39);
# the first that fits bounds the whole-node counts then checked one by one below it.
MORE_GPUS_FACTORS = tuple(2**k for k in range(1, 11))
# Whole-node counts checked below that bound: every one, or evenly spaced where there are more.
MAX_COUNTS_CHECKED = 64
# Rules on how the GPU count splits into degrees: a nearby count may satisfy them.
SPLIT_RULES = frozenset({"batch_divides", "cp_splits_sequence", "tp_divides_heads",
                         "tp_divides_kv_heads", "tp_kv_heads_compatible", "ep_divides_experts",
                         "expert_ranks_fit_stage", "pp_at_most_layers",
                         "virtual_stages_fit_layers"})
# Round counts tried: whole nodes of the form 2^a or 3 x 2^a, within a factor of 2.
NEARBY_TRIES = 6


def fits_with_offloads(problem: Problem) -> bool:
    """Whether some plan of `problem` fits: the search's feasibility test (any_feasible) on the
    problem and on each of its offload variants (solver.search.module_variants), which the
    search tries too."""
    if any_feasible(problem):
        return True
    for count in range(1, len(problem.offloads) + 1):
        for offloads in combinations(problem.offloads, count):
            variant = offload_variant(problem, offloads)
            if variant is not None and any_feasible(variant):
                return True
    return False


def fewest_gpus_that_fit(problem: Problem) -> int | None:
    """The fewest GPUs above the request, a whole number of nodes, with a plan that fits
    (fits_with_offloads); None if not even 1024 times the request has one. The request times
    2, 4, ... bounds it (the first that fits); below the bound every whole-node count is
    checked in order (feasibility is not monotone in the count: the degrees must divide it),
    or MAX_COUNTS_CHECKED evenly spaced ones where there are more."""
    node = problem.cluster.gpus_per_node

    def fits(count: int) -> bool:
        return fits_with_offloads(problem.model_copy(update={"num_gpus": count}))

    bound = next((count for count in (-(-max(problem.num_gpus * f, node) // node) * node
                                      for f in MORE_GPUS_FACTORS) if fits(count)), None)
    if bound is None:
        return None
    first = (problem.num_gpus // node + 1) * node
    step = node * max(1, -(-(bound - first) // (node * MAX_COUNTS_CHECKED)))
    return next((count for count in range(first, bound, step) if fits(count)), bound)


def suggest_fixes(problem: Problem, conflicts: tuple[str, ...]) -> list[str]:
    """Changes that make the problem feasible, cheapest first: lift a pin, the fewest GPUs, a
    count that splits evenly, a global batch, a GPU with more memory, TP across nodes, no
    framework rule."""
    fixes: list[str] = []
    for name in conflicts:
        if name.startswith("pin_"):
            variable = name.removeprefix("pin_")
            pins = {k: v for k, v in problem.pins.items() if k != variable}
            if fits_with_offloads(problem.model_copy(update={"pins": pins})):
                fixes.append(f"drop the pin on {variable}")
    fewest = fewest_gpus_that_fit(problem)
    if fewest is not None:
        fixes.append(f"--gpus {fewest} (the fewest that fit)")
    if SPLIT_RULES & set(conflicts):
        for count in _nearby_round_counts(problem):
            if count != fewest and fits_with_offloads(
                    problem.model_copy(update={"num_gpus": count})):
                fixes.append(f"--gpus {count} (a count that splits evenly)")
                break
    if "batch_divides" in conflicts:
        for batch in _nearby_global_batches(problem):
            job = problem.job.model_copy(update={"global_batch": batch})
            if fits_with_offloads(problem.model_copy(update={"job": job})):
                fixes.append(f"--global-batch {batch}")
                break
    if MEMORY_CONSTRAINT in conflicts:
        bigger = _bigger_gpu(problem.cluster)
        if bigger is not None and fits_with_offloads(
                problem.model_copy(update={"cluster": bigger})):
            fixes.append(f"a GPU with more memory: {bigger.gpu.name} "
                         f"({bigger.gpu.memory_gib * 2**30 / 1e9:.0f} GB)")
    if {"tp_within_nvlink", "etp_within_nvlink"} & set(conflicts):
        if fits_with_offloads(problem.model_copy(update={"allow_tp_across_nodes": True})):
            fixes.append("--allow-tp-across-nodes")
    if any(n.startswith(("megatron_", "torchtitan_", "deepspeed_")) for n in conflicts):
        if fits_with_offloads(problem.model_copy(update={"framework": "generic"})):
            fixes.append("another framework (--framework generic lifts the framework rules)")
    return fixes


def _nearby_round_counts(problem: Problem) -> list[int]:
    """Whole-node GPU counts of the form 2^a or 3 x 2^a within a factor of 2 of the request,
    nearest first (the fewest odd factors: they split into powers-of-two degrees)."""
    node, n = problem.cluster.gpus_per_node, problem.num_gpus
    counts = {base << shift for base in (1, 3) for shift in range(0, 40)
              if n // 2 <= base << shift <= 2 * n}
    counts = {c for c in counts if c % node == 0 and c != n}
    return sorted(counts, key=lambda c: (abs(c - n), c))[:NEARBY_TRIES]


def _nearby_global_batches(problem: Problem) -> list[int]:
    """Global batches within a factor of 2 of the request that the GPU count can split evenly:
    d x 2^a, d a divisor of the GPU count's odd part (DBRX on 23,040 = 45 x 2^9 GPUs asks
    1,024: 960, 1152, 1280, 768, ...), nearest first."""
    n, batch = problem.num_gpus, problem.job.global_batch
    odd = n >> ((n & -n).bit_length() - 1)
    near = {d << shift for d in range(1, odd + 1) if odd % d == 0 for shift in range(0, 40)
            if batch // 2 <= d << shift <= 2 * batch}
    near.discard(batch)
    return sorted(near, key=lambda m: (abs(m - batch), m))[:NEARBY_TRIES]


def _bigger_gpu(cluster: ClusterSpec) -> ClusterSpec | None:
    """The same cluster with the smallest catalog GPU of the same vendor that has more memory."""
    current = cluster.gpu
    options = [load_gpu_spec(name) for name in list_gpu_names()]
    larger = sorted((g for g in options if g.vendor == current.vendor
                     and g.memory_gib > current.memory_gib), key=lambda g: g.memory_gib)
    if not larger:
        return None
    return cluster.model_copy(update={"gpu": larger[0]})
