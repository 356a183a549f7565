"""A/B tests the sources ran themselves (one setting changed, everything else equal), which are
not rows of benchmarks/data/published_runs.jsonl: checks of a single term of the step-time
model. time_accuracy.py prints them; tests/test_published_loader.py holds the model to them.

BLOOM's head dimension (chronicles-prequel.md, bigscience-workshop/bigscience
train/tr11-176B-ml): Megatron-DeepSpeed's unfused attention loses the tensor cores when a
head's rows are not 16-byte aligned (solver.cost.kernels.efficiency.estimate_attention_core_s). Each
pair runs one layout with an aligned and a misaligned head dimension; the measured ratio is
the source's hardware TFLOP/s (or seconds per iteration, at equal FLOPs) of the aligned over
the misaligned run.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from published import PublishedRun, _bloom_prototype_model, load_published_runs
from time_accuracy import framework_switches

from solver.cost.candidates import Candidates
from solver.cost.step.steptime import TimeConstants, estimate_step_time
from solver.spec import JobSpec, ModelSpec, ParallelConfig


@dataclass(frozen=True)
class HeadDimAB:
    """One BLOOM A/B pair: (hidden, layers, heads) of the misaligned and the aligned model."""

    name: str
    misaligned: tuple[int, int, int]
    aligned: tuple[int, int, int]
    tp: int
    pp: int
    dp: int
    micro_batch: int
    measured: float  # aligned over misaligned throughput


BLOOM_HEAD_DIM_ABS = (
    # "tile and wave quantization" (02-20): NHIDDEN 14400 (head dim 225) 94.39 vs 13824 (216)
    # 120.05 hardware TFLOP/s, 40 nodes, tp 8, pp 10, dp 4, mb 1, 80 layers.
    HeadDimAB("02-20 NHIDDEN 14400 -> 13824", (14400, 80, 64), (13824, 80, 64), 8, 10, 4, 1,
              120.05 / 94.39),
    # "Another round of NHEADS" (02-26): NHIDDEN 13824, 78 layers; 128 heads (head dim 108)
    # 147.41 s/it vs 64 heads (216) 103.51 s/it, tp 4, pp 12, dp 8, mb 2.
    HeadDimAB("02-26 128 -> 64 heads, tp 4, mb 2", (13824, 78, 128), (13824, 78, 64), 4, 12, 8,
              2, 147.41 / 103.51),
    # The same table at mb 4: 153.90 vs 106.72 s/it.
    HeadDimAB("02-26 128 -> 64 heads, tp 4, mb 4", (13824, 78, 128), (13824, 78, 64), 4, 12, 8,
              4, 153.90 / 106.72),
    # The same table at tp 8, pp 6, mb 4: 128 heads 156.84 vs 96 heads (144) 118.12 s/it.
    HeadDimAB("02-26 128 -> 96 heads, tp 8, mb 4", (13824, 78, 128), (13824, 78, 96), 8, 6, 8,
              4, 156.84 / 118.12),
)


@lru_cache(maxsize=1)
def _bloom_0220_run() -> PublishedRun:
    """A mapped BLOOM run of the fp16 period: its cluster (Jean Zay) and framework switches."""
    runs, _ = load_published_runs()
    return next(run for run in runs if run.id.startswith("bloom-0220-topo"))


def _prototype(hidden: int, layers: int, heads: int) -> ModelSpec:
    return _bloom_prototype_model({
        "model": f"BLOOM-prototype (h={hidden}, L={layers}, heads={heads})",
        "source_locator": "bigscience-workshop/bigscience:train/tr11-176B-ml/"
                          "chronicles-prequel.md",
        "hidden": hidden, "ffn_hidden": 4 * hidden, "layers": layers, "heads": heads,
        "kv_heads": heads, "vocab": 250000})


def predict_head_dim_ab(ab: HeadDimAB, **switches: bool) -> float:
    """The model's aligned over misaligned throughput (FLOPs per second) for one pair, with the
    fp16-period BLOOM switches (time_accuracy.framework_switches) updated by `switches`."""
    run = _bloom_0220_run()
    constants = TimeConstants().model_copy(update={**framework_switches(run), **switches})
    job = JobSpec(seq_len=2048, global_batch=2048)
    config = ParallelConfig(tp=ab.tp, pp=ab.pp, dp=ab.dp, zero=1, micro_batch=ab.micro_batch,
                            recompute="full")
    candidates = Candidates.from_configs([config])
    tflops = [estimate_step_time(_prototype(*shape), run.cluster, job, candidates,
                                 constants).tflops_per_gpu[0]
              for shape in (ab.misaligned, ab.aligned)]
    return float(tflops[1] / tflops[0])
