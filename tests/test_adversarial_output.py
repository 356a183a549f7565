"""Issue 37, output errors, reproduced as filed: stdout to /dev/full gave tracebacks in
optimize, launch, models and report, a closed pipe exited 1 without a word (click's and rich's
own handling), and sweep masked its own clear error with a second one; `launch -o` on a full
disk left a 0-byte file. Now every output error is one line, `error: cannot write the output
(...)` or the -o flag's own, and exit 2 (solver.cli), and files are written whole or not at all
(solver.output_file; the results file cuts a failed line back off). A full disk is
RLIMIT_FSIZE in a child process (tests/limited_run.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from limited_run import assert_one_line, run_limited
from solver.errors import InputError
from solver.output_file import write_output_file

PLANNING = ["--model", "llama3.2-1b", "--cluster", "dgx-h100", "--gpus", "8"]
SWEEP = ["sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8,16",
         "--jobs", "1", "--top", "1"]
HAS_DEV_FULL = Path("/dev/full").exists()


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small sweep's results file, for `report`."""
    folder = tmp_path_factory.mktemp("out")
    finished = run_limited(*SWEEP, "-q", "-o", folder / "r.jsonl", cwd=folder)
    assert finished.returncode == 0, finished.stderr
    return folder / "r.jsonl"


def commands(results: Path, folder: Path) -> dict[str, list[object]]:
    """Every command that prints, with what it needs."""
    return {
        "optimize": ["optimize", *PLANNING],
        "optimize --json": ["optimize", *PLANNING, "--json"],
        "estimate": ["estimate", *PLANNING, "--tp", "1"],
        "launch": ["launch", *PLANNING, "--format", "megatron"],
        "launch groups": ["launch", *PLANNING],
        "models": ["models"],
        "models show": ["models", "show", "llama3.2-1b"],
        "clusters": ["clusters", "--json"],
        "serve": ["serve", *PLANNING, "--context", "8k"],
        "report": ["report", results, "-o", folder / "report", "--no-charts"],
        "sweep": [*SWEEP, "-o", folder / "s.jsonl"],
    }


NAMES = ["optimize", "optimize --json", "estimate", "launch", "launch groups", "models",
         "models show", "clusters", "serve", "report", "sweep"]


@pytest.mark.skipif(not HAS_DEV_FULL, reason="no /dev/full")
@pytest.mark.parametrize("name", NAMES)
def test_stdout_on_a_full_device_is_one_line(results: Path, tmp_path: Path, name: str) -> None:
    args = commands(results, tmp_path)[name]
    assert_one_line(run_limited(*args, cwd=tmp_path, stdout="/dev/full"),
                    "cannot write the output (No space left on device)")


@pytest.mark.parametrize("name", ["optimize", "launch groups", "models", "report", "sweep"])
def test_a_closed_pipe_is_one_line(results: Path, tmp_path: Path, name: str) -> None:
    args = commands(results, tmp_path)[name]
    assert_one_line(run_limited(*args, cwd=tmp_path, stdout="pipe-closed"),
                    "cannot write the output (Broken pipe)")


@pytest.mark.parametrize("name", ["optimize --json", "models"])
def test_a_closed_stdout_is_one_line(results: Path, tmp_path: Path, name: str) -> None:
    args = commands(results, tmp_path)[name]
    assert_one_line(run_limited(*args, cwd=tmp_path, stdout="closed"),
                    "cannot write the output (stdout is closed)")


def test_a_closed_stdout_does_not_stop_a_command_that_prints_nothing(tmp_path: Path) -> None:
    finished = run_limited(*SWEEP, "-q", "-o", tmp_path / "r.jsonl", cwd=tmp_path,
                           stdout="closed")
    assert finished.returncode == 0, finished.stderr
    assert len((tmp_path / "r.jsonl").read_text(encoding="utf-8").splitlines()) == 2


# ---- files on a full disk ---------------------------------------------------------------------

@pytest.mark.parametrize("existing", [None, b"the previous launch file\n"])
def test_launch_o_on_a_full_disk_leaves_no_partial_file(tmp_path: Path,
                                                        existing: bytes | None) -> None:
    target = tmp_path / "launch.py"
    if existing is not None:
        target.write_bytes(existing)
    finished = run_limited("launch", *PLANNING, "--format", "torch", "-o", target,
                           cwd=tmp_path, file_bytes=1000)
    assert_one_line(finished, f"-o {target}: cannot write it (File too large)")
    assert (target.read_bytes() if target.exists() else None) == existing
    assert sorted(p.name for p in tmp_path.iterdir()) == (["launch.py"] if existing else [])


def test_a_sweep_on_a_full_disk_gives_its_own_error_once(tmp_path: Path) -> None:
    """Its first line (about 2 kB at --top 1) does not fit: one line naming -o, not a second
    error from closing the file over it, and no torn line left to refuse the rerun."""
    target = tmp_path / "r.jsonl"
    finished = run_limited(*SWEEP, "-q", "-o", target, cwd=tmp_path, file_bytes=1000)
    assert_one_line(finished, f"-o {target}: cannot write the results file (File too large)")
    assert target.read_bytes() == b""
    again = run_limited(*SWEEP, "-q", "-o", target, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert [json.loads(line)["gpus"] for line in target.read_text().splitlines()] == [16, 8]


def test_report_on_a_full_disk_is_one_line_naming_the_folder(results: Path,
                                                             tmp_path: Path) -> None:
    folder = tmp_path / "report"
    finished = run_limited("report", results, "-o", folder, "--no-charts", cwd=tmp_path,
                           file_bytes=100)
    assert_one_line(finished, f"-o {folder}", "File too large")


def test_calibrate_o_on_a_full_disk_leaves_no_partial_file(tmp_path: Path) -> None:
    log = Path(__file__).parent / "data" / "nccl" / \
        "nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt"
    target = tmp_path / "profile.json"
    finished = run_limited("calibrate", "nccl-tests", log, "--cluster", "dgx-h100", "-o",
                           target, cwd=tmp_path, file_bytes=200)
    assert_one_line(finished, f"-o {target}: cannot write it (File too large)")
    assert list(tmp_path.iterdir()) == []


# ---- write_output_file ------------------------------------------------------------------------

def test_write_output_file_replaces_whole_and_keeps_the_mode(tmp_path: Path) -> None:
    target = tmp_path / "settings.sh"
    target.write_text("old\n")
    os.chmod(target, 0o750)
    write_output_file(target, "new\n")
    assert target.read_text() == "new\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o750
    assert [p.name for p in tmp_path.iterdir()] == ["settings.sh"]


def test_write_output_file_gives_a_new_file_the_umask_mode(tmp_path: Path) -> None:
    previous = os.umask(0o027)
    try:
        write_output_file(tmp_path / "new.json", "{}\n")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640


def test_write_output_file_writes_a_device_in_place_not_over_it() -> None:
    write_output_file("/dev/null", "text\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    if HAS_DEV_FULL:
        with pytest.raises(InputError, match=r"-o /dev/full: cannot write it \(No space"):
            write_output_file("/dev/full", "text\n")


def test_write_output_file_into_a_missing_folder_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--report .*missing/x.html: cannot write it"):
        write_output_file(tmp_path / "missing" / "x.html", "", "--report")
