"""`pip install .` must ship the zoo and the cluster catalog inside the wheel and find them there
(issue 2): build the wheel, unpack it away from the checkout, and run the CLI from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def unpacked_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("hatchling")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "-w", str(out), str(ROOT)],
        check=True, capture_output=True,
    )
    (wheel,) = out.glob("parplan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    zoo = [n for n in names if n.startswith("solver/_data/models/") and n.endswith(".toml")]
    assert len(zoo) == len(list((ROOT / "models").glob("*.toml")))
    assert any(n.startswith("solver/_data/clusters/presets/") for n in names)
    tables = {n for n in names if n.startswith("solver/catalog/kernels/")}
    assert {f"solver/catalog/kernels/{p.name}"
            for p in (ROOT / "solver" / "catalog" / "kernels").iterdir()} == tables
    # The report page's script and style, read at run time (solver.sweep.report_html).
    assert {"solver/sweep/report_page.js", "solver/sweep/report_page.css"} <= set(names)
    target = out / "site"
    zipfile.ZipFile(wheel).extractall(target)
    return target


def run_from(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(site))
    return subprocess.run(
        [sys.executable, "-m", "solver", *args],
        cwd=site.parent, env=env, capture_output=True, text=True, check=False,
    )


def test_installed_wheel_finds_its_zoo(unpacked_wheel: Path) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import solver.catalog.paths as p; print(p.data_dir('models'))"],
        cwd=unpacked_wheel.parent, env=dict(os.environ, PYTHONPATH=str(unpacked_wheel)),
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(unpacked_wheel)
    result = run_from(unpacked_wheel, "models", "--json")
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)) == len(list((ROOT / "models").glob("*.toml")))


def test_installed_wheel_finds_its_clusters(unpacked_wheel: Path) -> None:
    result = run_from(unpacked_wheel, "clusters", "--json")
    assert result.returncode == 0, result.stderr
    presets = json.loads(result.stdout)
    assert len(presets) == len(list((ROOT / "clusters" / "presets").glob("*.toml")))


def test_installed_wheel_reads_its_kernel_tables(unpacked_wheel: Path) -> None:
    """H100 times its GEMMs and attention from the packaged kernel table (issue 16)."""
    result = run_from(unpacked_wheel, "estimate", "--model", "llama3.1-8b", "--cluster",
                      "dgx-h100", "--gpus", "8", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["plans"][0]["step_seconds"] > 0
