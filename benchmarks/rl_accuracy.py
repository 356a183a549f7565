"""`parplan rl` against published RL step times (issue 41 item 6), nothing fitted to them.

    .venv/bin/python benchmarks/rl_accuracy.py [--rows SUBSTRING ...]

Rows: benchmarks/data/rl_published.csv (NeMo RL's performance page: GRPO, Megatron-Core
training, vLLM generation; its header says where each number comes from) and
benchmarks/data/rl_published.jsonl (verl's documentation pages, the LMSYS Miles-on-ROCm blog:
each row its URL, the quoted
table cells and setup, and `assumed`: every number the page does not give, with where it comes
from). `--rows` keeps the rows whose recipe (csv) or id (jsonl) contains one of the strings. Each row's own
configuration is costed (solver.rl.search.plan_rl with RlPins: the placement, the generation
GPUs and TP, the training degrees, micro-batch 1 and its recompute), not the planner's best.

What the page does not give, stated here and the same for every row (not tuned):

    prompts   PROMPT_TOKENS tokens: OpenMathInstruct-2 problems (tens of tokens) inside
              NeMo RL's math prompt and the chat template; the responses' mean is the
              published average sequence length less this
    responses the page gives their mean only, so three shapes: `fixed` (every response the
              mean: no straggler tail, a lower bound), `uniform` (the widest uniform with
              that mean inside 1 .. max_seq - prompt) and `exponential` (the maximum-entropy
              lengths with that mean on 1 .. max_seq - prompt: a tail to the maximum)

jsonl rows with no published mean response length are costed with every length 1..max equally
likely (uniform: the maximum-entropy lengths given only the bound), the same in all three
columns, and their median is printed apart from the rows whose lengths are published.

Printed: each row's measured and predicted step with both shapes and the errors; the median
|error| and the worst rows of each shape.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

import numpy as np

from rich.console import Console
from rich.table import Table

from solver.catalog import load_cluster_spec
from solver.rl.job import RlJob, RlPins
from solver.serve.job import vllm_batch_defaults
from solver.rl.search import plan_rl
from solver.serve.workload import LengthDistribution

ROWS = Path(__file__).parent / "data" / "rl_published.csv"
PUBLISHED = Path(__file__).parent / "data" / "rl_published.jsonl"
PUBLISHED_FIELDS = ("id", "source_url", "quote", "setup_quote", "assumed", "framework",
                    "framework_version", "training_framework", "rollout_engine", "algorithm",
                    "model", "cluster", "gpu_type", "gpus", "placement", "training_gpus",
                    "rollout_tp", "training", "prompts_per_step", "samples_per_prompt",
                    "prompt_len_max", "prompt_len_mean", "response_len_max",
                    "response_len_mean", "async_steps", "optimizer_steps_per_rollout",
                    "gen_memory_utilization", "measured_step_s", "measured_phases_s")
PROMPT_TOKENS = 150
SHAPES = ("fixed", "uniform", "exponential")
RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}


def load_rows() -> list[dict[str, str]]:
    lines = [line for line in ROWS.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#")]
    return list(csv.DictReader(lines))


def load_published() -> list[dict]:
    """The jsonl rows, each checked for every field (a missing or unknown one is an error
    naming the row: the file is data, not code)."""
    rows = []
    for number, line in enumerate(PUBLISHED.read_text(encoding="utf-8").splitlines(), 1):
        row = json.loads(line)
        if set(row) != set(PUBLISHED_FIELDS):
            raise ValueError(f"{PUBLISHED.name}:{number}: fields missing "
                             f"{sorted(set(PUBLISHED_FIELDS) - set(row))}, unknown "
                             f"{sorted(set(row) - set(PUBLISHED_FIELDS))}")
        rows.append(row)
    return rows


def response_lengths(shape: str, mean: int, most: int) -> LengthDistribution:
    """`fixed` at the mean; `uniform`, the widest uniform with that mean inside 1..most; or
    `exponential`, the most random lengths with that mean on 1..most (maximum entropy given the
    mean: a truncated exponential, Jaynes 1957), as 2,000 equally likely quantiles."""
    if shape == "fixed" or mean >= most:
        return LengthDistribution.fixed(min(mean, most))
    if shape == "exponential":
        return truncated_exponential(mean, most)
    low = max(1, 2 * mean - most)
    high = min(most, 2 * mean - 1)
    return LengthDistribution(kind="uniform", low=low, high=high)


def truncated_exponential(mean: float, most: int, points: int = 2000) -> LengthDistribution:
    """Lengths on 1..most with density proportional to exp(-rate x), the rate (negative for a
    mean above the middle) found by bisection so that their mean is `mean` (the mean falls as
    the rate rises)."""
    span = most - 1.0
    q = (np.arange(points) + 0.5) / points

    def quantiles(rate: float) -> np.ndarray:
        if abs(rate * span) < 1e-9:
            return 1.0 + q * span
        return 1.0 - np.log1p(-q * -np.expm1(-rate * span)) / rate

    low, high = -50.0 / span, 50.0 / span
    for _ in range(200):
        middle = (low + high) / 2.0
        low, high = (low, middle) if quantiles(middle).mean() < mean else (middle, high)
    values = np.clip(np.rint(quantiles(low)), 1, most).astype(int)
    return LengthDistribution(kind="empirical", low=int(values.min()), high=int(values.max()),
                              values=tuple(sorted(values.tolist())), source="exponential")


def predict(row: dict[str, str], shape: str):
    """The predicted plan of the row's configuration (None where it does not fit)."""
    max_seq, avg_seq = int(row["max_seq"]), int(row["avg_seq"])
    most = max_seq - PROMPT_TOKENS
    generations = 32 if int(row["g_gbs"]) == 2048 else 16
    job = RlJob(algorithm="grpo", prompts_per_step=int(row["g_gbs"]) // generations,
                samples_per_prompt=generations,
                prompt_lengths=LengthDistribution.fixed(PROMPT_TOKENS),
                response_lengths=response_lengths(shape, avg_seq - PROMPT_TOKENS, most),
                max_response_len=most, async_steps=int(row["lag"]),
                optimizer_steps_per_rollout=int(row["g_gbs"]) // int(row["t_gbs"]))
    gen_gpus = int(row["gen_gpus"])
    training = {name: (int(row[name]),) for name in ("tp", "cp", "ep", "pp")}
    training.update(micro_batch=(1,), recompute=(RECOMPUTE_CODES[row["recompute"]],))
    pins = RlPins(placement="split" if gen_gpus else "colocated",
                  training_gpus=int(row["gpus"]) - gen_gpus if gen_gpus else None,
                  rollout_tp=int(row["gen_tp"]), training=training,
                  rollout_max_num_seqs=vllm_batch_defaults(load_cluster_spec(row["cluster"]))[1],
                  rollout_gpu_memory_utilization=float(row["gen_memory_utilization"]))
    result = plan_rl(row["model"], row["cluster"], int(row["gpus"]), job, top=1, pins=pins)
    return result.plans[0] if result.plans else None


def predict_published(row: dict, shape: str):
    """The predicted plan of a jsonl row's configuration, pinned where the row gives it
    (None where it does not fit)."""
    most, mean = row["response_len_max"], row["response_len_mean"]
    lengths = (LengthDistribution(kind="uniform", low=1, high=most) if mean is None
               else response_lengths(shape, mean, most))
    job = RlJob(algorithm=row["algorithm"], prompts_per_step=row["prompts_per_step"],
                samples_per_prompt=row["samples_per_prompt"],
                prompt_lengths=LengthDistribution.fixed(row["prompt_len_mean"]),
                response_lengths=lengths, max_response_len=most,
                async_steps=row["async_steps"],
                optimizer_steps_per_rollout=row["optimizer_steps_per_rollout"])
    pins = RlPins(placement=row["placement"], training_gpus=row["training_gpus"],
                  rollout_tp=row["rollout_tp"],
                  training={name: (value,) for name, value in (row["training"] or {}).items()},
                  rollout_gpu_memory_utilization=row["gen_memory_utilization"])
    result = plan_rl(row["model"], row["cluster"], row["gpus"], job, top=1, pins=pins)
    return result.plans[0] if result.plans else None


def published_table(rows: list[dict], errors: dict[str, list[tuple[float, str]]],
                    unknown_mean: list[tuple[float, str]]) -> Table:
    """The jsonl rows' table; each error goes into `errors` by shape (rows with a published
    mean) or into `unknown_mean` (once: the uniform lengths every column uses)."""
    table = Table(title=f"parplan rl against {len(rows)} published steps (verl pages, Miles blog)")
    for column in ("id", "algo", "model", "GPUs", "placement", "lag", "mean resp.",
                   "measured s", "fixed s", "err", "uniform s", "err", "exponential s", "err",
                   "gen / log-probs / train / sync s (measured)"):
        table.add_column(column)
    for row in rows:
        measured = row["measured_step_s"]
        name = f"{row['id']} ({row['model']}, {row['gpus']} GPUs)"
        cells, parts, uniform = [], "-", None
        for shape in SHAPES:
            if row["response_len_mean"] is None and uniform is not None:
                plan = uniform
            else:
                plan = predict_published(row, shape)
            if plan is None:
                cells += ["no fit", "-"]
                continue
            error = plan.step_seconds / measured - 1.0
            if row["response_len_mean"] is None:
                if uniform is None:
                    unknown_mean.append((error, name))
                uniform = plan
            else:
                errors[shape].append((error, name))
            parts = " / ".join(
                f"{plan.phases[phase]:.0f} ({row['measured_phases_s'].get(phase, '-')})"
                for phase in ("generation", "log_probs", "training", "weight_sync"))
            cells += [f"{plan.step_seconds:.1f}", f"{100 * error:+.0f}%"]
        table.add_row(row["id"], row["algorithm"], row["model"], str(row["gpus"]),
                      row["placement"], str(row["async_steps"]),
                      str(row["response_len_mean"] or "unknown"), f"{measured:g}", *cells,
                      parts)
    return table


def summary(label: str, found: list[tuple[float, str]]) -> str:
    """Median |error| and the three worst rows of `found`."""
    median = statistics.median(abs(e) for e, _ in found)
    worst = sorted(found, key=lambda item: -abs(item[0]))[:3]
    return (f"{label}: median |error| {100 * median:.1f}% over {len(found)} rows; worst: "
            + "; ".join(f"{name} {100 * e:+.0f}%" for e, name in worst))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", default=None,
                        help="only rows whose recipe or id contains one of these strings")
    keep = parser.parse_args(argv).rows

    def kept(name: str) -> bool:
        return keep is None or any(part in name for part in keep)

    rows = [row for row in load_rows() if kept(row["recipe"])]
    published = [row for row in load_published() if kept(row["id"])]
    table = Table(title=f"parplan rl against {len(rows)} published GRPO steps (NeMo RL)")
    for column in ("system", "model", "GPUs", "gen", "lag", "avg seq", "measured s",
                   "fixed s", "err", "uniform s", "err", "exponential s", "err",
                   "exponential: gen / log-probs / train s"):
        table.add_column(column)
    errors: dict[str, list[tuple[float, str]]] = {shape: [] for shape in SHAPES}
    for row in rows:
        cells = []
        parts = "-"
        for shape in SHAPES:
            plan = predict(row, shape)
            measured = float(row["step_s"])
            if plan is None:
                cells += ["no fit", "-"]
                continue
            predicted = plan.step_seconds
            parts = " / ".join(f"{plan.phases[name]:.1f}"
                               for name in ("generation", "log_probs", "training"))
            error = predicted / measured - 1.0
            errors[shape].append((error, f"{row['model']} {row['system']} {row['gpus']} GPUs "
                                         f"lag {row['lag']}"))
            cells += [f"{predicted:.1f}", f"{100 * error:+.0f}%"]
        table.add_row(row["system"], row["model"], row["gpus"], row["gen_gpus"] or "coloc.",
                      row["lag"], row["avg_seq"], row["step_s"], *cells, parts)
    console = Console(width=200)
    if rows:
        console.print(table)
    unknown_mean: list[tuple[float, str]] = []
    if published:
        console.print(published_table(published, errors, unknown_mean))
    for shape, found in errors.items():
        if found:
            console.print(summary(f"{shape} (lengths published)", found))
    if unknown_mean:  # apart: their error is mostly the lengths assumed, not the model's
        console.print(summary("mean response not published (uniform 1..max)", unknown_mean))


if __name__ == "__main__":
    main()
