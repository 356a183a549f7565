"""`parplan rl` against published RL step times (issue 41 item 6), nothing fitted to them.

    .venv/bin/python benchmarks/rl_accuracy.py

Rows: benchmarks/data/rl_published.csv (NeMo RL's performance page: GRPO, Megatron-Core
training, vLLM generation; its header says where each number comes from). Each row's own
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

Printed: each row's measured and predicted step with both shapes and the errors; the median
|error| and the worst rows of each shape.
"""

from __future__ import annotations

import csv
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
PROMPT_TOKENS = 150
SHAPES = ("fixed", "uniform", "exponential")
RECOMPUTE_CODES = {"none": 0, "selective": 1, "full": 2}


def load_rows() -> list[dict[str, str]]:
    lines = [line for line in ROWS.read_text(encoding="utf-8").splitlines()
             if line and not line.startswith("#")]
    return list(csv.DictReader(lines))


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


def main() -> None:
    rows = load_rows()
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
    console.print(table)
    for shape, found in errors.items():
        if not found:
            continue
        median = statistics.median(abs(e) for e, _ in found)
        worst = sorted(found, key=lambda item: -abs(item[0]))[:3]
        console.print(f"{shape}: median |error| {100 * median:.1f}% over {len(found)} rows; "
                      "worst: " + "; ".join(f"{name} {100 * e:+.0f}%" for e, name in worst))


if __name__ == "__main__":
    main()
