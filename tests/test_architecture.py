"""The import rules of STYLE.md: imports go downward only (cli -> api -> search -> cost -> spec),
no module imports itself back through others (not even from inside a function), heavy
libraries stay out of the layers that must not need them, and `parplan --help` does not
import numpy, ortools or pydantic-heavy machinery it does not need."""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

SOLVER = Path(__file__).resolve().parent.parent / "solver"

# Which project layers each layer may import (besides itself).
ALLOWED = {
    "errors": set(),
    "runtime": set(),
    "output_file": {"errors"},
    "spec": {"errors"},
    "catalog": {"spec", "errors"},
    "cost": {"spec", "errors"},
    "search": {"cost", "spec", "errors"},
    "calibrate": {"cost", "spec", "errors", "catalog", "output_file"},
    "emit": {"search", "cost", "spec", "errors"},
    "serve": {"search", "cost", "spec", "errors"},
    "api": {"search", "cost", "spec", "errors", "catalog", "calibrate", "emit", "serve"},
    "ranked_plans": {"api", "search", "cost", "spec", "errors"},
    "fixes": {"search", "spec", "errors", "catalog"},
    "optimize": {"api", "ranked_plans", "fixes", "search", "cost", "spec", "errors", "catalog",
                 "calibrate"},
    "estimate_fixes": {"optimize", "fixes", "search", "spec"},
    "optimize_json": {"optimize", "ranked_plans", "cost", "spec"},
    # `optimize --gpus A,B --objective cost|energy` (issue 42): prices the plans of optimize.
    "optimize_counts": {"cost", "spec", "errors"},
    "sweep": {"api", "optimize", "optimize_json", "optimize_counts", "search", "cost", "spec", "errors", "catalog",
              "runtime", "output_file"},
    "rl": {"api", "optimize", "ranked_plans", "search", "cost", "spec", "errors", "catalog",
           "serve"},
    "cli": {"api", "optimize", "optimize_json", "optimize_counts", "estimate_fixes",
            "ranked_plans", "sweep", "search", "cost", "spec", "errors", "catalog", "calibrate",
            "emit", "serve", "rl",
            "runtime", "output_file"},
}
# Third-party libraries each layer must not import.
FORBIDDEN = {
    "spec": {"ortools", "click", "rich", "numpy"},
    "cost": {"ortools", "click", "rich"},
    "catalog": {"ortools", "click", "rich"},
    "search": {"click", "rich"},
}


def layer_of(path: Path) -> str:
    rel = path.relative_to(SOLVER)
    return rel.parts[0].removesuffix(".py")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


MODULES = sorted(p for p in SOLVER.rglob("*.py") if layer_of(p) not in {"__init__", "__main__"}
                 and "_data" not in p.parts)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SOLVER)))
def test_imports_go_downward_only(path: Path) -> None:
    layer = layer_of(path)
    assert layer in ALLOWED, f"new top-level module {layer}: add it to ALLOWED with its layer"
    for name in imported_modules(path):
        top = name.split(".")
        if top[0] == "solver" and len(top) > 1:
            target = top[1]
            assert target == layer or target in ALLOWED[layer], f"{layer} imports solver.{target}"
        else:
            assert top[0] not in FORBIDDEN.get(layer, set()), f"{layer} imports {top[0]}"


# Which folders of solver/cost each folder may import (besides itself), downward only:
# kernels < comm < layers < memory < step, and layers < serving. "" is solver/cost's own level
# (candidates, distinct, row_memo, uncertainty), which every folder may import and which
# imports no folder.
COST_ALLOWED = {
    "": set(),
    "kernels": {""},
    "comm": {"", "kernels"},
    "layers": {"", "kernels", "comm"},
    "memory": {"", "kernels", "comm", "layers"},
    "step": {"", "kernels", "comm", "layers", "memory"},
    "serving": {"", "kernels", "comm", "layers"},
    "rl": {"", "kernels", "comm", "layers", "memory", "step", "serving"},
}


def cost_folder(module: str) -> str | None:
    """The folder of solver/cost a dotted module lives in ('step' for solver.cost.step.steptime,
    '' for solver.cost.candidates), None outside solver/cost's modules."""
    parts = module.split(".")
    if parts[:2] != ["solver", "cost"] or len(parts) < 3:
        return None
    return parts[2] if (SOLVER / "cost" / parts[2]).is_dir() else ""


def cost_folder_violations(folder: str, imports: set[str]) -> list[str]:
    """The imported solver/cost modules a module of `folder` may not import (COST_ALLOWED)."""
    return sorted(name for name in imports
                  if (target := cost_folder(name)) is not None and target != folder
                  and target not in COST_ALLOWED[folder])


