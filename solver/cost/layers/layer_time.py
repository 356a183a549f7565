"""The time of one decoder layer (and of the LM head) for one micro-batch on one GPU, by part,
vectorised over candidates: the per-layer terms solver.cost.step.steptime composes into a step.

A layer kind is attention + dense MLP or attention + MoE (router, top-k routed experts on
ep*etp GPUs, shared experts split by TP). Its forward and backward compute, by part, come from
solver.cost.layers.layer_compute; here: exposed TP (sequence parallel all-gather and
reduce-scatter), CP (each framework's ring attention: solver.cost.comm.ring_attention) and EP
(dispatch and combine all-to-all) traffic as solver.cost.comm.comm prices it; full recompute adds
a forward and its traffic. Routing is taken as balanced, as in the vendor MoE benchmarks this
is checked against.
"""

from __future__ import annotations

import numpy as np

from solver.cost.layers.blocks import estimate_mixer_cp_s, hybrid_kinds
from solver.cost.candidates import RECOMPUTE_SELECTIVE
from solver.cost.comm.comm_ep import (
    estimate_dispatcher_s,
    estimate_ep_exposed_s,
    reached_domains,
)
from solver.cost.comm.comm import estimate_collective_s, estimate_group_link
from solver.cost.layers.layer_compute import (
    estimate_backward_s,
    estimate_forward_s,
    estimate_head_compute_s,
)
from solver.cost.layers.layer_compute_kept import LAYER_DEGREES, kept_compute_s
from solver.cost.kernels.precision import load_recipe
from solver.cost.comm.ring_attention import estimate_ring_exposed_s, estimate_ring_traffic
from solver.cost.layers.host_time import (
    estimate_host_s,
    estimate_host_wait_s,
    estimate_selective_host_s,
)
from solver.cost.layers.time_constants import TimeConstants
from solver.spec import ClusterSpec, JobSpec, ModelSpec
from solver.spec.blocks import ATTENTION_MIXERS

BF16_BYTES = 2.0
DEFAULT_NUM_SMS = 132  # H100; used when the GPU catalog does not give the SM count


