"""benchmarks/choice.py (issue 34, item 6): which public rows are one job, which pairs of them
are ordered and how, where the published mesh stands among our plans, and that the published
configuration is costed as the time benchmark costs it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from choice import (  # noqa: E402
    estimate_published,
    find_pairs,
    job_key,
    mesh_rank,
    part_differences,
    plan_rank,
    rank_job,
)
from published import PublishedRun, load_published_runs  # noqa: E402
from time_accuracy import evaluate  # noqa: E402

from solver.spec import ParallelConfig  # noqa: E402

# BLOOM's 02-21 "48 node contenders": one 181B model (h 14336, 72 layers) on 384 A100s, one
# global batch, pp 12 x micro-batch 1-8 and pp 6 x micro-batch 1-4 (chronicles-prequel).
CONTENDERS = ("bloom-0221-181B-dp4-pp12-mbs1", "bloom-0221-181B-dp4-pp12-mbs2",
              "bloom-0221-181B-dp4-pp12-mbs4", "bloom-0221-181B-dp4-pp12-mbs8",
              "bloom-0221-181B-dp8-pp6-mbs1", "bloom-0221-181B-dp8-pp6-mbs2",
              "bloom-0221-181B-dp8-pp6-mbs4")


@pytest.fixture(scope="module")
def runs() -> dict[str, PublishedRun]:
    return {run.id: run for run in load_published_runs()[0]}


def test_one_table_of_one_model_and_batch_is_one_job(runs) -> None:
    assert len({job_key(runs[name]) for name in CONTENDERS}) == 1


def test_bloom_topology_rows_are_different_jobs(runs) -> None:
    """The 02-20 table changes the layer count with pp ("to fit PP"): no two rows are one
    model, so none of them are compared."""
    topology = [run for name, run in runs.items() if name.startswith("bloom-0220-topo-")]
    assert len(topology) == 9
    assert len({job_key(run) for run in topology}) == 9


@pytest.mark.parametrize("source_group", ["llm-foundry", "megatron-lm"])
def test_sources_without_two_configurations_of_one_job(runs, source_group: str) -> None:
    """As the module docstring says: every row changes the GPU count, model or batch."""
    rows = [(run, 1.0) for run in runs.values() if run.source_group == source_group]
    assert rows
    assert find_pairs(rows, across_tables=True).num_jobs == 0


def _variant(run: PublishedRun, tokens: float, micro_batch: int | None = None,
             source: str | None = None) -> PublishedRun:
    parallel = run.parallel if micro_batch is None else run.parallel.model_copy(
        update={"micro_batch": micro_batch})
    return replace(run, id=f"{run.id}-{tokens}-{micro_batch}", tokens_per_sec_per_gpu=tokens,
                   parallel=parallel, source=source or run.source)


def test_a_pair_is_ordered_right_when_the_prediction_agrees(runs) -> None:
    base = runs[CONTENDERS[0]]
    slow, fast = _variant(base, 100.0, 1), _variant(base, 110.0, 2)
    agrees = find_pairs([(slow, 50.0), (fast, 60.0)])
    assert agrees.num_jobs == 1 and agrees.num_right == 1
    pair, = agrees.pairs
    assert pair.faster is fast and pair.measured_ratio == pytest.approx(1.1)
    assert pair.predicted_ratio == pytest.approx(1.2)
    disagrees = find_pairs([(fast, 50.0), (slow, 60.0)])
    assert len(disagrees.pairs) == 1 and disagrees.num_right == 0
    tie = find_pairs([(fast, 50.0), (slow, 50.0)])
    assert len(tie.pairs) == 1 and tie.num_right == 0  # a tie does not order them


def test_close_measurements_and_repeats_are_not_pairs(runs) -> None:
    base = runs[CONTENDERS[0]]
    close = find_pairs([(_variant(base, 100.0, 1), 1.0), (_variant(base, 104.0, 2), 2.0)])
    assert close.num_jobs == 1 and not close.pairs
    repeat = find_pairs([(_variant(base, 100.0), 1.0), (_variant(base, 120.0), 2.0)])
    assert repeat.num_jobs == 0 and not repeat.pairs
    assert repeat.repeats == pytest.approx((1.2,))


def test_rows_of_two_tables_pair_only_across_tables(runs) -> None:
    base = runs[CONTENDERS[0]]
    rows = [(_variant(base, 100.0, 1), 1.0),
            (_variant(base, 120.0, 2, source=base.source + " (a later table)"), 2.0)]
    assert find_pairs(rows).num_jobs == 0
    across = find_pairs(rows, across_tables=True)
    assert len(across.pairs) == 1 and across.num_right == 1
    same_table = [(_variant(base, 100.0, 1), 1.0), (_variant(base, 120.0, 2), 2.0)]
    assert find_pairs(same_table, across_tables=True).num_jobs == 0


def _plan(tp: int, pp: int, cp: int = 1, ep: int = 1, micro_batch: int = 1) -> SimpleNamespace:
    dp = 64 // (tp * pp * cp)
    return SimpleNamespace(config=ParallelConfig(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep,
                                                 micro_batch=micro_batch))


def test_plan_rank_and_mesh_rank() -> None:
    plans = [_plan(2, 1), _plan(2, 1, micro_batch=2), _plan(1, 2), _plan(4, 2, ep=2),
             _plan(1, 2, micro_batch=2)]
    assert plan_rank(plans, (1, 2, 1, 1)) == 3
    assert mesh_rank(plans, (1, 2, 1, 1)) == 2
    assert plan_rank(plans, (4, 2, 1, 2)) == 4 and mesh_rank(plans, (4, 2, 1, 2)) == 3
    assert plan_rank(plans, (8, 1, 1, 1)) is None and mesh_rank(plans, (8, 1, 1, 1)) is None


def test_part_differences_largest_first() -> None:
    ours = {"compute": 10.0, "ep": 0.5, "dp": 1.0, "bubble": 0.2}
    theirs = {"compute": 10.5, "ep": 4.0, "dp": 0.8, "bubble": 0.2}
    assert part_differences(ours, theirs, 2) == [("ep", -3.5), ("compute", -0.5)]


def test_a_small_job_ranks_its_published_mesh_first(runs) -> None:
    """Megatron-LM's GPT 1.7B on 48 H100s (tp 1, pp 1, dp 48): our top plan keeps its mesh,
    is no slower than the published configuration, and the published configuration is costed
    exactly as the time benchmark predicts it."""
    run = runs["mlm2024-h100-1.7B"]
    published = estimate_published(run)
    assert published.time is not None
    assert published.time.tokens_per_second_per_gpu == pytest.approx(evaluate([run])[0][1])
    job = rank_job([run], top=5, time_limit_s=20.0)
    assert job.result.status == "optimal"
    assert plan_rank(job.result.plans, job.mesh) == 1
    gain = job.claimed_gain(job.published)
    assert gain is not None and gain >= 0.0
