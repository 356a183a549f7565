"""No user string becomes an option (issue 37, argument injection): a zoo TOML named
`--trust-remote-code` (no `source`) made `launch --format vllm` and `serve` write `vllm serve
--trust-remote-code ...`, quoted for the shell but read by vLLM's argparse parser as the flag
(it then serves its default model with remote code trusted).

Three layers are checked: the spec refuses a name or source that starts with '-' (one line
naming the file and the field); past the specs (model_copy does not validate) every emitter
keeps an option-like name out of its options (vLLM and SGLang take it as `--model=ID` /
`--model-path=ID`, which argparse reads as the value: checked with argparse itself, the
parser both engines use); and torchtitan-python's config function is an identifier for any
name (`x½²` gave one that did not compile)."""

from __future__ import annotations

import argparse
import ast
import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.api import build_parallel_config, load_problem_specs
from solver.calibrate.profile import load_calibrated_cluster
from solver.catalog import load_model_spec
from solver.cli import cli
from solver.emit.formats import RENDERERS, render_launch
from solver.emit.layout import build_rank_layout
from solver.emit.quoting import render_toml_value
from solver.emit.sglang import SglangEngine, build_sglang_args
from solver.emit.target import LaunchTarget
from solver.emit.torchtitan_python import config_function_name
from solver.serve import ServeJob, ServeProblem
from solver.serve.plan import build_vllm_command

ROOT = Path(__file__).resolve().parent.parent
# Names an argparse parser would read as options: long and short flags, a flag with its value,
# a lone dash and the end-of-options marker.
OPTION_LIKE = ["--trust-remote-code", "-O3", "--model=evil", "--", "-", "-h"]
# Past the specs, the writers: argparse drops a value that is exactly "--" in every form
# (`--model=--` reads as [], Python 3.11 _get_values), so only the spec's refusal covers it.
WRITER_CASES = [name for name in OPTION_LIKE if name != "--"]


