"""How long `parplan rl` takes (issue 41: each plan under 5 s on 2 cores), and what it answers.

    .venv/bin/python benchmarks/rl_speed.py [--repeat R]

GRPO with 256 prompts x 8 samples, prompts of 512 tokens, responses uniform 512-4096, for a
dense 8B and 70B and a mixture of experts (Qwen3-30B-A3B) on DGX H100s, 8 to 256 GPUs; the
median of R runs, wall and CPU seconds (the CPU time of the process: what the machine's other
load does not inflate), the best plan's placement, pools and step. Not a test: timings depend
on the machine (tests/test_rl.py checks the plans, not their speed).
"""

from __future__ import annotations

import argparse
import statistics
import time

from rich.console import Console
from rich.table import Table

from solver.rl.explain import describe_placement
from solver.rl.job import RlJob
from solver.rl.search import plan_rl
from solver.serve.workload import LengthDistribution

PROBLEMS = [("llama3.1-8b", 8), ("llama3.1-8b", 64), ("llama3.1-8b", 256),
            ("llama3.1-70b", 64), ("llama3.1-70b", 256),
            ("qwen3-30b-a3b", 32), ("qwen3-30b-a3b", 256)]
JOB = RlJob(algorithm="grpo", prompts_per_step=256, samples_per_prompt=8,
            prompt_lengths=LengthDistribution.fixed(512),
            response_lengths=LengthDistribution(kind="uniform", low=512, high=4096),
            max_response_len=4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    table = Table(title="parplan rl: seconds to plan (median), best plan")
    for column in ("model", "GPUs", "wall s", "CPU s", "placement", "rollout", "step s", "colocated s",
                   "split s"):
        table.add_column(column)
    for model, gpus in PROBLEMS:
        seconds, cpu = [], []
        for _ in range(args.repeat):
            started, cpu_started = time.perf_counter(), time.process_time()
            result = plan_rl(model, "dgx-h100", gpus, JOB, top=100)
            seconds.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
        best = result.plans[0]

        def fastest(placement: str) -> str:
            steps = [p.step_seconds for p in result.plans if p.placement == placement]
            return f"{min(steps):.1f}" if steps else "-"

        table.add_row(model, str(gpus), f"{statistics.median(seconds):.2f}",
                      f"{statistics.median(cpu):.2f}",
                      describe_placement(best), best.rollout_layout,
                      f"{best.step_seconds:.1f}", fastest("colocated"), fastest("split"))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
