"""Writes docs/walkthrough.md: eight tasks a new user brings, each with the exact commands and
what they print, run here with the project's own CLI so the page cannot go stale.

    python benchmarks/walkthrough.py            # print the page
    python benchmarks/walkthrough.py --write    # rewrite docs/walkthrough.md
    python benchmarks/walkthrough.py --check    # exit 1 when docs/walkthrough.md is stale

`--write` also rewrites the README's worked example, the block between README_MARKERS: the first
README_EXAMPLE_LINES lines of README_EXAMPLE's output (the ranking and the notes under it).
tests/test_walkthrough.py runs `--check`'s comparisons in the normal suite.

How the page is made deterministic, all in `normalise_output`:
- each command runs through click's CliRunner (not a terminal: the wide tables, no colour, as in
  a pipe), in a fresh temporary folder holding copies of the input files it names (under the same
  relative paths, so the outputs echo the same names); files the commands write stay there;
- `> FILE` after a command is carried out by this script: the command's stdout goes to FILE;
  `cat FILE` prints a file a command wrote;
- wall-clock times vary from run to run: the solve time in a ranking's title ("(optimal, layout,
  0.12 s)") and a sweep's "in 1.8 s" are written as `T s` (SOLVE_TIME_PLACEHOLDER, matched by _TIMES);
- trailing spaces are cut;
- an output longer than MAX_LINES keeps its first HEAD_LINES and last TAIL_LINES lines, with a line
  saying how many were left out.
One kind of line depends on the machine, not on the code: `launch --validate` reports what each
framework's own parser said, or that the framework is not installed. The page shows the line as
generated; the freshness check ignores lines starting with VALIDATION_PREFIX.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from click.testing import CliRunner  # noqa: E402

from solver.cli import cli  # noqa: E402

PAGE = ROOT / "docs" / "walkthrough.md"
README = ROOT / "README.md"
README_EXAMPLE = "parplan optimize --model llama3.1-8b --cluster dgx-h100 --gpus 8 --top 3"
README_EXAMPLE_LINES = 12
README_MARKERS = ("<!-- begin: benchmarks/walkthrough.py README_EXAMPLE -->",
                  "<!-- end: benchmarks/walkthrough.py README_EXAMPLE -->")
SOLVE_TIME_PLACEHOLDER = "T"  # seconds of solve time: "T s"
MAX_LINES = 60
HEAD_LINES = 40
TAIL_LINES = 15
VALIDATION_PREFIX = "validation: "
INPUT_FILES = (
    "tests/data/hf_configs/qwen3-8b.json",
    "tests/data/nccl/nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt",
)
# The three places a wall-clock time is printed (solver/cli/render.py's ranking title and
# infeasible line, solver/cli/sweep_command.py's summary), matched on their own formats; the
# seconds are the second group.
_TIMES = (re.compile(r"^(top \d.*, )(\d+\.\d\d)( s\))$"),
          re.compile(r"^(infeasible \()(\d+\.\d\d)( s\))"),
          re.compile(r"^(.*: \d+ problems solved .* in )(\d+\.\d)( s)$"))


@dataclass(frozen=True)
class Task:
    title: str
    text: str
    commands: tuple[str, ...]
    after: str = ""


TASKS = (
    Task(
        "1. Plan a 70B pretraining run",
        "Llama 3.1 70B on 8 DGX H100 nodes, 8,192-token sequences, 512 a step, and the days to "
        "train 2T tokens. The table lists the five fastest plans; the README explains every "
        "column. The JSON of the same answer goes to `plans.json` for task 5.",
        ("parplan optimize --model llama3.1-70b --cluster dgx-h100 --gpus 64 --seq-len 8192 "
         "--global-batch 512 --token-budget 2T --top 5",
         "parplan optimize --model llama3.1-70b --cluster dgx-h100 --gpus 64 --seq-len 8192 "
         "--global-batch 512 --token-budget 2T --top 5 --json > plans.json"),
    ),
    Task(
        "2. DeepSeek-V3 on a GB200 NVL72",
        "DeepSeek-V3 (671B parameters, 256 routed experts) on 256 GB200s of NVL72 racks with the "
        "default job; the search places expert parallelism inside the racks' NVLink segments.",
        ("parplan optimize --model deepseek-v3 --cluster gb200-nvl72 --gpus 256 --top 3",),
    ),
    Task(
        "3. A Hugging Face config.json",
        "Any `config.json` of a supported model type works wherever a model name does. Check what "
        "parplan reads from it, then plan with it (here Qwen3-8B's config, packaged with the "
        "tests).",
        ("parplan models show tests/data/hf_configs/qwen3-8b.json",
         "parplan optimize --model tests/data/hf_configs/qwen3-8b.json --cluster dgx-h100 --gpus 8 "
         "--top 3"),
    ),
    Task(
        "4. Why does my configuration not fit?",
        "`estimate` costs one configuration: the memory table shows what fills the GPU and, when "
        "it does not fit, the changes that would. `optimize` on a problem nothing fits answers "
        "`infeasible` with the clashing constraints and the fixes.",
        ("parplan estimate --model llama2-70b --cluster dgx-h100 --gpus 64 --tp 8 --zero 0",
         "parplan optimize --model llama3.1-405b --cluster dgx-h100 --gpus 8"),
    ),
    Task(
        "5. Launch files, validated",
        "The best plan of task 1 as Megatron-LM arguments. `--validate` runs the framework's own "
        "argument checks where the framework is installed (`pip install 'parplan[frameworks]'`) "
        "and says what it could not check otherwise.",
        ("parplan launch --plan plans.json --format megatron --validate",),
        "The `validation:` line above is what this machine's installation allowed when the page "
        "was generated; with the frameworks installed it names what each check accepted.",
    ),
    Task(
        "6. Serving under an SLO",
        "Llama 3.1 8B on one DGX H100 under 20 requests/s of 1,000-3,000-token prompts, with a "
        "p90 time to first token under 1 s and a p90 time per output token under 30 ms.",
        ("parplan serve --model llama3.1-8b --cluster dgx-h100 --gpus 8 --context 8k "
         "--request-rate 20 --input-len 1000-3000 --output-len 512 --max-ttft-ms 1000 "
         "--max-tpot-ms 30 --top 3",),
    ),
    Task(
        "7. A sweep and its report",
        "Two models on two clusters at two GPU counts, solved one problem at a time into a "
        "results file (rerun the command to resume it), then the report: `report/index.html`, "
        "`summary.csv` and `summary.md` (`pip install 'parplan[report]'` adds the charts).",
        ("parplan sweep --models llama3.1-8b,mixtral-8x7b --clusters dgx-h100,dgx-a100-80gb "
         "--gpus 8,64 --jobs 1 -o results.jsonl",
         "parplan report results.jsonl -o report/ --no-charts",
         "cat report/summary.md"),
    ),
    Task(
        "8. Calibration from nccl-tests",
        "Fit an nccl-tests log of your cluster (here NVIDIA's DGX H100 one-node all-reduce, "
        "packaged with the tests) and cost a plan with the measured curves instead of the "
        "preset's datasheet bandwidths.",
        ("parplan calibrate nccl-tests "
         "tests/data/nccl/nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt --cluster dgx-h100 "
         "-o profile.json",
         "parplan estimate --model llama3.1-70b --cluster dgx-h100 --gpus 64 --tp 8 "
         "--calibration profile.json"),
    ),
)


def normalise_output(text: str) -> str:
    """The output as the page shows it: solve times replaced, trailing spaces cut, long outputs
    trimmed (first HEAD_LINES, last TAIL_LINES)."""
    lines = []
    for line in text.rstrip("\n").splitlines():
        line = line.rstrip()
        for pattern in _TIMES:
            line = pattern.sub(rf"\g<1>{SOLVE_TIME_PLACEHOLDER}\g<3>", line)
        lines.append(line)
    if len(lines) > MAX_LINES:
        left_out = len(lines) - HEAD_LINES - TAIL_LINES
        lines = [*lines[:HEAD_LINES], f"[... {left_out} lines left out of the walk-through ...]",
                 *lines[-TAIL_LINES:]]
    return "\n".join(lines)


def run_command(command: str, folder: Path) -> str:
    """Runs one command of the page in `folder` and returns what it printed."""
    words = shlex.split(command)
    if words[0] == "cat":
        return (folder / words[1]).read_text(encoding="utf-8")
    target = None
    if ">" in words:
        words, target = words[:words.index(">")], words[words.index(">") + 1]
    assert words[0] == "parplan", command
    result = CliRunner(env={"COLUMNS": None, "NO_COLOR": "1"}).invoke(cli, words[1:])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise RuntimeError(f"{command}: {result.exception!r}") from result.exception
    if result.exit_code != 0:
        raise RuntimeError(f"{command}: exit status {result.exit_code}\n{result.output}")
    if target is not None:
        (folder / target).write_text(result.stdout, encoding="utf-8")
        return result.stderr
    return result.output


def render_page() -> str:
    """The whole of docs/walkthrough.md, every command run afresh in a temporary folder."""
    parts = [
        "# Walk-through: eight tasks from a fresh clone",
        "",
        "[Back to the README](../README.md). Written by `benchmarks/walkthrough.py --write` from the "
        "commands below, run as shown from the repository root after the README's first line "
        "(`pip install .`); `tests/test_walkthrough.py` fails when this page differs from what "
        f"the commands print. Solve times vary from run to run and read `{SOLVE_TIME_PLACEHOLDER} s`; "
        f"an output over {MAX_LINES} lines keeps its first {HEAD_LINES} and last {TAIL_LINES}.",
        "",
    ]
    cwd = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="parplan-walkthrough-") as tmp:
        folder = Path(tmp)
        for name in INPUT_FILES:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, folder / name)
        os.chdir(folder)
        try:
            for task in TASKS:
                parts += [f"## {task.title}", "", task.text, ""]
                for command in task.commands:
                    output = normalise_output(run_command(command, folder))
                    parts += ["```", f"$ {command}"] + ([output] if output else []) + ["```", ""]
                if task.after:
                    parts += [task.after, ""]
        finally:
            os.chdir(cwd)
    return "\n".join(parts)


def render_readme_example() -> str:
    """The README's worked example: the command and the head of its output, as a code block."""
    with tempfile.TemporaryDirectory(prefix="parplan-walkthrough-") as tmp:
        output = run_command(README_EXAMPLE, Path(tmp))
    head = output.rstrip("\n").splitlines()[:README_EXAMPLE_LINES]
    return "\n".join(["```", f"$ {README_EXAMPLE}", normalise_output("\n".join(head)), "```"])


