"""Training logs users already have: the step time and peak memory a framework printed.

Formats (each line's source is the framework's own logging code):
  megatron    Megatron-LM / Megatron-Bridge / Megatron-DeepSpeed `training_log`
              (megatron/training/training.py): "iteration 10/ 100 | consumed samples: ... |
              elapsed time per iteration (ms): 1234.5 | ..." (the mean over the log interval),
              and its memory report (megatron/training/utils/common_utils.py
              report_memory): "[Rank 0] (after 10 iterations) memory (MB) | allocated: ... |
              max allocated: ... | reserved: ... | max reserved: ..." in MiB (1024^2 bytes), or
              the newer "(GB) | ... | mem-max-allocated-gigabytes: 194.41 | ..." in GiB;
              compared with the allocated view.
  torchtitan  torchtitan/components/metrics.py MetricsProcessor.log: "step: 20  loss: ...
              memory: 48.87GiB(51.44%)  tps: 4,376  tflops: ...  mfu: ...%": tps is tokens per
              second per GPU, memory torch.cuda.max_memory_reserved() in GiB (reserved view).
  deepspeed   deepspeed/utils/timer.py ThroughputTimer.stop: "epoch=0/micro_step=40/
              global_step=10, RunningAvgSamplesPerSec=..., CurrSamplesPerSec=25.7, ...
              MaxMemAllocated=38.49GB" (samples of the whole job per second: the engine's timer
              counts batch_size=self.train_batch_size(), deepspeed/runtime/engine.py; GiB, allocated
              view; before 2023 "0/20, RunningAvgSamplesPerSec=..." with epoch/step), and
              its oldest "0/50, SamplesPerSec=1292.64" (epoch/step, the running mean).

What a line measures is one **record**: its iteration number and either the step in seconds,
tokens per second per GPU, or samples per second; solver.calibrate.scales turns them into
steps with the plan's batch. Warm-up: records of iterations 1..`warmup_steps` are skipped
(CUDA and NCCL initialisation, torch.compile, the allocator's growth: DEFAULT_WARMUP_STEPS).
A Megatron log's own arguments block ("tensor_model_parallel_size ....... 4") is read so that
a plan for another configuration is refused (`stated`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from solver.errors import InputError

# Megatron's first log interval mixes initialisation into its mean; torchtitan's step 1
# compiles. Skipping iterations 1..10 drops both at the default log intervals (Megatron 100
# or 10: the record at 20 covers 11..20; torchtitan logs steps 1, 10, 20, ...).
DEFAULT_WARMUP_STEPS = 10
MIB_BYTES = 2**20
GIB_BYTES = 2**30
# The plan's memory view each format's counter reads (solver.spec.plan MEMORY_VIEWS).
MEMORY_VIEW = {"megatron": "allocated", "torchtitan": "reserved", "deepspeed": "allocated"}
# Framework profiles whose runs print each format (Megatron-DeepSpeed prints Megatron's).
FORMAT_FRAMEWORKS = {"megatron": ("megatron", "deepspeed"), "torchtitan": ("torchtitan",),
                     "deepspeed": ("deepspeed",)}

_NUMBER = r"([0-9][0-9,]*\.?[0-9]*(?:[eE][-+]?[0-9]+)?)"
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration "
                            r"\(ms\):\s*" + _NUMBER)
_MEGATRON_MEMORY = re.compile(r"\(after \d+ iterations\) memory \((MB|GB)\)(.*)")
_MEGATRON_MAX = {"MB": re.compile(r"\|\s*max allocated:\s*" + _NUMBER),
                 "GB": re.compile(r"\|\s*mem-max-allocated-gigabytes:\s*" + _NUMBER)}
_MEGATRON_ARG = re.compile(r"^\s*(tensor_model_parallel_size|pipeline_model_parallel_size|"
                           r"context_parallel_size|expert_model_parallel_size|"
                           r"micro_batch_size|global_batch_size|seq_length|world_size)"
                           r" \.{2,} (\d+)\s*$")
_TITAN = re.compile(r"step:\s*(\d+)\s.*?memory:\s*" + _NUMBER + r"\s*GiB.*?tps:\s*" + _NUMBER)
_DS_NEW = re.compile(r"(?:global_step=|\]\s+\d+/)(\d+), RunningAvgSamplesPerSec=\S+, "
                     r"CurrSamplesPerSec=" + _NUMBER + r"(?:.*?MaxMemAllocated=" + _NUMBER + r"GB)?")
_DS_OLD = re.compile(r"\]\s+(\d+)/(\d+), SamplesPerSec=" + _NUMBER)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class LogRecord:
    """One logged measurement: iteration, value in `unit` (step_s, tokens_per_s_per_gpu,
    samples_per_s) and the 1-based line it came from."""

    iteration: int
    value: float
    unit: str
    line: int


@dataclass(frozen=True)
class TrainingLog:
    """What one log holds: its format, every record, the peak memory it reported (bytes, in
    MEMORY_VIEW[log_format]) and the configuration values it states (name -> (value, line))."""

    path: str
    log_format: str
    records: tuple[LogRecord, ...]
    memory_bytes: float | None
    stated: dict[str, tuple[int, int]] = field(default_factory=dict)

    def kept(self, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> tuple[LogRecord, ...]:
        """The records after the warm-up (an InputError when none is left)."""
        kept = tuple(r for r in self.records if r.iteration > warmup_steps)
        if not kept:
            last = self.records[-1]
            raise InputError(f"{self.path}: line {last.line}: every iteration line is within "
                             f"the {warmup_steps} warm-up iterations (the last is iteration "
                             f"{last.iteration}); log longer or give --warmup-steps")
        return kept


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_training_log(lines: Iterable[str], path: str) -> TrainingLog:
    """The records of a Megatron, torchtitan or DeepSpeed log (module docstring); an
    InputError naming the file when it holds no iteration line or mixes formats."""
    records: dict[str, list[LogRecord]] = {"megatron": [], "torchtitan": [], "deepspeed": []}
    memory: dict[str, list[float]] = {"megatron": [], "torchtitan": [], "deepspeed": []}
    stated: dict[str, tuple[int, int]] = {}
    for number, raw in enumerate(lines, start=1):
        line = _ANSI.sub("", raw)
        if (match := _MEGATRON_ITER.search(line)) is not None:
            records["megatron"].append(LogRecord(int(match[1]), _number(match[2]) / 1e3,
                                                 "step_s", number))
        elif (match := _MEGATRON_MEMORY.search(line)) is not None:
            peak = _MEGATRON_MAX[match[1]].search(match[2])
            if peak is not None:
                scale = MIB_BYTES if match[1] == "MB" else GIB_BYTES
                memory["megatron"].append(_number(peak[1]) * scale)
        elif (match := _MEGATRON_ARG.match(line)) is not None:
            stated.setdefault(match[1], (int(match[2]), number))
        elif (match := _TITAN.search(line)) is not None:
            records["torchtitan"].append(LogRecord(int(match[1]), _number(match[3]),
                                                   "tokens_per_s_per_gpu", number))
            memory["torchtitan"].append(_number(match[2]) * GIB_BYTES)
        elif (match := _DS_NEW.search(line)) is not None:
            records["deepspeed"].append(LogRecord(int(match[1]), _number(match[2]),
                                                  "samples_per_s", number))
            if match[3] is not None:
                memory["deepspeed"].append(_number(match[3]) * GIB_BYTES)
        elif (match := _DS_OLD.search(line)) is not None:
            records["deepspeed"].append(LogRecord(int(match[2]), _number(match[3]),
                                                  "samples_per_s", number))
    found = sorted((name for name, found in records.items() if found),
                   key=lambda name: records[name][0].line)
    if not found:
        raise InputError(f"{path}: no iteration line of Megatron ('iteration N/ M | ... elapsed "
                         "time per iteration (ms): ...'), torchtitan ('step: N ... tps: ...') or "
                         "DeepSpeed ('...SamplesPerSec=...')")
    if len(found) > 1:
        second = records[found[1]][0]
        raise InputError(f"{path}: line {second.line}: a {found[1]} iteration line in a "
                         f"{found[0]} log; give one framework's log per file")
    log_format = found[0]
    bad = next((r for r in records[log_format] if r.value <= 0), None)
    if bad is not None:
        raise InputError(f"{path}: line {bad.line}: the iteration's time or rate must be "
                         f"positive, got {bad.value}")
    peaks = memory[log_format]
    return TrainingLog(path=path, log_format=log_format, records=tuple(records[log_format]),
                       memory_bytes=max(peaks) if peaks else None, stated=stated)


def load_training_log(path: str | Path) -> TrainingLog:
    """A log file (any problem reading it is one InputError naming it)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse_training_log(handle, str(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the log: {exc.strerror or exc}") from None
