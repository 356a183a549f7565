"""Offload to the host: the step time that keeping the optimizer or activations in CPU memory
costs (issue 17). What moves, and so the memory saved, is the memory model's
(MemoryOptions.optimizer_offload, activation_offload); the links are the catalog's: the GPU's
own host link, per direction (PCIe x16 or NVLink-C2C): its measured rate where the catalog has
one (GpuSpec.host_link_measured_gb_per_s: pinned copies of nvbandwidth, which carry PCIe's
protocol overhead: H100 51 GB/s of 64, H200 52, GB200 193 of 225), the datasheet's
(GpuSpec.host_link_gb_per_s) else; and the host memory bandwidth per GPU of its node
(ClusterSpec.host_memory_gb_per_s), a datasheet rate. The times here are lower bounds where a
datasheet rate is used, and do not count the sharing of a PCIe switch's uplink or of the CPUs
between the GPUs of a node beyond the per-GPU share (the measured rates are one GPU at a
time).

Optimizer offload (Megatron --optimizer-cpu-offload --optimizer-offload-fraction 1.0,
megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py; DeepSpeed ZeRO-Offload,
offload_optimizer.device "cpu"). Each GPU's optimizer shard of P parameters, per step:

    d2h  = P * grad_bytes / link              the reduced main gradients to the host
    host = P * host_optimizer_bytes / host    Adam on the CPU, streaming host memory
    h2d  = P * 2 / link                       the updated bf16 parameters back
    Megatron:  step = max(d2h, host, h2d)     --overlap-cpu-optimizer-d2h-h2d ("execute them
                                              concurrently", docs/user-guide/features/
                                              optimizer_cpu_offload.md), which launch emits
    DeepSpeed: step = host + h2d              gradients go to the host during the backward
                                              (ZeRO-Offload, Ren et al. 2021 §4.1); the
                                              updated parameters come back after the step

host_optimizer_bytes (TimeConstants): 28, one fused pass over fp32 tensors that reads the
parameter, gradient and both moments and writes the parameter and the moments: Megatron's CPU
optimizer is torch.optim.AdamW with fused=True (megatron/core/optimizer/__init__.py, "used to
improve the performance of the cpu optimizer"), DeepSpeed's DeepSpeedCPUAdam one SIMD loop.
Both run at the host memory's rate at best.

Activation offload (Megatron --fine-grained-activation-offloading): each offloaded group goes
to the host on its own stream after its module's forward and comes back before its backward
(docs/user-guide/features/fine_grained_activation_offloading.md: "asynchronously
transferring", d2h_stream / h2d_stream), so a layer's transfer hides behind that layer's
compute; what is left shows:

    per layer and micro-batch = max(0, b / link - forward) + max(0, b / link - backward)
with b its offloaded bytes (solver.cost.memory.activations.estimate_offload_bytes), forward
one third of the layer's compute and backward two thirds (twice the forward's FLOPs,
Narayanan et al. 2021 §3.1). Layers that recompute in full offload nothing.

Layer-level CPU offloading (Megatron --cpu-offloading-num-layers N of L layers; Transformer
Engine's default scheduling, docs/features/other_optimizations/cpu_offloading/
cpu_offloading.rst @d0067d0): layer i's copy starts as the layer saves its first tensor
("it does not wait for the layer's forward pass to complete"), ends no earlier than the layer,
and the copies run one after another on one stream; layer i + L - N cannot start until copy i
is done ("at most (model_layers - num_layers) sets of activations are on GPU at any time"), and
the backward reloads the same way. With t a layer's transfer and c a layer's forward (or
backward), copy i ends at max(i c, (i - 1) c + t, i t) while layer i + L - N would start at
(i + L - N - 1) c, so what the window cannot hide is, per micro-batch and direction,

    g(t, c) = max(0, t - (L - N) c, N t - (L - 1) c)
(the first copy's lag and the serial copies' total). The documented cases: N = 2 of 5 hides
copies up to t = 2c; N = L - 1 leaves one set on the GPU, and each layer waits for its copy's
excess over its compute, g = N (t - c). t is the mean of the offloaded layers' bytes over the
GPU's host link (per direction), c the mean layer's. Worked number: Llama-3.1-70B on GB200
(s 8192, b 1, tp 1) offloads 1.78 GB a layer: 9.2 ms over GB200's C2C (193 GB/s measured)
against a forward of about 12 ms, hidden for any N; 34.9 ms over an H100's PCIe (51 GB/s
measured) against about 26 ms: N = 50 of 80 hides it (50 x 34.9 < 79 x 26), N = 79 shows
79 x 8.9 = 703 ms of the forward a micro-batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.step.data_parallel import BF16_BYTES, PARAM_KINDS, estimate_optimizer_shard_params
from solver.cost.layers.layer_time import STAGE_PARTS
from solver.cost.memory.activations import estimate_activation_terms, estimate_kind_offload_bytes
from solver.cost.memory.layer_offload import estimate_offloaded_layer_counts
from solver.cost.memory.options import MemoryOptions
from solver.cost.layers.time_constants import TimeConstants
from solver.errors import InputError
from solver.spec import ClusterSpec, JobSpec, ModelSpec

# The backward's share of a layer's compute (twice the forward's FLOPs).
BACKWARD_SHARE = 2.0 / 3.0


def host_link_bytes_per_s(cluster: ClusterSpec) -> float:
    """The GPU's host link, bytes/s per direction: its measured rate where the catalog has one
    (GpuSpec.host_link_measured_gb_per_s, the slower of nvbandwidth's pinned host-to-device
    and device-to-host copies), else the datasheet's; an InputError where it has neither.
    H100 SXM: 51 GB/s measured (Azure ND H100 v5: 51 host to device, 52 back) of PCIe Gen5's
    64, so 1 GB takes 19.6 ms, not 15.6."""
    rate = cluster.gpu.host_link_measured_gb_per_s or cluster.gpu.host_link_gb_per_s
    if rate is None:
        raise InputError(f"gpu '{cluster.gpu.name}': no host_link_gb_per_s in its file, so "
                         "offload to the host cannot be costed")
    return rate * 1e9


def host_memory_bytes_per_s(cluster: ClusterSpec) -> float:
    """The host memory bandwidth per GPU, bytes/s; an InputError where the preset has none."""
    rate = cluster.host_memory_gb_per_s
    if rate is None:
        raise InputError(f"cluster '{cluster.name}': no host_memory_gb_per_s in its file, so "
                         "an optimizer step on the host cannot be costed")
    return rate * 1e9


def offload_available(cluster: ClusterSpec, feature: str) -> bool:
    """Whether the catalog has what `feature` (an OFFLOADS name) needs on this cluster."""
    if cluster.gpu.host_link_gb_per_s is None:
        return False
    return feature != "optimizer_offload" or cluster.host_memory_gb_per_s is not None


def estimate_optimizer_offload_s(model_spec: ModelSpec, cluster: ClusterSpec, candidates: Any,
                                 constants: TimeConstants) -> np.ndarray:
    """Seconds of an optimizer step on the host (module docstring), per candidate.

    Worked number: Llama-3.1-8B (8.03e9 parameters, one stage) on 8 GPUs of a DGX H100,
    dp 8, ZeRO-1: each GPU steps 1.00e9 parameters; d2h 4.02 GB of fp32 gradients at 64 GB/s
    = 0.063 s, Adam 28.1 GB at 76.8 GB/s = 0.37 s, h2d 2.01 GB = 0.031 s: 0.37 s pipelined
    (the GPU's own step: 0.011 s)."""
    link = host_link_bytes_per_s(cluster)
    host = host_memory_bytes_per_s(cluster)
    grad_bytes = BF16_BYTES if constants.grad_reduce_in_bf16 else constants.grad_reduce_bytes
    total = np.zeros(np.shape(candidates.zero), dtype=float)
    for kind in PARAM_KINDS:
        updated = estimate_optimizer_shard_params(model_spec, cluster, candidates, kind)
        d2h = updated * grad_bytes / link
        step = updated * constants.host_optimizer_bytes_per_param / host
        h2d = updated * BF16_BYTES / link
        if constants.offload_grads_during_backward:
            total = total + step + h2d
        else:
            total = total + np.maximum(np.maximum(d2h, step), h2d)
    return total


def estimate_activation_offload_s(offload_bytes: np.ndarray, layer_compute_s: np.ndarray,
                                  cluster: ClusterSpec) -> np.ndarray:
    """Exposed seconds per layer and micro-batch of activation offload (module docstring):
    `offload_bytes` and `layer_compute_s` (a layer's forward and backward compute) of the
    same shape.

    Worked number: 168.8 MB per layer (Llama-3.1-8B, s 8192, b 1, tp 1) takes 2.6 ms each way
    at 64 GB/s (PCIe Gen5), under a forward of ~6 ms: nothing shows."""
    transfer = np.asarray(offload_bytes, dtype=float) / host_link_bytes_per_s(cluster)
    backward = BACKWARD_SHARE * layer_compute_s
    forward = layer_compute_s - backward
    return np.maximum(transfer - forward, 0.0) + np.maximum(transfer - backward, 0.0)


def add_activation_offload_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                             degrees: dict[str, np.ndarray], constants: TimeConstants,
                             per_layer: np.ndarray) -> np.ndarray:
    """`per_layer` (N, kinds, STAGE_PARTS: a layer's seconds per micro-batch) with each kind's
    exposed activation offload in its "offload" part. The bytes are the memory model's, under
    the memory options the step-time switches imply (sequence parallel, FlashAttention, what
    selective recompute keeps)."""
    candidates = Candidates(**degrees)
    options = _memory_options(constants, activation_offload=True)
    offloaded = estimate_kind_offload_bytes(model_spec, job, candidates, options)
    assert offloaded.shape == per_layer.shape[:2], "memory and time kinds differ"
    compute = per_layer[:, :, STAGE_PARTS.index("compute")]
    out = per_layer.copy()
    out[:, :, STAGE_PARTS.index("offload")] += estimate_activation_offload_s(
        offloaded, compute, cluster)
    return out