def readme_with_example(readme: str, example: str) -> str:
    """The README's text with the block between README_MARKERS replaced by `example`."""
    begin, end = README_MARKERS
    start, stop = readme.index(begin) + len(begin), readme.index(end)
    return readme[:start] + "\n" + example + "\n" + readme[stop:]


def comparable(page: str) -> list[str]:
    """The page's lines less those that depend on the installed frameworks."""
    return [line for line in page.splitlines() if not line.startswith(VALIDATION_PREFIX)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite docs/walkthrough.md")
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is stale")
    args = parser.parse_args()
    page = render_page()
    readme = README.read_text(encoding="utf-8")
    fresh_readme = readme_with_example(readme, render_readme_example())
    if args.write:
        PAGE.write_text(page, encoding="utf-8")
        README.write_text(fresh_readme, encoding="utf-8")
        print(f"wrote {PAGE.relative_to(ROOT)} and README.md's worked example")
        return 0
    if args.check:
        stale = [name for name, fresh, stored in (
            (PAGE.relative_to(ROOT), comparable(page), comparable(PAGE.read_text("utf-8"))),
            ("README.md", fresh_readme, readme)) if fresh != stored]
        print(f"stale: {', '.join(map(str, stale))}" if stale else "up to date")
        return 1 if stale else 0
    print(page, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
