"""Names stay inert in every artefact `parplan launch` writes (issue 19): a model or cluster
name with quotes, triple quotes, newlines, `$(...)`, backticks, `;`, backslashes or DEL is
escaped, quoted or refused. Each format is checked by parsing what it wrote: Python `compile`
and `ast`, `tomllib`, `shlex.split`, `json`."""

from __future__ import annotations

import ast
import json
import shlex
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.api import build_parallel_config, load_problem_specs
from solver.cli import cli
from solver.emit.formats import render_launch
from solver.emit.layout import build_rank_layout
from solver.emit.quoting import render_python_text, render_toml_value
from solver.emit.target import LaunchTarget

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
# Printable, so a spec takes them: they must be escaped or quoted where they are written.
PRINTABLE_HOSTILE = ['x"""\\nimport os; os.system("id")\\n"""', "a'b\"c", "$(touch pwned)",
                     "`id`", "a; rm -rf ~", "back\\slash\\", "'''", 'end"', "café 中文 #x"]
# Not printable: a spec refuses them, and the writers escape them all the same.
UNPRINTABLE_HOSTILE = ['x"""\nimport os\nos.system("id")\n"""', "del\x7fchar", "tab\tname",
                       "line\u2028sep", "nul\x00", "cr\rname", "lone\ud800surrogate"]


def model_file(folder: Path, name: str) -> Path:
    """llama3.2-1b under another name (and no Hugging Face source, so vLLM gets the name)."""
    text = (ROOT / "models" / "llama3.2-1b.toml").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines()
             if not line.startswith(("name =", "source ="))]
    path = folder / "hostile.toml"
    path.write_text(f"name = {render_toml_value(name)}\n" + "\n".join(lines) + "\n",
                    encoding="utf-8")
    return path


def launch(model: Path, launch_format: str, *more: str) -> str:
    result = CliRunner().invoke(cli, ["launch", "--model", str(model), "--cluster", "dgx-h100",
                                      "--gpus", "8", "--tp", "2", "--pp", "2", "--format",
                                      launch_format, *more])
    assert result.exit_code == 0, result.output
    return result.stdout


def module_shape(text: str) -> list[str]:
    """The kinds of the module's top-level statements: a name cannot add one."""
    return [type(node).__name__ for node in ast.parse(text).body]


@pytest.mark.parametrize("name", PRINTABLE_HOSTILE)
def test_every_format_keeps_a_printable_hostile_name_inert(tmp_path: Path, name: str) -> None:
    benign = model_file(tmp_path, "benign")
    benign_torch = launch(benign, "torch")
    benign_megatron = launch(benign, "megatron")
    hostile = model_file(tmp_path, name)

    torch_module = launch(hostile, "torch")
    compile(torch_module, "<launch --format torch>", "exec")
    assert module_shape(torch_module) == module_shape(benign_torch)
    assert name in ast.get_docstring(ast.parse(torch_module))

    titan = launch(hostile, "torchtitan", "--target", "torchtitan@0.2")
    assert tomllib.loads(titan) == tomllib.loads(launch(benign, "torchtitan", "--target",
                                                        "torchtitan@0.2"))
    assert titan.splitlines()[0].startswith("# parplan launch: ")
    titan_cli = launch(hostile, "torchtitan")
    assert shlex.split(titan_cli, comments=True) == shlex.split(launch(benign, "torchtitan"),
                                                                comments=True)
    assert titan_cli.splitlines()[0].startswith("# parplan launch: ")

    megatron = launch(hostile, "megatron")
    assert shlex.split(megatron, comments=True) == shlex.split(benign_megatron, comments=True)

    vllm = shlex.split(launch(hostile, "vllm"), comments=True)
    assert vllm[:3] == ["vllm", "serve", name]

    assert json.loads(launch(hostile, "deepspeed")) == json.loads(launch(benign, "deepspeed"))
    groups = json.loads(launch(hostile, "groups", "--json"))
    assert groups["world_size"] == 8
    envelope = json.loads(launch(hostile, "megatron", "--json"))
    assert envelope["model"] == name


def test_a_spec_refuses_an_unprintable_name(tmp_path: Path) -> None:
    for name in UNPRINTABLE_HOSTILE[:-1]:  # TOML cannot spell a lone surrogate
        result = CliRunner().invoke(cli, ["models", "show", str(model_file(tmp_path, name))])
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "field 'name': must hold printable characters" in lines[0]


@pytest.fixture(scope="module")
def target() -> LaunchTarget:
    model_spec, cluster_spec, job = load_problem_specs("llama3.2-1b", "dgx-h100")
    config = build_parallel_config(8, tp=2, pp=2)
    return LaunchTarget(model_spec=model_spec, cluster=cluster_spec, job=job, config=config,
                        layout=build_rank_layout(config, model_spec.is_moe, "tp-cp-ep-dp-pp"))


@pytest.mark.parametrize("name", UNPRINTABLE_HOSTILE + PRINTABLE_HOSTILE)
def test_the_writers_escape_names_a_spec_would_refuse(target: LaunchTarget, name: str) -> None:
    """Past the specs (model_copy does not validate), the writers still keep names inert."""
    hostile = LaunchTarget(
        model_spec=target.model_spec.model_copy(update={"name": name, "source": ""}),
        cluster=target.cluster.model_copy(update={"name": name}), job=target.job,
        config=target.config, layout=target.layout)
    torch_module = render_launch("torch", hostile).text
    compile(torch_module, "<launch --format torch>", "exec")
    assert module_shape(torch_module) == module_shape(render_launch("torch", target).text)
    assert ast.get_docstring(ast.parse(torch_module), clean=False).count(name) == 2
    old_titan = {"version": "0.2"}
    titan = render_launch("torchtitan", replace(hostile, **old_titan)).text
    assert tomllib.loads(titan) == tomllib.loads(render_launch("torchtitan", replace(
        target, **old_titan)).text)
    for launch_format in ("torchtitan", "megatron"):
        assert shlex.split(render_launch(launch_format, hostile).text, comments=True) == \
            shlex.split(render_launch(launch_format, target).text, comments=True)
    assert shlex.split(render_launch("vllm", hostile).text, comments=True)[2] == name


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(text=st.text())
def test_quoted_text_reads_back_as_itself(text: str) -> None:
    assert tomllib.loads(f"x = {render_toml_value(text)}")["x"] == text
    for quote in ('"', "'", '"""', "'''"):
        assert ast.literal_eval(quote + render_python_text(text) + quote) == text