def _memory_options(constants: TimeConstants, **update: Any) -> MemoryOptions:
    """The memory options the step-time switches imply (sequence parallel, FlashAttention,
    element-wise fusion, what selective recompute keeps), with `update`."""
    return MemoryOptions(sequence_parallel=constants.sequence_parallel,
                         flash_attention=constants.flash_attention,
                         fused_elementwise=constants.fused_elementwise,
                         selective_recompute=constants.selective_recompute,
                         recompute_modules=constants.recompute_modules, **update)


def estimate_layer_offload_s(transfer_s: np.ndarray, layer_s: np.ndarray, num_layers: int,
                             num_offloaded: int) -> np.ndarray:
    """Exposed seconds per micro-batch in one direction of layer-level CPU offloading: g(t, c)
    of the module docstring, `transfer_s` t and `layer_s` c of the same shape."""
    t, c = np.asarray(transfer_s, dtype=float), np.asarray(layer_s, dtype=float)
    first = t - (num_layers - num_offloaded) * c
    last = num_offloaded * t - (num_layers - 1) * c
    return np.maximum(np.maximum(first, last), 0.0)


def add_layer_offload_s(model_spec: ModelSpec, cluster: ClusterSpec, job: JobSpec,
                        degrees: dict[str, np.ndarray], constants: TimeConstants,
                        per_layer: np.ndarray) -> np.ndarray:
    """`per_layer` (N, kinds, STAGE_PARTS) with layer-level CPU offloading's exposed time per
    micro-batch (forward and backward, module docstring) spread over the model's L layers in
    each kind's "offload" part (the only stage holds all L: check_layer_offload). The bytes are
    the memory model's layer activations."""
    num_layers, offloaded = model_spec.num_hidden_layers, constants.cpu_offloading_num_layers
    candidates = Candidates(**degrees)
    layer_bytes = estimate_activation_terms(model_spec, job, candidates,
                                            _memory_options(constants))["layer"]
    moved = estimate_offloaded_layer_counts(model_spec, offloaded)
    held = estimate_offloaded_layer_counts(model_spec, num_layers)
    width = min(len(held), per_layer.shape[1])
    transfer = (layer_bytes[:, :width] @ moved[:width]) / offloaded / host_link_bytes_per_s(
        cluster)
    compute = per_layer[:, :width, STAGE_PARTS.index("compute")] @ held[:width] / num_layers
    backward = BACKWARD_SHARE * compute
    exposed = (estimate_layer_offload_s(transfer, compute - backward, num_layers, offloaded)
               + estimate_layer_offload_s(transfer, backward, num_layers, offloaded))
    out = per_layer.copy()
    out[:, :, STAGE_PARTS.index("offload")] += exposed[:, None] / num_layers
    return out


