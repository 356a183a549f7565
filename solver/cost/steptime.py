"""Step time of a training iteration, vectorised over candidate configurations.

One micro-batch on the slowest pipeline stage costs

    t_mb = forward + backward (+ recompute) compute of its layers (+ LM head on the last stage)
           + exposed TP, CP and EP communication of those layers

and a step of m = global_batch / (dp * micro_batch) micro-batches costs

    step = m * t_mb                                  steady state
         + (pp - 1) / vpp * t_mb                     pipeline bubble (Narayanan et al. 2021 §2.2:
                                                     1F1B (p-1)/(m+p-1) of the step; interleaved
                                                     (p-1)/(v*m) of the ideal time)
         + m * pp point-to-point sends               (activations forward, gradients backward)
         + exposed DP / ZeRO traffic                 (gradient sync hides behind the last
                                                     micro-batch's backward, the parameter
                                                     all-gather behind the next forward; ZeRO-3
                                                     gathers per micro-batch behind its compute)
         + optimizer step                            (Adam streams ~30 bytes per local parameter)

Group links follow Megatron's rank order tp-cp-ep-dp-pp (dense generator tp-cp-dp-pp, expert
generator etp-ep-edp-pp): TP has stride 1, CP stride tp, DP stride tp*cp, PP stride tp*cp*dp;
EP stride etp, expert-DP stride etp*ep.

Layer kinds: attention + dense MLP, or attention + MoE (router, top-k routed experts on
ep*etp GPUs, shared experts split by TP). Routing is taken as balanced, as in the vendor MoE
benchmarks this is checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from solver.cost.comm import estimate_collective_s, estimate_group_link
from solver.cost.data_parallel import (
    estimate_dp_collectives_s,
    estimate_grad_accumulation_s,
    estimate_optimizer_s,
)
from solver.cost.efficiency import (
    estimate_attention_core_s,
    estimate_elementwise_s,
    estimate_gemm_s,
    estimate_streaming_s,
)
from solver.cost.flops import (
    estimate_attention_core_flops,
    estimate_model_flops_per_token,
)
# TimeConstants lives in solver.cost.time_constants; importing it from here keeps working.
from solver.cost.time_constants import TimeConstants, dp_part_overlaps, dp_syncs_per_step
from solver.spec import ClusterSpec, JobSpec, ModelSpec

BF16_BYTES = 2.0
DEFAULT_NUM_SMS = 132  # H100; used when the GPU catalog does not give the SM count
RECOMPUTE_FULL = 2


@dataclass(frozen=True)
class StepTime:
    """Seconds per step and its breakdown, one entry per candidate; the parts add up."""

    compute: np.ndarray
    recompute: np.ndarray
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    dp: np.ndarray
    pp: np.ndarray
    bubble: np.ndarray
    optimizer: np.ndarray
    step_s: np.ndarray
    tokens_per_s: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    tflops_per_gpu: np.ndarray
    mfu: np.ndarray

    def breakdown(self, index: int) -> dict[str, float]:
        """The DESIGN.md `time_seconds` object of one candidate."""
        names = ("compute", "recompute", "tp", "cp", "ep", "dp", "pp", "bubble", "optimizer")
        return {name: float(getattr(self, name)[index]) for name in names}

    def row(self, index: int) -> dict[str, float]:
        return {f.name: float(getattr(self, f.name)[index]) for f in fields(self)}


class _Degrees:
    """Attribute access to a dict of degree arrays (what the cost functions take)."""

    def __init__(self, degrees: dict[str, np.ndarray]) -> None:
        self.__dict__.update(degrees)


def _degrees(candidates: Any) -> dict[str, np.ndarray]:
    names = ("tp", "pp", "dp", "cp", "ep", "etp", "vpp", "zero", "micro_batch", "recompute")
    return {n: np.asarray(getattr(candidates, n), dtype=np.int64) for n in names}


def _layer_compute_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                     d: dict[str, np.ndarray], constants: TimeConstants) -> dict[str, np.ndarray]:
    """Forward seconds per micro-batch of one dense and one MoE layer on one GPU, split into
    GEMMs, attention core and element-wise passes."""
    gpu, precision, cc = cluster.gpu, job.precision, constants.compute
    tp, cp = d["tp"], d["cp"]
    h = model_spec.hidden_size
    rows = d["micro_batch"] * job.seq_len / cp  # tokens in a GPU's GEMMs (SP gathers over tp)
    gemm_bytes = 1.0 if precision == "fp8" else BF16_BYTES

    def two_gemms(params: float, rows_: np.ndarray, split: np.ndarray) -> np.ndarray:
        # A block of `params` weights as two GEMMs (up/in and down/out) of equal size.
        width = params / (2.0 * h * split)
        return 2.0 * estimate_gemm_s(gpu, precision, rows_, h, width, cc, gemm_bytes)

    attention = two_gemms(model_spec.attention_params_per_layer, rows, tp)
    core_flops = rows * estimate_attention_core_flops(model_spec, job.seq_len) / tp
    core = estimate_attention_core_s(gpu, precision, core_flops, cc,
                                     head_dims=(model_spec.qk_head_dim,
                                                model_spec.value_head_dim),
                                     flash=constants.flash_attention,
                                     native=constants.native_attention_kernels)
    q_width = model_spec.num_attention_heads * model_spec.qk_head_dim
    kv_width = 2 * model_spec.kv_heads * model_spec.qk_head_dim
    # Element-wise bytes per token: 2 norms (read + write h), 2 residual adds (2 reads + write),
    # rotary on q and k, the MLP activation (gated: read 2F, write F; plain: read F, write F).
    # Norms and residual adds work on the full hidden width: split over TP only under
    # sequence parallel; rotary and the MLP activation work on TP-split heads and widths.
    sequence_bytes = BF16_BYTES * (4 * h + 6 * h)
    sequence_split = tp if constants.sequence_parallel else 1
    head_bytes = BF16_BYTES * 2 * (q_width + kv_width)

    def elementwise(mlp_width: float, routed_copies: int = 0) -> np.ndarray:
        factor = 3.0 if model_spec.mlp_type == "gated" else 2.0
        # MoE token permutation and un-permutation each read and write k copies of h.
        permute = 2.0 * 2.0 * routed_copies * h
        split_bytes = head_bytes + BF16_BYTES * (factor * mlp_width + permute)
        per_gpu = rows * (sequence_bytes / sequence_split + split_bytes / tp)
        return estimate_elementwise_s(gpu, per_gpu, cc)

    dense = {
        "gemm": attention + two_gemms(model_spec.dense_mlp_params_per_layer, rows, tp),
        "core": core,
        "elementwise": elementwise(model_spec.intermediate_size),
    }
    if not model_spec.is_moe:
        return {"dense": dense, "moe": dense}
    k, experts = model_spec.num_experts_per_tok, model_spec.num_experts
    expert_rows = rows * k * d["ep"] * d["etp"] / (experts * tp)
    local_experts = experts / d["ep"]
    routed = local_experts * two_gemms(model_spec.expert_params, expert_rows, d["etp"])
    shared = two_gemms(model_spec.shared_expert_params_per_layer, rows, tp)
    router = estimate_gemm_s(gpu, "bf16", rows / tp, h, experts, cc)
    moe_width = k * model_spec.moe_intermediate_size + (
        model_spec.num_shared_experts
        * (model_spec.shared_expert_intermediate_size or model_spec.moe_intermediate_size)
    )
    moe = {
        "gemm": attention + shared + router,
        "routed": routed,
        "core": core,
        "elementwise": elementwise(moe_width, k),
    }
    return {"dense": dense, "moe": moe}


def _mixed_layer_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                   d: dict[str, np.ndarray], constants: TimeConstants) -> dict[str, np.ndarray]:
    """Forward seconds of the average layer (dense and MoE layers in the model's proportion),
    by part: GEMMs ("gemm" without the routed experts, "routed"), attention core, element-wise."""
    layer = _layer_compute_s(model_spec, cluster, job, d, constants)
    moe_share = model_spec.num_moe_layers / model_spec.num_hidden_layers
    return {part: (1.0 - moe_share) * layer["dense"].get(part, 0.0)
            + moe_share * layer["moe"].get(part, 0.0)
            for part in ("gemm", "routed", "core", "elementwise")}


def _backward_s(fwd: dict[str, np.ndarray], constants: TimeConstants) -> np.ndarray:
    """Backward seconds from the forward parts: GEMMs and element-wise passes twice (input
    and weight gradients), the attention core by FlashAttention's ratio."""
    return (2.0 * (fwd["gemm"] + fwd["routed"])
            + constants.attention_backward_ratio * fwd["core"] + 2.0 * fwd["elementwise"])


def estimate_layer_compute_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                             candidates: Any, constants: TimeConstants | None = None
                             ) -> dict[str, np.ndarray]:
    """Forward and backward seconds of one (average) layer for one micro-batch on one GPU
    ("fwd", "bwd"), and the routed experts' share of each ("fwd_routed", "bwd_routed"): that
    share depends on micro_batch / (cp x tp), ep and etp only, the rest on tp and
    micro_batch / cp only (the CP-SAT tables keep them apart).

    Worked number: a routed expert GEMM sees rows = micro_batch x seq / (cp x tp) x top-k x
    ep x etp / experts tokens; Mixtral-8x7B (top-2 of 8) at 4,096 tokens, tp = cp = 1,
    ep = 8: 4,096 x 2 x 8 / 8 = 8,192 rows on each GPU's one expert."""
    constants = constants or TimeConstants()
    fwd = _mixed_layer_s(model_spec, cluster, job, _degrees(candidates), constants)
    total = fwd["gemm"] + fwd["routed"] + fwd["core"] + fwd["elementwise"]
    return {"fwd": total, "bwd": _backward_s(fwd, constants),
            "fwd_routed": fwd["routed"], "bwd_routed": 2.0 * fwd["routed"]}


