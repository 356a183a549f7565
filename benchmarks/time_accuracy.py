"""How well the step-time model predicts the public training runs (issue 4, "Check it against").

    .venv/bin/python benchmarks/time_accuracy.py [--summary-only]

Every run `benchmarks/published.py` maps is predicted from its own model, cluster, job and
parallel configuration with `solver.cost.step.steptime.estimate_step_time`, and compared with its
measured tokens/s per GPU. Printed: one row per run, the median and 90th-percentile absolute
relative error (overall and split by source group, GPU, dense/MoE, precision, recompute), the
ten worst runs, and the Spearman rank correlation of predicted vs measured within each sweep.

Targets (issue 4): median error <= 10% on dense runs and <= 20% on MoE runs; Spearman >= 0.8
within each sweep. Sweeps rank runs by model FLOP/s per GPU (tokens/s x parplan's model FLOPs
per token), which orders runs of one model exactly as tokens/s does and stays comparable when a
sweep changes the model (the Megatron-LM weak-scaling table, BLOOM's 02-28 shape sweep).
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from rich.console import Console
from rich.table import Table

from published import PublishedRun, load_published_runs
from solver.cost.candidates import Candidates
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.step.frameworks import ATTENTION_SWITCHES, framework_time_constants
from solver.cost.layers.flops import estimate_model_flops_per_token
from solver.cost.step.steptime import TimeConstants, estimate_step_time
from solver.spec.plan import TIME_PARTS
from solver.spec.profiles import resolve_profile

MIN_SWEEP_RUNS = 3
# BLOOM's benchmarks switched from fp16 (DeepSpeed ZeRO-1) to the bf16 optimizer on 02-28.
BLOOM_BF16_OPTIMIZER_FROM = "0228"
# The pp values of BLOOM's 02-20 topology table that the same day's micro-batch tables repeat.
BLOOM_0220_MB_SWEEPS = (6, 10, 11, 12)


# The framework profile (solver.cost.step.frameworks) each source ran under; LLM Foundry's Composer
# (PyTorch FSDP) is none of parplan's frameworks and keeps the generic profile.
SOURCE_FRAMEWORKS = {"megatron-lm": "megatron", "megatron-bridge": "megatron",
                     "bloom": "deepspeed", "llm-foundry": "generic"}


def evaluate(runs: Sequence[PublishedRun], constants: TimeConstants | None = None,
             compute: ComputeConstants | None = None) -> list[tuple[PublishedRun, float]]:
    """(run, predicted tokens/s per GPU) in the order of `runs` (estimate_runs)."""
    return [(run, step["tokens_per_s_per_gpu"])
            for run, step in estimate_runs(runs, constants, compute)]


def estimate_runs(runs: Sequence[PublishedRun], constants: TimeConstants | None = None,
                  compute: ComputeConstants | None = None
                  ) -> list[tuple[PublishedRun, dict[str, float]]]:
    """(run, its StepTime as floats: the TIME_PARTS seconds, step_s, tokens_per_s_per_gpu)
    in the order of `runs`; runs that share model, cluster and job go through
    estimate_step_time in one vectorised call. Each run starts from its source's framework
    profile (SOURCE_FRAMEWORKS), or from `constants` when given, with the switches its source
    states (framework_switches); `compute` replaces the compute constants of whichever it
    starts from (what benchmarks/fit_time.py varies)."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for index, run in enumerate(runs):
        switches = tuple(sorted(framework_switches(run).items()))
        groups[(run.model_spec, run.cluster, run.job, run.source_group, switches)].append(index)
    steps: list[dict[str, float]] = [{} for _ in runs]
    for (model_spec, cluster, job, group, switches), indices in groups.items():
        candidates = Candidates.from_configs([runs[i].parallel for i in indices])
        base = constants or framework_time_constants(SOURCE_FRAMEWORKS[group])
        update = dict(switches) if compute is None else {**dict(switches), "compute": compute}
        run_constants = base.model_copy(update=update)
        estimate = estimate_step_time(model_spec, cluster, job, candidates, run_constants)
        for position, index in enumerate(indices):
            steps[index] = {name: float(getattr(estimate, name)[position])
                            for name in (*TIME_PARTS, "step_s", "tokens_per_s_per_gpu")}
    return list(zip(runs, steps))


