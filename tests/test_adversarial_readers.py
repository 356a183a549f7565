"""Every reader of a hand-editable file validates what it reads (issue 37, item 4): each
reproducer of the adversarial pass is answered with one stderr line naming the file (and the
line and field where there is one), exit 2, no traceback.

- `report` on a results line whose optional fields have the wrong type or hold NaN/Infinity
  (why, optimality_gap, layout, time_seconds, equivalent, memory_savers, usable_memory_gb, ...)
  gave tracebacks after summary.csv and summary.md were written: now refused before any file
  is written;
- an unreadable results file (/proc/self/mem: EIO on read) gave an OSError traceback;
- duplicate keys in a JSON input (plan file, calibration profile, Hugging Face config.json,
  results line) were read as the last one;
- duplicate tier names in a cluster file were accepted;
- nccl-tests rows flagged `#wrong` and bus bandwidths no GPU of the cluster can reach were
  fitted;
- `serve --kv-cache-dtype fp4` on H100 was planned, though Hopper keeps no FP4 KV cache.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from bad_input import NCCL_LOG, ROOT, assert_ok, assert_one_line_error, invoke
from solver.catalog import load_cluster_spec


@pytest.fixture(scope="module")
def optimized() -> dict:
    """`optimize --json` of mixtral-8x7b on 16 GPUs: a plan with a layout, memory savers and
    recompute modules, as a sweep writes it into a results line."""
    result = invoke("optimize", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus",
                    "16", "--top", "2", "--json")
    assert_ok(result)
    return json.loads(result.stdout)


# (where, value): a line-level key, or `plans.0.KEY`, set to a value the report cannot show.
BAD_OPTIONAL_FIELDS = [
    ("why", 5), ("why", "one string"), ("why", [1]), ("why", math.nan),
    ("optimality_gap", "x"), ("optimality_gap", math.nan), ("optimality_gap", math.inf),
    ("optimality_gap", -1.0), ("optimality_gap", [0.0]),
    ("rules", [1]), ("rules", {"a": 1}), ("memory_headroom", 5),
    ("plans.0.layout", "x"), ("plans.0.layout", 5), ("plans.0.layout", {"syntax": 5}),
    ("plans.0.time_seconds", [1.0]), ("plans.0.time_seconds", {"compute": math.nan}),
    ("plans.0.time_seconds", {"compute": "x"}), ("plans.0.time_seconds", 5),
    ("plans.0.time_seconds", {"compute": math.inf}),
    ("plans.0.equivalent", "x"), ("plans.0.equivalent", [5]),
    ("plans.0.equivalent", [{"recompute": 5}]),
    ("plans.0.memory_savers", "abc"), ("plans.0.memory_savers", [5]),
    # The launch line writes `--` + each name: "model=x" would be another --model.
    ("plans.0.memory_savers", ["model=x"]), ("plans.0.offloads", ["format=vllm"]),
    ("plans.0.recompute_modules", ["core_attn --trust"]),
    ("plans.0.offloads", "optimizer"), ("plans.0.recompute_modules", 5),
    ("plans.0.usable_memory_gb", "x"), ("plans.0.usable_memory_gb", math.nan),
    ("plans.0.usable_memory_gb", math.inf), ("plans.0.usable_memory_gb", -1.0),
]


def results_file(folder: Path, optimized: dict, where: str, value: object) -> Path:
    """A results file of three lines whose second has `where` set to `value`."""
    line = json.loads(json.dumps(optimized))
    target, key = (line["plans"][0], where.split(".")[-1]) if where.startswith("plans.") \
        else (line, where)
    target[key] = value
    other = {**optimized, "gpus": 32}
    path = folder / "results.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in (optimized, line, other)),
                    encoding="utf-8")
    return path


@pytest.mark.parametrize(("where", "value"), BAD_OPTIONAL_FIELDS,
                         ids=[f"{w}={v!r}" for w, v in BAD_OPTIONAL_FIELDS])
def test_report_refuses_a_bad_optional_field_before_writing_anything(
        tmp_path: Path, optimized: dict, where: str, value: object) -> None:
    path = results_file(tmp_path, optimized, where, value)
    out = tmp_path / "report"
    result = invoke("report", path, "-o", out, "--no-plots")
    field = where.split(".")[-1]
    assert_one_line_error(result, f"{path}:2", field)
    assert not (out / "summary.csv").exists() and not (out / "summary.md").exists()


def test_report_takes_the_optional_fields_as_optimize_writes_them(tmp_path: Path,
                                                                  optimized: dict) -> None:
    """The control: the same line unchanged (and with the optional fields null) reports."""
    line = json.loads(json.dumps(optimized))
    for key in ("why", "rules", "optimality_gap", "memory_headroom"):
        line[key] = None
    for key in ("layout", "time_seconds", "equivalent", "memory_savers", "usable_memory_gb"):
        line["plans"][1][key] = None
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(optimized) + "\n" + json.dumps({**line, "gpus": 32}) + "\n",
                    encoding="utf-8")
    assert_ok(invoke("report", path, "-o", tmp_path / "report", "--no-plots"))
    assert (tmp_path / "report" / "summary.csv").exists()


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="no /proc")
def test_an_unreadable_results_file_is_one_line() -> None:
    """/proc/self/mem is a regular file whose read fails (EIO at offset 0)."""
    assert_one_line_error(invoke("report", "/proc/self/mem", "-o", "unused-report"),
                          "/proc/self/mem", "cannot read")


# ---- duplicate keys in JSON ------------------------------------------------------------------

def with_duplicate_key(text: str, key: str) -> str:
    """`text` (JSON) with the first `"key": value` pair written twice (the copy first, with
    another value where the reader would notice)."""
    match = re.search(rf'"{re.escape(key)}": ([^,\n{{}}\[\]]+)', text)
    assert match is not None, key
    return text[:match.start()] + f'"{key}": 12345, ' + text[match.start():]


def test_a_duplicate_key_in_a_plan_file_is_one_line(tmp_path: Path, optimized: dict) -> None:
    path = tmp_path / "plan.json"
    path.write_text(with_duplicate_key(json.dumps(optimized), "tp"), encoding="utf-8")
    assert_one_line_error(invoke("launch", "--model", "mixtral-8x7b", "--cluster", "dgx-h100",
                                 "--gpus", "16", "--plan", path), str(path), "'tp' appears twice")


def test_a_duplicate_key_in_a_hugging_face_config_is_one_line(tmp_path: Path) -> None:
    source = ROOT / "tests" / "data" / "hf_configs" / "mixtral-8x7b-v0.1.json"
    path = tmp_path / "mixtral" / "config.json"
    path.parent.mkdir()
    path.write_text(with_duplicate_key(source.read_text(encoding="utf-8"), "num_hidden_layers"),
                    encoding="utf-8")
    assert_one_line_error(invoke("models", "show", path), str(path),
                          "'num_hidden_layers' appears twice")


def test_a_duplicate_key_in_a_calibration_profile_is_one_line(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    assert_ok(invoke("calibrate", "nccl-tests", NCCL_LOG, "--cluster", "dgx-h100", "-o",
                     profile))
    profile.write_text(with_duplicate_key(profile.read_text(encoding="utf-8"), "num_ranks"),
                       encoding="utf-8")
    assert_one_line_error(invoke("estimate", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                 "--gpus", "8", "--calibration", profile), str(profile),
                          "'num_ranks' appears twice")


def test_a_duplicate_key_in_a_results_line_is_one_line(tmp_path: Path, optimized: dict) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(optimized) + "\n" + with_duplicate_key(
        json.dumps({**optimized, "gpus": 32}), "gpus") + "\n", encoding="utf-8")
    assert_one_line_error(invoke("report", path, "-o", tmp_path / "report", "--no-plots"),
                          f"{path}:2", "'gpus' appears twice")
    assert not (tmp_path / "report" / "summary.csv").exists()


# ---- cluster files: duplicate tier names -----------------------------------------------------

def test_duplicate_tier_names_are_one_line(tmp_path: Path) -> None:
    text = (ROOT / "clusters" / "presets" / "dgx-h100.toml").read_text(encoding="utf-8")
    text = text.replace('name = "fabric"', 'name = "nvlink"')
    path = tmp_path / "twice.toml"
    path.write_text(text, encoding="utf-8")
    assert_one_line_error(invoke("estimate", "--model", "llama3.2-1b", "--cluster", path,
                                 "--gpus", "8"), str(path), "tiers",
                          "'nvlink' names more than one tier")


# ---- nccl-tests: #wrong and impossible bandwidths --------------------------------------------

NCCL_LINES = NCCL_LOG.read_text(encoding="utf-8").splitlines()
ROW = next(i for i, line in enumerate(NCCL_LINES) if line.split()[:1] == ["1048576"])


def nccl_log_with(tmp_path: Path, column: int, value: str) -> Path:
    """The DGX H100 log with field `column` of the 1 MiB row set to `value` (columns: size
    count type redop root time algbw busbw #wrong time algbw busbw #wrong)."""
    fields = NCCL_LINES[ROW].split()
    fields[column] = value
    lines = list(NCCL_LINES)
    lines[ROW] = "  ".join(fields)
    path = tmp_path / "all_reduce_edited.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize(("column", "half"), [(8, "out-of-place"), (12, "in-place")])
def test_an_nccl_tests_row_with_wrong_elements_is_refused(tmp_path: Path, column: int,
                                                          half: str) -> None:
    path = nccl_log_with(tmp_path, column, "3")
    assert_one_line_error(invoke("calibrate", "nccl-tests", path, "--cluster", "dgx-h100",
                                 "-o", tmp_path / "p.json"),
                          str(path), f"line {ROW + 1}", f"'#wrong' ({half}) is 3")
    assert not (tmp_path / "p.json").exists()


def test_the_old_formats_error_column_is_a_deviation_not_a_count(tmp_path: Path) -> None:
    """ABCI's pre-2.13 log prints `error` 5e-07 (SHARP's reduction order): still fitted."""
    log = ROOT / "tests" / "data" / "nccl" / "abci_a100_2node_ib_hdr_sharp_all_reduce_oldformat.txt"
    assert re.search(r"\s5e-07\s", log.read_text(encoding="utf-8"))
    assert_ok(invoke("calibrate", "nccl-tests", log, "--cluster", "dgx-a100-40gb", "-o",
                     tmp_path / "abci.json"))


def test_the_bus_bandwidth_bound_is_twice_the_fastest_link() -> None:
    """H100 SXM: NVLink 450 GB/s per direction (datasheet: 900 bidirectional) -> 900 GB/s; the
    real DGX H100 NVLS all-reduce peaks at 479.9 GB/s (tests/data/nccl/README.md), the 2-node
    p5 one at 480.9, both inside it."""
    from solver.calibrate.nccl_tests import find_bus_bandwidth_bound

    assert find_bus_bandwidth_bound(load_cluster_spec("dgx-h100")) == 900.0
    assert find_bus_bandwidth_bound(load_cluster_spec("dgx-a100-40gb")) == 600.0


@pytest.mark.parametrize(("column", "value"), [(7, "901"), (7, "1e6"), (11, "5000")])
def test_an_impossible_bus_bandwidth_is_refused(tmp_path: Path, column: int,
                                                value: str) -> None:
    path = nccl_log_with(tmp_path, column, value)
    assert_one_line_error(invoke("calibrate", "nccl-tests", path, "--cluster", "dgx-h100",
                                 "-o", tmp_path / "p.json"),
                          str(path), f"line {ROW + 1}", "field 'busbw'", "900 GB/s")


def test_the_real_logs_stay_within_the_bound(tmp_path: Path) -> None:
    for name, cluster in (("nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt", "dgx-h100"),
                          ("gcp_a3mega_h100_2node_tcpxo_all_reduce.txt", "dgx-h100")):
        assert_ok(invoke("calibrate", "nccl-tests", ROOT / "tests" / "data" / "nccl" / name,
                         "--cluster", cluster, "-o", tmp_path / f"{name}.json"))


# ---- serve: length files ---------------------------------------------------------------------

@pytest.mark.parametrize("value", ["²", "½", "٣", "1e3", "0x10"])
def test_a_length_that_is_not_ascii_digits_is_one_line(tmp_path: Path, value: str) -> None:
    """"²" passed str.isdigit() and then failed in int() (ValueError's own words)."""
    path = tmp_path / "lengths.txt"
    path.write_text(f"100\n{value}\n", encoding="utf-8")
    assert_one_line_error(invoke("serve", "--model", "llama3.2-1b", "--cluster", "dgx-h100",
                                 "--gpus", "8", "--context", "8k", "--input-len", f"@{path}"),
                          str(path), "line 2", "not a whole number of tokens")


# ---- serve: no FP4 KV cache on Hopper --------------------------------------------------------

@pytest.mark.parametrize("cluster", ["dgx-h100", "dgx-h200", "dgx-a100-40gb"])
def test_an_fp4_kv_cache_is_refused_below_blackwell(cluster: str) -> None:
    """Llama-3.1-8B (head size 128) on H100 was planned with `--kv-cache-dtype nvfp4`."""
    result = invoke("serve", "--model", "llama3.1-8b", "--cluster", cluster, "--gpus", "8",
                    "--context", "8k", "--kv-cache-dtype", "fp4", "--json")
    assert_ok(result)
    answer = json.loads(result.stdout)
    assert answer["status"] == "infeasible"
    assert answer["conflicts"] == ["nvfp4_kv_cache_supported"]
    assert "has no FP4" in answer["rules"]["nvfp4_kv_cache_supported"]
    assert "--kv-cache-dtype fp8" in answer["fixes"]
