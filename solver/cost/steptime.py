"""Step time of a training iteration, vectorised over candidate configurations.

One micro-batch on pipeline stage i costs

    T_i = forward + backward (+ recompute) compute of its layers, by kind (dense, MoE)
          + exposed TP, CP and EP communication of those layers
          (+ LM head, loss and MTP modules on the last stage)

and a step of m = global_batch / (dp * micro_batch) micro-batches costs

    step = m * max_i T_i                             steady state (the slowest stage)
         + (sum_i T_i - max_i T_i) / vpp             pipeline fill and drain (Narayanan et al.
                                                     2021 §2.2: equal stages give the 1F1B
                                                     bubble (p-1)/(m+p-1) of the step and the
                                                     interleaved (p-1)/(v*m) of the ideal time)
         + m * pp point-to-point sends               (activations forward, gradients backward)
         + exposed DP / ZeRO traffic                 (gradient sync hides behind the last
                                                     micro-batch's backward, the parameter
                                                     all-gather behind the next forward; ZeRO-3
                                                     gathers per micro-batch behind its compute)
         + optimizer step                            (Adam streams ~30 bytes per local parameter)

`estimate_time_terms` gives every coefficient, `compose_step_time` the one composition: the
even split (`estimate_step_time`), a given layout (`estimate_layout_step_time`) and the integer
coefficients of the layout program (solver.search.layout_program) all go through it.

Group links follow Megatron's rank order tp-cp-ep-dp-pp (dense generator tp-cp-dp-pp, expert
generator etp-ep-edp-pp): TP has stride 1, CP stride tp, DP stride tp*cp, PP stride tp*cp*dp;
EP stride etp, expert-DP stride etp*ep.

Layer kinds: attention + dense MLP, or attention + MoE (router, top-k routed experts on
ep*etp GPUs, shared experts split by TP). Routing is taken as balanced, as in the vendor MoE
benchmarks this is checked against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.comm import estimate_collective_s, estimate_group_link
from solver.cost.data_parallel import (
    estimate_dp_collectives_s,
    estimate_grad_accumulation_s,
    estimate_optimizer_s,
)
from solver.cost.distinct import distinct_inverse, distinct_rows
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
from solver.cost.memory.layout import estimate_stage_layers, layer_kinds, layout_layer_counts
# TimeConstants lives in solver.cost.time_constants; importing it from here keeps working.
from solver.cost.time_constants import TimeConstants, dp_part_overlaps, dp_syncs_per_step
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig, PipelineLayout
from solver.spec.job import PARALLEL_FIELDS

BF16_BYTES = 2.0
DEFAULT_NUM_SMS = 132  # H100; used when the GPU catalog does not give the SM count


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

    def take(self, index: np.ndarray) -> StepTime:
        """The candidates at `index`."""
        return StepTime(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


class _Degrees:
    """Attribute access to a dict of degree arrays (what the cost functions take)."""

    def __init__(self, degrees: dict[str, np.ndarray]) -> None:
        self.__dict__.update(degrees)


def _degrees(candidates: Any) -> dict[str, np.ndarray]:
    return {n: np.asarray(getattr(candidates, n), dtype=np.int64) for n in PARALLEL_FIELDS}


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
    by part: GEMMs ("gemm" without the routed experts, "routed"), attention core, element-wise.
    It sizes the DP overlap window (the layers of the even split's largest stage)."""
    layer = _layer_compute_s(model_spec, cluster, job, d, constants)
    moe_share = model_spec.num_moe_layers / model_spec.num_hidden_layers
    return {part: (1.0 - moe_share) * layer["dense"].get(part, 0.0)
            + moe_share * layer["moe"].get(part, 0.0)
            for part in ("gemm", "routed", "core", "elementwise")}


def _backward_s(fwd: dict[str, np.ndarray], constants: TimeConstants) -> np.ndarray:
    """Backward seconds from the forward parts: GEMMs and element-wise passes twice (input
    and weight gradients), the attention core by FlashAttention's ratio."""
    return (2.0 * (fwd["gemm"] + fwd.get("routed", 0.0))
            + constants.attention_backward_ratio * fwd["core"] + 2.0 * fwd["elementwise"])


