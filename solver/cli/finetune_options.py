"""The fine-tuning flags (issue 42; solver.spec.finetune) shared by estimate, optimize and sweep:
--finetune --lora-rank --lora-alpha --lora-targets --packed-sequences. Defaults come from
FinetuneSpec, so they are written once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click
from pydantic import ValidationError

from solver.cli.params import BoundedInt, FiniteFloat
from solver.errors import InputError, format_validation_error
from solver.spec.finetune import (
    FINETUNE_MODES,
    MEGATRON_TARGETS,
    PEFT_TARGETS,
    FinetuneSpec,
)
from solver.spec.strict import MAX_WIDTH

F = TypeVar("F", bound=Callable[..., object])
FINETUNE_PARAMS = ("finetune", "lora_rank", "lora_alpha", "lora_targets", "packed_sequences")
_DEFAULTS = FinetuneSpec()


def finetune_options(command: F) -> F:
    """The five flags, as parameters named FINETUNE_PARAMS (collected by `pop_finetune`)."""
    options = [
        click.option("--finetune", type=click.Choice(FINETUNE_MODES), default="none",
                     show_default=True,
                     help="What trains: none (pretraining), full (SFT: every weight), lora "
                          "(frozen bf16 base, low-rank adapters) or qlora (frozen NF4 base)."),
        click.option("--lora-rank", type=BoundedInt(1, MAX_WIDTH), default=None,
                     help=f"Adapter rank r (default {_DEFAULTS.lora_rank}, "
                          "Megatron-Bridge's LoRA dim)."),
        click.option("--lora-alpha", type=FiniteFloat(0, None, min_open=True), default=None,
                     help=f"Adapter alpha; scale alpha/r (default {_DEFAULTS.lora_alpha:g})."),
        click.option("--lora-targets", default=None, metavar="M,M,...",
                     help="Adapted linears, as PEFT names them (" + ",".join(PEFT_TARGETS)
                          + ") or as Megatron-Bridge does (" + ",".join(MEGATRON_TARGETS)
                          + "; the default)."),
        click.option("--packed-sequences", is_flag=True, default=False,
                     help="Samples packed into each --seq-len sequence (Megatron-Bridge "
                          "packed_sequence, TRL packing); a label and launch setting: "
                          "attention is costed over the whole sequence (an upper bound)."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def pop_finetune(values: dict[str, Any]) -> FinetuneSpec | None:
    """The FinetuneSpec of a command's keyword arguments (removed from `values`); None for
    pretraining with no adapter flag given. Adapter flags without --finetune lora|qlora are
    refused in one line."""
    given = {name: values.pop(name, None) for name in FINETUNE_PARAMS}
    mode = given["finetune"] or "none"
    adapter_flags = [f"--{name.replace('_', '-')}" for name in FINETUNE_PARAMS[1:4]
                     if given[name] is not None]
    if adapter_flags and mode not in ("lora", "qlora"):
        raise InputError(f"{', '.join(adapter_flags)}: adapters need --finetune lora or qlora "
                         f"(not {mode})")
    if mode == "none" and not given["packed_sequences"]:
        return None
    fields: dict[str, Any] = {"mode": mode, "packed_sequences": bool(given["packed_sequences"])}
    if given["lora_rank"] is not None:
        fields["lora_rank"] = given["lora_rank"]
    if given["lora_alpha"] is not None:
        fields["lora_alpha"] = given["lora_alpha"]
    if given["lora_targets"] is not None:
        fields["lora_targets"] = tuple(name.strip() for name in given["lora_targets"].split(",")
                                       if name.strip())
    try:
        return FinetuneSpec(**fields)
    except ValidationError as exc:
        raise InputError(format_validation_error("--lora-targets", exc)) from None

