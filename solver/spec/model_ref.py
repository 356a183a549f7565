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
