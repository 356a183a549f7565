"""Disaggregated prefill and decode: a pool of prefill engines and a pool of decode engines on
the same GPUs, the KV cache of each prompt sent from one to the other (vLLM's NixlConnector,
SGLang's --disaggregation-mode with NIXL or Mooncake, as Dynamo and llm-d deploy them),
against the best aggregated plan on the same GPUs.

Each pool is a number of copies of one engine (tp, pp, dp, ep as `parplan serve` searches
them, dp ranks each serving their share). The load splits evenly over the copies' DP ranks:

  prefill  an M/G/1 queue of prompts with nothing decoding beside them
           (solver.cost.serving.load.estimate_prefill_queue); its KV cache holds every prompt
           from its first chunk until the decode side has read it (Little's law,
           solver.cost.comm.kv_transfer), which bounds the rate a prefill rank takes;
  transfer the prompt's KV cache over the tier that joins the pools: inside the NVLink domain
           when both pools fit in it, else the cluster's network; the pools may differ in TP
           (vLLM 0.33.0's NixlConnector: the larger TP a multiple of the smaller, nixl_pairs),
           a prefill GPU then serving several decode GPUs or a decode GPU reading from several
           prefill GPUs (solver.cost.comm.kv_transfer, send_recv of solver.cost.comm.comm);
  decode   continuous batching with no prefill rounds (solver.cost.serving.load, phase "decode").

TTFT = prefill TTFT + transfer (the prefill engine returns the first token; the decode engine
starts after the transfer), TPOT = the decode engine's. The SLO constraints separate: the
prefill pool must meet the TTFT limit (with the transfer) and the decode pool the TPOT limit,
so the most requests/s a pair carries is the smaller of what each pool carries, and the search
over (prefill engine, decode engine, prefill copies) is arithmetic on per-engine capacities.
The aggregated plans are candidates of the same search: the answer is the plan, aggregated or
disaggregated, that carries the most load within the SLO.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.comm.comm import estimate_group_link
from solver.cost.comm.kv_transfer import estimate_kv_transfer_s, estimate_prefill_kv_tokens
from solver.serve.candidates import ServeCandidates
from solver.serve.enumerate import enumerate_serving
from solver.serve.job import ServeProblem
from solver.cost.serving.curves import LoadCurves
from solver.spec import ModelSpec
from solver.cost.serving.load import estimate_load_point, estimate_prefill_queue, largest_rate
from solver.serve.load import (
    estimate_load_curves,
    estimate_max_num_seqs,
    estimate_serving_load,
    meets_slo,
)
from solver.serve.memory import estimate_kv_bytes_per_token, estimate_serving_memory

ENGINE_KEYS = ("tp", "pp", "dp", "ep")


@dataclass(frozen=True)
class PoolPlan:
    """One pool: the engine's degrees and how many copies of it."""

    degrees: dict[str, int]
    copies: int

    @property
    def num_gpus(self) -> int:
        d = self.degrees
        return d["tp"] * d["pp"] * d["dp"] * self.copies


@dataclass(frozen=True)
class SplitPlan:
    """A plan of the disaggregated search: `kind` aggregated (prefill None, decode the whole
    engine and its copies) or disaggregated; the most requests/s it carries within the SLO
    and its latency at the operating point (the offered load, else that most), seconds."""

    kind: str
    prefill: PoolPlan | None
    decode: PoolPlan
    num_gpus: int
    max_rate_per_s: float
    ttft_s: float
    tpot_s: float
    transfer_s: float
    same_domain: bool
    decode_max_num_seqs: int = 0
    prefill_index: int = -1  # rows of DisaggResult.engines (disaggregated plans)
    decode_index: int = -1