def test_cost_folders_import_downward_only() -> None:
    """Issue 35 item 7: solver/cost is grouped by concept, and the folders import one way
    (function-level imports included), so a term's folder says what it may depend on."""
    folders = {p.name for p in (SOLVER / "cost").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(COST_ALLOWED) - {""}, "a new folder of solver/cost: add it to COST_ALLOWED"
    assert find_import_cycle(COST_ALLOWED) == []
    for name, path in SOLVER_MODULES.items():
        folder = cost_folder(name)
        if folder is not None:
            bad = cost_folder_violations(folder, solver_imports(path))
            assert not bad, f"solver/cost/{folder or '.'}: {name} imports {', '.join(bad)}"
    # The rule sees an upward import and lets a downward one pass.
    assert cost_folder("solver.cost.step.steptime") == "step"
    assert cost_folder("solver.cost.candidates") == "" and cost_folder("solver.spec") is None
    assert cost_folder_violations("kernels", {"solver.cost.step.steptime",
                                              "solver.cost.candidates"}) == [
        "solver.cost.step.steptime"]
    assert cost_folder_violations("serving", {"solver.cost.memory.options"}) == [
        "solver.cost.memory.options"]
    assert cost_folder_violations("step", {"solver.cost.memory.options",
                                           "solver.cost.kernels.kernels"}) == []


def module_name(path: Path) -> str:
    """The dotted name of a solver source file (a package is its __init__.py)."""
    parts = path.relative_to(SOLVER.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOLVER_MODULES = {module_name(p): p for p in sorted(SOLVER.rglob("*.py"))}


def solver_imports(path: Path) -> set[str]:
    """The solver modules `path` imports anywhere: at module level, inside functions and under
    TYPE_CHECKING alike (an import moved into a function still runs the other module's code
    at call time, and a type-only one still says the two modules need each other).
    `from solver.a import b` is solver.a.b when that is a module, else solver.a."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [name if name in SOLVER_MODULES else node.module for name in names]
        else:
            continue
        for name in names:
            while name not in SOLVER_MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            if name in SOLVER_MODULES:
                found.add(name)
    return found - {module_name(path)} if path.is_relative_to(SOLVER) else found


def find_import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` (module -> the modules it imports) as [a, ..., a], [] when there
    is none (graphlib's topological sort finds it)."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_no_import_cycles() -> None:
    """Issue 35 item 6: the solver package's import graph, function-level and TYPE_CHECKING
    imports included, has no cycle; a shared definition lives in the lower module of the two
    (STYLE.md: a function-level import that only breaks a cycle hides a design question)."""
    graph = {name: solver_imports(path) for name, path in SOLVER_MODULES.items()}
    cycle = find_import_cycle(graph)
    assert not cycle, "import cycle: " + " -> ".join(reversed(cycle))


def test_the_cycle_check_sees_every_import(tmp_path: Path) -> None:
    """The collector sees imports inside functions and under TYPE_CHECKING, resolves a name
    imported from a module to that module, and the search reports a cycle it is given."""
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "from solver.spec.blocks import MIXERS\n"
        "if TYPE_CHECKING:\n    from solver.spec.model import ModelSpec\n"
        "def f():\n    from solver.emit import validate\n    import solver.cost.comm.comm\n",
        encoding="utf-8")
    assert solver_imports(source) == {"solver.spec.blocks", "solver.spec.model",
                                      "solver.emit.validate", "solver.cost.comm.comm"}
    # `launch --validate` loads its checks only when asked (a lazy import, not a cycle).
    assert "solver.emit.validate" in solver_imports(SOLVER / "cli" / "launch_command.py")
    cycle = find_import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert set(cycle) == {"a", "b", "c"} and cycle[0] == cycle[-1] and len(cycle) == 4
    assert find_import_cycle({"a": {"b"}, "b": set(), "d": {"a", "b"}}) == []


def test_only_the_cli_prints_or_exits() -> None:
    for path in MODULES:
        if layer_of(path) == "cli":
            continue
        text = path.read_text(encoding="utf-8")
        assert "print(" not in text and "sys.exit" not in text, path


def test_help_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys; from solver.cli import cli; "
        "heavy = [m for m in ('numpy', 'ortools', 'rich', 'torch', 'plotly', 'playwright') "
        "if m in sys.modules]; print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_top_level_help_loads_no_command() -> None:
    """`parplan --help` lists the commands from solver.cli._COMMANDS without importing their
    modules or pydantic (issue 15: --help in at most 0.3 s); each listed command loads, and
    shows the same line as its short help."""
    code = (
        "import sys\nfrom solver.cli import main\ntry:\n    main(['--help'])\n"
        "except SystemExit:\n    pass\n"
        "loaded = [m for m in sys.modules if m.endswith('_command') or m.endswith('_commands')"
        " or m == 'pydantic']\nprint('LOADED', ','.join(sorted(loaded)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("LOADED")
    import click

    from solver.cli import _COMMANDS, cli

    ctx = click.Context(cli)
    for name, (_, line) in _COMMANDS.items():
        assert f"  {name}" in out.stdout and line in out.stdout
        command = cli.get_command(ctx, name)
        assert command is not None and command.name == name
        assert command.get_short_help_str(80) == line
    assert cli.get_command(ctx, "nosuch") is None


def test_the_degrees_are_listed_once() -> None:
    """ParallelConfig's fields are the list (solver.spec.job.PARALLEL_FIELDS); the candidate
    arrays hold the same fields in the same order, and the search binds the same set."""
    from dataclasses import fields

    from solver.cost.candidates import Candidates
    from solver.search.space import VARIABLES
    from solver.spec.job import PARALLEL_FIELDS

    assert tuple(f.name for f in fields(Candidates)) == PARALLEL_FIELDS
    assert sorted(VARIABLES) == sorted(PARALLEL_FIELDS)
