"""Explanations of a serving answer: the seed's decision tree against the winner, what the
runner-up loses on, and, when nothing is feasible, the clashing constraints and the fixes.

Seed 002's tree: the weights fit one GPU -> one GPU per copy, DP replicas for throughput; they
fit a node -> TP inside the node; larger -> TP = GPUs per node x PP across nodes; MoE -> add
EP. "Fits" here is the serving memory model at the requested context (weights, activations,
reserves and one full-context sequence of KV cache), not the seed's fixed 6 GB reserve.

Conflicts: a deletion filter (solver.search.explain.deletion_filter) over the named
constraints, the model's own rules first on their own, then the others on the candidates
those allow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from solver.search.constraints import MEMORY_CONSTRAINT
from solver.search.explain import deletion_filter
from solver.serve.candidates import ServeCandidates
from solver.serve.constraints import build_serve_constraints, is_hard, tp_domain
from solver.serve.enumerate import RankedServe, enumerate_serving, load_is_active
from solver.serve.estimate import estimate_serving
from solver.serve.job import ServeProblem
from solver.serve.memory import estimate_model_weight_bytes, estimate_serving_memory
from solver.spec import GpuSpec

GB = 1e9


def find_serve_conflicts(problem: ServeProblem) -> list[str]:
    """Names of an irreducible set of constraints that cannot hold together (empty if the
    problem is feasible)."""
    constraints = build_serve_constraints(problem)
    hard = [c for c in constraints if is_hard(c)]
    allowed = enumerate_serving(problem, hard)
    if len(allowed) == 0:
        return deletion_filter(hard, lambda kept: len(enumerate_serving(problem, kept)) > 0)
    soft = [c for c in constraints if not is_hard(c)]
    values = allowed.values()
    masks = {c.name: np.broadcast_to(np.asarray(c.check(values), bool), (len(allowed),))
             for c in soft}

    def feasible(kept: Sequence) -> bool:
        return bool(np.logical_and.reduce([masks[c.name] for c in kept]
                                          + [np.ones(len(allowed), bool)]).any())

    if feasible(soft):
        return []
    return deletion_filter(soft, feasible)


def tree_plan(problem: ServeProblem) -> tuple[int, int, str]:
    """(tp, pp, reason) of the seed's tree: the smallest power-of-two tp inside the TP domain
    that fits the context, else tp = the domain and the fewest pipeline stages."""
    domain, _ = tp_domain(problem)
    layers = problem.model_spec.num_hidden_layers
    options = [(tp, 1) for tp in _powers_of_two(domain)]
    options += [(domain, pp) for pp in range(2, layers + 1)]
    tp = np.array([o[0] for o in options])
    pp = np.array([o[1] for o in options])
    ones = np.ones_like(tp)
    fits = estimate_serving_memory(problem, ServeCandidates(tp=tp, pp=pp, dp=ones, ep=ones,
                                                            replicas=ones)).fits
    if not fits.any():
        return 0, 0, f"does not fit even {layers} pipeline stages of {domain} GPUs"
    index = int(np.argmax(fits))
    best_tp, best_pp = options[index]
    if best_tp == 1:
        return 1, 1, "fits one GPU -> one GPU per copy, DP replicas for throughput"
    if best_pp == 1:
        return best_tp, 1, f"fits {best_tp} GPUs of a node -> TP {best_tp} inside the node"
    return best_tp, best_pp, (f"larger than a node -> TP {best_tp} inside each node x PP "
                              f"{best_pp} across nodes")


def _powers_of_two(limit: int) -> list[int]:
    values, value = [], 1
    while value <= limit:
        values.append(value)
        value *= 2
    return values


def explain_serving(problem: ServeProblem, ranked: RankedServe) -> list[str]:
    """The lines of `why`: weights, the seed's tree, the winner, experts, the runner-up."""
    m, job = problem.model_spec, problem.job
    c, e = ranked.candidates, ranked.estimate
    best = c.row(0)
    usable = job.gpu_memory_utilization * problem.cluster.usable_memory_bytes
    capacity = problem.cluster.memory_headroom.describe(problem.cluster.gpu_memory_bytes)
    capacity = f"({capacity})" if problem.cluster.memory_headroom.label() else capacity
    weights = estimate_model_weight_bytes(problem)
    lines = [f"weights: {weights / GB:.1f} GB in {job.precision} ({m.total_params / 1e9:.2f}B "
             f"parameters); vLLM may use {job.gpu_memory_utilization:g} x "
             f"{capacity} = {usable / GB:.1f} GB of each GPU"]
    tp, pp, reason = tree_plan(problem)
    lines.append(f"rule of thumb (one GPU per copy if it fits, else TP inside a node, else PP "
                 f"across nodes) at {job.context:,} tokens of context: {reason}"
                 + (" -> add EP (ep = tp x dp)" if m.is_moe else ""))
    lines.append(
        f"chosen: tp {best['tp']} x pp {best['pp']} x dp {best['dp']}"
        + (f" x {best['replicas']} replicas" if best["replicas"] > 1 else "")
        + f" ({int(e.num_gpus[0])} GPUs): KV cache {e.memory.kv_cache_bytes[0] / GB:.1f} GB per "
        f"GPU = {int(e.memory.kv_tokens[0]):,} tokens = {int(e.memory.max_sequences[0]):,} "
        f"sequences of {job.context:,}; {int(e.batch[0])} sequences decode at once per DP rank")
    if tp and (best["tp"], best["pp"], best["ep"] > 1) != (tp, pp, m.is_moe):
        lines.append(_departure(problem, ranked, tp, pp))
    if m.is_moe:
        if best["ep"] > 1:
            lines.append(f"experts: --enable-expert-parallel, ep = tp x dp = {best['ep']}: "
                         f"{m.num_experts // best['ep']} of {m.num_experts} experts per GPU")
        else:
            lines.append(f"experts: no expert parallel; every expert split over tp x dp = "
                         f"{best['tp'] * best['dp']} GPUs (vLLM flattens TP over DP)")
    if load_is_active(problem):
        lines.append(_load_line(problem, ranked))
    if len(c) > 1:
        lines.append(_load_runner_up(ranked) if load_is_active(problem)
                     else _runner_up(problem, ranked))
    return lines


