"""`parplan calibrate nccl-tests` and `--calibration` through click's CliRunner: the profile
and fit table, bad logs and bad profiles (one stderr line, exit 2), what `estimate` reports, and
the plan changing for the right reason when the measured fabric gets 10x slower."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from solver.api import estimate
from solver.calibrate.profile import load_profile
from solver.cli import cli

DATA = Path(__file__).resolve().parent / "data" / "nccl"
DGX = str(DATA / "nvidia_dgxc_dgx_h100_1node_nvls_all_reduce.txt")
GCP = str(DATA / "gcp_a3mega_h100_2node_tcpxo_all_reduce.txt")
AWS = str(DATA / "aws_p5_h100_2node_efa_all_reduce_tagged.txt")
ABCI = str(DATA / "abci_a100_2node_ib_hdr_sharp_all_reduce_oldformat.txt")


def invoke(*args: str):
    return CliRunner().invoke(cli, list(args))


def assert_one_line_error(result, *needles: str) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "Traceback" not in result.output


@pytest.fixture(scope="module")
def profile_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dgx-h100 calibrated with the DGX H100 NVLink log and the p5 2-node EFA log."""
    path = tmp_path_factory.mktemp("calibration") / "dgx-h100.json"
    result = invoke("calibrate", "nccl-tests", DGX, AWS, "--cluster", "dgx-h100",
                    "--ranks", "16", "--nodes", "2", "-o", str(path))
    assert result.exit_code == 0, result.output
    return path


def test_writes_a_profile_and_prints_the_fit(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    result = invoke("calibrate", "nccl-tests", DGX, AWS, "--cluster", "dgx-h100",
                    "--ranks", "16", "--nodes", "2", "-o", str(path))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "nvlink all_reduce: 8 ranks on 1 node(s)" in out
    assert "fabric all_reduce: 16 ranks on 2 node(s)" in out
    for column in ("size", "busbw GB/s", "fitted GB/s", "residual"):
        assert column in out
    assert "16 GiB" in out and "62,636 " in out  # the DGX log's largest row
    assert "per GPU on the tier" in out and f"wrote {path}" in out
    profile = load_profile(path)
    assert profile.cluster == "dgx-h100" and profile.method == "nccl-tests"
    assert set(profile.tiers) == {"nvlink", "fabric"}
    fabric = profile.tiers["fabric"]["all_reduce"]
    assert (fabric.num_ranks, fabric.num_nodes, fabric.num_domains) == (16, 2, 2)
    assert len(fabric.measured) == 32 and fabric.source == AWS


def test_json_fit_report(tmp_path: Path) -> None:
    result = invoke("calibrate", "nccl-tests", GCP, "--cluster", "dgx-h100", "-o",
                    str(tmp_path / "p.json"), "--json")
    assert result.exit_code == 0, result.output
    (curve,) = json.loads(result.stdout)["curves"]
    assert (curve["tier"], curve["collective"], curve["num_ranks"]) == ("fabric", "all_reduce", 16)
    assert curve["worst_residual_1mib"] < 0.10
    assert curve["latency_us"] == pytest.approx(123, rel=0.02)
    assert len(curve["points"]) == 31 and any(p["knot"] for p in curve["points"])


def test_tier_option_and_an_old_format_log(tmp_path: Path) -> None:
    path = tmp_path / "a100.json"
    result = invoke("calibrate", "nccl-tests", ABCI, "--cluster", "dgx-a100-40gb",
                    "--tier", "fabric", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert list(load_profile(path).tiers) == ["fabric"]


@pytest.mark.parametrize(("args", "needles"), [
    ([GCP, ABCI], ["all_reduce on tier 'fabric' is already measured by", GCP]),
    ([AWS], [AWS, "pass --ranks and --nodes"]),
    ([DGX, "--tier", "ib"], ["--tier (ib): cluster 'dgx-h100' has the tiers nvlink, fabric"]),
    ([DGX, "--cluster", "no-such"], ["unknown cluster 'no-such'"]),
    (["missing.txt"], ["missing.txt: cannot read file"]),
    ([AWS, "--ranks", "8", "--nodes", "1"], ["busbw / algbw is 1.875", "check --ranks"]),
])
def test_bad_calibration_input_is_one_line(tmp_path: Path, args: list[str],
                                           needles: list[str]) -> None:
    cluster = [] if "--cluster" in args else ["--cluster", "dgx-h100"]
    result = invoke("calibrate", "nccl-tests", *args, *cluster, "-o", str(tmp_path / "p.json"))
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda lines: lines[:30] + [lines[30][:50] + "\n"], "line 31: a result row needs 13 fields"),
    (lambda lines: lines[:26] + [lines[26].replace("0.91", "n/a", 1)] + lines[27:],
     "line 27: field 'algbw' (out-of-place) is 'n/a', not a number"),
    (lambda lines: [line for line in lines if "size" not in line],
     "no nccl-tests result table found"),
])
def test_malformed_logs_exit_2_with_file_and_line(tmp_path: Path, edit, needle: str) -> None:
    log = tmp_path / "dgx_all_reduce.txt"
    lines = Path(DGX).read_text(encoding="utf-8").splitlines(keepends=True)
    log.write_text("".join(edit(lines)), encoding="utf-8")
    result = invoke("calibrate", "nccl-tests", str(log), "--cluster", "dgx-h100", "-o",
                    str(tmp_path / "p.json"))
    assert_one_line_error(result, str(log), needle)


