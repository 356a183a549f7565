"""Command-line options shared by the planning commands, as reusable decorators.

`planning_options` adds the common options of DESIGN.md ("Interfaces"): --model --cluster
--gpus --gpus-per-node --segment-gpus --seq-len --global-batch --precision --calibration --json.
`degree_options` adds one value per decision variable (--tp .. --recompute), as `estimate`
takes them. Defaults come from the specs, so they are written once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from solver.cli.params import MAX_ZERO_STAGE, BoundedInt
from solver.spec.framework import (
    ATTENTION_KERNELS,
    DP_OVERLAPS,
    FEATURES,
    FP8_WEIGHT_COPIES,
    LOSS_IMPLEMENTATIONS,
    RECOMPUTE_MODULES,
    MOE_DISPATCHERS,
    SELECTIVE_RECOMPUTES,
    TRAINING_STATES,
    FrameworkFeatures,
)
from solver.spec.job import FRAMEWORKS, PRECISIONS, RECOMPUTE_LEVELS, JobSpec, ParallelConfig
from solver.spec.strict import MAX_BATCH, MAX_GPUS, MAX_LAYERS, MAX_SEQ_LEN, MAX_TOKENS

F = TypeVar("F", bound=Callable[..., object])


def _apply(command: F, decorators: list[Callable[[F], F]]) -> F:
    for decorator in reversed(decorators):
        command = decorator(command)
    return command


class TokenCount(click.ParamType):
    """A token count: an integer, or a number with a K/M/B/T suffix ("2T", "300B", "1.5e12")."""

    name = "TOKENS"
    _suffixes = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper()
        scale = self._suffixes.get(text[-1:], 1.0)
        number = text[:-1] if text[-1:] in self._suffixes else text
        try:
            tokens = float(number) * scale
        except ValueError:
            self.fail(f"{value!r} is not a token count (e.g. 2T, 300B, 1.5e12)", param, ctx)
        if not 1 <= tokens <= MAX_TOKENS.most:  # also nan and inf
            self.fail(f"{value!r} must be between 1 and 1e18 tokens", param, ctx)
        return int(round(tokens))


def _default(spec: type, field: str) -> object:
    return spec.model_fields[field].default


def framework_option(help_text: str) -> Callable[[F], F]:
    """--framework: whose rules (optimize) and timing (optimize, estimate) to assume."""
    return click.option("--framework", type=click.Choice(FRAMEWORKS), default="megatron",
                        show_default=True, help=help_text)


def framework_feature_options(command: F) -> F:
    """Flags that override single features of the --framework profile (solver.cost.frameworks;
    parameters named as FrameworkFeatures' fields, collected by `pop_framework_features`)."""
    return _apply(command, [
        click.option("--attention-kernel", type=click.Choice(ATTENTION_KERNELS), default=None,
                     help="Attention kernels: native (FlashAttention-3 / cuDNN), flash2 "
                          "(FlashAttention-2, Ampere instructions on Hopper), triton (2022 "
                          "FlashAttention in Triton) or unfused (keeps the s x s "
                          "probabilities for backward)."),
        click.option("--fused-elementwise/--eager-elementwise", default=None,
                     help="Fused norms, RoPE and SwiGLU (TE, torch.compile) or eager ops "
                          "(more launches, and more activations saved for backward)."),
        click.option("--cuda-graphs/--no-cuda-graphs", default=None,
                     help="Replay captured kernels without host launches."),
        click.option("--moe-dispatcher", type=click.Choice(MOE_DISPATCHERS), default=None,
                     help="MoE token dispatcher (deepep, hybridep: one copy per NVLink "
                          "domain, forwarded inside it)."),
        click.option("--tp-comm-overlap/--no-tp-comm-overlap", default=None,
                     help="Hide TP/SP collectives behind the GEMMs."),
        click.option("--ep-comm-overlap/--no-ep-comm-overlap", default=None,
                     help="Hide EP all-to-alls behind another micro-batch's compute."),
        click.option("--dp-overlap", type=click.Choice(DP_OVERLAPS), default=None,
                     help="When DP collectives overlap compute."),
        click.option("--selective-recompute", type=click.Choice(SELECTIVE_RECOMPUTES),
                     default=None,
                     help="What --recompute selective recomputes: attention_core (Megatron) or "
                          "op_level (torchtitan: all but every second GEMM and the attention)."),
        click.option("--fp8-weight-copies", type=click.Choice(FP8_WEIGHT_COPIES), default=None,
                     help="Quantised weight copies below bf16: transformer_engine (cached "
                          "row- and column-wise, sharded like the weights) or none (torchao "
                          "float8 casts on the fly)."),
        click.option("--precision-aware-optimizer/--no-precision-aware-optimizer",
                     default=None,
                     help="Adam moments and main gradients in bf16 (Megatron "
                          "--use-precision-aware-optimizer)."),
        click.option("--grad-reduce-in-bf16/--no-grad-reduce-in-bf16", default=None,
                     help="Gradient buffer and DP reduction in bf16, not fp32."),
        click.option("--fp8-param-gather/--no-fp8-param-gather", default=None,
                     help="Below bf16, Transformer Engine's quantised weights are the "
                          "parameters, with no bf16 copy (Megatron --fp8-param-gather)."),
        click.option("--optimizer-offload/--no-optimizer-offload", default=None,
                     help="Optimizer state in host memory, stepped on the CPU (Megatron "
                          "--optimizer-cpu-offload, DeepSpeed ZeRO-Offload); default: the "
                          "search's choice (optimize), off (estimate)."),
        click.option("--activation-offload/--no-activation-offload", default=None,
                     help="Attention and expert activations to host memory between forward "
                          "and backward (Megatron --fine-grained-activation-offloading); "
                          "default: the search's choice (optimize), off (estimate)."),
        click.option("--cpu-offloading-num-layers", type=BoundedInt(0, MAX_LAYERS),
                     default=None, metavar="N",
                     help="The first N decoder layers' activations to host memory (Megatron "
                          "layer-level CPU offloading; pp 1, no recompute; default 0)."),
        click.option("--fp8-all-gather/--no-fp8-all-gather", default=None,
                     help="torchao float8: FSDP gathers the weights in float8 (torchtitan "
                          "enable_fsdp_float8_all_gather; with --precision fp8)."),
        click.option("--recompute-modules", default=None, metavar="M,M,...",
                     callback=_split_modules,
                     help="Modules --recompute selective recomputes (Megatron): "
                          + ",".join(RECOMPUTE_MODULES) + " (default core_attn)."),
        click.option("--loss-implementation", type=click.Choice(LOSS_IMPLEMENTATIONS),
                     default=None,
                     help="How the loss runs, what the last stage holds for the logits: eager "
                          "(the framework's own), compiled (torch.compile), chunked (upcast "
                          "per chunk), fused (gradient written into the logits: Transformer "
                          "Engine, Liger) or fused_linear (LM head fused with the loss: "
                          "Liger); default: the framework's."),
        click.option("--training-states", type=click.Choice(TRAINING_STATES), default=None,
                     help="Weights, gradients and Adam state: mixed (the framework's fp32 "
                          "master and moments; default), pure_bf16 (all bf16, no master: "
                          "8 B per parameter), adam8bit (8-bit block-wise moments, "
                          "bitsandbytes / torchao) or pure_bf16_adam8bit."),
    ])


def _split_modules(ctx: click.Context, param: click.Parameter, value: str | None
                   ) -> tuple[str, ...] | None:
    """--recompute-modules core_attn,mlp -> ("core_attn", "mlp"); unknown names are a usage
    error naming the choices."""
    if value is None:
        return None
    modules = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in modules if name not in RECOMPUTE_MODULES]
    if unknown or not modules:
        raise click.BadParameter(f"{value!r}: choose from {', '.join(RECOMPUTE_MODULES)}",
                                 ctx=ctx, param=param)
    return modules