def framework_switches(run: PublishedRun) -> dict[str, bool | float]:
    """What each source's framework did, from its own text and code (not fitted).

    BLOOM ran Megatron-DeepSpeed (2022) without sequence parallelism and with unfused
    attention (baddbmm + fused softmax; FlashAttention came later), on DeepSpeed's pipeline
    engine, which runs the DP collectives itself after the last backward, hiding none
    (pipe/engine.py "We schedule the all-reduces"). Its runs kept Megatron's default attention
    dropout (tr11-176B-ml README: "The default Megatron-LM dropout settings are inherited:
    --attention-dropout 0.1"), which the unfused path applies to the materialised
    probabilities, and ran with CUDA_LAUNCH_BLOCKING=1 from the 3D-topology tables on
    (chronicles-prequel "dealing with JZ hanging": at 320 GPUs "always hangs" without it, and
    "With having `CUDA_LAUNCH_BLOCKING=1` workaround providing a robust solution we will use
    that for a time being"; tr11-176B-ml.slurm exports it for the production run). Up to
    02-27 the runs were fp16 with DeepSpeed's ZeRO-1 optimizer: torch accumulates each
    micro-batch's fp16 gradient into .grad (read both, write the sum: 6 B per parameter) and
    the gradients are reduced to their shard owners in fp16 (2 B). From 02-28 ("from now on
    the testing is happening with BF16 optimizer that was just written to accumulate
    gradients in fp32", chronicles-prequel) and
    in production (tr11-176B-ml.slurm: "bf16 must use z0! it implements its own zero stage 1
    equivalent"), DeepSpeed's bf16 optimizer adds every micro-batch's bf16 gradients into fp32
    ones outside the GEMMs (18 B, TimeConstants.grad_accumulation_bytes_per_param) and the
    engine all-reduces the whole fp32 gradient (_bf16_reduce_grads ->
    buffered_allreduce_fallback) before each rank updates its shard.

    The Megatron-LM README runs state `--tp-comm-overlap`; Megatron-Bridge's performance
    scripts reduce gradients in bf16 for every model (`cfg.ddp.grad_reduce_in_fp32 = False`:
    25.09 e4bb622 configs/*/*.yaml, v0.2.0-v0.5.0 configs/<family>/*_llm_pretrain.py), and
    its H100 recipes enable TP communication overlap whenever tp > 1, and EP all-to-all overlap for MoE
    models ("EP A2A communication overlap with computation in both 1F1B pipelining and
    non-pipelined training", changelog 0.1.0; the Megatron-MoE model zoo's H100 baselines run
    A2A_OVERLAP=1)."""
    if run.source_group == "bloom":
        common = {"sequence_parallel": False, "flash_attention": False, "dp_overlap": "never",
                  "cuda_launch_blocking": True, "attention_dropout": True}
        date = run.id.split("-")[1]
        if date.isdigit() and date < BLOOM_BF16_OPTIMIZER_FROM:
            return {**common, "grad_accumulation_bytes_per_param": 6.0,
                    "grad_reduce_bytes": 2.0}
        return {**common, "grad_accumulation_bytes_per_param": 18.0, "grad_reduce_bytes": 4.0,
                "zero1_grad_all_reduce": True}
    if run.source_group == "megatron-bridge":
        # The row's own release's profile (solver.spec.profiles: megatron-bridge@<release>,
        # with its recipe for the row's model under the row's precision: FP8 with current
        # scaling where the recipe runs it).
        return dict(resolve_profile(run_profile(run), run.model_spec.name,
                                    run.job.precision).features)
    if run.source_group == "megatron-lm":
        return {"tp_comm_overlap": True}
    # LLM Foundry's tables (2023) ran FlashAttention in Triton: submit_benchmarks.py defaults
    # --attn_impl to triton at every commit that wrote them (up to 5e85bd62, 2024-01; flash
    # from 7f0fdae, 2024-03), and its yamls say `attn_impl: triton`.
    foundry = dict(ATTENTION_SWITCHES["triton"])
    if run.mixed_precision_mode == "DEFAULT":
        # Composer's FSDP "DEFAULT" mixed precision (torch 1.13 era, the tables' own note):
        # bf16 parameters, gradients reduced in fp32 (mosaic_fsdp.get_mixed_precision).
        return {**foundry, "zero3_grad_reduce_bytes": 4.0}
    return foundry


def run_profile(run: PublishedRun) -> str:
    """The `--framework` profile a row is predicted with: a Megatron-Bridge row its own
    release's (megatron-bridge@26.02), the others their source's framework
    (SOURCE_FRAMEWORKS)."""
    if run.source_group == "megatron-bridge":
        return f"megatron-bridge@{bridge_release(run)}"
    return SOURCE_FRAMEWORKS[run.source_group]


def bridge_release(run: PublishedRun) -> str:
    """The NeMo release of a Megatron-Bridge archive row, without its patch number:
    "mb-archive-26.02.01-H100-..." -> "26.02"."""
    return ".".join(run.id.split("-")[2].split(".")[:2])


# ---- statistics -------------------------------------------------------------------------------

