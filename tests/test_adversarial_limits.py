"""Issue 37, unbounded work and paths that leave their folder, reproduced as filed:

- `sweep --models all --clusters all --gpus 1-1000000` grew ~70 MB/s until the machine ran out
  of memory, `--seq-len 1-1000000 --global-batch 1-1000000` spun forever: a sweep now counts
  its problems (the product of the axes' sizes) before building any, and refuses more than
  --max-problems (default 10,000) with the count and the flag;
- `serve --input-len @/dev/zero` read without end, a length file holding '²' passed
  isdigit() and failed in int(): length files are read up to MAX_FILE_BYTES, digits are ASCII;
- an 8 GB results file was read whole by `report`: results files and lines have size caps,
  checked before the bytes are read;
- a cluster file's `kernel_table` could name any .npz on disk (absolute or ../), and a 9.4 MB
  archive can expand to 2 GiB: it names a packaged table, whose declared sizes are checked
  before it is loaded;
- `--model ../clusters/presets/dgx-h100` loaded a cluster file as a model (outside the zoo), a
  5,000-character --model raised "File name too long".

The commands that used to grow without bound run in a child process under a 1 GiB address-space
limit (tests/limited_run.py): before the fixes they die there with a MemoryError or a timeout.
"""

from __future__ import annotations

import re
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bad_input import ROOT, assert_one_line_error, invoke
from limited_run import assert_one_line, run_limited
from solver.cost.kernels import kernels
from solver.errors import InputError
from solver.sweep.problems import build_sweep_problems, check_problem_count
from solver.sweep.results import MAX_LINE_BYTES, read_results

PLANNING = ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8"]


# ---- unbounded grids --------------------------------------------------------------------------

@pytest.mark.parametrize("grid, count", [
    (["--models", "all", "--clusters", "all", "--gpus", "1-1000000"], "754,000,000"),
    (["--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8", "--seq-len",
      "1-1000000", "--global-batch", "1-1000000"], "1,000,000,000,000"),
], ids=["gpus", "seq-len-x-global-batch"])
def test_an_unbounded_sweep_grid_is_refused_before_it_is_built(tmp_path: Path, grid: list[str],
                                                               count: str) -> None:
    finished = run_limited("sweep", *grid, "-o", tmp_path / "r.jsonl", cwd=tmp_path,
                           timeout_s=30)
    assert_one_line(finished, f"has {count} problems", "--max-problems 10,000")
    assert not (tmp_path / "r.jsonl").exists()
    # In this process (imports already done) the count answers in well under a second; 5 s
    # leaves room for a loaded machine.
    start = time.perf_counter()
    assert_one_line_error(invoke("sweep", *grid, "-o", tmp_path / "r.jsonl"), "--max-problems")
    assert time.perf_counter() - start < 5.0


def test_max_problems_is_the_limit_and_names_the_count(tmp_path: Path) -> None:
    args = ["sweep", "--models", "llama3.2-1b,qwen3-8b", "--clusters", "dgx-h100", "--gpus",
            "8,16,16", "-o", tmp_path / "r.jsonl"]
    line = invoke(*args, "--max-problems", "3")
    assert_one_line_error(line, "the sweep has 4 problems (2 x 1 x 2 x 1 x 1 x 1 models",
                          "--max-problems 3")
    assert_one_line_error(invoke(*args, "--max-problems", "0"), "--max-problems")


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(models=st.lists(st.sampled_from("abc"), min_size=1, max_size=4),
       gpus=st.lists(st.sampled_from([8, 16, 64]), min_size=1, max_size=4),
       seq_lens=st.lists(st.sampled_from([2048, 4096]), min_size=1, max_size=3),
       precisions=st.lists(st.sampled_from(["bf16", "fp8"]), min_size=1, max_size=3))
def test_the_count_is_the_number_of_problems_built(models, gpus, seq_lens, precisions) -> None:
    axes = [models, ["x"], gpus, seq_lens, [512], precisions]
    built = build_sweep_problems(*axes)
    assert check_problem_count(axes, len(built)) == len(built)
    with pytest.raises(InputError, match=f"has {len(built):,} problems"):
        check_problem_count(axes, len(built) - 1)


# ---- length files -----------------------------------------------------------------------------

def test_a_length_file_that_never_ends_is_refused_within_bounded_memory(tmp_path: Path) -> None:
    finished = run_limited("serve", *PLANNING, "--context", "8k", "--input-len", "@/dev/zero",
                           cwd=tmp_path, timeout_s=30)
    assert_one_line(finished, "--input-len", "@/dev/zero", "more than 67,108,864 bytes")


