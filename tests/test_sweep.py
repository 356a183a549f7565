"""parplan sweep: the problems of a sweep, the crash-safe results file (a torn last line is cut
off and redone, never duplicated), error lines for bad combinations, and a sweep killed with
SIGKILL and resumed that ends with the same results as an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import list_zoo_names, load_model_spec
from solver.cli import cli
from solver.errors import InputError
from solver.sweep.outcome import SolveSettings, solve_sweep_problem
from solver.sweep.problems import (
    KEY_FIELDS,
    SweepProblem,
    build_sweep_problems,
    expand_names,
    key_of_line,
)
from solver.sweep.results import ResultsFile, read_results

ROOT = Path(__file__).resolve().parent.parent
# Small models (tens of ms a problem), an infeasible one (405B on 8 and 16 GPUs; 70B fits 8
# with the optimizer offloaded), and fp8 on an A100 cluster, which has none: an error line.
SWEEP = ["--models", "llama3.2-1b,llama3.1-405b", "--clusters", "dgx-h100,dgx-a100-80gb",
         "--gpus", "8,16", "--precision", "bf16,fp8", "--top", "2"]
NUM_PROBLEMS = 2 * 2 * 2 * 2


def line_for(model: str, gpus: int, status: str = "infeasible") -> dict:
    problem = SweepProblem(model, "dgx-h100", gpus, 4096, 1024, "bf16")
    return {"status": status, **problem.as_dict(), **SolveSettings().as_line_fields(),
            "plans": []}


def comparable(lines: list[dict]) -> dict:
    """Lines by key, without the one field that may differ between runs (the solve time)."""
    return {key_of_line(line): {k: v for k, v in line.items() if k != "solve_seconds"}
            for line in lines}


def test_expand_names_takes_all_globs_names_and_drops_repeats() -> None:
    zoo = list_zoo_names()
    assert expand_names("--models", ["all"], zoo, load_model_spec) == zoo
    assert expand_names("--models", ["llama3.2*", "llama3.2-1b", "LLAMA3.1-8B"], zoo,
                        load_model_spec) == ["llama3.2-1b", "llama3.2-3b", "llama3.1-8b"]
    with pytest.raises(InputError, match="matches no name"):
        expand_names("--models", ["nothing*"], zoo, load_model_spec)
    with pytest.raises(InputError, match="unknown model 'lama3'"):
        expand_names("--models", ["lama3"], zoo, load_model_spec)


@given(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1),
       st.lists(st.sampled_from([8, 16, 64]), min_size=1),
       st.lists(st.sampled_from([2048, 4096]), min_size=1))
def test_sweep_problems_are_every_combination_once(models, gpus, seq_lens) -> None:
    problems = build_sweep_problems(models, ["x"], gpus, seq_lens, [512], ["bf16"])
    assert len({p.key for p in problems}) == len(problems)
    assert len(problems) == len(set(models)) * len(set(gpus)) * len(set(seq_lens))


@settings(max_examples=50, deadline=None)
@given(num_lines=st.integers(0, 4), cut=st.integers(0, 400))
def test_a_torn_last_line_is_cut_off_and_redone(num_lines: int, cut: int) -> None:
    """Whatever prefix of a line a kill -9 leaves, the complete lines survive, the torn one is
    gone, and the next append makes a valid file with no repeated key. A file holding only a
    torn line is not known to be a results file (issue 37): refused, and left as it was."""
    lines = [line_for("llama3.2-1b", 8 * (i + 1)) for i in range(num_lines)]
    torn = json.dumps(line_for("qwen3-8b", 8)).encode()
    cut = min(cut, len(torn) - 1)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.jsonl"
        path.write_bytes(b"".join(json.dumps(x).encode() + b"\n" for x in lines) + torn[:cut])
        if not lines and cut:
            with pytest.raises(InputError, match="not a results file"):
                ResultsFile(path)
            assert path.read_bytes() == torn[:cut]
            return
        with ResultsFile(path) as results:
            assert results.num_torn_bytes == cut
            assert results.done_keys == {key_of_line(x) for x in lines}
            results.append(line_for("qwen3-8b", 8))
        again, was_torn = read_results(path)
        assert not was_torn
        assert [key_of_line(x) for x in again] == [key_of_line(x) for x in lines + [
            line_for("qwen3-8b", 8)]]


def test_read_results_skips_a_torn_line_without_touching_the_file(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    data = json.dumps(line_for("llama3.2-1b", 8)).encode() + b"\n" + b'{"status": "opt'
    path.write_bytes(data)
    lines, torn = read_results(path)
    assert torn and len(lines) == 1
    assert path.read_bytes() == data


def test_a_foreign_line_is_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(line_for("llama3.2-1b", 8)) + "\nnot json\n")
    with pytest.raises(InputError, match=r"results.jsonl:2: not JSON \(Expecting value"):
        ResultsFile(path)
    path.write_text('{"status": "optimal"}\n')
    with pytest.raises(InputError, match="results.jsonl:1: field 'model': required field is "
                                         "missing"):
        read_results(path)


def test_a_second_writer_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    code = ("import sys; from solver.sweep.results import ResultsFile\n"
            "try:\n    ResultsFile(sys.argv[1])\nexcept Exception as exc:\n    print(exc)")
    with ResultsFile(path):  # a lock belongs to a process: ask from another one
        out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                             text=True, check=True, cwd=ROOT)
    assert "another sweep is writing this file" in out.stdout


def test_bad_combinations_are_error_lines_not_failures() -> None:
    line = solve_sweep_problem(SweepProblem("llama3.2-1b", "dgx-a100-80gb", 8, 4096, 1024,
                                            "fp8"), SolveSettings())
    assert line["status"] == "error" and "no fp8 support" in line["error"]
    assert {name: line[name] for name in KEY_FIELDS}["cluster"] == "dgx-a100-80gb"


def test_a_line_is_the_optimize_json_plus_the_key(tmp_path: Path) -> None:
    line = solve_sweep_problem(SweepProblem("llama3.2-1b", "dgx-h100", 8, 4096, 1024, "bf16"),
                               SolveSettings(top=2))
    result = CliRunner().invoke(cli, ["optimize", "--model", "llama3.2-1b", "--cluster",
                                      "dgx-h100", "--gpus", "8", "--top", "2", "--json"])
    answer = json.loads(result.output)
    # The solve settings (top, time limit, min fit probability) are the line's own.
    assert {k: v for k, v in line.items() if k not in ("solve_seconds", "top",
                                                        "time_limit_seconds",
                                                        "work_limit_seconds",
                                                        "min_fit_probability")} == {
        k: v for k, v in answer.items() if k != "solve_seconds"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    path = tmp_path_factory.mktemp("sweep") / "results.jsonl"
    result = CliRunner().invoke(cli, ["sweep", *SWEEP, "--jobs", "1", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert f"{NUM_PROBLEMS} problems solved" in result.output
    lines, torn = read_results(path)
    assert not torn and len(lines) == NUM_PROBLEMS
    assert {line["status"] for line in lines} == {"optimal", "infeasible", "error"}
    return lines


def test_a_rerun_solves_nothing_again(uninterrupted: list[dict], tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in uninterrupted[:5]))
    result = CliRunner().invoke(cli, ["sweep", *SWEEP, "--jobs", "2", "-o", str(path)])
    assert result.exit_code == 0, result.output
    assert f"{NUM_PROBLEMS - 5} problems solved" in result.output
    assert "5 already there" in result.output
    lines, _ = read_results(path)
    assert len(lines) == NUM_PROBLEMS
    assert comparable(lines) == comparable(uninterrupted)
    again = CliRunner().invoke(cli, ["sweep", *SWEEP, "-o", str(path)])
    assert "0 problems solved" in again.output
    other = CliRunner().invoke(cli, ["sweep", *SWEEP[:-1], "3", "-o", str(path)])
    assert other.exit_code == 2 and "solved with engine layout, top 2" in other.output


def test_a_sweep_killed_mid_run_resumes_to_the_same_results(uninterrupted: list[dict],
                                                            tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "solver", "sweep", *SWEEP, "--jobs", "2", "-o", str(path)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= 3:
            break
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    process.wait()
    written = path.read_bytes().count(b"\n")
    assert written < NUM_PROBLEMS, "the sweep finished before it could be killed"
    # The workers notice that their parent is gone and leave (no orphan keeps a core busy).
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("worker processes outlived the killed sweep")
    result = CliRunner().invoke(cli, ["sweep", *SWEEP, "--jobs", "2", "-o", str(path)])
    assert result.exit_code == 0, result.output
    lines, torn = read_results(path)
    assert not torn and len(lines) == NUM_PROBLEMS  # nothing lost, nothing twice
    assert comparable(lines) == comparable(uninterrupted)


def test_bad_sweep_options_are_one_line_and_exit_2(tmp_path: Path) -> None:
    out = str(tmp_path / "r.jsonl")
    for args, message in [
        (["--models", "nothing*", "--clusters", "dgx-h100", "--gpus", "8"], "matches no name"),
        (["--models", "llama3.2-1b", "--clusters", "nope", "--gpus", "8"], "unknown cluster"),
        (["--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "0"], "positive"),
        (["--models", "llama3.2-1b", "--clusters", "dgx-h100", "--gpus", "8", "--precision",
          "fp4"], "precision"),
    ]:
        result = CliRunner().invoke(cli, ["sweep", *args, "-o", out])
        assert result.exit_code == 2, result.output
        assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_ray_missing_is_one_line_and_exit_2(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    result = CliRunner().invoke(cli, ["sweep", "--models", "llama3.2-1b", "--clusters",
                                      "dgx-h100", "--gpus", "8", "--executor", "ray", "-o",
                                      str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: --executor ray: ray is not installed "
                                     "(pip install 'parplan[ray]')")


def test_an_unexpected_failure_is_not_written_and_the_sweep_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import solver.sweep.outcome as outcome

    solve = outcome.solve_sweep_problem

    def broken(problem: SweepProblem, settings: SolveSettings) -> dict:
        if problem.gpus == 16:
            raise RuntimeError("a bug")
        return solve(problem, settings)

    monkeypatch.setattr(outcome, "solve_sweep_problem", broken)
    path = tmp_path / "r.jsonl"
    result = CliRunner().invoke(cli, ["sweep", "--models", "llama3.2-1b", "--clusters",
                                      "dgx-h100", "--gpus", "8,16", "--jobs", "1", "-o",
                                      str(path)])
    assert result.exit_code == 2
    assert ("error: 1 problem(s) failed unexpectedly and were not written (first: llama3.2-1b "
            "on 16 x dgx-h100 (seq 4096, batch 1024, bf16, megatron): RuntimeError: a bug)"
            in result.output)
    lines, _ = read_results(path)
    assert [line["gpus"] for line in lines] == [8]


def test_a_sweep_takes_a_release_profile_as_optimize_does() -> None:
    """`sweep --framework megatron-bridge@26.02` solves each problem under the release's
    features for its model and precision (solver.spec.profiles.resolve_profile), exactly as
    `optimize --framework megatron-bridge@26.02` does; the line keeps the name given and
    its launch line names the profile, so launch writes the features the plan was costed
    with."""
    from solver.sweep.report_data import render_launch_line

    problem = SweepProblem("qwen3-30b-a3b", "dgx-h100", 16, 4096, 1024, "bf16",
                           framework="megatron-bridge@26.02")
    line = solve_sweep_problem(problem, SolveSettings(top=2))
    result = CliRunner().invoke(cli, ["optimize", "--model", "qwen3-30b-a3b", "--cluster",
                                      "dgx-h100", "--gpus", "16", "--top", "2", "--json",
                                      "--framework", "megatron-bridge@26.02"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert line["framework"] == "megatron-bridge@26.02"
    assert line["framework_profile"] == answer["framework_profile"]
    assert answer["framework_profile"]["sources"]["moe_dispatcher"].startswith(
        "Megatron-Bridge 26.02")
    assert line["plans"] == answer["plans"]
    launch = render_launch_line(line, line["plans"][0])
    assert launch.endswith("--format megatron --framework megatron-bridge@26.02")
    plain = solve_sweep_problem(SweepProblem("qwen3-30b-a3b", "dgx-h100", 16, 4096, 1024,
                                             "bf16"), SolveSettings(top=2))
    assert render_launch_line(plain, plain["plans"][0]).endswith("--format megatron")
    assert plain["plans"][0]["step_seconds"] != line["plans"][0]["step_seconds"]


def test_estimate_plan_reproduces_a_release_profile_line(tmp_path: Path) -> None:
    """A sweep line solved under megatron-bridge@26.02 names the profile as its framework;
    `estimate --plan LINE` reads it as the framework the profile runs, with the line's
    features, and gives the plan's step time back."""
    problem = SweepProblem("qwen3-30b-a3b", "dgx-h100", 16, 4096, 1024, "bf16",
                           framework="megatron-bridge@26.02")
    line = solve_sweep_problem(problem, SolveSettings(top=1))
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(line) + "\n")
    result = CliRunner().invoke(cli, ["estimate", "--plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    step = json.loads(result.output)["plans"][0]["step_seconds"]
    assert step == pytest.approx(line["plans"][0]["step_seconds"], rel=1e-9)
