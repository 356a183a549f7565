"""Disaggregated serving across two clusters: prefill engines on one GPU type (`--cluster A`,
the first given), decode engines on another (`--cluster B`), the KV cache of each prompt sent
between them over the slower side's network between nodes (solver.cost.comm.kv_transfer
.estimate_between_clusters_link).

The pools are sized for the offered --request-rate within the SLOs, as solver.serve.disagg
sizes them on one cluster: a prefill DP rank carries the most requests/s with its queue's TTFT
plus the transfer within --max-ttft-ms and the prompts it holds within its KV cache, a decode
DP rank the most with TPOT within --max-tpot-ms; each pool takes the fewest copies of its
engine that carry the rate, at most --gpus GPUs of its cluster. Among the engine pairs vLLM's
NixlConnector accepts (solver.serve.disagg.nixl_pairs), the plan is the one on the fewest
GPUs, or the lowest $ an hour when both clusters are priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solver.cost.comm.kv_transfer import estimate_between_clusters_link, estimate_kv_transfer_s
from solver.cost.serving.load import largest_rate
from solver.serve.disagg import (
    SplitPlan,
    _engines,
    _largest_prefill_rate,
    _without,
    build_split_plan,
    nixl_pairs,
    within_pool_pins,
)
from solver.serve.job import ServeProblem
from solver.serve.load import estimate_load_curves, meets_slo
from solver.serve.memory import estimate_kv_bytes_per_token, estimate_serving_memory


@dataclass(frozen=True)
class TwoClusterResult:
    """The plans best first (prefill on `prefill_problem`'s cluster, decode on
    `decode_problem`'s), the link between them (its bandwidth, bytes/s, and the cluster whose
    network it is) and the prices per GPU-hour (None: not priced)."""

    prefill_problem: ServeProblem
    decode_problem: ServeProblem
    plans: tuple[SplitPlan, ...]
    link_bytes_per_s: float
    link_cluster: str
    prefill_price: float | None = None
    decode_price: float | None = None

    def dollars_per_hour(self, plan: SplitPlan) -> float | None:
        if self.prefill_price is None or self.decode_price is None or plan.prefill is None:
            return None
        return (self.prefill_price * plan.prefill.num_gpus
                + self.decode_price * plan.decode.num_gpus)


def search_two_clusters(prefill_problem: ServeProblem, decode_problem: ServeProblem,
                        top: int = 5, prefill_price: float | None = None,
                        decode_price: float | None = None) -> TwoClusterResult:
    """The plans that carry the offered rate within the SLOs (module docstring)."""
    rate = prefill_problem.job.load.request_rate
    assert rate is not None, "the caller requires --request-rate"
    link, link_cluster = estimate_between_clusters_link(prefill_problem.cluster,
                                                        decode_problem.cluster)
    answer = TwoClusterResult(prefill_problem, decode_problem, (),
                              float(link.bandwidth_bytes_per_s[0]), link_cluster,
                              prefill_price, decode_price)
    prefill, decode = _engines(prefill_problem), _engines(decode_problem)
    if len(prefill) == 0 or len(decode) == 0:
        return answer
    job = prefill_problem.job
    pair_i, pair_j = np.nonzero(
        nixl_pairs(prefill, decode, prefill_problem.model_spec)
        & within_pool_pins(prefill_problem, "prefill", prefill)[:, None]
        & within_pool_pins(decode_problem, "decode", decode)[None, :])
    if len(pair_i) == 0:
        return answer
    p_curves = estimate_load_curves(prefill_problem, prefill, "prefill")
    d_curves = estimate_load_curves(decode_problem, decode, "decode")
    kv_tokens = estimate_serving_memory(prefill_problem, prefill).kv_tokens
    prompt = job.input_distribution.quantile(job.load.quantile)
    p, d = prefill.take(pair_i), decode.take(pair_j)
    transfer = estimate_kv_transfer_s(prompt, estimate_kv_bytes_per_token(decode_problem, d.tp,
                                                                          d.pp),
                                      p.tp, p.pp, d.tp, d.pp, link)
    prefill_rate = _largest_prefill_rate(prefill_problem, p_curves.take(pair_i), transfer,
                                         kv_tokens[pair_i]) * p.dp
    decode_rate = largest_rate(d_curves, lambda point: meets_slo(
        _without(decode_problem, "ttft"), point))[pair_j] * d.dp
    plans = []
    for k, (i, j) in enumerate(zip(pair_i, pair_j)):
        if prefill_rate[k] <= 0 or decode_rate[k] <= 0:
            continue
        copies_p = math.ceil(rate / prefill_rate[k])
        copies_d = math.ceil(rate / decode_rate[k])
        if (copies_p * prefill.num_gpus[i] > prefill_problem.num_gpus
                or copies_d * decode.num_gpus[j] > decode_problem.num_gpus):
            continue
        plans.append(build_split_plan(
            prefill_problem.job.load.request_rate, prefill, decode, decode_problem, int(i),
            int(j), copies_p, copies_d, min(copies_p * prefill_rate[k], copies_d * decode_rate[k]),
            False, p_curves, d_curves, float(transfer[k])))

    def key(plan: SplitPlan) -> tuple[float, int, float]:
        money = answer.dollars_per_hour(plan)  # None for every plan unless both are priced
        return (0.0 if money is None else money, plan.num_gpus,
                plan.ttft_s + job.output_len * plan.tpot_s)

    plans.sort(key=key)
    return TwoClusterResult(prefill_problem, decode_problem, tuple(plans[:top]),
                            answer.link_bytes_per_s, link_cluster, prefill_price, decode_price)

