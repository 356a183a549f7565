"""`launch --validate` for `vllm serve` lines (solver.emit.validate): vLLM 0.33's own parser.

Each node's line goes through what `vllm serve` runs before it loads a model
(vllm/entrypoints/cli/serve.py): make_arg_parser (vllm/entrypoints/common/cli_args.py, every
engine and frontend argument), validate_parsed_serve_args, AsyncEngineArgs.from_cli_args; then
the parallel and scheduler settings are built as vLLM's ParallelConfig and SchedulerConfig
(whose pydantic checks hold the size rules). vLLM needs a device platform to list its
arguments; without a GPU it is told to use the CPU one (VLLM_TARGET_DEVICE=cpu, only while the
check runs). ModelConfig and the engine need the checkpoint's config and GPUs.
"""

from __future__ import annotations

import os
import shlex

from solver.emit.target import Emitted, LaunchTarget
from solver.emit.check_harness import (
    Validation,
    environment,
    require_version,
    run_check,
    run_parser,
)
from solver.emit.vllm import VERSION


def _node_lines(emitted: Emitted) -> list[list[str]]:
    """Every `vllm serve` line of the text, as tokens after `vllm serve`."""
    lines = [shlex.split(line) for line in emitted.text.splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return [tokens[2:] for tokens in lines if tokens[:2] == ["vllm", "serve"]]


def check_vllm(target: LaunchTarget, emitted: Emitted, validation: Validation) -> None:
    """Each node's line through vLLM's parser and configs (module docstring)."""
    if not require_version(validation, "vllm", VERSION, "the serve line"):
        return
    device = {} if os.environ.get("VLLM_TARGET_DEVICE") else {"VLLM_TARGET_DEVICE": "cpu"}
    lines = _node_lines(emitted)
    with environment(**device):
        for tokens in lines:
            _check_line(tokens)
    validation.accepted.append(f"`vllm serve`'s parser and validate_parsed_serve_args, "
                               f"ParallelConfig and SchedulerConfig ({len(lines)} line(s))")
    validation.unchecked.append("ModelConfig and the engine (they need the checkpoint and GPUs)")


def _check_line(tokens: list[str]) -> None:
    def parse() -> object:
        from vllm.entrypoints.common.cli_args import make_arg_parser
        from vllm.utils.argparse_utils import FlexibleArgumentParser

        return make_arg_parser(FlexibleArgumentParser()).parse_args(tokens)

    args = run_check("vLLM's serve parser", lambda: run_parser("vLLM's serve parser", parse))

    def configs() -> None:
        from vllm.config import ParallelConfig, SchedulerConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.entrypoints.common.cli_args import validate_parsed_serve_args

        validate_parsed_serve_args(args)
        if args.model_tag is not None:
            args.model = args.model_tag
        engine = AsyncEngineArgs.from_cli_args(args)
        ParallelConfig(tensor_parallel_size=engine.tensor_parallel_size,
                       pipeline_parallel_size=engine.pipeline_parallel_size,
                       data_parallel_size=engine.data_parallel_size,
                       data_parallel_size_local=engine.data_parallel_size_local or 1,
                       enable_expert_parallel=engine.enable_expert_parallel)
        max_model_len = engine.max_model_len or 8192
        SchedulerConfig(max_model_len=max_model_len, is_encoder_decoder=False,
                        **{name: getattr(engine, name) for name in
                           ("max_num_seqs", "max_num_batched_tokens")
                           if getattr(engine, name) is not None})

    run_check("vLLM's engine arguments", configs)
