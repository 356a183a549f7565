"""What a loader takes to find a model's weights: `vllm serve MODEL`, from_pretrained.

A zoo model names its Hugging Face repository in `source` ("https://huggingface.co/ORG/NAME");
a model imported from a local `config.json` is the folder that holds it (the checkpoint lies
beside its config), kept as the user wrote it ("./hf/config.json" -> "./hf"), not the folder's
bare name, which a loader would look up on the Hub; anything else is the model's name.
"""

from __future__ import annotations

import re
from pathlib import PurePath

from solver.spec.model import ModelSpec

HF_REPO = re.compile(r"^https?://huggingface\.co/([\w.-]+/[\w.-]+)")


def render_model_reference(model_spec: ModelSpec) -> str:
    """The Hugging Face repository, the local checkpoint folder, or the name (module docstring)."""
    source = model_spec.source
    found = HF_REPO.match(source)
    if found:
        return found.group(1)
    path = PurePath(source)
    if source and "://" not in source and path.suffix.lower() == ".json":
        folder = str(path.parent)
        # "config.json" alone is the current folder; a relative folder keeps its "./" so that
        # the loader reads it as a path, not a Hub repository
        if folder == ".":
            return "."
        return folder if path.is_absolute() or folder.startswith((".", "~")) else f"./{folder}"
    return model_spec.name


def render_model_tokens(model_id: str, flag: str, positional: bool = False) -> list[str]:
    """The model id as command-line tokens of an engine: the id alone (`positional`, `vllm
    serve MODEL`) or `flag MODEL` (`--model-path MODEL`); an id that starts with '-' as the one
    token `flag=MODEL`, which argparse reads as the option's value whatever it holds, where a
    separate token that starts with '-' is read as an option (argparse's
    _parse_optional: "--trust-remote-code" would turn the flag on). vLLM takes `--model=X` for
    its positional model_tag (vllm/utils FlexibleArgumentParser.parse_args refuses only the bare
    token `--model`; vllm/entrypoints/cli/serve.py sets args.model from model_tag when given).
    ModelSpec refuses such names and sources; this keeps the writers safe past the specs."""
    if model_id.startswith("-"):
        return [f"{flag}={model_id}"]
    return [model_id] if positional else [flag, model_id]