def _abs_errors(results: Iterable[tuple[PublishedRun, float]]) -> np.ndarray:
    return np.array([abs(p / r.tokens_per_sec_per_gpu - 1.0) for r, p in results])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1, ties sharing their average rank."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    for value in np.unique(values):
        tied = values == value
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman rank correlation (scipy's when installed); nan when either side is constant."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    try:
        from scipy.stats import spearmanr
    except ImportError:
        return float(np.corrcoef(_ranks(x), _ranks(y))[0, 1])
    return float(spearmanr(x, y).statistic)


def sweep_keys(run: PublishedRun) -> tuple[str, ...]:
    """The sweeps a run belongs to: runs of one source that vary the parallel configuration.
    BLOOM's 02-20 topology table (mb 1, pp 4-12) continues in micro-batch tables for pp 6, 10,
    11 and 12, so its rows with those pp also open each micro-batch sweep."""
    if run.source_group == "bloom":
        parts = run.id.split("-")
        date = parts[1]
        if not date.isdigit():  # the production run stands alone
            return ()
        day = f"{date[:2]}-{date[2:]}"
        if date != "0220":
            return (f"bloom {day} sweep ({run.num_gpus} GPUs)",)
        mb_sweep = f"bloom {day} micro-batch sweep, pp {run.parallel.pp} ({run.num_gpus} GPUs)"
        if parts[2] == "mbs":
            return (mb_sweep,)
        topology = f"bloom {day} topology table (mb 1, 320-384 GPUs)"
        return (topology, mb_sweep) if run.parallel.pp in BLOOM_0220_MB_SWEEPS else (topology,)
    if run.source_group == "megatron-lm":
        return ("megatron-lm H100 weak-scaling table",)
    if run.source_group == "llm-foundry":
        return (f"llm-foundry {run.gpu} {run.precision} {run.model_spec.name} "
                f"s{run.job.seq_len} (GPUs x micro-batch)",)
    return ()


def _model_flops_per_gpu(run: PublishedRun, tokens_per_s_per_gpu: float) -> float:
    return tokens_per_s_per_gpu * estimate_model_flops_per_token(run.model_spec, run.job.seq_len)


# ---- rendering --------------------------------------------------------------------------------

def render_config(run: PublishedRun) -> str:
    c = run.parallel
    parts = [f"tp{c.tp}", f"pp{c.pp}", f"dp{c.dp}"]
    parts += [f"{n}{getattr(c, n)}" for n in ("cp", "ep", "etp", "vpp") if getattr(c, n) > 1]
    parts += [f"z{c.zero}", f"mb{c.micro_batch}", c.recompute]
    return " ".join(parts)


def render_runs(console: Console, results: Sequence[tuple[PublishedRun, float]],
                title: str) -> None:
    table = Table(title=title)
    for name in ("id", "model", "gpu", "config", "seq", "gbs"):
        table.add_column(name, overflow="fold")
    for name in ("predicted tok/s/GPU", "measured", "pred/meas"):
        table.add_column(name, justify="right")
    for run, predicted in results:
        ratio = predicted / run.tokens_per_sec_per_gpu
        table.add_row(run.id, run.model_spec.name, run.gpu, render_config(run),
                      str(run.job.seq_len), str(run.job.global_batch), f"{predicted:,.0f}",
                      f"{run.tokens_per_sec_per_gpu:,.0f}", f"{ratio:.2f}")
    console.print(table)


def render_splits(console: Console, results: Sequence[tuple[PublishedRun, float]]) -> None:
    splits: list[tuple[str, Callable[[PublishedRun], str]]] = [
        ("all", lambda r: "all runs"),
        ("source", lambda r: r.source_group),
        ("framework", lambda r: SOURCE_FRAMEWORKS[r.source_group]),
        ("profile", run_profile),
        ("gpu", lambda r: r.gpu),
        ("arch", lambda r: r.arch_kind),
        ("precision", lambda r: r.precision),
        ("recompute", lambda r: r.parallel.recompute),
    ]
    table = Table(title="Absolute relative error of tokens/s per GPU")
    for name in ("split", "value", "n"):
        table.add_column(name)
    for name in ("median |err|", "p90 |err|", "median pred/meas"):
        table.add_column(name, justify="right")
    for split, key in splits:
        groups: dict[str, list[tuple[PublishedRun, float]]] = defaultdict(list)
        for item in results:
            groups[key(item[0])].append(item)
        for value in sorted(groups):
            items = groups[value]
            errors = _abs_errors(items)
            ratios = [p / r.tokens_per_sec_per_gpu for r, p in items]
            table.add_row(split, value, str(len(items)), f"{np.median(errors):.1%}",
                          f"{np.percentile(errors, 90):.1%}", f"{np.median(ratios):.2f}")
        table.add_section()
    console.print(table)


def noise_ceiling(items: Sequence[tuple[PublishedRun, float]]) -> tuple[int, float, float]:
    """Within one sweep: how many configurations were measured more than once, the largest
    max/min among their repeats, and the Spearman correlation a model would score if it
    predicted each configuration's mean measurement (nan without repeats). Any prediction
    that depends on the configuration alone ties the repeats, so the repeats' spread is
    noise no model of the configuration can rank."""
    measured: dict[tuple, list[float]] = defaultdict(list)
    for run, _ in items:
        key = (run.model_spec, run.parallel, run.job)
        measured[key].append(_model_flops_per_gpu(run, run.tokens_per_sec_per_gpu))
    repeated = [values for values in measured.values() if len(values) > 1]
    if not repeated:
        return 0, float("nan"), float("nan")
    spread = max(max(values) / min(values) for values in repeated)
    means = {key: float(np.mean(values)) for key, values in measured.items()}
    keys = [(run.model_spec, run.parallel, run.job) for run, _ in items]
    actual = [_model_flops_per_gpu(run, run.tokens_per_sec_per_gpu) for run, _ in items]
    return len(repeated), spread, spearman([means[k] for k in keys], actual)


def render_sweeps(console: Console, results: Sequence[tuple[PublishedRun, float]]) -> None:
    sweeps: dict[str, list[tuple[PublishedRun, float]]] = defaultdict(list)
    for run, predicted in results:
        for key in sweep_keys(run):
            sweeps[key].append((run, predicted))
    table = Table(title="Spearman rank correlation within sweeps (model FLOP/s per GPU; "
                        f"sweeps of >= {MIN_SWEEP_RUNS} runs); noise: configurations measured "
                        "more than once, their largest max/min, and the Spearman of each "
                        "configuration's mean measurement (the ceiling for any model of the "
                        "configuration)")
    table.add_column("sweep", overflow="fold")
    for name in ("n", "measured max/min", "median pred/meas", "spearman", "repeated",
                 "repeat max/min", "ceiling"):
        table.add_column(name, justify="right")
    for key in sorted(sweeps):
        items = sweeps[key]
        if len(items) < MIN_SWEEP_RUNS:
            continue
        measured = [_model_flops_per_gpu(r, r.tokens_per_sec_per_gpu) for r, _ in items]
        predicted = [_model_flops_per_gpu(r, p) for r, p in items]
        ratios = [p / r.tokens_per_sec_per_gpu for r, p in items]
        repeated, spread, ceiling = noise_ceiling(items)
        table.add_row(key, str(len(items)), f"{max(measured) / min(measured):.2f}",
                      f"{np.median(ratios):.2f}", f"{spearman(predicted, measured):+.2f}",
                      str(repeated), "-" if repeated == 0 else f"{spread:.2f}",
                      "-" if repeated == 0 else f"{ceiling:+.2f}")
    console.print(table)


def render_ab_checks(console: Console) -> None:
    """The sources' own A/B tests (benchmarks/ab_checks.py): measured vs predicted ratio."""
    from ab_checks import BLOOM_HEAD_DIM_ABS, predict_head_dim_ab

    table = Table(title="A/B tests of the sources (not benchmark rows): BLOOM's head "
                        "dimension, aligned over misaligned throughput")
    for name in ("pair", "layout", "measured", "predicted"):
        table.add_column(name, justify="left" if name in ("pair", "layout") else "right")
    for ab in BLOOM_HEAD_DIM_ABS:
        table.add_row(ab.name, f"tp{ab.tp} pp{ab.pp} dp{ab.dp} mb{ab.micro_batch}",
                      f"{ab.measured:.2f}x", f"{predict_head_dim_ab(ab):.2f}x")
    console.print(table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary-only", action="store_true", help="skip the per-run table")
    args = parser.parse_args(argv)
    console = Console() if Console().is_terminal else Console(width=160)

    runs, skipped = load_published_runs()
    results = evaluate(runs)
    if not args.summary_only:
        render_runs(console, results, f"Predicted vs measured ({len(runs)} runs)")
    reasons: dict[str, int] = defaultdict(int)
    for _, reason in skipped:
        reasons[reason] += 1
    console.print(f"{len(runs)} runs mapped, {len(skipped)} rows skipped:")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        console.print(f"  {count:3d}  {reason}")
    render_splits(console, results)
    worst = sorted(results, key=lambda item: -abs(item[1] / item[0].tokens_per_sec_per_gpu - 1))
    render_runs(console, worst[:10], "The 10 worst runs")
    render_sweeps(console, results)
    render_ab_checks(console)


if __name__ == "__main__":
    main()