def pop_framework_features(values: dict[str, object]) -> FrameworkFeatures:
    """The FrameworkFeatures of a command's keyword arguments (removed from `values`)."""
    return FrameworkFeatures(**{name: values.pop(name) for name in FEATURES if name in values})


def planning_options(command: F) -> F:
    """The common planning options with --gpus required."""
    return make_planning_options(gpus_required=True)(command)


def make_planning_options(gpus_required: bool, model_required: bool = True
                          ) -> Callable[[F], F]:
    """The common planning options; `optimize --gpus-for-days` makes --gpus optional,
    `launch --plan FILE` also --model and --cluster (the plan file names them)."""
    return lambda command: _planning_options(command, gpus_required, model_required)


def _planning_options(command: F, gpus_required: bool, model_required: bool = True) -> F:
    """--model --cluster --gpus --gpus-per-node --segment-gpus --seq-len --global-batch
    --precision --token-budget --calibration --json (parameters model, cluster, num_gpus,
    gpus_per_node, segment_gpus, seq_len, global_batch, precision, token_budget, calibration,
    as_json)."""
    return _apply(command, [
        click.option("--model", required=model_required, metavar="NAME|PATH",
                     help="Zoo name, zoo-format TOML or Hugging Face config.json."),
        click.option("--cluster", required=model_required, metavar="NAME|PATH",
                     help="Cluster preset name or cluster TOML file."),
        click.option("--gpus", "num_gpus", required=gpus_required,
                     type=BoundedInt(1, MAX_GPUS), help="Number of GPUs of the job."),
        click.option("--gpus-per-node", type=BoundedInt(1, MAX_GPUS), default=None,
                     help="GPUs per node (overrides the preset)."),
        # How it fits the cluster is checked by ClusterSpec (one line naming --segment-gpus).
        click.option("--segment-gpus", type=BoundedInt(None, MAX_GPUS), default=None,
                     help="GPUs of the aligned block of one NVLink domain the job is allocated "
                          "in (SLURM --segment x GPUs per node); default: the largest "
                          "power-of-two number of nodes in a domain (64 on NVL72)."),
        click.option("--seq-len", type=BoundedInt(1, MAX_SEQ_LEN), show_default=True,
                     default=_default(JobSpec, "seq_len"), help="Tokens per sequence."),
        click.option("--global-batch", type=BoundedInt(1, MAX_BATCH), show_default=True,
                     default=_default(JobSpec, "global_batch"),
                     help="Sequences per optimizer step."),
        click.option("--precision", type=click.Choice(PRECISIONS), show_default=True,
                     default=_default(JobSpec, "precision"),
                     help="Training precision recipe (fp8: tensor-wise scaling; mxfp8 and "
                          "nvfp4 need Blackwell)."),
        click.option("--token-budget", type=TokenCount(), default=None,
                     help="Tokens to train on (e.g. 2T): adds days and GPU-hours."),
        click.option("--calibration", metavar="FILE", default=None,
                     help="Fitted bandwidth curves (`parplan calibrate`)."),
        click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables."),
    ])