def _load_line(problem: ServeProblem, ranked: RankedServe) -> str:
    """The winner under the offered load, against one request alone, and the most it carries."""
    load, job = ranked.load, problem.job
    point, q = load.point, f"p{job.load.slo_percentile}"
    return (f"under load: {float(point.rate_per_s[0]):.2f} requests/s, "
            f"{float(point.concurrency[0]):,.0f} in flight: TTFT {q} "
            f"{1e3 * float(point.ttft_s[0]):,.0f} ms, TPOT {q} {1e3 * float(point.tpot_s[0]):.1f}"
            f" ms (alone: {1e3 * float(load.ttft_idle_s[0]):,.0f} ms and "
            f"{1e3 * float(load.tpot_idle_s[0]):.1f} ms); it carries up to "
            f"{float(load.max_rate_per_s[0]):.2f} requests/s within the SLO")


def _load_runner_up(ranked: RankedServe) -> str:
    c, load = ranked.candidates, ranked.load
    best, second = float(load.max_rate_per_s[0]), float(load.max_rate_per_s[1])
    gap = 1.0 - second / max(best, 1e-300)
    return (f"runner-up #2 ({_describe(c.row(1))}): carries {second:.2f} requests/s within the "
            f"SLO ({100 * gap:.1f}% less than {best:.2f})")


def _describe(row: dict[str, int]) -> str:
    text = f"tp {row['tp']}, pp {row['pp']}, dp {row['dp']}, ep {row['ep']}"
    return text + (f", {row['replicas']} replicas" if row["replicas"] > 1 else "")


def _tree_candidate(problem: ServeProblem, tp: int, pp: int) -> ServeCandidates | None:
    """The tree's plan scaled out as the objective scales: DP over the other GPUs, or (gpus)
    the copies the throughput target needs; expert parallel for a MoE."""
    n, moe = problem.num_gpus, problem.model_spec.is_moe
    if problem.job.objective != "gpus":
        if n % (tp * pp):
            return None
        dp = n // (tp * pp)
        return ServeCandidates(tp=tp, pp=pp, dp=dp, ep=tp * dp if moe else 1, replicas=1)
    unit = ServeCandidates(tp=tp, pp=pp, dp=1, ep=tp if moe else 1, replicas=1)
    target = problem.job.min_tokens_per_s
    rate = float(estimate_serving(problem, unit).tokens_per_s[0])
    if target is None or rate <= 0:
        return unit
    copies = int(np.ceil(target / rate - 1e-12))
    return ServeCandidates(tp=tp, pp=pp, dp=1 if moe else copies, ep=tp if moe else 1,
                           replicas=copies if moe else 1)


def _departure(problem: ServeProblem, ranked: RankedServe, tp: int, pp: int) -> str:
    """Why the winner is not the tree's plan."""
    tree = _tree_candidate(problem, tp, pp)
    if tree is None:
        return (f"the rule of thumb's tp {tp} x pp {pp} does not divide --gpus "
                f"{problem.num_gpus}")
    row = tree.row(0)
    described = (f"tp {tp} x pp {pp} x dp {row['dp']}" + (f", ep {row['ep']}" if row["ep"] > 1
                                                           else "")
                 + (f" x {row['replicas']} replicas" if row["replicas"] > 1 else ""))
    broken = [c.name for c in build_serve_constraints(problem)
              if not np.asarray(c.check(tree.values()), bool).all()]
    if broken:
        return f"the rule of thumb's {described} breaks {', '.join(broken)}"
    theirs, e = estimate_serving(problem, tree), ranked.estimate
    return (f"departs from the rule of thumb: its {described} ({int(theirs.num_gpus[0])} "
            f"GPUs) gives {float(theirs.tokens_per_s[0]):,.0f} tokens/s and "
            f"{float(theirs.latency_s[0]):.2f} s per request against "
            f"{float(e.tokens_per_s[0]):,.0f} and {float(e.latency_s[0]):.2f} s here; its KV "
            f"caches hold {_capacity(theirs, tree):,} sequences of the context against "
            f"{_capacity(e, ranked.candidates):,}")