def estimate_step_time(
    model_spec: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    candidates: Any,
    constants: TimeConstants | None = None,
) -> StepTime:
    """Step time and breakdown for every candidate (arrays with attributes tp, pp, dp, cp, ep,
    etp, vpp, zero, micro_batch, recompute as in solver.cost.candidates).

    Worked number (seed 003, example 3): PP = 2 and m = 32 micro-batches give a 1F1B bubble of
    (p - 1) / (m + p - 1) = 1/33 = 3.0% of the step (the seed writes 1/32 = 3.1%).
    """
    constants = constants or TimeConstants()
    d = _degrees(candidates)
    tp, pp, dp, cp, ep, etp, vpp = (d[n] for n in ("tp", "pp", "dp", "cp", "ep", "etp", "vpp"))
    zero, mb, recompute = d["zero"], d["micro_batch"], d["recompute"]
    h, s = model_spec.hidden_size, job.seq_len
    num_layers = model_spec.num_hidden_layers
    num_micro = job.global_batch / (dp * mb)
    layers_per_stage = np.ceil(num_layers / pp)
    moe_share = model_spec.num_moe_layers / num_layers
    dense_share = 1.0 - moe_share

    # ---- compute per micro-batch on one GPU of the slowest stage -----------------------------
    fwd = _mixed_layer_s(model_spec, cluster, job, d, constants)
    gemm = fwd["gemm"] + fwd["routed"]
    fwd_layer = gemm + fwd["core"] + fwd["elementwise"]
    bwd_layer = _backward_s(fwd, constants)
    full = recompute == RECOMPUTE_FULL
    recompute_layer = np.where(full, fwd_layer, 0.0)

    rows = mb * s / cp
    gemm_bytes = 1.0 if job.precision == "fp8" else BF16_BYTES
    head_fwd = estimate_gemm_s(cluster.gpu, job.precision, rows, h, model_spec.vocab_size / tp,
                               constants.compute, gemm_bytes)
    # Cross-entropy reads the fp32 logits about three times (max, exp-sum, gradient).
    loss = estimate_streaming_s(cluster.gpu, 3 * 4.0 * rows * model_spec.vocab_size / tp,
                                constants.compute)
    head = 3.0 * head_fwd + loss

    # ---- exposed communication per micro-batch per layer --------------------------------------
    tp_link = estimate_group_link(cluster, 1, tp)
    activation_bytes = rows * h * BF16_BYTES
    ag = estimate_collective_s("all_gather", activation_bytes, tp, tp_link)
    rs = estimate_collective_s("reduce_scatter", activation_bytes, tp, tp_link)
    # Sequence parallel: attention and MLP each all-gather in and reduce-scatter out, forward
    # and backward (Korthikanti et al. 2022 §4.2.2); an MoE layer's MLP side goes by EP instead.
    tp_dense = 2.0 * (ag + rs)
    tp_moe = 1.0 * (ag + rs)
    tp_fwd = dense_share * tp_dense + moe_share * tp_moe
    if constants.tp_comm_overlap:
        hidden_tp = np.minimum(tp_fwd, gemm)
        tp_fwd = tp_fwd - hidden_tp + hidden_tp * sm_contention(cluster, constants)
    tp_layer = tp_fwd * np.where(full, 3.0, 2.0)

    cp_link = estimate_group_link(cluster, tp, cp)
    kv_heads_per_rank = np.maximum(model_spec.kv_heads / tp, 1.0)
    kv_bytes = (mb * (s / cp) * kv_heads_per_rank * BF16_BYTES
                * (model_spec.qk_head_dim + model_spec.value_head_dim))
    ring_step = estimate_collective_s("send_recv", kv_bytes, np.where(cp > 1, 2, 1), cp_link)
    ring_fwd = (cp - 1) * ring_step
    # The ring hides behind the attention core it feeds (Megatron context_parallel.md).
    cp_fwd = np.maximum(ring_fwd - fwd["core"], 0.0)
    cp_bwd = np.maximum(2.0 * ring_fwd - constants.attention_backward_ratio * fwd["core"], 0.0)
    cp_layer = cp_fwd * np.where(full, 2.0, 1.0) + cp_bwd

    if model_spec.is_moe:
        ep_link = estimate_group_link(cluster, etp, ep, all_to_all=True)
        dispatch_bytes = rows / tp * model_spec.num_experts_per_tok * h * BF16_BYTES
        a2a = estimate_collective_s("all_to_all", dispatch_bytes, ep, ep_link)
        etp_link = estimate_group_link(cluster, 1, etp)
        etp_bytes = dispatch_bytes * etp
        etp_comm = estimate_collective_s("all_gather", etp_bytes, etp, etp_link) + (
            estimate_collective_s("reduce_scatter", etp_bytes, etp, etp_link))
        ep_fwd = moe_share * (2.0 * a2a + etp_comm)  # dispatch + combine
        ep_layer = ep_fwd * np.where(full, 3.0, 2.0)
        if constants.ep_comm_overlap:
            hidden_ep = np.minimum(ep_layer, fwd_layer + bwd_layer)
            ep_layer = ep_layer - hidden_ep + hidden_ep * sm_contention(cluster, constants)
    else:
        ep_layer = np.zeros_like(tp_layer)

    grad_accumulation = estimate_grad_accumulation_s(model_spec, cluster, _Degrees(d), constants)
    per_mb = {
        "compute": layers_per_stage * (fwd_layer + bwd_layer) + head + grad_accumulation,
        "recompute": layers_per_stage * recompute_layer,
        "tp": layers_per_stage * tp_layer,
        "cp": layers_per_stage * cp_layer,
        "ep": layers_per_stage * ep_layer,
    }
    t_mb = sum(per_mb.values())

    # ---- pipeline ----------------------------------------------------------------------------
    # Each TP rank sends its 1/tp slice of the hand-off: with sequence parallel the activation
    # is sharded already; without it, Megatron's scatter/gather optimization (Narayanan et al.
    # 2021 §4.1) and DeepSpeed's pipeline engine (is_pipe_partitioned = is_model_parallel)
    # split it before the send and all-gather it over TP (NVLink) on arrival.
    pp_link = estimate_group_link(cluster, tp * cp * dp, np.where(pp > 1, 2, 1))
    p2p = estimate_collective_s("send_recv", activation_bytes / tp, np.where(pp > 1, 2, 1),
                                pp_link)
    if not constants.sequence_parallel:
        regather = estimate_collective_s("all_gather", activation_bytes, tp, tp_link)
        p2p = p2p + np.where(pp > 1, regather, 0.0)
    pp_time = num_micro * 2.0 * vpp * p2p
    bubble = (pp - 1) / vpp * t_mb

    # ---- data parallel / ZeRO ------------------------------------------------------------------
    dp_s = estimate_dp_collectives_s(model_spec, cluster, _Degrees(d), constants)
    grads_ar, grads_rs = dp_s["grads_all_reduce"], dp_s["grads_reduce_scatter"]
    params_ag, z3_rs = dp_s["params_all_gather"], dp_s["zero3_reduce_scatter"]
    if constants.zero1_grad_all_reduce:
        grads_rs = np.where(zero == 1, grads_ar, grads_rs)
    fwd_mb, bwd_mb = layers_per_stage * fwd_layer, layers_per_stage * bwd_layer
    # What hides behind compute: gradient sync behind the last micro-batch's backward and the
    # parameter gather behind the first forward (ZeRO 0-2, once per step); ZeRO-3 gathers and
    # reduce-scatters every micro-batch behind its own compute. One layer's share of each
    # collective cannot hide: the first gather comes before any compute, the last
    # reduce-scatter after the last backward (notes §4.5: "exposes only one DP communication
    # chunk"; FSDP: "the 1st all-gather will not be able to overlap").
    # The collectives compared with a backward (gradients; ZeRO-3 also its gathers) and with
    # a forward (the parameter gather), their volume per sync and how often they run.
    volume_b = np.select([zero == 0, zero == 3], [grads_ar, params_ag + z3_rs],
                         default=grads_rs)
    volume_f = np.where(zero == 0, 0.0, params_ag)
    every_b, every_f = dp_syncs_per_step(constants, zero, num_micro)
    hideable = 1.0 - 1.0 / layers_per_stage
    overlap_b, overlap_f = dp_part_overlaps(constants, zero, pp)
    hidden_b = np.where(overlap_b, np.minimum(volume_b * hideable, bwd_mb), 0.0)
    hidden_f = np.where(overlap_f, np.minimum(volume_f * hideable, fwd_mb), 0.0)
    # Overlapped collectives run on SMs the GEMMs then lack (notes §4.5): the hidden time
    # slows compute by the communication kernels' share of the SMs.
    kept = 1.0 - sm_contention(cluster, constants)
    dp_time = (every_b * (volume_b - kept * hidden_b)
               + every_f * (volume_f - kept * hidden_f))

    optimizer = estimate_optimizer_s(model_spec, cluster, _Degrees(d), constants)

    parts = {name: num_micro * value for name, value in per_mb.items()}
    step = sum(parts.values()) + bubble + pp_time + dp_time + optimizer
    num_gpus = tp * pp * dp * cp
    tokens = job.global_batch * s
    tokens_per_s = tokens / step
    model_flops = estimate_model_flops_per_token(model_spec, s) * tokens_per_s / num_gpus
    peak = cluster.gpu.peak_flop_per_s(job.precision)
    return StepTime(
        compute=parts["compute"], recompute=parts["recompute"], tp=parts["tp"],
        cp=parts["cp"], ep=parts["ep"], dp=dp_time, pp=pp_time, bubble=bubble,
        optimizer=optimizer, step_s=step, tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / num_gpus, tflops_per_gpu=model_flops / 1e12,
        mfu=model_flops / peak,
    )


def sm_contention(cluster: ClusterSpec, constants: TimeConstants) -> float:
    """Extra compute time per second of overlapped communication: f / (1 - f), f the share of
    the SMs that communication kernels hold (16 of H100's 132: 0.138)."""
    fraction = constants.comm_sms / (cluster.gpu.num_sms or DEFAULT_NUM_SMS)
    return fraction / (1.0 - fraction)
