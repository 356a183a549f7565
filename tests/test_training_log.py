"""Training logs (solver.calibrate.training_log): one parser test per framework on real log
lines copied from the frameworks' own repositories and docs (tests/data/training_logs: each
file's header names its source and commit), DeepSpeed's current ThroughputTimer format from its
code, and bad logs refused in one line naming the file and line."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from solver.calibrate.training_log import (
    GIB_BYTES,
    MIB_BYTES,
    load_training_log,
    parse_training_log,
)
from solver.errors import InputError

DATA = Path(__file__).resolve().parent / "data" / "training_logs"


def test_megatron_iteration_and_memory_lines() -> None:
    """bigscience-workshop/bigscience experiments/gpt2-meg-ds-3d/meg_ds_3d_gpt2_perf_n16-ds-off.out:
    Megatron's training_log ("iteration        1/    1000 | ... | elapsed time per iteration
    (ms): 144915.6 | ...") and report_memory ("[Rank 43] (after 1 iterations) memory (MB) |
    allocated: 15492.84619140625 | max allocated: 15492.84619140625 | ..."), and the arguments
    block ("tensor_model_parallel_size ...................... 4")."""
    log = load_training_log(DATA / "megatron_bigscience.log")
    assert log.log_format == "megatron"
    assert [r.iteration for r in log.records] == list(range(1, 21))
    assert log.records[0].value == pytest.approx(144.9156)  # ms -> s
    assert log.records[-1].value == pytest.approx(124.7309)
    assert log.memory_bytes == pytest.approx(15492.84619140625 * MIB_BYTES)
    assert log.stated["tensor_model_parallel_size"][0] == 4
    assert log.stated["pipeline_model_parallel_size"][0] == 16
    assert log.stated["global_batch_size"][0] == 1024
    assert log.stated["world_size"][0] == 64
    kept = log.kept(10)  # iterations 11..20: 126.6076 ... 124.7309 s
    assert [r.iteration for r in kept] == list(range(11, 21))
    assert statistics.median(r.value for r in kept) == pytest.approx(
        (125.3523 + 125.9841) / 2)


def test_megatron_bridge_lines() -> None:
    """NVIDIA-NeMo/Megatron-Bridge docs/training/multi-token-prediction.md: "iteration
    100/  300000 | consumed samples:         3200 | elapsed time per iteration (ms): 3738.6";
    NVIDIA/dgxc-benchmarking llama3.1/README.md: the GB memory report
    ("mem-max-allocated-gigabytes: 194.41")."""
    mtp = load_training_log(DATA / "megatron_bridge_mtp.log")
    assert [(r.iteration, r.value) for r in mtp.records] == [(100, pytest.approx(3.7386))]
    assert mtp.memory_bytes is None
    dgxc = load_training_log(DATA / "megatron_bridge_dgxc.log")
    assert dgxc.records[0].value == pytest.approx(20.2891)
    assert dgxc.memory_bytes == pytest.approx(194.41 * GIB_BYTES)


def test_torchtitan_metrics_line() -> None:
    """pytorch/torchtitan torchtitan/experiments/graph_trainer/.claude/CLAUDE.md: "step: 20
    loss: 11.83506  grad_norm:  9.6669  memory: 48.87GiB(51.44%)  tps: 4,376  tflops: 253.41
    mfu: 25.62%" (metrics.py: tps per device, memory the max reserved GiB)."""
    log = load_training_log(DATA / "torchtitan_graph_trainer.log")
    assert log.log_format == "torchtitan"
    assert [(r.iteration, r.value, r.unit) for r in log.records] == [
        (20, 4376.0, "tokens_per_s_per_gpu")]
    assert log.memory_bytes == pytest.approx(48.87 * GIB_BYTES)


def test_torchtitan_colours_are_ignored() -> None:
    """metrics.py wraps each field in a colour code when the terminal has colours."""
    line = ("\x1b[31mstep: 30  \x1b[32mloss:  7.12345  \x1b[33mgrad_norm:  1.0000  "
            "\x1b[36mmemory: 12.34GiB(25.00%)  \x1b[34mtps: 12,345  \x1b[36mtflops: 123.45  "
            "\x1b[35mmfu: 12.34%\x1b[39m")
    log = parse_training_log([line], "colour.log")
    assert (log.records[0].iteration, log.records[0].value) == (30, 12345.0)


def test_deepspeed_throughput_lines() -> None:
    """microsoft/DeepSpeed docs/_tutorials/cifar-10.md: "worker-0: [INFO 2020-02-06 19:53:56]
    0/50, SamplesPerSec=1292.6411179579866" (ThroughputTimer's oldest format)."""
    log = load_training_log(DATA / "deepspeed_cifar10.log")
    assert log.log_format == "deepspeed"
    assert log.records[0].iteration == 50
    assert log.records[0].value == pytest.approx(1292.6411179579866)
    assert log.records[-1].iteration == 24850
    assert all(r.unit == "samples_per_s" for r in log.records)


def test_deepspeed_current_format() -> None:
    """deepspeed/utils/timer.py ThroughputTimer.stop prints "epoch={}/micro_step={}/
    global_step={}, RunningAvgSamplesPerSec={}, CurrSamplesPerSec={}, MemAllocated={}GB,
    MaxMemAllocated={}GB" (logged under "[timer.py:260:stop]")."""
    text = ("epoch={}/micro_step={}/global_step={}, RunningAvgSamplesPerSec={}, "
            "CurrSamplesPerSec={}, MemAllocated={}GB, MaxMemAllocated={}GB").format(
        0, 40, 10, 25.025771473496132, 25.704280480541442, 4.32, 38.49)
    log = parse_training_log([f"[INFO] [timer.py:260:stop] {text}"], "ds.log")
    assert (log.records[0].iteration, log.records[0].value) == (10, pytest.approx(25.7042804805))
    assert log.memory_bytes == pytest.approx(38.49 * GIB_BYTES)


def test_a_log_without_iteration_lines_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "empty.log"
    path.write_text("Number of parameters in billions: 8.03\nDeleting CUDA graphs\n")
    with pytest.raises(InputError, match=r"empty.log: no iteration line of Megatron"):
        load_training_log(path)


def test_only_warm_up_iterations_are_refused() -> None:
    """dgxc-benchmarking's log ran one iteration: within the warm-up, nothing to measure."""
    log = load_training_log(DATA / "megatron_bridge_dgxc.log")
    with pytest.raises(InputError, match=r"megatron_bridge_dgxc.log: line 3: every iteration "
                                         r"line is within the 10 warm-up iterations"):
        log.kept(10)
    assert len(log.kept(0)) == 1


def test_mixed_formats_are_refused() -> None:
    lines = ["step: 20  loss: 1.0  grad_norm: 1.0  memory: 1.00GiB(1.00%)  tps: 1,000  "
             "tflops: 1.00  mfu: 1.00%",
             "iteration 30/ 100 | consumed samples: 3 | elapsed time per iteration (ms): 9.0 |"]
    with pytest.raises(InputError, match=r"mixed.log: line 2: a megatron iteration line in a "
                                         r"torchtitan log"):
        parse_training_log(lines, "mixed.log")


def test_an_unreadable_log_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"missing.log: cannot read the log"):
        load_training_log(tmp_path / "missing.log")