def _overlap_window_s(layer: dict[str, dict[str, np.ndarray]], model_spec: ModelSpec,
                      waits: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Forward and backward seconds of the average layer (each kind in its share of the
    layers), each kind's pass with the GPU's wait for the host's launches (`waits`: forward
    and backward, (N, kinds), as its per-layer time counts them, _layer_terms): the wall
    time the DP traffic of the even split's largest stage can hide behind. A layer that gets
    faster on the GPU while the host paces it hides no less (a windowed layer never costs
    more time), and slower launches lengthen the window only by the wait they add to the
    step (they never make it shorter)."""
    if model_spec.has_block_kinds:  # every kind in its share of the layers
        counts = np.bincount(model_spec.layer_kind_indices, minlength=len(model_spec.block_kinds))
        names = ["dense", "moe", *(f"kind{k}" for k in hybrid_kinds(model_spec))]
        shares = [(name, count / model_spec.num_hidden_layers)
                  for name, count in zip(names, counts)]
    else:
        moe_share = model_spec.num_moe_layers / model_spec.num_hidden_layers
        shares = [("dense", 1.0 - moe_share), ("moe", moe_share)]
    forward, backward = 0.0, 0.0
    wait_fwd, wait_bwd = waits
    for index, (name, share) in enumerate(shares):
        if share:
            forward = forward + share * (estimate_forward_s(layer[name]) + wait_fwd[:, index])
            backward = backward + share * (estimate_backward_s(layer[name])
                                           + wait_bwd[:, index])
    return np.asarray(forward), np.asarray(backward)


# The parts of a stage's time per micro-batch (TIME_PARTS of a plan, less the step-level ones).
STAGE_PARTS = ("compute", "recompute", "tp", "cp", "ep", "offload")


def stack_parts(**values: np.ndarray | float) -> np.ndarray:
    """STAGE_PARTS on a last axis (missing parts 0)."""
    shape = np.broadcast_shapes(*(np.shape(v) for v in values.values()))
    out = np.zeros((*shape, len(STAGE_PARTS)))
    for name, value in values.items():
        out[..., STAGE_PARTS.index(name)] = value
    return out


# SMs a flex dispatcher's kernels hold while they overlap compute: DeepEP's historical default
# 20 (Megatron transformer_config.py moe_deepep_num_sms, DeepEP Buffer.num_sms); HybridEP uses
# "fewer SMs" (Megatron moe/README.md) [C: 16, the count a Megatron HybridEP trace study found
# sufficient]. NCCL's all-to-all holds TimeConstants.comm_sms.
DISPATCHER_SMS = {"deepep": 20, "hybridep": 16}


def _domain_dedup(cluster: ClusterSpec, model_spec: ModelSpec, ep: np.ndarray,
                  etp: np.ndarray) -> np.ndarray:
    """What DeepEP / HybridEP send across NVLink domains per byte the all-to-all sends: a
    token goes once to each other domain holding one of its k experts, forwarded inside it
    (DeepEP README, "forwarding data from NVLink domain to RDMA domain"). With balanced
    routing over an EP group spanning D domains: reached(D) / k of the all-to-all's
    k (D - 1) / D copies off the domain (reached_domains); k = 8, D = 2: 0.249; D = 8: 0.656
    (DeepSeek-V3's node-limited routing, 4 of 8 groups: 0.450); 1 within a domain."""
    k = model_spec.experts_per_token
    domains = _ep_domains(cluster, ep, etp)
    reached = reached_domains(domains, k, model_spec.n_group, model_spec.topk_group)
    return np.where(domains > 1.0, reached / k, 1.0)


def _ep_domains(cluster: ClusterSpec, ep: np.ndarray, etp: np.ndarray) -> np.ndarray:
    """NVLink domains an EP group spans: ranks fill the job's segment of a domain in order
    (solver.spec.hardware); the group's ep * etp ranks sit etp apart."""
    members = np.clip(cluster.job_segment_gpus // etp, 1, ep)
    return np.maximum(ep / members, 1.0)


def _estimate_ep_fwd_s(model_spec: ModelSpec, cluster: ClusterSpec, d: dict[str, np.ndarray],
                       constants: TimeConstants, rows: np.ndarray) -> np.ndarray:
    """Forward seconds of one MoE layer's token dispatch and combine, plus expert-TP's gather
    and reduce-scatter, by the framework's dispatcher (TimeConstants.moe_dispatcher):
      alltoall   each token's k routed copies go to their experts' ranks and back: two
                 all-to-alls of rows/tp * k * h
      allgather  every rank gathers the EP group's tokens and reduce-scatters its experts'
                 outputs (Megatron MoEAllGatherTokenDispatcher): rows/tp * h * ep each way
      deepep, hybridep  the all-to-all's bytes times _domain_dedup; across nodes, where the
                 cluster file gives the backend's measured rates, at those
                 (solver.cost.comm.comm_ep.estimate_dispatcher_s).
    Tokens travel at moe_token_width: LatentMoE dispatches its latent tokens (Megatron-Core
    MoELayer.preprocess projects before dispatch; Nemotron 3 Super: 1024 of 4096, a quarter).
    Worked number: ep 8 inside one node, k = 8: alltoall and allgather move the same bytes."""
    ep, etp, tp = d["ep"], d["etp"], d["tp"]
    h, k = model_spec.moe_token_width, model_spec.experts_per_token
    token_bytes = rows / tp * h * BF16_BYTES
    dispatch_bytes = token_bytes * k
    if constants.moe_dispatcher == "allgather":
        link = estimate_group_link(cluster, etp, ep)
        gathered = token_bytes * ep
        moved = (estimate_collective_s("all_gather", gathered, ep, link)
                 + estimate_collective_s("reduce_scatter", gathered, ep, link))
    else:
        link = estimate_group_link(cluster, etp, ep, all_to_all=True)
        sent = dispatch_bytes
        if constants.moe_dispatcher in DISPATCHER_SMS:
            sent = dispatch_bytes * _domain_dedup(cluster, model_spec, ep, etp)
        moved = 2.0 * estimate_collective_s("all_to_all", sent, ep, link)
        rates = cluster.dispatcher_rate(constants.moe_dispatcher)
        if rates is not None:  # measured across nodes (solver.cost.comm.comm_ep)
            moved = np.where(_ep_domains(cluster, ep, etp) > 1.0,
                             estimate_dispatcher_s(rates, sent, ep), moved)
    etp_link = estimate_group_link(cluster, 1, etp)
    etp_bytes = dispatch_bytes * etp
    return moved + estimate_collective_s("all_gather", etp_bytes, etp, etp_link) + (
        estimate_collective_s("reduce_scatter", etp_bytes, etp, etp_link))


def _estimate_qkv_gather_s(model_spec: ModelSpec, tp: np.ndarray, rows: np.ndarray,
                           tp_link) -> np.ndarray:
    """Seconds per pass of Megatron's QKV sub-sharding where tp exceeds the KV heads
    (core_v0.16.0, PR #2565; attention.py get_query_key_value_tensors): linear_qkv's output
    (q, its output gate, k, v) is all-gathered over TP and each rank slices its own group; the
    backward reduce-scatters the gradient alike. Zero where tp divides the KV heads, and for
    MLA. Worked number: Qwen3-Next-80B at tp 8 (16 heads of 256 with a gate, 2 KV heads)
    gathers (16 + 16 + 4) x 256 = 9,216 values a token."""
    m = model_spec
    if m.is_mla:
        return np.zeros(np.shape(tp))
    heads = m.num_attention_heads * (2 if m.attention_output_gate else 1)
    width = heads * m.qk_head_dim + m.kv_heads * (m.qk_head_dim + m.value_head_dim)
    gathered = estimate_collective_s("all_gather", rows * width * BF16_BYTES, tp, tp_link)
    return np.where(tp > m.kv_heads, gathered, 0.0)


def _estimate_selective_s(model_spec: ModelSpec, fwd: dict[str, np.ndarray],
                          constants: TimeConstants, is_moe: bool) -> np.ndarray:
    """Seconds `--recompute selective` adds to a layer's backward: nothing for the attention
    core (FlashAttention's backward recomputes it anyway); under op-level checkpointing
    (torchtitan) every second GEMM (half of the GEMM time), the grouped expert GEMMs (not in
    its save list) and every element-wise op (TimeConstants.selective_recompute). Under
    Megatron's module list (TimeConstants.recompute_modules) the forward GEMMs of each
    recomputed module, as its share of the layer's GEMM parameters (a token's GEMM FLOPs are
    2 x parameters; [B]: one GEMM efficiency for all of them): mlp the dense MLP, shared_experts
    the shared experts, moe the routed experts, shared experts and router (its all-to-alls:
    _layer_terms), mla_up_proj MLA's up-projections. layernorm and moe_act re-run element-wise
    kernels only, a few percent of a layer's forward, not charged, save a SwiGLU limit's eager
    clamp that moe_act re-runs (the layer's "moe_act" part: solver.cost.layers.moe_eager)."""
    if constants.selective_recompute == "op_level":
        return 0.5 * fwd["gemm"] + fwd.get("routed", 0.0) + fwd["elementwise"]
    m, modules = model_spec, set(constants.recompute_modules)
    attention = float(m.attention_params_per_layer)
    if is_moe:
        shared, router = float(m.shared_expert_params_per_layer), float(m.router_params_per_layer)
        latent = float(m.latent_projection_params_per_layer)
        gemm_params, redo_params = attention + shared + router + latent, 0.0
        if "moe" in modules:
            redo_params = shared + router + latent
        elif "shared_experts" in modules:
            redo_params = shared
    else:
        mlp = float(m.dense_mlp_params_per_layer)
        gemm_params, redo_params = attention + mlp, mlp if "mlp" in modules else 0.0
    if "mla_up_proj" in modules and m.is_mla:
        redo_params += m.num_attention_heads * (
            (m.q_lora_rank or 0) * m.qk_head_dim
            + (m.kv_lora_rank or 0) * (m.qk_nope_head_dim + m.value_head_dim))
    redo = fwd["gemm"] * (redo_params / gemm_params if gemm_params else 0.0)
    if is_moe and "moe" in modules:
        redo = redo + fwd.get("routed", 0.0)
    elif is_moe and "moe_act" in modules:
        redo = redo + fwd.get("moe_act", 0.0)
    return redo


def _layer_terms(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                 d: dict[str, np.ndarray], constants: TimeConstants,
                 layer: dict[str, dict[str, np.ndarray]]
                 ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """(per layer, recompute) of TimeTerms: each layer kind at the candidate's own recompute
    level (none, or selective), and what recomputing it in full adds to the level none, from
    each kind's compute `layer` (solver.cost.layers.layer_compute_kept); and each kind's wait for the
    host in its forward and backward passes ((N, kinds) each, _overlap_window_s).

    The host launches each pass's kernels ahead of the GPU, which waits only when the launches
    take longer than the pass's GPU work (compute and exposed communication): a pass costs
    max(GPU, host), a roofline on the CPU side, per pass (forward, recompute, backward) since
    the frameworks synchronise the host between them (MoE token counts, autograd). Under
    CUDA_LAUNCH_BLOCKING=1 (TimeConstants.cuda_launch_blocking) the host issues each op only
    after the previous one has run: a pass costs GPU + host. Worked number: a dense layer of
    DeepSpeed's profile at tp 8 issues 8 + 5 + 4 = 17 forward ops, 34 backward, at 13.48 us
    each (X86_HOST_OP_S): 0.23 + 0.46 ms, and its full recompute 0.23 ms more, on every
    micro-batch."""
    tp, cp = d["tp"], d["cp"]
    h, s, mb = model_spec.hidden_size, job.seq_len, d["micro_batch"]
    rows = mb * s / cp
    tp_link = estimate_group_link(cluster, 1, tp)
    activation_bytes = rows * h * BF16_BYTES
    gathered_bytes = rows * h * load_recipe(job.precision).sp_gather_bytes
    ag = estimate_collective_s("all_gather", gathered_bytes, tp, tp_link)
    rs = estimate_collective_s("reduce_scatter", activation_bytes, tp, tp_link)
    qkv = _estimate_qkv_gather_s(model_spec, tp, rows, tp_link)

    ring = estimate_ring_traffic(model_spec, cluster, job, d, constants.context_parallel_ring,
                                 constants.compute)

    ep_fwd = np.zeros_like(ag)
    if model_spec.is_moe:
        ep_fwd = _estimate_ep_fwd_s(model_spec, cluster, d, constants, rows)
    tp_contention = sm_contention(cluster, constants)
    ep_contention = sm_contention(cluster, constants,
                                  DISPATCHER_SMS.get(constants.moe_dispatcher))
    selective = np.asarray(d["recompute"]) == RECOMPUTE_SELECTIVE

    def kind(fwd: dict[str, np.ndarray], is_moe: bool, sp_blocks: float | None = None,
             mixer_cp_fwd: np.ndarray | None = None, attention: bool = True
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        fwd_s, bwd_s = estimate_forward_s(fwd), estimate_backward_s(fwd)
        gemm = fwd["gemm"] + fwd.get("routed", 0.0)
        # Sequence parallel: attention and MLP each all-gather in and reduce-scatter out,
        # forward and backward (Korthikanti et al. 2022 §4.2.2); an MoE layer's MLP side goes
        # by EP instead. `sp_blocks`: a block-pattern kind's count of such blocks;
        # `mixer_cp_fwd`: its mixer's CP traffic when that mixer is no attention.
        pairs = sp_blocks if sp_blocks is not None else (1.0 if is_moe else 2.0)
        gathers = pairs * ag
        tp_pass = pairs * (ag + rs) + (qkv if attention else 0.0)
        if constants.tp_comm_overlap:
            hidden_tp = np.minimum(tp_pass, gemm)
            tp_pass = tp_pass - hidden_tp + hidden_tp * tp_contention
        # Each ring transfer hides behind the attention step the framework overlaps it with.
        cp_fwd, cp_bwd = estimate_ring_exposed_s(ring, fwd["core"], fwd["core_bwd"])
        if mixer_cp_fwd is not None:
            cp_fwd, cp_bwd = mixer_cp_fwd, 2.0 * mixer_cp_fwd

        def ep_exposed(passes: float) -> np.ndarray:
            if not is_moe:
                return np.zeros_like(fwd_s)
            routed, routed_bwd = fwd.get("routed", 0.0), fwd.get("routed_bwd", 0.0)
            return estimate_ep_exposed_s(ep_fwd, passes, constants.ep_comm_overlap,
                                         ep_contention, (fwd_s - routed, bwd_s - routed_bwd),
                                         (routed, routed_bwd))

        host_fwd = estimate_host_s(model_spec, cluster, job, d, constants, is_moe)
        host_bwd = constants.launches.backward_ratio * (host_fwd[0] + host_fwd[1])
        ep_plain = ep_exposed(2.0)

        blocking = constants.cuda_launch_blocking

        def waits(gpu_s: np.ndarray, host_s: np.ndarray) -> np.ndarray:
            # Blocking launches: the host issues each op after the previous one has run, so
            # the GPU waits for all of the host's time, not what exceeds its own.
            return host_s + np.zeros_like(gpu_s) if blocking else np.maximum(host_s - gpu_s, 0.0)

        def pass_wait(gpu_s: np.ndarray, gpu_after_s: np.ndarray) -> np.ndarray:
            if blocking:
                return waits(gpu_s, host_fwd[0] + host_fwd[1])
            return estimate_host_wait_s(gpu_s, gpu_after_s, host_fwd)

        # The GPU work after an MoE layer's sync: its experts and its dispatch and combine.
        routed = fwd.get("routed", 0.0) if is_moe else 0.0
        wait_fwd = pass_wait(fwd_s + tp_pass + cp_fwd + 0.5 * ep_plain, routed + 0.5 * ep_plain)
        wait_bwd = waits(bwd_s + tp_pass + cp_bwd + 0.5 * ep_plain, host_bwd)
        exposed = wait_fwd + wait_bwd
        plain = stack_parts(compute=fwd_s + bwd_s + exposed, tp=2.0 * tp_pass,
                            cp=cp_fwd + cp_bwd, ep=ep_plain)
        # Full recompute: one more forward pass with its traffic, before the backward.
        ep_full = ep_exposed(3.0)
        recompute_pass = fwd_s + tp_pass + cp_fwd + (ep_full - ep_plain)
        full = stack_parts(recompute=fwd_s + pass_wait(
            recompute_pass, routed + ep_full - ep_plain), tp=tp_pass,
                           cp=cp_fwd, ep=ep_full - ep_plain)
        # Op-level selective recompute: its recomputed ops, and the SP all-gathers it repeats
        # (communication outputs other than reduce-scatter and all-to-all are not saved).
        # Megatron's recomputed modules gather their input once (SP) and, for moe, dispatch
        # and combine again.
        redo_s = _estimate_selective_s(model_spec, fwd, constants, is_moe)
        op_level = constants.selective_recompute == "op_level"
        redo_tp = np.where(redo_s > 0.0, gathers if op_level else ag, 0.0)
        redo_ep = (ep_exposed(1.0) if is_moe and not op_level
                   and "moe" in constants.recompute_modules else np.zeros_like(redo_s))
        redo = stack_parts(recompute=redo_s + np.where(
            redo_s > 0.0, waits(redo_s + redo_tp + redo_ep, estimate_selective_host_s(
                model_spec, cluster, constants, is_moe, host_fwd)), 0.0), tp=redo_tp,
            ep=redo_ep)
        # What the forward and backward of a chunk the overlap cannot merge expose beyond a
        # merged pair's (solver.cost.comm.comm_ep.estimate_unmerged_share says how many).
        unmerged = (2.0 * ep_fwd - ep_plain if is_moe and constants.ep_comm_overlap
                    else np.zeros_like(fwd_s))
        return (plain + np.where(selective[:, None], redo, 0.0), full, wait_fwd, wait_bwd,
                unmerged)

    kinds = [("dense", False), ("moe", model_spec.is_moe)]
    terms = [kind(layer[name], moe) for name, moe in kinds]
    for index in hybrid_kinds(model_spec):  # solver.cost.layers.blocks: a block pattern's kinds
        mixer, mlp = model_spec.block_kinds[index]
        mixer_cp = (None if mixer in ATTENTION_MIXERS
                    else estimate_mixer_cp_s(model_spec, cluster, d, mixer, rows))
        terms.append(kind(layer[f"kind{index}"], mlp == "moe",
                          float((mixer != "none") + (mlp == "dense")), mixer_cp,
                          mixer in ATTENTION_MIXERS))
    def column(index: int) -> np.ndarray:
        return np.stack([np.broadcast_to(term[index], np.shape(term[0])[:1]) for term in terms],
                        axis=1)

    return (np.stack([term[0] for term in terms], axis=1),
            np.stack([term[1] for term in terms], axis=1),
            (column(2), column(3)), column(4))




def layer_degrees(constants: TimeConstants) -> tuple[str, ...]:
    """LAYER_DEGREES, and "recompute" where `selective` changes a layer's time (op level, or
    modules beyond the attention core)."""
    if (constants.selective_recompute == "op_level"
            or set(constants.recompute_modules) - {"core_attn"}):
        return (*LAYER_DEGREES, "recompute")
    return LAYER_DEGREES


def estimate_layer_terms(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                      d: dict[str, np.ndarray], constants: TimeConstants
                      ) -> dict[str, np.ndarray]:
    """The terms of TimeTerms a layer and the LM head give (per_layer, recompute, head), the
    average layer's forward and backward seconds (the DP overlap window), and what each kind
    exposes of EP beyond its merged per-layer term where the EP overlap cannot merge a chunk's
    passes (ep_unmerged; solver.cost.step.steptime spreads it by
    solver.cost.comm.comm_ep.estimate_unmerged_share)."""
    # Both the layer terms and the average layer start from the same compute: work it once.
    layer = kept_compute_s(model_spec, cluster, job, d, constants)
    per_layer, recompute_terms, waits, unmerged = _layer_terms(model_spec, cluster, job, d,
                                                               constants, layer)
    head = estimate_head_compute_s(model_spec, cluster, job, d, constants)
    window_fwd, window_bwd = _overlap_window_s(layer, model_spec, waits)
    return {"per_layer": per_layer, "recompute": recompute_terms,
            "head": stack_parts(compute=head), "mixed_fwd": window_fwd,
            "mixed_bwd": window_bwd, "ep_unmerged": unmerged}


def sm_contention(cluster: ClusterSpec, constants: TimeConstants,
                  comm_sms: int | None = None) -> float:
    """Extra compute time per second of overlapped communication: f / (1 - f), f the share of
    the SMs that communication kernels hold (`comm_sms`, default TimeConstants.comm_sms: 16 of
    H100's 132: 0.138; DeepEP's 20: 0.179)."""
    fraction = (comm_sms or constants.comm_sms) / (cluster.gpu.num_sms or DEFAULT_NUM_SMS)
    return fraction / (1.0 - fraction)
