"""`launch --format megatron`: Megatron-LM command-line arguments for a plan.

Flag names are those of megatron/training/arguments.py (NVIDIA/Megatron-LM main, 2025):
_add_distributed_args (--tensor-model-parallel-size, --pipeline-model-parallel-size,
--overlap-grad-reduce, --overlap-param-gather,
--num-layers-per-virtual-pipeline-stage, --pipeline-model-parallel-layout,
--context-parallel-size, --use-distributed-optimizer, --use-megatron-fsdp,
--data-parallel-sharding-strategy, --use-tp-pp-dp-mapping), _add_moe_args
(--expert-model-parallel-size, --expert-tensor-parallel-size), _add_training_args
(--micro-batch-size, --global-batch-size, --sequence-parallel, --recompute-granularity
{full,selective}, --recompute-method {uniform,block}, --recompute-num-layers,
--no-gradient-accumulation-fusion), _add_data_args (--seq-length), _add_mixed_precision_args
(--bf16), _add_checkpointing_args (--ckpt-format) and _add_transformer_engine_args
(--fp8-format {e4m3,hybrid}). There is no --virtual-pipeline-model-parallel-size any more.

Mappings: ZeRO 1 is the distributed optimizer; ZeRO 2 and 3 are Megatron-FSDP with sharding
strategy optim_grads / optim_grads_params, which validate_args requires to checkpoint as
fsdp_dtensor (Megatron-Core docs, "Megatron FSDP": --use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion
--use-distributed-optimizer). Virtual stages: --num-layers-per-virtual-pipeline-stage when
pp x vpp divides the layers, else an explicit --pipeline-model-parallel-layout
("Et*5|t*5|t*4|t*4,L": E embedding, t decoder layer, L loss, | between virtual stages in layer
order), which also expresses an uneven pp split; Megatron accepts only one of the two.
"""

from __future__ import annotations

import shlex

import numpy as np

from solver.emit.layout import build_rank_layout
from solver.emit.target import Emitted, LaunchTarget
from solver.errors import InputError

# Megatron-LM builds its groups in one of two orders (parallel_state.initialize_model_parallel).
MEGATRON_ORDERS = {"tp-cp-ep-dp-pp": (), "tp-cp-ep-pp-dp": ("--use-tp-pp-dp-mapping",)}
FSDP_STRATEGIES = {2: "optim_grads", 3: "optim_grads_params"}


def _order_flags(target: LaunchTarget) -> tuple[list[str], list[str]]:
    """The flag that selects the target's rank order, or a warning when Megatron has none."""
    config, layout = target.config, target.layout
    is_moe = layout.expert is not None
    for order, flags in MEGATRON_ORDERS.items():
        try:
            theirs = build_rank_layout(config, is_moe, order).groups()
        except InputError:  # Megatron refuses that order for this plan too
            continue
        if all(np.array_equal(theirs[name], rows) for name, rows in layout.groups().items()):
            return list(flags), []
    return [], [f"Megatron-LM builds its groups in order tp-cp-ep-dp-pp (or tp-cp-ep-pp-dp with "
                f"--use-tp-pp-dp-mapping), not {'-'.join(layout.order)}: its groups will differ "
                "from `--format groups`"]


def _pipeline_layout(layers: list[int]) -> str:
    """Megatron's layout string for the given layers per virtual stage."""
    stages = [f"t*{n}" if n > 1 else "t" * n for n in layers]
    stages[0] = "E" + stages[0]
    stages[-1] = stages[-1] + ",L"
    return "|".join(stages)


def build_megatron_args(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str],
                                                         list[str]]:
    """Flags (each a tuple: the flag and its value, if any), warnings and notes."""
    c, job, model_spec = target.config, target.job, target.model_spec
    flags: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(c.tp)),
        ("--pipeline-model-parallel-size", str(c.pp)),
        ("--context-parallel-size", str(c.cp)),
    ]
    order_flags, warnings = _order_flags(target)
    notes: list[str] = []
    if model_spec.is_moe:
        flags += [("--expert-model-parallel-size", str(c.ep)),
                  ("--expert-tensor-parallel-size", str(c.etp))]
    layers = target.layers_per_virtual_stage()
    if len(set(layers)) > 1:
        flags.append(("--pipeline-model-parallel-layout", _pipeline_layout(layers)))
        notes.append(f"{model_spec.num_hidden_layers} layers do not split evenly over pp x vpp "
                     f"= {len(layers)} stages: --pipeline-model-parallel-layout places them as "
                     "the memory model does (a recent Megatron-Core)")
    elif c.vpp > 1:
        flags.append(("--num-layers-per-virtual-pipeline-stage", str(layers[0])))
    if c.vpp > 1 and target.num_micro_batches % c.pp:
        warnings.append(f"the interleaved schedule wants the {target.num_micro_batches} "
                        f"micro-batches per step to be a multiple of pp ({c.pp})")
    if c.sequence_parallel:
        flags.append(("--sequence-parallel",))
    if c.zero >= 1:
        flags.append(("--use-distributed-optimizer",))
    if c.dp * c.cp > 1:
        # The step-time model hides DP traffic behind compute; Megatron does so only when
        # asked (_add_distributed_args: --overlap-grad-reduce, and --overlap-param-gather,
        # which needs the distributed optimizer or Megatron-FSDP).
        flags.append(("--overlap-grad-reduce",))
        if c.zero >= 1:
            flags.append(("--overlap-param-gather",))
    if c.zero >= 2:
        flags += [("--use-megatron-fsdp",),
                  ("--data-parallel-sharding-strategy", FSDP_STRATEGIES[c.zero]),
                  ("--no-gradient-accumulation-fusion",), ("--ckpt-format", "fsdp_dtensor")]
        if c.pp > 1:
            warnings.append("Megatron-FSDP (ZeRO 2/3) does not combine with pipeline "
                            "parallelism")
    flags += [("--micro-batch-size", str(c.micro_batch)),
              ("--global-batch-size", str(job.global_batch)),
              ("--seq-length", str(job.seq_len))]
    if c.recompute == "selective":
        flags.append(("--recompute-granularity", "selective"))
    elif c.recompute == "full":
        flags += [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                  ("--recompute-num-layers", "1")]
    flags.append(("--bf16",))
    if job.precision == "fp8":
        flags.append(("--fp8-format", "hybrid"))
    flags += [(flag,) for flag in order_flags]
    if c.zero >= 2:
        notes.append("leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (Megatron-FSDP "
                     "asserts it)")
    elif c.tp > 1 or c.cp > 1:
        notes.append("export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it with tp or cp "
                     "> 1 on GPUs before Blackwell)")
    return flags, warnings, notes


def render_megatron(target: LaunchTarget) -> Emitted:
    """The arguments as a shell continuation, one flag per line, every token shell-quoted."""
    flags, warnings, notes = build_megatron_args(target)
    text = " \\\n".join(" ".join(shlex.quote(token) for token in flag) for flag in flags)
    return Emitted(text=text + "\n", settings=[token for flag in flags for token in flag],
                   warnings=tuple(warnings), notes=tuple(notes))
