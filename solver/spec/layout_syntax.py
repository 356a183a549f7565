"""Megatron-LM's `--pipeline-model-parallel-layout` text for a PipelineLayout, both ways.

The grammar, as NVIDIA/Megatron-LM reads it (megatron/core/transformer/
pipeline_parallel_layer_layout.py, PipelineParallelLayerLayout.parse_str_to_list; the user guide
docs/user-guide/features/pipeline_parallel_layout.md):

1. commas are cosmetic and dropped first;
2. `(X)*N` repeats the text X (no parentheses inside, so groups do not nest) N times;
3. then `c*N` repeats the single character before it (any character, `|` too) N times;
4. `|` separates the virtual stages, listed in virtual-stage order: stage i is model chunk
   i // pp of pipeline rank i % pp;
5. each character is a layer: `E` embedding, `t` decoder ("transformer") layer, `m` multi-token
   prediction layer, `L` loss (final norm, LM head and loss).

Its checks (PipelineParallelLayerLayout.__init__ and validate_layer_layout): the stage count is
a multiple of pp (vpp is that count / pp); the first layer is E and the last L, each once; the
t count equals --num-layers and the m count --mtp-num-layers; no t after the first m; MTP sits
in a rank's last chunk, all in one virtual stage, not on the first rank. Megatron also allows
empty stages (`E||t|L`) and MTP in a stage of its own ("MTP standalone"); parplan's layouts are
narrower (solver.spec.layout): every virtual stage holds something and the MTP layers sit with
the loss on the last virtual stage, so such texts are refused here with that reason.
Recompute counts are not part of the syntax: a parsed layout recomputes nothing.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from solver.errors import InputError
from solver.spec.layout import PipelineLayout, VirtualStage

LAYER_NAMES = {"E": "embedding", "t": "decoder layer", "m": "MTP layer", "L": "loss"}
GROUP = re.compile(r"\(([^)]+)\)\*([0-9]+)")
REPEAT = re.compile(r"(.)\*([0-9]+)")
# A repeat count with more digits than this cannot belong to a layout (and int() of a very
# long digit string is refused by Python itself).
MAX_COUNT_DIGITS = 9


def _expand(pattern: re.Pattern[str], text: str, max_chars: int, fail: InputError) -> str:
    """`pattern`'s matches replaced by their repeated text, refusing results over max_chars
    before building them."""
    size = len(text)
    for found in pattern.finditer(text):
        digits = found.group(2)
        count = int(digits) if len(digits) <= MAX_COUNT_DIGITS else max_chars + 1
        size += len(found.group(1)) * count - len(found.group(0))
        if size > max_chars:
            raise fail
    return pattern.sub(lambda found: found.group(1) * int(found.group(2)), text)


def parse_layout_stages(text: str, max_chars: int, source: str = "--layout") -> list[str]:
    """The virtual stages of a layout text, each as its layer characters ("Et*3|(tt|)*2,L" ->
    ["Ettt", "tt", "tt", "L"]); `max_chars` bounds the expansion."""
    where = f"{source} {text!r}"
    too_long = InputError(f"{where}: expands to more than {max_chars} characters, more than "
                          "the model's layers and the virtual stages can take")
    expanded = _expand(GROUP, text.replace(",", ""), 4 * max_chars, too_long)
    expanded = _expand(REPEAT, expanded, max_chars, too_long)
    stages = expanded.split("|")
    for index, stage in enumerate(stages):
        unknown = [char for char in stage if char not in LAYER_NAMES]
        if unknown:
            hint = (" ('(...)' needs a count '*N' and groups do not nest; '*N' follows one "
                    "layer or a group)" if unknown[0] in "()*" else "")
            raise InputError(f"{where}: unknown character {unknown[0]!r} in virtual stage "
                             f"{index}: Megatron's layers are E (embedding), t (decoder layer), "
                             f"m (MTP layer) and L (loss), stages split by '|'{hint}")
    return stages


def max_layout_chars(num_layers: int, num_mtp_layers: int, num_stages: int) -> int:
    """A bound on the expanded text of a layout: a valid one is a character a layer plus a '|'
    between stages; twice that leaves room to name a wrong count rather than the length."""
    return 2 * (num_layers + num_mtp_layers + 1 + num_stages) + 64


def _check_megatron_rules(stages: list[str], num_layers: int, num_mtp_layers: int,
                          where: str) -> None:
    """validate_layer_layout's rules on the expanded stages."""
    flat = "".join(stages)
    for char, place, index in (("E", "first", 0), ("L", "last", -1)):
        name = LAYER_NAMES[char]
        if flat.count(char) != 1:
            raise InputError(f"{where}: {char} ({name}) appears {flat.count(char)} times; it "
                             f"must appear once, as the {place} layer")
        if flat[index] != char:
            raise InputError(f"{where}: the {place} layer must be {char} ({name}), not "
                             f"{flat[index]} ({LAYER_NAMES[flat[index]]})")
    for char, wanted, flag in (("t", num_layers, "decoder layers"),
                               ("m", num_mtp_layers, "MTP layers")):
        if flat.count(char) != wanted:
            raise InputError(f"{where}: it holds {flat.count(char)} {flag} ({char}); the model "
                             f"has {wanted}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise InputError(f"{where}: a decoder layer (t) follows an MTP layer (m); the MTP "
                         "layers come after every decoder layer")