def check_layer_offload(constants: TimeConstants, model_spec: ModelSpec,
                        cluster: ClusterSpec | None, pp_degrees: tuple[int, ...],
                        recompute_levels: tuple[str, ...]) -> None:
    """An InputError naming the flag where Megatron's layer-level CPU offloading cannot run
    (transformer_config.py __post_init__): N not below the model's layers, with pipeline
    parallelism, with recompute (its rules with other features are FEATURE_RULES,
    solver.spec.feature_rules); or, given the `cluster` to cost it on, a GPU without a host link."""
    offloaded = constants.cpu_offloading_num_layers
    if not offloaded:
        return
    flag = f"--cpu-offloading-num-layers {offloaded}"
    rules = (
        (offloaded >= model_spec.num_hidden_layers,
         f"Megatron offloads fewer layers than the model's {model_spec.num_hidden_layers}"),
        (any(pp != 1 for pp in pp_degrees),
         "Megatron's CPU offloading runs without pipeline parallelism (--pp 1)"),
        (any(level != "none" for level in recompute_levels),
         "Megatron's CPU offloading does not run with activation recompute (--recompute none)"),
        (cluster is not None and cluster.gpu.host_link_gb_per_s is None,
         f"gpu '{cluster.gpu.name if cluster else ''}' has no host_link_gb_per_s in its file, "
         "so the offload cannot be costed"))
    for broken, why in rules:
        if broken:
            raise InputError(f"{flag}: {why}")