def _forward_s(fwd: dict[str, np.ndarray]) -> np.ndarray:
    return fwd["gemm"] + fwd.get("routed", 0.0) + fwd["core"] + fwd["elementwise"]


# The parts of a stage's time per micro-batch (TIME_PARTS of a plan, less the step-level ones).
STAGE_PARTS = ("compute", "recompute", "tp", "cp", "ep")


@dataclass(frozen=True)
class TimeTerms:
    """Seconds per micro-batch on one GPU, by STAGE_PARTS, of what a pipeline stage holds, and
    the step-level terms; one row per candidate.

        per_layer  (N, kinds, parts)  a decoder layer of kind k (0 dense, 1 MoE), forward and
                                      backward with its exposed TP / CP / EP traffic
        recompute  (N, kinds, parts)  what recomputing that layer in full adds
        per_stage  (N, parts)         every stage (gradient accumulation outside the GEMMs)
        last       (N, parts)         the last stage: LM head, loss and the MTP modules
        num_micro, vpp, pp_s, dp_s, optimizer_s  (N,)
    """

    per_layer: np.ndarray
    recompute: np.ndarray
    per_stage: np.ndarray
    last: np.ndarray
    num_micro: np.ndarray
    vpp: np.ndarray
    pp_s: np.ndarray
    dp_s: np.ndarray
    optimizer_s: np.ndarray
    tokens: float
    flop_per_gpu_per_step: np.ndarray
    peak_flop_per_s: float
    num_gpus: np.ndarray

    def take(self, index: np.ndarray) -> TimeTerms:
        scalars = ("tokens", "peak_flop_per_s")
        values = {name: getattr(self, name)[index] for name in self.__dataclass_fields__
                  if name not in scalars}
        return TimeTerms(tokens=self.tokens, peak_flop_per_s=self.peak_flop_per_s, **values)


@dataclass(frozen=True)
class StageTimeContent:
    """What the stages of each candidate hold, for the step time: S stage rows per candidate,
    `count` of them alike (0 pads). layers, recompute: (N, S, kinds); is_last, count: (N, S)."""

    layers: np.ndarray
    recompute: np.ndarray
    is_last: np.ndarray
    count: np.ndarray


def _parts(**values: np.ndarray | float) -> np.ndarray:
    """STAGE_PARTS on a last axis (missing parts 0)."""
    shape = np.broadcast_shapes(*(np.shape(v) for v in values.values()))
    out = np.zeros((*shape, len(STAGE_PARTS)))
    for name, value in values.items():
        out[..., STAGE_PARTS.index(name)] = value
    return out


