"""`parplan calibrate run` for real: torchrun starts 2 local processes on the gloo backend,
each emulating a node (--ranks-per-node 1), so the group spans 2 "nodes" and lands on the
fabric tier; rank 0 writes a profile that `estimate --calibration` then loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from solver.calibrate.bench import build_sizes
from solver.calibrate.profile import load_profile
from solver.cli import cli
from solver.errors import InputError

ROOT = Path(__file__).resolve().parent.parent


def test_message_sizes() -> None:
    assert build_sizes(1024, 8192) == [1024, 2048, 4096, 8192]
    assert build_sizes(1024, 10000, 4) == [1024, 4096]
    with pytest.raises(InputError, match="--step-factor"):
        build_sizes(1024, 8192, 1)


def test_torchrun_two_gloo_processes_write_a_profile_that_estimate_loads(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    profile_path = tmp_path / "gloo.json"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "solver", "calibrate", "run", "--cluster", "dgx-h100", "--backend", "gloo",
        "--ranks-per-node", "1", "--min-bytes", "1K", "--max-bytes", "16K", "--iters", "3",
        "--warmup", "1", "-o", str(profile_path),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    # Rank 0 alone prints the fit.
    assert done.stdout.count("fabric all_reduce: 2 ranks on 2 node(s), torch.distributed gloo "
                             "inter-node") == 1
    assert f"wrote {profile_path}" in done.stdout

    profile = load_profile(profile_path)
    assert profile.cluster == "dgx-h100" and profile.method == "torch.distributed gloo"
    assert list(profile.tiers) == ["fabric"]
    curves = profile.tiers["fabric"]
    assert set(curves) == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                           "send_recv"}
    for curve in curves.values():
        assert (curve.num_ranks, curve.num_nodes, curve.num_domains) == (2, 2, 2)
        assert [p.size_bytes for p in curve.measured] == [1024, 2048, 4096, 8192, 16384]
        assert all(p.time_us > 0 for p in curve.measured)

    result = CliRunner().invoke(cli, [
        "estimate", "--model", "llama3.1-8b", "--cluster", "dgx-h100", "--gpus", "16",
        "--tp", "8", "--calibration", str(profile_path), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["calibration"]["bandwidths"]
    assert {r["source"] for r in rows if r["tier"] == "fabric"} == {"measured"}
    assert {r["source"] for r in rows if r["tier"] == "nvlink"} == {"preset"}