def degree_options(command: F) -> F:
    """One value per decision variable: --tp --pp --cp --ep --etp --vpp --zero --micro-batch
    --recompute (dp is the rest of the GPUs)."""
    degree = BoundedInt(1, MAX_GPUS)
    return _apply(command, [
        click.option("--tp", type=degree, default=1, show_default=True,
                     help="Tensor-parallel degree (sequence parallel on when > 1)."),
        click.option("--pp", type=degree, default=1, show_default=True,
                     help="Pipeline stages."),
        click.option("--cp", type=degree, default=1, show_default=True,
                     help="Context-parallel degree."),
        click.option("--ep", type=degree, default=1, show_default=True,
                     help="Expert-parallel degree (carved out of tp x cp x dp)."),
        click.option("--etp", type=degree, default=1, show_default=True,
                     help="Expert tensor-parallel degree."),
        click.option("--vpp", type=BoundedInt(1, MAX_LAYERS), default=1, show_default=True,
                     help="Virtual pipeline stages per stage (interleaved 1F1B)."),
        click.option("--zero", type=BoundedInt(0, MAX_ZERO_STAGE), show_default=True,
                     default=_default(ParallelConfig, "zero"),
                     help="ZeRO stage (1 = Megatron distributed optimizer, 3 = FSDP)."),
        click.option("--micro-batch", type=BoundedInt(1, MAX_BATCH), show_default=True,
                     default=_default(ParallelConfig, "micro_batch"),
                     help="Sequences per micro-batch."),
        click.option("--recompute", type=click.Choice(RECOMPUTE_LEVELS), show_default=True,
                     default=_default(ParallelConfig, "recompute"),
                     help="Activation recomputation."),
    ])
