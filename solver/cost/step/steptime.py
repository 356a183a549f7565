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
         + pipeline sends                            (activations forward, gradients backward,
                                                     as the framework's schedule exposes them:
                                                     solver.cost.comm.pipeline_sends)
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

A layer's own time, by kind and part, is solver.cost.layers.layer_time's; what each stage holds,
solver.cost.step.stage_content's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from solver.cost.candidates import RECOMPUTE_FULL, Candidates
from solver.cost.comm.comm_ep import estimate_unmerged_share
from solver.cost.step.data_parallel import (
    estimate_dp_collectives_s,
    estimate_grad_accumulation_s,
    estimate_optimizer_s,
)
from solver.cost.distinct import distinct_rows
from solver.cost.layers.flops import estimate_step_flops_per_token
from solver.cost.layers.layer_time import (
    STAGE_PARTS,
    estimate_layer_terms,
    layer_degrees,
    sm_contention,
    stack_parts,
)
from solver.cost.step.offload import (
    add_activation_offload_s,
    add_layer_offload_s,
    estimate_optimizer_offload_s,
)
from solver.cost.comm.pipeline_sends import estimate_pipeline_sends_s
from solver.cost.row_memo import RowMemo
from solver.cost.step.stage_content import (
    StageTimeContent,
    even_stage_time_content,
    layout_stage_time_content,
)
# TimeConstants lives in solver.cost.layers.time_constants; importing it from here keeps working.
from solver.cost.layers.time_constants import TimeConstants, dp_part_overlaps, dp_syncs_per_step
from solver.spec import ClusterSpec, JobSpec, ModelSpec, ParallelConfig, PipelineLayout
from solver.spec.job import PARALLEL_FIELDS



@dataclass(frozen=True)
class StepTime:
    """Seconds per step and its breakdown, one entry per candidate; the parts add up."""

    compute: np.ndarray
    recompute: np.ndarray
    tp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    offload: np.ndarray  # activation offload's exposed host transfers (solver.cost.step.offload)
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
        names = ("compute", "recompute", "tp", "cp", "ep", "offload", "dp", "pp", "bubble",
                 "optimizer")
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


# The layer terms of the last few problems (solver.cost.row_memo): the search asks for the
# same degree tuples in every phase.
_LAYER_TERMS = RowMemo(keep=6)


