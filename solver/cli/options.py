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

from solver.cli.params import MAX_ZERO_STAGE, BoundedInt, PinSpec
from solver.spec.features import FEATURE_DECLARATIONS, FEATURES, Feature, FrameworkFeatures
from solver.spec.framework import RECOMPUTE_MODULES
from solver.spec.profiles import ResolvedProfile, profile_names, resolve_profile
from solver.spec.job import PRECISIONS, RECOMPUTE_LEVELS, JobSpec, ParallelConfig
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
    """--framework: whose rules (optimize, sweep) and timing (optimize, estimate, sweep) to
    assume, NAME@RELEASE (solver.spec.profiles: resolve_framework)."""
    return click.option("--framework", type=click.Choice(profile_names()), default="megatron",
                        show_default=True,
                        help=help_text + " NAME@RELEASE picks a release's features (a bare "
                                         "name: the newest).")


def resolve_framework(framework: str, model: str | None, features: FrameworkFeatures,
                      precision: str | None = None
                      ) -> tuple[ResolvedProfile, FrameworkFeatures]:
    """--framework NAME[@RELEASE] for `model` (a zoo name gets its release recipe's
    features, as that recipe sets them under --precision): the resolved profile, and its
    release's features with the flags' over them."""
    resolved = resolve_profile(framework, model, precision)
    return resolved, FrameworkFeatures(**{**resolved.features, **features.given()})


def framework_feature_options(command: F) -> F:
    """Flags that override single features of the --framework profile, one per feature
    declaration (solver.spec.features; parameters named as FrameworkFeatures' fields,
    collected by `pop_framework_features`)."""
    return _apply(command, [_feature_option(feature) for feature in FEATURE_DECLARATIONS])


def _feature_option(feature: Feature) -> Callable[[F], F]:
    """The click option of one declared feature: a choice, an on/off switch (its off flag
    `--no-...` unless declared), a count of layers, or a module list."""
    if feature.flag_kind == "switch":
        off = feature.off_flag or "--no-" + feature.flag[2:]
        return click.option(f"{feature.flag}/{off}", feature.name, default=None,
                            help=feature.help)
    if feature.flag_kind == "count":
        return click.option(feature.flag, feature.name, default=None, metavar="N",
                            type=BoundedInt(feature.minimum, MAX_LAYERS), help=feature.help)
    if feature.flag_kind == "modules":
        return click.option(feature.flag, feature.name, default=None, metavar="M,M,...",
                            callback=_split_modules, help=feature.help)
    return click.option(feature.flag, feature.name, default=None, help=feature.help,
                        type=click.Choice(feature.choices))


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


def make_planning_options(gpus_required: bool, model_required: bool = True,
                          gpu_counts: bool = False) -> Callable[[F], F]:
    """The common planning options; `optimize --gpus-for-days` makes --gpus optional,
    `launch --plan FILE` also --model and --cluster (the plan file names them); `gpu_counts`:
    --gpus takes a list of counts (optimize, solver.optimize_counts)."""
    return lambda command: _planning_options(command, gpus_required, model_required, gpu_counts)


def _planning_options(command: F, gpus_required: bool, model_required: bool = True,
                      gpu_counts: bool = False) -> F:
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
                     type=PinSpec(1) if gpu_counts else BoundedInt(1, MAX_GPUS),
                     help="GPU counts of the job to compare (N or N,N,...: the best count by "
                          "the objective)." if gpu_counts else "Number of GPUs of the job."),
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