def model_file(folder: Path, name: str, source: str | None = None) -> Path:
    """llama3.2-1b under another name, with no (or another) Hugging Face source."""
    text = (ROOT / "models" / "llama3.2-1b.toml").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.startswith(("name =", "source ="))]
    head = f"name = {render_toml_value(name)}\n"
    if source is not None:
        head += f"source = {render_toml_value(source)}\n"
    path = folder / "option-like.toml"
    path.write_text(head + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def vllm_serve_parser() -> argparse.ArgumentParser:
    """The shape of `vllm serve`'s parser (vllm/entrypoints/cli/serve.py: an optional positional
    model_tag; vllm/engine/arg_utils.py: --model, --trust-remote-code store_true, -O for the
    compilation config): argparse, as vLLM's FlexibleArgumentParser is."""
    parser = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--model")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("-O", dest="compilation_config")
    parser.add_argument("-h", "--help", action="store_true")
    for option in VLLM_VALUE_OPTIONS:
        parser.add_argument(option)
    for option in ("--enable-expert-parallel", "--headless", "--enable-chunked-prefill"):
        parser.add_argument(option, action="store_true")
    return parser


# The engine arguments with a value that parplan's vLLM lines use (solver.emit.vllm,
# solver.serve.plan).
VLLM_VALUE_OPTIONS = ("--tensor-parallel-size", "--pipeline-parallel-size",
                      "--data-parallel-size", "--data-parallel-size-local",
                      "--data-parallel-address", "--data-parallel-rpc-port",
                      "--data-parallel-start-rank", "--max-model-len",
                      "--gpu-memory-utilization", "--quantization", "--kv-cache-dtype",
                      "--max-num-seqs", "--max-num-batched-tokens")


def served_model(tokens: list[str]) -> tuple[str, argparse.Namespace]:
    """What `vllm serve TOKENS...` serves (model_tag, else --model, as serve.py's cmd does)."""
    args, unknown = vllm_serve_parser().parse_known_args(tokens)
    assert unknown == [], unknown
    return (args.model_tag if args.model_tag is not None else args.model), args


# ---- the edge: specs refuse option-like names ---------------------------------------------------

@pytest.mark.parametrize("name", OPTION_LIKE)
def test_a_model_named_like_an_option_is_refused_by_launch_and_serve(tmp_path: Path,
                                                                     name: str) -> None:
    path = model_file(tmp_path, name)
    for args in (["launch", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8",
                  "--format", "vllm"],
                 ["serve", "--model", str(path), "--cluster", "dgx-h100", "--gpus", "8",
                  "--context", "8k"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and str(path) in lines[0], result.stderr
        assert "field 'name': must not start with '-'" in lines[0]
        assert "vllm serve" not in result.stdout


def test_a_source_like_an_option_is_refused(tmp_path: Path) -> None:
    path = model_file(tmp_path, "fine-name", source="--trust-remote-code")
    result = CliRunner().invoke(cli, ["launch", "--model", str(path), "--cluster", "dgx-h100",
                                      "--gpus", "8", "--format", "vllm"])
    assert result.exit_code == 2, result.output
    assert "field 'source': must not start with '-'" in result.stderr


# ---- past the specs: every emitter ------------------------------------------------------------

@pytest.fixture(scope="module")
def target() -> LaunchTarget:
    model_spec, cluster_spec, job = load_problem_specs("llama3.2-1b", "dgx-h100")
    config = build_parallel_config(8, tp=2, pp=2)
    return LaunchTarget(model_spec=model_spec.model_copy(update={"source": ""}),
                        cluster=cluster_spec, job=job, config=config,
                        layout=build_rank_layout(config, model_spec.is_moe, "tp-cp-ep-dp-pp"))


def renamed(target: LaunchTarget, name: str) -> LaunchTarget:
    return LaunchTarget(model_spec=target.model_spec.model_copy(update={"name": name}),
                        cluster=target.cluster.model_copy(update={"name": name}),
                        job=target.job, config=target.config, layout=target.layout)


def parsed(launch_format: str, text: str) -> object:
    """What a framework reads of an artefact: JSON, a Python module's statements, shell tokens."""
    if launch_format in ("groups", "deepspeed"):
        return json.loads(text)
    if launch_format in ("torch", "torchtitan-python"):
        compile(text, f"<launch --format {launch_format}>", "exec")
        return [type(node).__name__ for node in ast.parse(text).body]
    return shlex.split(text, comments=True)


@pytest.mark.parametrize("launch_format", sorted(RENDERERS))
@pytest.mark.parametrize("name", WRITER_CASES)
def test_every_emitter_keeps_an_option_like_name_out_of_its_options(
        target: LaunchTarget, launch_format: str, name: str) -> None:
    hostile = parsed(launch_format, render_launch(launch_format, renamed(target, name)).text)
    benign = parsed(launch_format, render_launch(launch_format, renamed(target, "plain")).text)
    if launch_format != "vllm":  # the name is in no option, token or statement
        assert hostile == benign, launch_format
        return
    model, args = served_model(hostile[2:])
    assert model == name
    assert args.trust_remote_code is False and args.compilation_config is None
    assert not args.help
    assert served_model(benign[2:])[0] == "plain"


@pytest.mark.parametrize("name", WRITER_CASES)
def test_serve_and_sglang_lines_take_an_option_like_id_as_the_model(name: str) -> None:
    model_spec = load_model_spec("llama3.1-8b").model_copy(update={"name": name,
                                                                   "source": ""})
    problem = ServeProblem(model_spec=model_spec,
                           cluster=load_calibrated_cluster("dgx-h100", None, None), num_gpus=8,
                           job=ServeJob(context=8192, input_len=2048, output_len=512))
    tokens = shlex.split(build_vllm_command(problem, {"tp": 2, "pp": 1, "dp": 1, "ep": 1}))
    model, args = served_model(tokens[2:])
    assert model == name and args.trust_remote_code is False
    assert tokens[tokens.index("--tensor-parallel-size") + 1] == "2"

    sglang = argparse.ArgumentParser(exit_on_error=False, add_help=False)
    sglang.add_argument("--model-path", required=True)  # sglang/srt/server_args.py
    sglang.add_argument("--trust-remote-code", action="store_true")
    sglang.add_argument("--tp-size", type=int)
    engine = SglangEngine(name, tp=2, pp=1, dp=1, ep=1, context=8192, memory_share=0.9)
    found, _ = sglang.parse_known_args(build_sglang_args(engine)[3:])
    assert found.model_path == name and found.trust_remote_code is False
    assert found.tp_size == 2


def test_an_ordinary_id_keeps_its_usual_form(target: LaunchTarget) -> None:
    """Only an option-like id changes form: `vllm serve ORG/NAME`, `--model-path ORG/NAME`."""
    tokens = shlex.split(render_launch("vllm", renamed(target, "plain")).text, comments=True)
    assert tokens[:3] == ["vllm", "serve", "plain"]
    engine = SglangEngine("org/model", tp=1, pp=1, dp=1, ep=1, context=4096, memory_share=0.9)
    assert build_sglang_args(engine)[3:5] == ["--model-path", "org/model"]


# ---- torchtitan-python: the function name is an identifier -------------------------------------

def test_a_name_with_superscripts_gives_a_module_that_compiles(target: LaunchTarget) -> None:
    """`x½²`: `\\w` matched ½ and ² (str.isalnum) though no identifier may hold them."""
    emitted = render_launch("torchtitan-python", renamed(target, "x½²"))
    compile(emitted.text, "<torchtitan-python>", "exec")
    assert emitted.settings["function"] == "parplan_x122_tp2_pp2_dp2"
    assert "--config parplan_x122_tp2_pp2_dp2" in emitted.text


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(name=st.text(min_size=1, max_size=40))
def test_the_config_function_is_an_ascii_identifier_for_any_name(target: LaunchTarget,
                                                                 name: str) -> None:
    function = config_function_name(renamed(target, name))
    assert function.isidentifier() and function.isascii() and function.startswith("parplan_")
