"""The KV cache of a prompt sent from a prefill engine to a decode engine (disaggregated
serving), vectorised over engine pairs, and the KV it holds meanwhile.

vLLM's NixlConnector lets the decode side pull: every decode TP rank reads its heads from the
prefill rank tp_rank // (tp_decode / tp_prefill), a prefill rank serving tp_decode /
tp_prefill readers, or, when the prefill TP is the larger (vLLM 0.33.0, PR #27274), from
tp_prefill / tp_decode prefill ranks, each sending its share of the heads
(vllm/distributed/kv_transfer/kv_connector/utils.py tp_ratio; the pairs it accepts:
solver.serve.disagg.nixl_pairs). Per prompt of I tokens:

    ingress per decode GPU    I x kv_d             (its KV bytes per token, heads replicated
                                                   where tp exceeds the KV heads; MLA's
                                                   latent whole on every rank)
    egress per prefill GPU    I x kv_d x (tp_d pp_d) / (tp_p pp_p)
                              (what all decode GPUs read, spread over the prefill GPUs; under
                              the ingress when the prefill TP is the larger)

The transfer takes the busier side's bytes as one send/recv over the tier that joins the pools
(solver.cost.comm.comm). With equal degrees both sides carry I x kv: Llama-3.1-70B at tp 8,
2,048 tokens, 83.9 MB per GPU, about 2.1 ms at 40 GB/s. Prefill tp 4 feeding decode tp 8:
each prefill GPU sends twice that, 167.8 MB.

A prefill engine keeps a prompt's KV from its first chunk until the decode side has read it
(NixlConnector frees the blocks on the reader's notification), so by Little's law it holds
lam x E[I] x (time in the prefill engine + transfer) tokens on average at lam requests/s.
"""

from __future__ import annotations

import numpy as np

from solver.cost.comm.comm import GroupLink, estimate_collective_s, estimate_group_link
from solver.spec import ClusterSpec


def estimate_kv_transfer_bytes(prompt_tokens, decode_kv_bytes_per_token, tp_prefill,
                               pp_prefill, tp_decode, pp_decode) -> np.ndarray:
    """Bytes on the busier side of one prompt's transfer, per GPU (module docstring)."""
    ingress = np.asarray(prompt_tokens, dtype=float) * np.asarray(decode_kv_bytes_per_token,
                                                                    dtype=float)
    readers = (np.asarray(tp_decode, dtype=float) * np.asarray(pp_decode, dtype=float)
               / (np.asarray(tp_prefill, dtype=float) * np.asarray(pp_prefill, dtype=float)))
    return ingress * np.maximum(readers, 1.0)


def estimate_kv_transfer_s(prompt_tokens, decode_kv_bytes_per_token, tp_prefill, pp_prefill,
                           tp_decode, pp_decode, link: GroupLink) -> np.ndarray:
    """Seconds to move one prompt's KV cache from the prefill to the decode engine over
    `link`: the busier side's bytes as one send/recv (solver.cost.comm.comm)."""
    size = estimate_kv_transfer_bytes(prompt_tokens, decode_kv_bytes_per_token, tp_prefill,
                                      pp_prefill, tp_decode, pp_decode)
    return estimate_collective_s("send_recv", size, np.full(np.shape(size), 2), link)


def estimate_prefill_kv_tokens(rate_per_s, prompt_mean_tokens: float, in_engine_s,
                               transfer_s) -> np.ndarray:
    """Mean KV tokens a prefill engine holds at `rate_per_s` (Little's law, module
    docstring): 10 requests/s of 2,000 tokens, 0.3 s in the engine and 2 ms of transfer:
    10 x 2,000 x 0.302 = 6,040 tokens."""
    return (np.asarray(rate_per_s, dtype=float) * prompt_mean_tokens
            * (np.asarray(in_engine_s, dtype=float) + np.asarray(transfer_s, dtype=float)))


def estimate_between_clusters_link(prefill_cluster: ClusterSpec, decode_cluster: ClusterSpec
                                   ) -> tuple[GroupLink, str]:
    """The link a prompt's KV cache crosses from a prefill engine on one cluster to a decode
    engine on another: each side's network between nodes (a pair of GPUs a node apart,
    solver.cost.comm), the slower of the two, and the name of the cluster it belongs to
    (the prefill side's on a tie). dgx-h100 (40 GB/s per GPU between nodes) and
    dgx-a100-80gb (20 GB/s): 20 GB/s, so 2,048 tokens of Llama-3.1-70B at tp 8 (83.9 MB per
    GPU) take about 4.2 ms."""
    links = []
    for cluster in (prefill_cluster, decode_cluster):
        stride = max(cluster.scale_up_gpus, cluster.gpus_per_node)
        links.append((estimate_group_link(cluster, np.array([stride]), np.array([2])),
                      cluster.name))
    (p_link, p_name), (d_link, d_name) = links
    slower = float(d_link.bandwidth_bytes_per_s[0]) < float(p_link.bandwidth_bytes_per_s[0])
    return (d_link, d_name) if slower else (p_link, p_name)