@dataclass(frozen=True)
class DisaggResult:
    """Plans of the search best first (the aggregated best among them) and the best of each
    kind."""

    plans: tuple[SplitPlan, ...]
    best_aggregated: SplitPlan | None
    best_disaggregated: SplitPlan | None
    # Every disaggregated plan (one per prefill and decode engine pair), the engines and their
    # prefill and decode curves: what the Pareto front samples (solver.serve.pareto).
    candidates: tuple[SplitPlan, ...] = ()
    engines: ServeCandidates | None = None
    prefill_curves: LoadCurves | None = None
    decode_curves: LoadCurves | None = None
    kv_tokens: np.ndarray | None = None  # each engine's KV cache per DP rank, tokens
    pinned_out: str = ""  # the pool pin that leaves a pool no engine, if one does

    @property
    def winner(self) -> SplitPlan | None:
        return self.plans[0] if self.plans else None


def _engines(problem: ServeProblem) -> ServeCandidates:
    """Every engine of at most --gpus GPUs that fits (one copy; no SLO or load rule)."""
    job = problem.job.model_copy(update={"objective": "gpus", "max_ttft_ms": None,
                                         "max_tpot_ms": None, "min_tokens_per_s": None})
    lone = job.model_copy(update={"load": job.load.model_copy(update={"request_rate": None,
                                                                      "concurrency": None})})
    return enumerate_serving(problem.model_copy(update={"job": lone}))


def estimate_transfer_s(problem: ServeProblem, prefill: ServeCandidates, same_domain: bool,
                        prompt_tokens: float, decode: ServeCandidates | None = None
                        ) -> np.ndarray:
    """Seconds to move one prompt's KV cache from each prefill engine to its decode engine
    (the same engines when `decode` is None): solver.cost.comm.kv_transfer over NVLink when both
    pools sit in one NVLink domain, else over the cluster's network. Llama-3.1-70B at tp 8,
    2,048 tokens: 2,048 x 40,960 B = 83.9 MB per GPU; over a 40 GB/s network that is about
    2.1 ms, over 360 GB/s NVLink about 0.23 ms."""
    decode = prefill if decode is None else decode
    cluster = problem.cluster
    kv_decode = estimate_kv_bytes_per_token(problem, decode.tp, decode.pp)
    stride = 1 if same_domain else max(cluster.scale_up_gpus, cluster.gpus_per_node)
    link = estimate_group_link(cluster, np.full(len(prefill), stride), np.full(len(prefill), 2))
    return estimate_kv_transfer_s(prompt_tokens, kv_decode, prefill.tp, prefill.pp, decode.tp,
                                  decode.pp, link)


def nixl_pairs(prefill: ServeCandidates, decode: ServeCandidates,
               model_spec: ModelSpec) -> np.ndarray:
    """The pairs vLLM 0.33.0's NixlConnector accepts (matrix over prefill x decode engines):

    nixl_tp_sizes_divide      the larger TP a multiple of the smaller
                              (vllm/distributed/kv_transfer/kv_connector/utils.py tp_ratio:
                              a decode rank reads from one prefill rank, or from
                              tp_prefill / tp_decode of them, PR #27274);
    nixl_prefill_tp_above_decode_needs_unreplicated_kv
                              a prefill TP above the decode TP only where the prefill engine
                              does not replicate KV heads (tp <= num_key_value_heads) or the
                              model has MLA (v1/nixl/base_worker.py, the assert on tp_ratio < 0
                              and is_kv_replicated);
    nixl_decode_pp_is_one     a decode engine of one pipeline stage (base_worker.py: a
                              kv_consumer with pipeline_parallel_size > 1 raises
                              NotImplementedError).

    vLLM before PR #27274 (October 2025) asserted "Decode TP cannot be smaller than prefill
    TP"."""
    tp_p, tp_d = prefill.tp[:, None], decode.tp[None, :]
    divide = (np.maximum(tp_p, tp_d) % np.minimum(tp_p, tp_d)) == 0
    replicated = (tp_p > model_spec.kv_heads) & (not model_spec.is_mla)
    return divide & ~((tp_p > tp_d) & replicated) & (decode.pp[None, :] == 1)


