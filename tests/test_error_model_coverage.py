"""Issue 36's leave-one-out coverage (benchmarks/error_model.py): the README's table is the
script's, each row is predicted by a fit without its source, sources are what the data files
say, and the between-source alternative (benchmarks/error_model_random_effect.py) computes what
its docstring says."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"


def load_benchmark(name: str):
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


@pytest.fixture(scope="module")
def error_model():
    return load_benchmark("error_model")


@pytest.fixture(scope="module")
def rows(error_model):
    return error_model.load_time_rows(), error_model.load_memory_rows()


def test_readme_table_is_the_scripts(error_model, rows) -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = error_model.render_coverage_block(*rows)
    assert error_model.replace_block(readme, block) == readme, (
        "README.md's coverage table is stale: run benchmarks/error_model.py --write")


def test_sources_are_the_data_files(rows) -> None:
    """published_runs.jsonl's `source` strings (BLOOM's chronicle days, LLM Foundry's README
    sections, Megatron-Bridge's releases) and modern_memory.jsonl's document and table (its
    torchao Llama 4 "same table" row is the table above it)."""
    def sources(kind_rows, family):
        return len({r["source"] for r in kind_rows if r["family"] == family})

    time_rows, memory_rows = rows
    assert {f: sources(time_rows, f) for f in ("bloom", "llm-foundry", "megatron-bridge")} == {
        "bloom": 7, "llm-foundry": 5, "megatron-bridge": 7}
    assert {f: sources(memory_rows, f) for f in ("bloom", "torchao", "torchtitan")} == {
        "bloom": 7, "torchao": 4, "torchtitan": 6}


def test_a_held_out_row_is_not_in_its_fit(error_model, rows) -> None:
    """Moving every error of one source leaves that source's intervals as they were (its fit
    is the other sources'), and moves another source's."""
    memory_rows = rows[1]
    plain = lambda f, r: error_model.lookup_scale(f, r["levels"])  # noqa: E731
    held = "bloom"
    source = sorted({r["source"] for r in memory_rows if r["family"] == held})[0]
    moved = [{**r, "error": r["error"] + 0.5} if r["source"] == source else r
             for r in memory_rows]
    before = error_model.held_out_sigmas(memory_rows, error_model.fit_plain, plain, "source")
    after = error_model.held_out_sigmas(moved, error_model.fit_plain, plain, "source")
    inside = np.array([r["source"] == source for r in memory_rows])
    assert (before[inside] == after[inside]).all()
    assert (before[~inside] != after[~inside]).any()


def test_coverage_and_width_arithmetic(error_model) -> None:
    """80%: z = 1.2816; sigma 0.1 covers |error| <= 0.128 (0.1 in, 0.3 out: 50%) and its
    interval's relative width is exp(0.128) - exp(-0.128) = 2 sinh(0.12816) = 0.2570."""
    table_rows = [{"family": "f", "source": "a", "error": 0.1},
                  {"family": "f", "source": "b", "error": -0.3}]
    (row,) = error_model.coverage_by_family(table_rows, np.array([0.1, 0.1]))
    assert (row["rows"], row["sources"], row["coverage"]) == (2, 2, 0.5)
    assert row["median_width"] == pytest.approx(2 * math.sinh(0.128155), abs=1e-5)


def test_random_effect_worked_number() -> None:
    """Two sources of one category: A errors 0.1, 0.3 (mean 0.2), B -0.2, 0.0 (mean -0.1).
    Centred squares x n/(n-1) = 0.01 x 2 = 0.02 each: scale^2 0.02 at the root and (10 x 0.02
    + 4 x 0.02) / 14 = 0.02 in the category. Offsets: A 0.2^2 - 0.02 / 2 = 0.03, B 0.1^2 -
    0.01 = 0: tau^2 0.015 at the root, (2 x 0.015 + 0.03) / 4 = 0.015 in the category. An
    unseen source's sigma: sqrt(0.015 + 0.02) = 0.1871."""
    module = load_benchmark("error_model_random_effect")
    synthetic = [{"family": "f", "source": s, "levels": ("x",), "error": e}
                 for s, e in (("a", 0.1), ("a", 0.3), ("b", -0.2), ("b", 0.0))]
    fitted = module.fit_memory_random_effect(synthetic)
    assert fitted["scale2"]["x"] == pytest.approx(0.02)
    assert fitted["tau2"][""] == pytest.approx(0.015)
    assert fitted["tau2"]["x"] == pytest.approx(0.015)
    assert module.sigma(fitted, synthetic[0]) == pytest.approx(math.sqrt(0.035))


def test_memory_shared_share_worked_number() -> None:
    """benchmarks/calibration_check.py fit_memory_shared_share on the two sources above:
    within (source-centred x n/(n-1)) 0.02 per row, total mean square (0.01 + 0.09 + 0.04 + 0)
    / 4 = 0.035, shared 1 - 0.02 / 0.035 = 0.4286; a source of one row adds to the total
    only, and a framework with no source of two rows takes the root's."""
    module = load_benchmark("calibration_check")
    synthetic = [{"source": s, "levels": (f,), "error": e}
                 for s, f, e in (("a", "x", 0.1), ("a", "x", 0.3), ("b", "x", -0.2),
                                 ("b", "x", 0.0))]
    shares = module.fit_memory_shared_share(synthetic)
    assert shares == pytest.approx({"": 1 - 0.02 / 0.035, "x": 1 - 0.02 / 0.035})
    lone = module.fit_memory_shared_share([*synthetic, {"source": "c", "levels": ("y",),
                                                        "error": 0.4}])
    assert "y" not in lone and lone["x"] == pytest.approx(1 - 0.02 / 0.035)
    assert lone[""] == pytest.approx(1 - 0.02 / ((0.01 + 0.09 + 0.04 + 0.16) / 5))