@pytest.mark.parametrize(("args", "needle"), [
    (["--min-bytes", "0"], "--min-bytes"),
    (["--min-bytes", "1M", "--max-bytes", "1K"], "--min-bytes (1048576) <= --max-bytes (1024)"),
    (["--min-bytes", "1K", "--max-bytes", "1K"], "gives one message size"),
    (["--max-bytes", "lots"], "'lots' is not a size in bytes"),
])
def test_run_rejects_bad_sizes_before_starting(tmp_path: Path, args: list[str],
                                               needle: str) -> None:
    result = invoke("calibrate", "run", "--cluster", "dgx-h100", "-o", str(tmp_path / "p.json"),
                    *args)
    assert_one_line_error(result, needle)


# ---- --calibration on estimate --------------------------------------------------------------


def estimate_args(profile: Path | str, *more: str) -> list[str]:
    return ["estimate", "--model", "llama3.1-70b", "--cluster", "dgx-h100", "--gpus", "64",
            "--tp", "8", "--calibration", str(profile), *more]


def test_estimate_says_which_bandwidths_are_measured(profile_path: Path) -> None:
    result = invoke(*estimate_args(profile_path))
    assert result.exit_code == 0, result.output
    assert f"bandwidths (calibration {profile_path})" in result.stdout
    assert "measured (all_reduce curve)" in result.stdout
    as_json = invoke(*estimate_args(profile_path, "--json"))
    answer = json.loads(as_json.stdout)
    rows = {(r["tier"], r["collective"]): r for r in answer["calibration"]["bandwidths"]}
    assert answer["calibration"]["file"] == str(profile_path)
    assert rows["fabric", "all_reduce"]["source"] == "measured"
    assert rows["fabric", "all_reduce"]["plateau_rate_gb_per_s"] == pytest.approx(32.1, rel=0.02)
    assert rows["nvlink", "reduce_scatter"]["measured_as"] == "all_reduce"
    preset = json.loads(invoke(*estimate_args(profile_path, "--json")[:-3], "--json").stdout)
    assert "calibration" not in preset
    assert preset["plans"][0]["time_seconds"]["dp"] != answer["plans"][0]["time_seconds"]["dp"]


def test_partial_profile_keeps_the_preset_elsewhere(tmp_path: Path) -> None:
    path = tmp_path / "fabric-only.json"
    assert invoke("calibrate", "nccl-tests", GCP, "--cluster", "dgx-h100", "-o",
                  str(path)).exit_code == 0
    answer = json.loads(invoke(*estimate_args(path, "--json")).stdout)
    rows = {(r["tier"], r["collective"]): r for r in answer["calibration"]["bandwidths"]}
    assert rows["nvlink", "all_reduce"] == {"tier": "nvlink", "collective": "all_reduce",
                                            "source": "preset", "measured_as": None,
                                            "bandwidth_gb_per_s": 360.0}