def search_disaggregated(problem: ServeProblem, top: int = 5) -> DisaggResult:
    """The plans that carry the most load within the SLO on --gpus GPUs (module docstring)."""
    job, n = problem.job, problem.num_gpus
    plans = _aggregated(problem)
    engines = _engines(problem)
    split, curves, kv_tokens = [], (None, None), None
    if len(engines) and n >= 2:
        curves = (estimate_load_curves(problem, engines, "prefill"),
                  estimate_load_curves(problem, engines, "decode"))
        kv_tokens = estimate_serving_memory(problem, engines).kv_tokens
        split = _disaggregated(problem, engines, *curves, kv_tokens)
    pinned_out = find_pool_pin_conflict(problem, engines)
    plans += split
    plans.sort(key=lambda p: (-p.max_rate_per_s, p.num_gpus, p.kind != "aggregated",
                              p.ttft_s + job.output_len * p.tpot_s))
    aggregated = next((p for p in plans if p.kind == "aggregated"), None)
    best_split = next((p for p in plans if p.kind == "disaggregated"), None)
    return DisaggResult(plans=tuple(plans[:top]), best_aggregated=aggregated,
                        best_disaggregated=best_split, candidates=tuple(split),
                        engines=engines, prefill_curves=curves[0], decode_curves=curves[1],
                        kv_tokens=kv_tokens, pinned_out=pinned_out)


def within_pool_pins(problem: ServeProblem, pool: str, engines: ServeCandidates
                     ) -> np.ndarray:
    """Which engines a pool's pins (--prefill-tp, --decode-dp, ...) allow."""
    ok = np.ones(len(engines), dtype=bool)
    for name, values in problem.pool_pins.get(pool, {}).items():
        ok &= np.isin(getattr(engines, name), np.array(values))
    return ok


def find_pool_pin_conflict(problem: ServeProblem, engines: ServeCandidates) -> str:
    """The pool pin that leaves its pool no engine the rules allow, as one line naming it
    ('' where every pinned pool keeps one)."""
    for pool, pins in sorted(problem.pool_pins.items()):
        if within_pool_pins(problem, pool, engines).any():
            continue
        for name, values in sorted(pins.items()):
            alone = problem.model_copy(update={"pool_pins": {pool: {name: values}}})
            if not within_pool_pins(alone, pool, engines).any():
                shown = ", ".join(str(v) for v in sorted(values))
                return (f"pin_{pool}_{name}: {pool} {name} pinned to {{{shown}}} leaves the "
                        f"{pool} pool no engine the rules allow")
        return (f"pin_{pool}: the {pool} pins together ("
                + ", ".join(f"{k} {sorted(v)}" for k, v in sorted(pins.items()))
                + f") leave the {pool} pool no engine the rules allow")
    return ""


def _aggregated(problem: ServeProblem) -> list[SplitPlan]:
    """The best aggregated plan on all the GPUs (the load and SLO rules lifted, so a plan
    that carries less than the offered load still competes)."""
    job = problem.job.model_copy(update={"objective": "throughput", "max_ttft_ms": None,
                                         "max_tpot_ms": None, "min_tokens_per_s": None})
    lone = job.model_copy(update={"load": job.load.model_copy(update={"request_rate": None,
                                                                      "concurrency": None})})
    candidates = enumerate_serving(problem.model_copy(update={"job": lone}))
    if len(candidates) == 0:
        return []
    load = estimate_serving_load(problem, candidates)
    best = int(np.lexsort((candidates.num_gpus, -load.max_rate_per_s))[0])
    row = candidates.row(best)
    rate = float(load.max_rate_per_s[best])
    point = _operating_rate(problem, rate)
    curves = load.curves
    at = estimate_load_point(curves.take(best), np.array(
        [point / float(curves.engines[best])]))
    return [SplitPlan(kind="aggregated", prefill=None,
                      decode=PoolPlan({k: row[k] for k in ENGINE_KEYS}, row["replicas"]),
                      num_gpus=int(candidates.num_gpus[best]), max_rate_per_s=rate,
                      ttft_s=float(at.ttft_s[0]), tpot_s=float(at.tpot_s[0]), transfer_s=0.0,
                      same_domain=True)]