def _layer_terms(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                 d: dict[str, np.ndarray], constants: TimeConstants
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(per layer, recompute) of TimeTerms: each layer kind without and with full recompute."""
    tp, cp, ep, etp = d["tp"], d["cp"], d["ep"], d["etp"]
    h, s, mb = model_spec.hidden_size, job.seq_len, d["micro_batch"]
    layer = _layer_compute_s(model_spec, cluster, job, d, constants)
    contention = sm_contention(cluster, constants)
    rows = mb * s / cp
    tp_link = estimate_group_link(cluster, 1, tp)
    activation_bytes = rows * h * BF16_BYTES
    ag = estimate_collective_s("all_gather", activation_bytes, tp, tp_link)
    rs = estimate_collective_s("reduce_scatter", activation_bytes, tp, tp_link)

    cp_link = estimate_group_link(cluster, tp, cp)
    kv_heads_per_rank = np.maximum(model_spec.kv_heads / tp, 1.0)
    kv_bytes = (mb * (s / cp) * kv_heads_per_rank * BF16_BYTES
                * (model_spec.qk_head_dim + model_spec.value_head_dim))
    ring_step = estimate_collective_s("send_recv", kv_bytes, np.where(cp > 1, 2, 1), cp_link)
    ring_fwd = (cp - 1) * ring_step

    ep_fwd = np.zeros_like(ag)
    if model_spec.is_moe:
        ep_link = estimate_group_link(cluster, etp, ep, all_to_all=True)
        dispatch_bytes = rows / tp * model_spec.num_experts_per_tok * h * BF16_BYTES
        a2a = estimate_collective_s("all_to_all", dispatch_bytes, ep, ep_link)
        etp_link = estimate_group_link(cluster, 1, etp)
        etp_bytes = dispatch_bytes * etp
        etp_comm = estimate_collective_s("all_gather", etp_bytes, etp, etp_link) + (
            estimate_collective_s("reduce_scatter", etp_bytes, etp, etp_link))
        ep_fwd = 2.0 * a2a + etp_comm  # dispatch + combine

    def kind(fwd: dict[str, np.ndarray], is_moe: bool, full: bool) -> np.ndarray:
        fwd_s, bwd_s = _forward_s(fwd), _backward_s(fwd, constants)
        gemm = fwd["gemm"] + fwd.get("routed", 0.0)
        # Sequence parallel: attention and MLP each all-gather in and reduce-scatter out,
        # forward and backward (Korthikanti et al. 2022 §4.2.2); an MoE layer's MLP side goes
        # by EP instead.
        tp_fwd = (1.0 if is_moe else 2.0) * (ag + rs)
        if constants.tp_comm_overlap:
            hidden_tp = np.minimum(tp_fwd, gemm)
            tp_fwd = tp_fwd - hidden_tp + hidden_tp * contention
        # The ring hides behind the attention core it feeds (Megatron context_parallel.md).
        cp_fwd = np.maximum(ring_fwd - fwd["core"], 0.0)
        cp_bwd = np.maximum(2.0 * ring_fwd - constants.attention_backward_ratio * fwd["core"],
                            0.0)
        ep_s = ep_fwd * (3.0 if full else 2.0) if is_moe else np.zeros_like(fwd_s)
        if is_moe and constants.ep_comm_overlap:
            hidden_ep = np.minimum(ep_s, fwd_s + bwd_s)
            ep_s = ep_s - hidden_ep + hidden_ep * contention
        return _parts(compute=fwd_s + bwd_s, recompute=fwd_s if full else 0.0,
                      tp=tp_fwd * (3.0 if full else 2.0),
                      cp=cp_fwd * (2.0 if full else 1.0) + cp_bwd, ep=ep_s)

    kinds = [("dense", False), ("moe", model_spec.is_moe)]
    plain = np.stack([kind(layer[name], moe, False) for name, moe in kinds], axis=1)
    full = np.stack([kind(layer[name], moe, True) for name, moe in kinds], axis=1)
    return plain, full - plain


# What a layer's time (and the LM head's) depends on.
LAYER_DEGREES = ("tp", "cp", "ep", "etp", "micro_batch")


def _layer_part_terms(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                      d: dict[str, np.ndarray], constants: TimeConstants
                      ) -> dict[str, np.ndarray]:
    """The terms of TimeTerms a layer and the LM head give (per_layer, recompute, head), and
    the average layer's forward and backward seconds (the DP overlap window)."""
    tp, cp, mb = d["tp"], d["cp"], d["micro_batch"]
    h = model_spec.hidden_size
    per_layer, recompute_terms = _layer_terms(model_spec, cluster, job, d, constants)
    rows = mb * job.seq_len / cp
    gemm_bytes = 1.0 if job.precision == "fp8" else BF16_BYTES
    head_fwd = estimate_gemm_s(cluster.gpu, job.precision, rows, h, model_spec.vocab_size / tp,
                               constants.compute, gemm_bytes)
    # Cross-entropy reads the fp32 logits about three times (max, exp-sum, gradient).
    loss = estimate_streaming_s(cluster.gpu, 3 * 4.0 * rows * model_spec.vocab_size / tp,
                                constants.compute)
    fwd = _mixed_layer_s(model_spec, cluster, job, d, constants)
    return {"per_layer": per_layer, "recompute": recompute_terms,
            "head": _parts(compute=3.0 * head_fwd + loss), "mixed_fwd": _forward_s(fwd),
            "mixed_bwd": _backward_s(fwd, constants)}


def estimate_time_terms(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                        candidates: Any, constants: TimeConstants | None = None) -> TimeTerms:
    """Every term of the step time of each candidate (TimeTerms; composed by
    compose_step_time). The DP / ZeRO, pipeline send and optimizer terms are the mesh's: the
    DP traffic hides behind the even split's largest stage, whatever the layout."""
    constants = constants or TimeConstants()
    d = _degrees(candidates)
    tp, pp, dp, cp, vpp = (d[n] for n in ("tp", "pp", "dp", "cp", "vpp"))
    zero, mb, recompute = d["zero"], d["micro_batch"], d["recompute"]
    h, s = model_spec.hidden_size, job.seq_len
    num_micro = job.global_batch / (dp * mb)
    # The layer and head terms depend on (tp, cp, ep, etp, micro_batch) only: work them out
    # once per distinct tuple (a few hundred among hundreds of thousands of candidates).
    first, back = distinct_rows(d, LAYER_DEGREES)
    layer = _layer_part_terms(model_spec, cluster, job,
                              {n: d[n][first] for n in PARALLEL_FIELDS}, constants)
    per_layer, recompute_terms = layer["per_layer"][back], layer["recompute"][back]
    head = layer["head"][back]
    # Each MTP module is one more layer (of the model's MoE kind) with its own head and loss,
    # recomputed as the configuration recomputes.
    mtp_kind = 1 if model_spec.is_moe else 0
    full = (recompute == RECOMPUTE_FULL)[:, None]
    mtp = model_spec.num_nextn_predict_layers * (
        per_layer[:, mtp_kind] + np.where(full, recompute_terms[:, mtp_kind], 0.0) + head)
    grad_accumulation = estimate_grad_accumulation_s(model_spec, cluster, _Degrees(d), constants)

    # ---- pipeline sends ----------------------------------------------------------------------
    # Each TP rank sends its 1/tp slice of the hand-off: with sequence parallel the activation
    # is sharded already; without it, Megatron's scatter/gather optimization (Narayanan et al.
    # 2021 §4.1) and DeepSpeed's pipeline engine (is_pipe_partitioned = is_model_parallel)
    # split it before the send and all-gather it over TP (NVLink) on arrival.
    activation_bytes = mb * s / cp * h * BF16_BYTES
    tp_link = estimate_group_link(cluster, 1, tp)
    pp_link = estimate_group_link(cluster, tp * cp * dp, np.where(pp > 1, 2, 1))
    p2p = estimate_collective_s("send_recv", activation_bytes / tp, np.where(pp > 1, 2, 1),
                                pp_link)
    if not constants.sequence_parallel:
        regather = estimate_collective_s("all_gather", activation_bytes, tp, tp_link)
        p2p = p2p + np.where(pp > 1, regather, 0.0)
    pp_time = num_micro * 2.0 * vpp * p2p

    # ---- data parallel / ZeRO ------------------------------------------------------------------
    layers_per_stage = np.ceil(model_spec.num_hidden_layers / pp)
    dp_s = estimate_dp_collectives_s(model_spec, cluster, _Degrees(d), constants)
    grads_ar, grads_rs = dp_s["grads_all_reduce"], dp_s["grads_reduce_scatter"]
    params_ag, z3_rs = dp_s["params_all_gather"], dp_s["zero3_reduce_scatter"]
    if constants.zero1_grad_all_reduce:
        grads_rs = np.where(zero == 1, grads_ar, grads_rs)
    fwd_mb = layers_per_stage * layer["mixed_fwd"][back]
    bwd_mb = layers_per_stage * layer["mixed_bwd"][back]
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

    num_gpus = tp * pp * dp * cp
    tokens = job.global_batch * s
    return TimeTerms(
        per_layer=per_layer, recompute=recompute_terms,
        per_stage=_parts(compute=grad_accumulation), last=head + mtp,
        num_micro=num_micro, vpp=vpp.astype(float), pp_s=pp_time, dp_s=dp_time,
        optimizer_s=estimate_optimizer_s(model_spec, cluster, _Degrees(d), constants),
        tokens=float(tokens),
        flop_per_gpu_per_step=estimate_model_flops_per_token(model_spec, s) * tokens / num_gpus,
        peak_flop_per_s=cluster.gpu.peak_flop_per_s(job.precision), num_gpus=num_gpus)


def _stage_seconds(terms: TimeTerms, content: StageTimeContent
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(which stage row is the slowest, its seconds per micro-batch, the bubble)."""
    stage_s = (terms.per_stage.sum(axis=1)[:, None]
               + content.is_last * terms.last.sum(axis=1)[:, None])
    layer_s, recompute_s = terms.per_layer.sum(axis=2), terms.recompute.sum(axis=2)
    for kind in range(layer_s.shape[1]):  # a few kinds: faster than einsum
        stage_s = (stage_s + content.layers[:, :, kind] * layer_s[:, kind, None]
                   + content.recompute[:, :, kind] * recompute_s[:, kind, None])
    present = content.count > 0
    slowest = np.argmax(np.where(present, stage_s, -np.inf), axis=1)
    slowest_s = stage_s[np.arange(len(slowest)), slowest]
    total_s = (content.count * stage_s).sum(axis=1)
    return slowest, slowest_s, (total_s - slowest_s) / terms.vpp


def compose_step_seconds(terms: TimeTerms, content: StageTimeContent) -> np.ndarray:
    """compose_step_time's step_s alone (the search ranks by it; the breakdown is for the
    plans it keeps)."""
    _, slowest_s, bubble = _stage_seconds(terms, content)
    return (terms.num_micro * slowest_s + bubble + terms.pp_s + terms.dp_s
            + terms.optimizer_s)


def compose_step_time(terms: TimeTerms, content: StageTimeContent) -> StepTime:
    """The step time of stages holding `content` (the one composition of the step time):

        T_i  = per micro-batch on stage i: its layers' (and recomputes') terms, the per-stage
               term, and the last stage's head, loss and MTP
        step = m * max_i T_i + (sum_i T_i - max_i T_i) / vpp  + sends + exposed DP + optimizer

    With equal stages this is Narayanan et al. 2021 §2.2: m t + (p - 1) t / v, the 1F1B bubble
    (p-1)/(m+p-1) of the step and the interleaved one (p-1)/(v m) of the ideal time; with
    unequal stages the slowest sets the steady state and every stage adds its share to the
    fill and drain (1F1B: sum_i T_i + (m - 1) max_i T_i).
    Worked number (seed 003, example 3): PP = 2 and m = 32 micro-batches give a 1F1B bubble of
    (p - 1) / (m + p - 1) = 1/33 = 3.0% of the step (the seed writes 1/32 = 3.1%).
    """
    slowest, slowest_s, bubble = _stage_seconds(terms, content)
    rows = np.arange(len(slowest))
    layers, recompute = content.layers[rows, slowest], content.recompute[rows, slowest]
    parts = terms.per_stage + content.is_last[rows, slowest, None] * terms.last
    for kind in range(terms.per_layer.shape[1]):
        parts = (parts + layers[:, kind, None] * terms.per_layer[:, kind]
                 + recompute[:, kind, None] * terms.recompute[:, kind])
    steady = terms.num_micro[:, None] * parts
    step = terms.num_micro * slowest_s + bubble + terms.pp_s + terms.dp_s + terms.optimizer_s
    tokens_per_s = terms.tokens / step
    model_flop_per_s = terms.flop_per_gpu_per_step / step
    by_part = {name: steady[:, i] for i, name in enumerate(STAGE_PARTS)}
    return StepTime(
        **by_part, dp=terms.dp_s, pp=terms.pp_s, bubble=bubble, optimizer=terms.optimizer_s,
        step_s=step, tokens_per_s=tokens_per_s, tokens_per_s_per_gpu=tokens_per_s
        / terms.num_gpus, tflops_per_gpu=model_flop_per_s / 1e12,
        mfu=model_flop_per_s / terms.peak_flop_per_s)


def estimate_step_time(
    model_spec: ModelSpec,
    cluster: ClusterSpec,
    job: JobSpec,
    candidates: Any,
    constants: TimeConstants | None = None,
    embedding_slots: bool = False,
    terms: TimeTerms | None = None,
) -> StepTime:
    """Step time and breakdown for every candidate under the even split of its layers (arrays
    with attributes tp, pp, dp, cp, ep, etp, vpp, zero, micro_batch, recompute as in
    solver.cost.candidates); compose_step_time says how. `terms`: the candidates' TimeTerms
    when the caller has them."""
    if terms is None:
        terms = estimate_time_terms(model_spec, cluster, job, candidates, constants)
    return compose_step_time(terms, even_stage_time_content(
        model_spec, _degrees(candidates), embedding_slots))


def estimate_step_seconds(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                          candidates: Any, constants: TimeConstants | None = None,
                          embedding_slots: bool = False, terms: TimeTerms | None = None
                          ) -> np.ndarray:
    """estimate_step_time's step_s alone (compose_step_seconds)."""
    if terms is None:
        terms = estimate_time_terms(model_spec, cluster, job, candidates, constants)
    return compose_step_seconds(terms, even_stage_time_content(
        model_spec, _degrees(candidates), embedding_slots))


