"""The problems of a sweep: every combination of models, clusters, GPU counts and jobs.

A **sweep problem** is one `optimize` call, named by its key (KEY_FIELDS): the model and the
cluster as given (a zoo or preset name, or a file path), the GPU count, the job (seq_len,
global_batch, precision), the framework and the objective. The key is what a results file is
resumed by: a problem whose key already has a line is not solved again.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import ValidationError

from solver.errors import InputError, format_validation_error
from solver.spec import JobSpec

KEY_FIELDS = ("model", "cluster", "gpus", "seq_len", "global_batch", "precision", "framework",
              "objective")
GLOB_CHARACTERS = "*?["


@dataclass(frozen=True, order=True)
class SweepProblem:
    """One problem of a sweep (its fields are KEY_FIELDS, in that order)."""

    model: str
    cluster: str
    gpus: int
    seq_len: int
    global_batch: int
    precision: str
    framework: str = "megatron"
    objective: str = "time"

    @property
    def key(self) -> tuple[Any, ...]:
        return tuple(getattr(self, name) for name in KEY_FIELDS)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        """`llama3.1-8b on 64 x dgx-h100 (seq 4096, batch 1024, bf16, megatron)`."""
        return (f"{self.model} on {self.gpus} x {self.cluster} (seq {self.seq_len}, batch "
                f"{self.global_batch}, {self.precision}, {self.framework})")


def key_of_line(line: dict[str, Any]) -> tuple[Any, ...]:
    """The key of a results line; KeyError if a key field is missing."""
    return tuple(line[name] for name in KEY_FIELDS)


def expand_names(option: str, patterns: Sequence[str], known: Sequence[str],
                 check: Callable[[str], object]) -> list[str]:
    """`all`, names, globs (`llama3*`) or file paths, in the order given, without repeats.
    A glob must match a known name; a name or path is checked by `check` (which raises the
    InputError of an unknown name or a bad file)."""
    names: list[str] = []
    for pattern in (p.strip() for p in patterns):
        if not pattern:
            continue
        if pattern.lower() == "all":
            matched = list(known)
        elif any(c in pattern for c in GLOB_CHARACTERS):
            matched = [name for name in known if fnmatch.fnmatchcase(name, pattern.lower())]
            if not matched:
                raise InputError(f"{option} {pattern}: the pattern matches no name "
                                 f"({', '.join(known[:6])}, ...)")
        else:
            check(pattern)
            matched = [pattern.lower() if pattern.lower() in known else pattern]
        names.extend(name for name in matched if name not in names)
    if not names:
        raise InputError(f"{option}: give at least one name")
    return names


def check_problem_count(axes: Sequence[Sequence[Any]], most: int) -> int:
    """The number of problems of a sweep whose axes (models, clusters, GPU counts, seq_lens,
    global_batches, precisions) are `axes`, counted without building them (repeated values
    count once, as build_sweep_problems keeps them); an InputError when it exceeds `most`:
    `--gpus 1-1000000` on every model and cluster is 663 million problems, which would fill
    the memory before the first one is solved."""
    count = 1
    for values in axes:
        count *= len(set(values))
    if count > most:
        sizes = " x ".join(f"{len(set(values)):,}" for values in axes)
        raise InputError(f"the sweep has {count:,} problems ({sizes} models, clusters, GPU "
                         "counts, seq_lens, global_batches, precisions), more than "
                         f"--max-problems {most:,}: narrow the lists or raise --max-problems")
    return count


def check_jobs(seq_lens: Iterable[int], global_batches: Iterable[int],
               precisions: Iterable[str]) -> None:
    """Raise the InputError of the first job the options cannot make."""
    for seq_len, global_batch, precision in itertools.product(seq_lens, global_batches,
                                                              precisions):
        try:
            JobSpec(seq_len=seq_len, global_batch=global_batch, precision=precision)
        except ValidationError as exc:
            raise InputError(format_validation_error("job", exc)) from None


def build_sweep_problems(models: Sequence[str], clusters: Sequence[str], gpus: Sequence[int],
                         seq_lens: Sequence[int], global_batches: Sequence[int],
                         precisions: Sequence[str], framework: str = "megatron",
                         objective: str = "time") -> list[SweepProblem]:
    """Every combination, without repeats, in a fixed order (model, cluster, gpus, job)."""
    problems = [
        SweepProblem(model=model, cluster=cluster, gpus=num_gpus, seq_len=seq_len,
                     global_batch=global_batch, precision=precision, framework=framework,
                     objective=objective)
        for model, cluster, num_gpus, seq_len, global_batch, precision in itertools.product(
            models, clusters, gpus, seq_lens, global_batches, precisions)
    ]
    return list(dict.fromkeys(problems))


def order_longest_first(problems: Iterable[SweepProblem]) -> list[SweepProblem]:
    """Problems with the most GPUs first: their search spaces are the largest, and starting
    them early keeps a core from finishing the sweep alone on one big problem."""
    return sorted(problems, key=lambda p: (-p.gpus, p))