def _operating_rate(problem: ServeProblem, most: float) -> float:
    """The deployment's rate to report latency at: the offered one, else the most carried."""
    rate = problem.job.load.request_rate
    return most if rate is None else rate


def _disaggregated(problem: ServeProblem, engines: ServeCandidates, prefill_curves: LoadCurves,
                   decode_curves: LoadCurves, prefill_kv: np.ndarray) -> list[SplitPlan]:
    job, n = problem.job, problem.num_gpus
    q_len = job.input_distribution.quantile(job.load.quantile)
    ranks = engines.dp.astype(float)
    gpus = engines.num_gpus
    # Per DP rank: what a decode rank carries within the TPOT limit; per pair (prefill i,
    # decode j) and placement, what a prefill rank carries within the TTFT limit once the
    # transfer is added and while its KV cache holds the prompts it keeps (module docstring).
    decode_rate = largest_rate(decode_curves,
                               lambda p: meets_slo(_without(problem, "ttft"), p))
    pair_i, pair_j = np.nonzero(nixl_pairs(engines, engines, problem.model_spec)
                                & (gpus[:, None] + gpus[None, :] <= n)
                                & within_pool_pins(problem, "prefill", engines)[:, None]
                                & within_pool_pins(problem, "decode", engines)[None, :])
    if len(pair_i) == 0:
        return []
    curves = prefill_curves.take(pair_i)
    transfer, prefill_rate = {}, {}
    for same in (True, False):
        transfer[same] = estimate_transfer_s(problem, engines.take(pair_i), same, q_len,
                                             engines.take(pair_j))
        prefill_rate[same] = _largest_prefill_rate(problem, curves, transfer[same],
                                                   prefill_kv[pair_i])
    plans = []
    domain = problem.cluster.scale_up_gpus
    for k, (i, j) in enumerate(zip(pair_i, pair_j)):
        copies_p = np.arange(1, (n - gpus[j]) // gpus[i] + 1)
        copies_d = (n - copies_p * gpus[i]) // gpus[j]
        used = copies_p * gpus[i] + copies_d * gpus[j]
        same = used <= domain
        carried = np.minimum(
            copies_p * ranks[i] * np.where(same, prefill_rate[True][k], prefill_rate[False][k]),
            copies_d * ranks[j] * decode_rate[j])
        best = int(np.lexsort((used, -carried))[0])
        if carried[best] <= 0:
            continue
        placed = bool(same[best])
        plans.append(build_split_plan(
            _operating_rate(problem, float(carried[best])), engines, engines, problem, int(i),
            int(j), int(copies_p[best]), int(copies_d[best]), float(carried[best]), placed,
            prefill_curves, decode_curves, float(transfer[placed][k])))
    return plans


def _without(problem: ServeProblem, limit: str) -> ServeProblem:
    job = problem.job.model_copy(update={f"max_{limit}_ms": None})
    return problem.model_copy(update={"job": job})


def _largest_prefill_rate(problem: ServeProblem, curves, transfer_s: np.ndarray,
                          kv_tokens: np.ndarray) -> np.ndarray:
    """Most requests/s per prefill DP rank with TTFT + transfer within the limit and the KV
    the rank holds (solver.cost.comm.kv_transfer.estimate_prefill_kv_tokens) within its cache
    (bisection)."""
    limit = problem.job.max_ttft_ms
    prompt = problem.job.input_distribution.mean
    service = curves.service_s[:, 0, :] @ curves.weights
    high = np.where(service > 0, 1.0 / np.maximum(service, 1e-300), 0.0)
    low = np.zeros_like(high)
    for _ in range(40):
        middle = (low + high) / 2.0
        ttft, ttft_mean, stable = estimate_prefill_queue(curves, middle)
        held = estimate_prefill_kv_tokens(middle, prompt, np.where(stable, ttft_mean, 0.0),
                                          transfer_s)
        good = stable & (held <= kv_tokens)
        if limit is not None:
            good &= ttft + transfer_s <= limit * 1e-3
        low, high = np.where(good, middle, low), np.where(good, high, middle)
    return low


def build_split_plan(rate: float, prefill_engines: ServeCandidates,
                     decode_engines: ServeCandidates, decode_problem: ServeProblem, i: int,
                     j: int, copies_p: int, copies_d: int, carried: float, same: bool,
                     prefill_curves, decode_curves, transfer_s: float) -> SplitPlan:
    """The split plan of prefill engine `i` (`copies_p` copies) and decode engine `j` at
    `rate`: TTFT from the prefill queue plus the KV transfer, TPOT from the decode pool;
    shared by one cluster's search and the two-cluster one (solver.serve.disagg_across)."""
    p_row, d_row = prefill_engines.row(i), decode_engines.row(j)
    ttft, _, _ = estimate_prefill_queue(prefill_curves.take(i),
                                        np.array([rate / (copies_p * p_row["dp"])]))
    decode = estimate_load_point(decode_curves.take(j),
                                 np.array([rate / (copies_d * d_row["dp"])]))
    seqs = int(estimate_max_num_seqs(decode_problem, decode_curves.take(j))[0])
    prefill = PoolPlan({k: p_row[k] for k in ENGINE_KEYS}, copies_p)
    decode_pool = PoolPlan({k: d_row[k] for k in ENGINE_KEYS}, copies_d)
    return SplitPlan(kind="disaggregated", prefill=prefill, decode=decode_pool,
                     num_gpus=prefill.num_gpus + decode_pool.num_gpus, max_rate_per_s=carried,
                     ttft_s=float(ttft[0]) + transfer_s, tpot_s=float(decode.tpot_s[0]),
                     transfer_s=transfer_s, same_domain=same, decode_max_num_seqs=seqs,
                     prefill_index=i, decode_index=j)


def describe_pool(pool: PoolPlan) -> str:
    d = pool.degrees
    text = f"tp {d['tp']} x pp {d['pp']} x dp {d['dp']}" + (f", ep {d['ep']}" if d["ep"] > 1
                                                           else "")
    return text + (f", {pool.copies} copies" if pool.copies > 1 else "")


def describe_split(plan: SplitPlan) -> str:
    if plan.prefill is None:
        return f"aggregated {describe_pool(plan.decode)}"
    return (f"prefill {describe_pool(plan.prefill)} ({plan.prefill.num_gpus} GPUs) + decode "
            f"{describe_pool(plan.decode)} ({plan.decode.num_gpus} GPUs)")


def explain_disaggregation(result: DisaggResult) -> str:
    """Why the winner is aggregated or disaggregated, with the load each kind carries."""
    agg, split = result.best_aggregated, result.best_disaggregated
    if split is None and result.pinned_out:
        return f"no disaggregated split: {result.pinned_out}"
    if split is None:
        return "no disaggregated split fits: every split leaves a pool without a fitting engine"
    if agg is None:
        return (f"disaggregated: {describe_split(split)} carries "
                f"{split.max_rate_per_s:.2f} requests/s within the SLO; no aggregated plan fits")
    if result.winner is not None and result.winner.kind == "disaggregated":
        gain = split.max_rate_per_s / max(agg.max_rate_per_s, 1e-300) - 1.0
        return (f"disaggregated wins: {describe_split(split)} carries "
                f"{split.max_rate_per_s:.2f} requests/s within the SLO against "
                f"{agg.max_rate_per_s:.2f} for the best aggregated plan "
                f"({describe_split(agg)}): {100 * gain:+.1f}%; KV transfer "
                f"{1e3 * split.transfer_s:.2f} ms per prompt over "
                f"{'NVLink' if split.same_domain else 'the network'}")
    loss = 1.0 - split.max_rate_per_s / max(agg.max_rate_per_s, 1e-300)
    return (f"aggregated wins: {describe_split(agg)} carries {agg.max_rate_per_s:.2f} "
            f"requests/s within the SLO; the best split, {describe_split(split)}, carries "
            f"{split.max_rate_per_s:.2f} ({100 * loss:.1f}% less: a pool idles while the "
            "other limits, and the KV transfer adds "
            f"{1e3 * split.transfer_s:.2f} ms to TTFT)")