def edited(profile_path: Path, tmp_path: Path, edit) -> Path:
    data = json.loads(profile_path.read_text(encoding="utf-8"))
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _set(data: dict[str, Any], **values: Any) -> None:
    data.update(values)


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda d: _set(d, cluster="dgx-a100-80gb"),
     "the profile was fitted for cluster 'dgx-a100-80gb', not 'dgx-h100'"),
    (lambda d: d["tiers"].update(ib=d["tiers"].pop("fabric")),
     "tier 'ib' is not a tier of cluster 'dgx-h100' (nvlink, fabric)"),
    (lambda d: _set(d, bandwidth=1), "field 'bandwidth': unknown field"),
    (lambda d: d["tiers"]["fabric"].update(allreduce=d["tiers"]["fabric"].pop("all_reduce")),
     "field 'tiers.fabric.allreduce.[key]': Input should be 'all_reduce'"),
    (lambda d: d["tiers"]["fabric"]["all_reduce"]["knots"].reverse(),
     "size_bytes must increase strictly"),
    (lambda d: d["tiers"]["nvlink"]["all_reduce"]["knots"][3].update(time_us=-1),
     "field 'tiers.nvlink.all_reduce.knots.3.time_us'"),
    (lambda d: _set(d, tiers={}), "the profile holds no curve"),
    (lambda d: _set(d, format="parplan-calibration/9"), "field 'format'"),
])
def test_bad_profiles_are_one_line_exit_2(profile_path: Path, tmp_path: Path, edit,
                                          needle: str) -> None:
    path = edited(profile_path, tmp_path, edit)
    assert_one_line_error(invoke(*estimate_args(path)), f"--calibration ({path})", needle)


def test_unreadable_profiles_are_one_line_exit_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"cluster": "dgx-h100", ', encoding="utf-8")
    assert_one_line_error(invoke(*estimate_args(broken)), f"--calibration ({broken})",
                          "not valid JSON")
    assert_one_line_error(invoke(*estimate_args(tmp_path / "none.json")),
                          "--calibration (", "cannot read file")


# ---- the plan changes for the right reason ------------------------------------------------


def cut_fabric(profile_path: Path, tmp_path: Path, factor: float) -> Path:
    """The same profile with every fabric segment `factor` times slower (latency kept)."""
    def edit(data: dict[str, Any]) -> None:
        for curve in data["tiers"]["fabric"].values():
            floor = curve["knots"][0]["time_us"]
            for knot in curve["knots"]:
                knot["time_us"] = floor + factor * (knot["time_us"] - floor)
    return edited(profile_path, tmp_path, edit)


def step(calibration: Path, **degrees: Any):
    result = estimate("llama3.1-70b", "dgx-h100", 64, seq_len=8192, global_batch=128,
                      calibration=str(calibration), micro_batch=1, recompute="full", zero=1,
                      **degrees)
    assert result.plan.fits
    assert result.plan.time is not None
    return result.plan.time


def test_cutting_the_fabric_10x_flips_dp_across_nodes_against_pp_across_nodes(
        profile_path: Path, tmp_path: Path) -> None:
    """Llama 3.1 70B on 64 H100s, TP = 8 in each node. Across the 8 nodes either DP = 8 (the
    distributed optimizer's reduce-scatter and all-gather of the gradients and weights cross
    the fabric once per step, one rank per node on each NIC) or PP = 8 (only the activations of
    every micro-batch cross it, and a pipeline bubble is paid). On the measured p5 fabric DP
    wins; with the fabric curve 10x slower DP's exposed sync outgrows the bubble and PP wins.
    What grew is the exposed `dp` time; compute and TP did not move."""
    slow = cut_fabric(profile_path, tmp_path, 10.0)
    dp_fast, pp_fast = step(profile_path, tp=8), step(profile_path, tp=8, pp=8)
    dp_slow, pp_slow = step(slow, tp=8), step(slow, tp=8, pp=8)

    assert dp_fast.step_seconds < pp_fast.step_seconds
    assert dp_slow.step_seconds > pp_slow.step_seconds

    grown = {k: dp_slow.time_seconds[k] - dp_fast.time_seconds[k] for k in dp_fast.time_seconds}
    assert max(grown, key=grown.get) == "dp"
    assert dp_slow.time_seconds["dp"] > 10 * dp_fast.time_seconds["dp"]
    for part in ("compute", "recompute", "tp", "bubble", "optimizer"):
        assert abs(grown[part]) < 0.01 * grown["dp"], part
    # PP has no DP group to sync (dp = 1); only its activation sends cross the fabric, and
    # they grow far less than DP's sync.
    assert pp_fast.time_seconds["dp"] == pytest.approx(pp_slow.time_seconds["dp"])
    pp_grown = pp_slow.step_seconds - pp_fast.step_seconds
    assert pp_slow.time_seconds["pp"] - pp_fast.time_seconds["pp"] == pytest.approx(pp_grown)
    assert pp_grown < grown["dp"] / 3
