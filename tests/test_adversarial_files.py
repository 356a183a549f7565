"""Issue 37, data loss: `parplan sweep -o FILE` never changes a file before it is known to be
a results file. Reproduced as filed: `printf '{"my": "config"}' > conf.json; parplan sweep
--models llama3.2-1b --clusters dgx-h100 --gpus 8 -o conf.json` cut conf.json to its last
newline (none: 0 bytes) and fsync'd it before checking it, then replaced it by results; a .gz
was left corrupt (ResultsFile._cut_torn_line). Now every line is read and checked first, a
file is ours only when it holds a results line, a torn last line is cut (and a complete last
line's missing newline written) only at the first append, and a complete last line without
its newline is read, not skipped (solver/sweep/results.py)."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bad_input import assert_one_line_error, invoke
from solver.errors import InputError
from solver.sweep.outcome import SolveSettings
from solver.sweep.problems import SweepProblem, key_of_line
from solver.sweep.results import ResultsFile, read_results

SWEEP = ["sweep", "--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8", "--jobs",
         "1", "-q"]
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


def results_line(model: str = "llama3.2-1b", gpus: int = 8) -> dict:
    """A results line as `parplan sweep` writes one (an infeasible problem: no plans)."""
    problem = SweepProblem(model, "dgx-h100", gpus, 4096, 1024, "bf16")
    return {"status": "infeasible", **problem.as_dict(), **SolveSettings().as_line_fields(),
            "plans": []}


def encoded(line: dict) -> bytes:
    return json.dumps(line, separators=(",", ":")).encode()


@pytest.mark.parametrize("content", [
    b'{"my": "config"}',  # the conf.json: one JSON object, no final newline
    b'{"my": "config"}\n',
    b"some notes\nwithout a final newline",
    gzip.compress(b'{"a": 1}\n' * 50, mtime=0),  # a .gz holds newlines at random places
    b"\n\n",  # blank lines: no results line, so not known to be ours
], ids=["json-no-newline", "json", "text", "gzip", "blank-lines"])
def test_a_sweep_on_a_file_that_is_not_a_results_file_leaves_it_byte_identical(
        tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "conf.json"
    path.write_bytes(content)
    assert_one_line_error(invoke(*SWEEP, "-o", path), str(path), "left as it was")
    assert path.read_bytes() == content


@PROPERTY
@given(content=st.binary(min_size=1, max_size=2000))
def test_any_bytes_that_are_not_a_results_file_are_refused_and_left_as_they_were(
        content: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.jsonl"
        path.write_bytes(content)
        with pytest.raises(InputError, match="results"):
            ResultsFile(path)
        assert path.read_bytes() == content


@PROPERTY
@given(num_lines=st.integers(1, 3), tail=st.binary(max_size=300))
def test_opening_a_results_file_changes_nothing_until_the_first_append(
        num_lines: int, tail: bytes) -> None:
    """Results lines followed by any bytes: refused, or opened; either way the file is the same
    bytes until a line is appended (a refused resume, e.g. other solve settings, leaves it)."""
    lines = [results_line(gpus=8 * (i + 1)) for i in range(num_lines)]
    content = b"".join(encoded(line) + b"\n" for line in lines) + tail
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.jsonl"
        path.write_bytes(content)
        try:
            with ResultsFile(path) as results:
                assert results.done_keys >= {key_of_line(line) for line in lines}
                with pytest.raises(InputError, match="solved with"):
                    results.check_settings({"top": 99})
        except InputError:
            pass
        assert path.read_bytes() == content


def test_a_complete_last_line_without_its_newline_is_read_not_skipped(tmp_path: Path) -> None:
    first, last = results_line(gpus=8), results_line(gpus=16)
    path = tmp_path / "results.jsonl"
    content = encoded(first) + b"\n" + encoded(last)
    path.write_bytes(content)
    lines, torn = read_results(path)
    assert [key_of_line(x) for x in lines] == [key_of_line(first), key_of_line(last)]
    assert not torn and path.read_bytes() == content
    with ResultsFile(path) as results:
        assert results.done_keys == {key_of_line(first), key_of_line(last)}
        assert results.num_torn_bytes == 0
        assert path.read_bytes() == content
        results.append(results_line(gpus=32))
    assert path.read_bytes() == content + b"\n" + encoded(results_line(gpus=32)) + b"\n"
    assert [line["gpus"] for line in read_results(path)[0]] == [8, 16, 32]


def test_a_complete_last_line_that_is_bad_is_refused_not_cut(tmp_path: Path) -> None:
    """A last line that is whole JSON but no results line (hand-edited) is an error naming it,
    not a torn line to cut off."""
    path = tmp_path / "results.jsonl"
    content = encoded(results_line()) + b"\n" + b'{"status": "optimal"}'
    path.write_bytes(content)
    with pytest.raises(InputError, match=r"results.jsonl:2: field 'model'"):
        ResultsFile(path)
    assert path.read_bytes() == content


def test_a_resume_with_other_settings_leaves_a_torn_file_as_it_was(tmp_path: Path) -> None:
    """Through the CLI: the torn line is cut only when a line is written, and the refusal (here
    --top 3 against the default 5 in the file) comes before any."""
    path = tmp_path / "results.jsonl"
    content = encoded(results_line(gpus=16)) + b"\n" + b'{"status":"opt'
    path.write_bytes(content)
    assert_one_line_error(invoke(*SWEEP, "--top", "3", "-o", path), "solved with")
    assert path.read_bytes() == content