def _check_parplan_rules(stages: list[str], where: str) -> None:
    """What parplan's PipelineLayout cannot hold although Megatron can."""
    last = len(stages) - 1
    for index, stage in enumerate(stages):
        if not stage:
            raise InputError(f"{where}: virtual stage {index} is empty; parplan's layouts give "
                             "every virtual stage a decoder layer, the embedding or the loss")
        if "m" in stage and index != last:
            raise InputError(f"{where}: the MTP layers (m) sit on virtual stage {index}; "
                             f"parplan places them with the loss (L) on the last virtual stage "
                             f"({last}), not in a stage of their own")


def parse_pipeline_layout(text: str, pp: int, vpp: int, num_layers: int, num_mtp_layers: int,
                          source: str = "--layout") -> PipelineLayout:
    """The PipelineLayout a Megatron layout text describes for pp x vpp virtual stages and a
    model of `num_layers` decoder layers and `num_mtp_layers` MTP layers (no recompute)."""
    where = f"{source} {text!r}"
    num_stages = pp * vpp
    stages = parse_layout_stages(text, max_layout_chars(num_layers, num_mtp_layers, num_stages),
                                 source)
    if len(stages) != num_stages:
        reading = (f" (Megatron would read it as vpp {len(stages) // pp})"
                   if len(stages) % pp == 0 else "")
        raise InputError(f"{where}: it has {len(stages)} virtual stages; pp {pp} x vpp {vpp} "
                         f"needs {num_stages}{reading}")
    _check_megatron_rules(stages, num_layers, num_mtp_layers, where)
    _check_parplan_rules(stages, where)
    try:
        return PipelineLayout(pp=pp, vpp=vpp, stages=tuple(
            VirtualStage(layers=stage.count("t"), embedding="E" in stage, loss="L" in stage,
                         mtp_layers=stage.count("m"))
            for stage in stages))
    except ValidationError as exc:  # the rules above leave none; kept one line regardless
        message = exc.errors(include_url=False)[0]["msg"].removeprefix("Value error, ")
        raise InputError(f"{where}: {message}") from None


def _run(char: str, count: int) -> list[str]:
    """`count` layers `char`, written out up to two ("tt"), else repeated ("t*3")."""
    if count == 0:
        return []
    return [char * count] if count <= 2 else [f"{char}*{count}"]


def _render_stage(stage: VirtualStage) -> str:
    """One virtual stage: E, then its decoder layers, MTP layers and L; a comma after a
    repetition, as Megatron's documentation writes them ("Et*3", "t*7,mL")."""
    tokens = (["E"] if stage.embedding else []) + _run("t", stage.layers) + _run(
        "m", stage.mtp_layers) + (["L"] if stage.loss else [])
    text = tokens[0]
    for before, token in zip(tokens, tokens[1:]):
        text += ("," if "*" in before else "") + token
    return text


def render_pipeline_layout(layout: PipelineLayout) -> str:
    """The Megatron layout text of `layout` ("E|(t|)*126,L"): runs of equal virtual stages as a
    group "(X|)*N" where that is shorter. The last stage (the only one with L) is never in a
    run, so no group ends the text with an empty stage."""
    texts = [_render_stage(stage) for stage in layout.stages]
    pieces: list[str] = []
    index = 0
    while index < len(texts):
        count = 1
        while index + count < len(texts) and texts[index + count] == texts[index]:
            count += 1
        text = texts[index]
        group = f"({text}|)*{count},"
        if len(group) < count * (len(text) + 1):
            pieces.append(group)
        else:
            pieces.extend(f"{text}|" for _ in range(count))
        index += count
    return "".join(pieces).removesuffix("|")