def estimate_layout_step_time(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                              configs: Sequence[ParallelConfig],
                              layouts: Sequence[PipelineLayout],
                              constants: TimeConstants | None = None) -> StepTime:
    """Step time of each configuration whose stages hold its layout (one row each)."""
    candidates = Candidates.from_configs(configs)
    terms = estimate_time_terms(model_spec, cluster, job, candidates, constants)
    kinds = layer_kinds(model_spec)
    width = max(config.pp for config in configs)
    layers = np.zeros((len(configs), width, 2))
    recompute = np.zeros((len(configs), width, 2))
    is_last = np.zeros((len(configs), width))
    count = np.zeros((len(configs), width))
    for row, (config, layout) in enumerate(zip(configs, layouts)):
        assert (layout.pp, layout.vpp) == (config.pp, config.vpp)
        layers[row, :config.pp], recompute[row, :config.pp] = layout_layer_counts(kinds, layout)
        is_last[row, config.pp - 1] = 1.0
        count[row, :config.pp] = 1.0
    return compose_step_time(terms, StageTimeContent(layers=layers, recompute=recompute,
                                                     is_last=is_last, count=count))


def even_stage_time_content(model_spec: ModelSpec, d: dict[str, np.ndarray],
                            embedding_slots: bool = False) -> StageTimeContent:
    """The distinct stages of each candidate's even split (solver.cost.memory.layout) with how
    many stages are alike; every layer recomputes where the candidate recomputes in full."""
    pp, vpp = d["pp"], d["vpp"]
    width = int(vpp.max(initial=1)) + 1
    keys, pair_of = distinct_inverse(pp * width + vpp)
    rows = []
    for key in keys:
        stage = np.arange(key // width)
        total, moe = estimate_stage_layers(model_spec, np.full(len(stage), key // width),
                                           np.full(len(stage), key % width), stage,
                                           embedding_slots)
        seen = np.stack([total - moe, moe, stage == len(stage) - 1], axis=1)
        distinct, counts = np.unique(seen, axis=0, return_counts=True)
        rows.append((distinct, counts))
    num_rows = max((len(counts) for _, counts in rows), default=1)
    table = np.zeros((len(keys), num_rows, 3))
    count = np.zeros((len(keys), num_rows))
    for index, (distinct, counts) in enumerate(rows):
        table[index, :len(counts)] = distinct
        count[index, :len(counts)] = counts
    layers = table[pair_of, :, :2]
    full = (d["recompute"] == RECOMPUTE_FULL)[:, None, None]
    return StageTimeContent(layers=layers, recompute=np.where(full, layers, 0.0),
                            is_last=table[pair_of, :, 2], count=count[pair_of])


def sm_contention(cluster: ClusterSpec, constants: TimeConstants) -> float:
    """Extra compute time per second of overlapped communication: f / (1 - f), f the share of
    the SMs that communication kernels hold (16 of H100's 132: 0.138)."""
    fraction = constants.comm_sms / (cluster.gpu.num_sms or DEFAULT_NUM_SMS)
    return fraction / (1.0 - fraction)