@pytest.mark.parametrize("text", ["²", "1²", "٣", "9" * 5000])
def test_a_length_that_is_not_ascii_digits_is_one_line(tmp_path: Path, text: str) -> None:
    """'²' and Arabic-Indic '٣' pass str.isdigit(); int() refuses the first and reads the
    second as 3; 5,000 digits pass isdigit() and exceed int()'s 4,300-digit limit."""
    path = tmp_path / "lengths.txt"
    path.write_text(f"100\n{text}\n", encoding="utf-8")
    assert_one_line_error(invoke("serve", *PLANNING, "--context", "8k", "--input-len",
                                 f"@{path}"), "--input-len", "line 2")


# ---- results files ----------------------------------------------------------------------------

def test_an_8_gb_results_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as handle:  # sparse: 8 GB of zeros, no disk used
        handle.truncate(8 * 10**9)
    finished = run_limited("report", path, "-o", tmp_path / "report", cwd=tmp_path)
    assert_one_line(finished, str(path), "8,000,000,000 bytes is too large")
    finished = run_limited("sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100",
                           "--gpus", "8", "-o", path, cwd=tmp_path)
    assert_one_line(finished, str(path), "too large")
    assert path.stat().st_size == 8 * 10**9


def test_a_results_line_that_never_ends_is_refused_at_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "long.jsonl"
    path.write_bytes(b"{" + b" " * MAX_LINE_BYTES.most + b"}\n")
    with pytest.raises(InputError, match=r"long.jsonl:1: the line is too long"):
        read_results(path)


# ---- kernel tables ----------------------------------------------------------------------------

def cluster_with_kernel_table(folder: Path, table: str) -> Path:
    """dgx-h100 with its GPU table embedded and `kernel_table` set to `table`."""
    preset = (ROOT / "clusters" / "presets" / "dgx-h100.toml").read_text(encoding="utf-8")
    gpu = (ROOT / "clusters" / "gpus" / "h100-sxm.toml").read_text(encoding="utf-8")
    gpu_lines = [line for line in gpu.splitlines() if re.match(r"^[a-z_0-9]+ = ", line)
                 and not line.startswith("kernel_table")]
    text = (preset.replace('gpu = "h100-sxm"\n', "") + "\n[gpu]\n" + "\n".join(gpu_lines)
            + f"\nkernel_table = {table!r}\n".replace("'", '"'))
    path = folder / "cluster.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("table", ["../../../tmp/bomb", "/tmp/bomb", "h100_sxm/../h100_sxm",
                                   "..", "H100_SXM", "h100_sxm.npz"])
def test_kernel_table_names_a_packaged_table_not_a_path(tmp_path: Path, table: str) -> None:
    path = cluster_with_kernel_table(tmp_path, table)
    assert_one_line_error(invoke("estimate", "--model", "llama3.2-1b", "--cluster", path,
                                 "--gpus", "8", "--json"), str(path), "kernel_table")


def test_the_packaged_name_is_accepted(tmp_path: Path) -> None:
    path = cluster_with_kernel_table(tmp_path, "h100_sxm")
    result = invoke("estimate", "--model", "llama3.2-1b", "--cluster", path, "--gpus", "8")
    assert result.exit_code == 0, result.output


def test_a_table_that_expands_past_the_cap_is_refused_before_it_is_loaded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An archive of 3 KB that declares 2**27 bytes (zeros compress ~1000:1): refused from its
    declared sizes, without the allocation."""
    archive = tmp_path / "bomb.npz"
    header = np.lib.format.header_data_from_array_1_0(np.zeros(1))
    header["shape"] = (2**24,)  # 128 MiB of float64
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
        with bundle.open("gemm.bf16.latency_ms.npy", "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            chunk = bytes(2**20)
            for _ in range(128):
                member.write(chunk)
    assert archive.stat().st_size < 2**20
    monkeypatch.setattr(kernels, "KERNEL_DIR", tmp_path)
    kernels.load_kernel_table.cache_clear()
    try:
        with pytest.raises(InputError, match=r"kernel_table 'bomb': its arrays expand to "
                                             r"134,217,8\d\d bytes"):
            kernels.load_kernel_table("bomb")
    finally:
        kernels.load_kernel_table.cache_clear()


def test_every_packaged_table_is_within_the_cap() -> None:
    for name in kernels.list_kernel_tables():
        with zipfile.ZipFile(kernels.KERNEL_DIR / f"{name}.npz") as archive:
            assert sum(m.file_size for m in archive.infolist()) < kernels.MAX_KERNEL_TABLE_BYTES


# ---- zoo names --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../clusters/presets/dgx-h100", "../models/llama3.2-1b",
                                  "./llama3.2-1b", "a" * 5000, "llama3.2-1b/"])
def test_a_model_name_cannot_leave_the_zoo(name: str) -> None:
    for args in (["models", "show", name],
                 ["estimate", "--model", name, "--cluster", "dgx-h100", "--gpus", "8"]):
        assert_one_line_error(invoke(*args), "unknown model")


def test_zoo_names_still_load_in_any_case() -> None:
    assert invoke("models", "show", "LLAMA3.2-1B").exit_code == 0