def _capacity(estimate, candidates: ServeCandidates) -> int:
    """Full-context sequences the whole deployment's KV caches hold (first candidate)."""
    copies = candidates.dp[0] * candidates.replicas[0]
    return int(estimate.memory.max_sequences[0] * copies)


def _runner_up(problem: ServeProblem, ranked: RankedServe) -> str:
    c, e = ranked.candidates, ranked.estimate
    same = (c.tp == c.tp[0]) & (c.pp == c.pp[0]) & ((c.ep > 1) == (c.ep[0] > 1))
    others = np.flatnonzero(~same)
    if len(others) == 0:
        return "every listed plan has the winner's tp, pp and expert-parallel setting"
    i = int(others[0])
    gap = 1.0 - float(e.tokens_per_s[i]) / max(float(e.tokens_per_s[0]), 1e-300)
    return (f"runner-up #{i + 1} ({_describe(c.row(i))}): {float(e.tokens_per_s[i]):,.0f} "
            f"tokens/s ({100 * gap:.1f}% fewer), {float(e.latency_s[i]):.2f} s per request; "
            f"TTFT {1e3 * float(e.ttft_s[i]):.0f} ms against {1e3 * float(e.ttft_s[0]):.0f}, "
            f"TPOT {1e3 * float(e.tpot_s[i]):.1f} ms against {1e3 * float(e.tpot_s[0]):.1f} at "
            f"batch {int(e.batch[i])} against {int(e.batch[0])}")


def suggest_serve_fixes(problem: ServeProblem, conflicts: Sequence[str],
                        other_gpus: Sequence[GpuSpec] = ()) -> list[str]:
    """Changes that make the problem feasible, cheapest first: an fp8 (or nvfp4) KV cache,
    lighter weights, a shorter context, more GPUs, a GPU with more memory, a looser SLO."""
    job = problem.job
    fixes = []

    def works(**update: object) -> bool:
        trial = problem.model_copy(update=update)
        return len(enumerate_serving(trial)) > 0

    def with_job(**update: object) -> dict[str, object]:
        return {"job": job.model_copy(update=update)}

    memory = MEMORY_CONSTRAINT in conflicts
    dtypes = ("auto", "fp8", "fp4")
    for dtype in dtypes[1:]:  # the lightest KV cache first that works, fp8 before nvfp4
        lighter = dtypes.index(dtype) > dtypes.index(job.kv_cache_dtype)
        if memory and lighter and works(**with_job(kv_cache_dtype=dtype)):
            fixes.append(f"--kv-cache-dtype {dtype}")
            break
    if "nvfp4_kv_cache_supported" in conflicts and works(**with_job(kv_cache_dtype="fp8")):
        fixes.append("--kv-cache-dtype fp8")
    for precision in ("fp8", "int4"):
        weaker = ("bf16", "fp8", "int4").index(precision) > ("bf16", "fp8", "int4").index(
            job.precision)
        if memory and weaker and works(**with_job(precision=precision)):
            fixes.append(f"--precision {precision}")
            break
    if memory:
        context = job.context // 2
        while context >= job.input_len + job.output_len:
            if works(**with_job(context=context)):
                fixes.append(f"--context {context // 1024}k" if context % 1024 == 0
                             else f"--context {context}")
                break
            context //= 2
    node = problem.cluster.gpus_per_node
    for factor in (2, 4, 8, 16, 32, 64, 128):
        more = -(-max(problem.num_gpus * factor, node) // node) * node
        if works(num_gpus=more):
            fixes.append(f"--gpus {more}")
            break
    if memory:
        larger = sorted((g for g in other_gpus if g.vendor == problem.cluster.gpu.vendor
                         and g.memory_gib > problem.cluster.gpu.memory_gib),
                        key=lambda g: g.memory_gib)
        for gpu in larger:
            if works(cluster=problem.cluster.model_copy(update={"gpu": gpu})):
                fixes.append(f"a GPU with more memory: {gpu.name} "
                             f"({gpu.memory_gib * 2**30 / 1e9:.0f} GB)")
                break
    fixes += _looser_slos(problem, conflicts)
    return fixes


def _looser_slos(problem: ServeProblem, conflicts: Sequence[str]) -> list[str]:
    """The tightest SLO the plans meeting every other constraint reach."""
    names = {"ttft_within_slo": ("ttft_s", "--max-ttft-ms"),
             "tpot_within_slo": ("tpot_idle_s", "--max-tpot-ms")}
    wanted = [n for n in conflicts if n in names]
    if not wanted:
        return []
    others = [c for c in build_serve_constraints(problem) if c.name not in wanted]
    allowed = enumerate_serving(problem, others)
    if len(allowed) == 0:
        return []
    estimate = estimate_serving(problem, allowed)
    fixes = []
    for name in wanted:
        field, option = names[name]
        fixes.append(f"{option} {1e3 * float(getattr(estimate, field).min()):.1f}")
    return fixes
