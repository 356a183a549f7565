"""`launch --format torch` (solver/emit/torch_script.py): the emitted module lists the layout's
groups, and runs for real: 8 local processes on the gloo backend build every group and both
device meshes, and an all-reduce inside each group gives the sum of its members."""

from __future__ import annotations

import dataclasses
import importlib.util
import multiprocessing
import os
import socket
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from test_emit_frameworks import make_target
from test_emit_layout import CONFIGS, plan_config

from solver.emit.layout import AXES, build_rank_layout
from solver.emit.torch_script import render_torch_module
from solver.errors import InputError


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("parplan_groups", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@settings(max_examples=40, deadline=None)
@given(CONFIGS, st.permutations(AXES), st.booleans())
def test_module_groups_are_the_layout_groups(tmp_path_factory: pytest.TempPathFactory,
                                             drawn: tuple[int, ...], order: list[str],
                                             is_moe: bool) -> None:
    pytest.importorskip("torch")
    config = plan_config(drawn)
    try:
        layout = build_rank_layout(config, is_moe, "-".join(order))
    except InputError:
        assume(False)
    base = make_target("mixtral-8x7b" if is_moe else "llama3.1-8b", 8, tp=8)
    target = dataclasses.replace(base, config=config, layout=layout)
    path = tmp_path_factory.mktemp("torch") / "groups.py"
    path.write_text(render_torch_module(target).text, encoding="utf-8")
    module = load_module(path)
    assert module.all_groups() == {name: rows.tolist() for name, rows in layout.groups().items()}
    assert module.WORLD_SIZE == config.num_gpus


def _run_rank(path: str, rank: int, world_size: int, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    load_module(Path(path)).main(["--check"])


def test_module_runs_on_8_gloo_processes(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """Mixtral 8x7B, tp 2 pp 2 dp 2 ep 2 (etp 1): tp, cp, dp, pp, dp_cp, ep, etp and edp groups
    and two device meshes. The processes are forked after torch is imported once, so the run
    takes seconds, not one torch import per rank."""
    pytest.importorskip("torch.distributed")
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs the fork start method")
    target = make_target("mixtral-8x7b", 8, tp=2, pp=2, ep=2, etp=1)
    path = tmp_path / "groups.py"
    path.write_text(render_torch_module(target).text, encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("fork")
    processes = [context.Process(target=_run_rank, args=(str(path), rank, 8, port))
                 for rank in range(8)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    for process in processes:
        if process.is_alive():
            process.kill()
    assert [p.exitcode for p in processes] == [0] * 8, capfd.readouterr().err[-3000:]
    assert ("built 8 groups per rank and 2 device mesh(es) on 8 ranks, all-reduce checks "
            "passed") in capfd.readouterr().out