def refuse_activation_offload(model_spec: ModelSpec, recompute_modules: tuple[str, ...],
                              level: str) -> str | None:
    """Why Megatron's fine-grained activation offloading (--activation-offload: the offload
    modules core_attn attn_proj, and expert_fc1 moe_act on MoE models, solver.emit.megatron)
    does not run at recompute `level`, or None where it does:
      offload_not_with_full_recompute  it pairs with selective recompute, not full
          (docs/user-guide/features/fine_grained_activation_offloading.md, Compatibility)
      offload_not_inside_recomputed_moe  selective recompute of the moe module wraps the
          whole MoE forward in a checkpoint, which saves only the block's input, so there is
          nothing inside it to offload: transformer_config.py __post_init__ asserts "Cannot
          offload {'moe_act', 'expert_fc1'} while recomputing the entire MoE layer" (core @
          d98e8a6; a dense model offloads neither, so Megatron takes it there)."""
    if level == "full":
        return ("offload_not_with_full_recompute: Megatron's fine-grained activation "
                "offloading pairs with selective recompute, not full")
    if level == "selective" and model_spec.is_moe and "moe" in recompute_modules:
        return ("offload_not_inside_recomputed_moe: Megatron refuses to offload expert_fc1 "
                "and moe_act while --recompute-modules moe recomputes the whole MoE block "
                "(transformer_config.py)")
    return None


def activation_offload_levels(model_spec: ModelSpec, recompute_modules: tuple[str, ...],
                              levels: tuple[str, ...]) -> tuple[str, ...]:
    """The recompute `levels` Megatron's fine-grained activation offloading runs with
    (refuse_activation_offload)."""
    return tuple(level for level in levels
                 if refuse_activation_offload(model_spec, recompute_modules, level) is None)


def check_activation_offload(constants: TimeConstants, model_spec: ModelSpec,
                             recompute_levels: tuple[str, ...]) -> None:
    """An InputError naming the flags where activation offload is on at a recompute level
    Megatron refuses it with (refuse_activation_offload)."""
    for level in recompute_levels if constants.activation_offload else ():
        why = refuse_activation_offload(model_spec, constants.recompute_modules, level)
        if why is not None:
            modules = (f" --recompute-modules {' '.join(constants.recompute_modules)}"
                       if level == "selective" else "")
            raise InputError(f"--activation-offload with --recompute {level}{modules}: {why}")


def check_offload(constants: TimeConstants, cluster: ClusterSpec, framework: str,
                  recompute_levels: tuple[str, ...], zero_stages: tuple[int, ...],
                  model_spec: ModelSpec) -> None:
    """An InputError naming the flag where an offload that is on cannot run or be costed:
    activation offload at a recompute level Megatron refuses it with (full, or selective of
    the moe module: refuse_activation_offload), DeepSpeed's optimizer offload below ZeRO-1
    (offload_optimizer is a zero_optimization option of stages 1-3), or a GPU or cluster file
    without the bandwidths it needs."""
    if constants.optimizer_offload and framework == "deepspeed" and 0 in zero_stages:
        raise InputError("--optimizer-offload with --zero 0: DeepSpeed offloads the optimizer "
                         "of ZeRO stages 1-3 only (zero_optimization.offload_optimizer)")
    check_activation_offload(constants, model_spec, recompute_levels)
    for feature in ("optimizer_offload", "activation_offload"):
        if getattr(constants, feature) and not offload_available(cluster, feature):
            flag = "--" + feature.replace("_", "-")
            what = (f"gpu '{cluster.gpu.name}' has no host_link_gb_per_s"
                    if cluster.gpu.host_link_gb_per_s is None
                    else f"cluster '{cluster.name}' has no host_memory_gb_per_s")
            raise InputError(f"{flag}: {what} in its file, so the offload cannot be costed")