def estimate_time_terms(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                        candidates: Any, constants: TimeConstants | None = None,
                        layers_only: bool = False) -> TimeTerms:
    """Every term of the step time of each candidate (TimeTerms; composed by
    compose_step_time). The DP / ZeRO, pipeline send and optimizer terms are the mesh's: the
    DP traffic hides behind the even split's largest stage, whatever the layout.

    `layers_only`: the layer, LM head and MTP terms only (without what the EP overlap's
    unmerged passes add, which depends on the mesh), every other term 0 (the costly per-mesh
    ones). Every term is >= 0 and the composition grows with each, so the step time
    these give is a lower bound of the full one, for any layout (the search's first pass)."""
    constants = constants or TimeConstants()
    d = _degrees(candidates)
    tp, pp, dp, cp, vpp = (d[n] for n in ("tp", "pp", "dp", "cp", "vpp"))
    zero, mb, recompute = d["zero"], d["micro_batch"], d["recompute"]
    s = job.seq_len
    num_micro = job.global_batch / (dp * mb)
    # The layer and head terms depend on (tp, cp, ep, etp, micro_batch) only: work them out
    # once per distinct tuple (a few hundred among hundreds of thousands of candidates).
    # Activation offload adds each layer's exposed host transfers (solver.cost.step.offload),
    # which read the recompute level too. Optimizer offload leaves the layers alone: the
    # kept terms of a problem serve its optimizer-offload search.
    names = layer_degrees(constants)
    if constants.activation_offload and "recompute" not in names:
        names = (*names, "recompute")

    def layers(rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        terms = estimate_layer_terms(model_spec, cluster, job, rows, constants)
        if constants.activation_offload:
            terms["per_layer"] = add_activation_offload_s(model_spec, cluster, job, rows,
                                                          constants, terms["per_layer"])
        if constants.cpu_offloading_num_layers:  # Megatron's layer-level CPU offloading
            terms["per_layer"] = add_layer_offload_s(model_spec, cluster, job, rows,
                                                     constants, terms["per_layer"])
        return terms

    first, back = distinct_rows(d, names)
    layer = _LAYER_TERMS.rows((model_spec, cluster, job),
                              constants.model_copy(update={"optimizer_offload": False}),
                              {n: d[n][first] for n in PARALLEL_FIELDS}, names, layers)
    per_layer, recompute_terms = layer["per_layer"][back], layer["recompute"][back]
    head = layer["head"][back]
    # Each MTP depth is one more layer (of the model's MoE kind) with its own head and loss,
    # recomputed as the configuration recomputes (a repeated module runs once per depth).
    mtp_kind = 1 if model_spec.is_moe else 0
    full = (recompute == RECOMPUTE_FULL)[:, None]
    mtp = model_spec.mtp_depths * (
        per_layer[:, mtp_kind] + np.where(full, recompute_terms[:, mtp_kind], 0.0) + head)
    num_gpus = tp * pp * dp * cp
    tokens = job.global_batch * s
    flop_per_gpu = estimate_step_flops_per_token(model_spec, s, job.finetune) * tokens / num_gpus
    peak = cluster.gpu.peak_flop_per_s(job.precision)
    if layers_only:
        zero_s = np.zeros(len(tp))
        return TimeTerms(per_layer=per_layer, recompute=recompute_terms,
                         per_stage=stack_parts(compute=zero_s), last=head + mtp,
                         num_micro=num_micro, vpp=vpp.astype(float), pp_s=zero_s, dp_s=zero_s,
                         optimizer_s=zero_s, tokens=float(tokens),
                         flop_per_gpu_per_step=flop_per_gpu, peak_flop_per_s=peak,
                         num_gpus=num_gpus)
    # The EP overlap's unmerged chunk passes (warm-up, cool-down) expose their all-to-alls in
    # full, spread over the step's micro-batches (solver.cost.comm.comm_ep.estimate_unmerged_share):
    # a per-mesh term, left out of the layers-only bound above (it only adds).
    unmerged = np.zeros_like(per_layer)
    unmerged[:, :, STAGE_PARTS.index("ep")] = (
        estimate_unmerged_share(pp, vpp, num_micro)[:, None] * layer["ep_unmerged"][back])
    per_layer = per_layer + unmerged
    mtp = mtp + model_spec.mtp_depths * unmerged[:, mtp_kind]
    grad_accumulation = estimate_grad_accumulation_s(model_spec, cluster, _Degrees(d), constants,
                                                     job.finetune)

    # ---- pipeline sends, as the framework's schedule issues them (solver.cost.comm.pipeline_sends)
    pp_time = estimate_pipeline_sends_s(model_spec, cluster, job, d, num_micro,
                                        constants.pipeline_sends, constants.sequence_parallel)

    # ---- data parallel / ZeRO ------------------------------------------------------------------
    layers_per_stage = np.ceil(model_spec.num_hidden_layers / pp)
    dp_s = estimate_dp_collectives_s(model_spec, cluster, _Degrees(d), constants, job.finetune)
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

    return TimeTerms(
        per_layer=per_layer, recompute=recompute_terms,
        per_stage=stack_parts(compute=grad_accumulation), last=head + mtp,
        num_micro=num_micro, vpp=vpp.astype(float), pp_s=pp_time, dp_s=dp_time,
        optimizer_s=(estimate_optimizer_offload_s(model_spec, cluster, _Degrees(d), constants)
                     if constants.optimizer_offload else
                     estimate_optimizer_s(model_spec, cluster, _Degrees(d), constants,
                                          job.finetune)),
        tokens=float(tokens), flop_per_gpu_per_step=flop_per_gpu, peak_flop_per_s=peak,
        num_gpus=num_gpus)


def _stage_seconds(terms: TimeTerms, content: StageTimeContent
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(which stage row is the slowest, its seconds per micro-batch, the bubble)."""
    per_stage_s, last_s = terms.per_stage.sum(axis=1), terms.last.sum(axis=1)
    layer_s, recompute_s = terms.per_layer.sum(axis=2), terms.recompute.sum(axis=2)
    # The content keeps only the stages that may be the slowest for times >= 0.
    assert (layer_s >= 0).all() and (recompute_s >= 0).all() and (last_s >= 0).all()
    table = content.table
    total_s = (content.num_stages[table] * per_stage_s + last_s
               + (content.total_layers[table] * layer_s).sum(axis=1)
               + (content.total_recompute[table] * recompute_s).sum(axis=1))
    slowest = np.zeros(len(table), dtype=np.int64)
    slowest_s = np.zeros(len(table))
    # Candidate by table row: (candidates x kinds) @ (kinds x stage rows).
    order = np.argsort(table, kind="stable")
    ends = np.cumsum(np.bincount(table, minlength=len(content.num_rows)))
    for index, (begin, end) in enumerate(zip(ends - np.diff(ends, prepend=0), ends)):
        if begin == end:
            continue
        rows, width = order[begin:end], int(content.num_rows[index])
        stage_s = (per_stage_s[rows, None] + last_s[rows, None] * content.is_last[index, :width]
                   + layer_s[rows] @ content.layers[index, :width].T
                   + recompute_s[rows] @ content.recompute[index, :width].T)
        slowest[rows] = np.argmax(stage_s, axis=1)
        slowest_s[rows] = stage_s[np.arange(len(rows)), slowest[rows]]
    # The other stages' sum, summed kind by kind: it may round a hair below 0 on one stage.
    return slowest, slowest_s, np.maximum(total_s - slowest_s, 0.0) / terms.vpp


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
    table = content.table
    layers, recompute = content.layers[table, slowest], content.recompute[table, slowest]
    parts = terms.per_stage + content.is_last[table, slowest, None] * terms.last
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
    return compose_step_time(terms, layout_stage_time_content(model_spec, configs, layouts))
