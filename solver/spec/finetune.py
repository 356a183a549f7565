"""FinetuneSpec: what a fine-tuning job trains (issue 42, `--finetune`).

  none   pretraining: every weight trains (the default; nothing below applies)
  full   full fine-tuning (SFT): every weight trains, as in pretraining; the label says so
  lora   the base weights are frozen in bf16 and low-rank adapters train beside the linears
         named in `lora_targets` (Hu et al. 2021): W x + (alpha / r) B A x, A: r x in, B: out x r
  qlora  lora over a base whose decoder-layer linears are stored in 4-bit NormalFloat with
         double-quantized block constants and dequantized to bf16 for every GEMM
         (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs")

Module names are spelled as Hugging Face PEFT (LoraConfig.target_modules over a Llama-style
model: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or as Megatron-Bridge
(megatron/bridge/peft/lora.py LoRA.target_modules: linear_qkv, linear_proj, linear_fc1,
linear_fc2), one spelling per job.

Defaults are Megatron-Bridge's LoRA (peft/lora.py: dim 32, alpha 32, the four Megatron linears,
dropout 0.0), since the default framework is Megatron; PEFT's own default is r 8, alpha 8.
Adapter dropout is taken as 0.0 (Bridge's, PEFT's LoraConfig.lora_dropout and torchtune's
default); the copy of the input a non-zero dropout makes is not modelled.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import ConfigDict, Field, field_validator

from solver.spec.strict import MAX_WIDTH, InputSpec

FinetuneMode = Literal["none", "full", "lora", "qlora"]
FINETUNE_MODES: tuple[FinetuneMode, ...] = get_args(FinetuneMode)
# The linears of a decoder layer as PEFT names them on Llama-style models (transformers
# LlamaAttention / LlamaMLP) and as Megatron-Core names them (SelfAttention.linear_qkv /
# linear_proj, MLP.linear_fc1 / linear_fc2; the gated MLP's gate and up are one linear_fc1).
PEFT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MEGATRON_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
LORA_TARGETS = PEFT_TARGETS + MEGATRON_TARGETS
DEFAULT_LORA_RANK = 32
DEFAULT_LORA_ALPHA = 32.0


class FinetuneSpec(InputSpec):
    """A fine-tuning job's adapters (module docstring); `mode` none is pretraining."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: FinetuneMode = "none"
    lora_rank: Annotated[int, MAX_WIDTH] = Field(default=DEFAULT_LORA_RANK, gt=0)
    lora_alpha: float = Field(default=DEFAULT_LORA_ALPHA, gt=0)
    lora_targets: tuple[str, ...] = MEGATRON_TARGETS
    packed_sequences: bool = False

    @field_validator("lora_targets")
    @classmethod
    def _known_targets(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [name for name in targets if name not in LORA_TARGETS]
        if unknown or not targets:
            raise ValueError(f"{','.join(unknown) or 'nothing'}: choose from "
                             f"{','.join(PEFT_TARGETS)} or {','.join(MEGATRON_TARGETS)}")
        if len(set(targets)) != len(targets):
            raise ValueError(f"{','.join(targets)} names a module twice")
        if set(targets) & set(PEFT_TARGETS) and set(targets) & set(MEGATRON_TARGETS):
            raise ValueError(f"{','.join(targets)} mixes PEFT and Megatron-Bridge names; "
                             "use one spelling")
        return targets

    @property
    def has_adapters(self) -> bool:
        """Whether the base is frozen and only adapters train (lora, qlora)."""
        return self.mode in ("lora", "qlora")

    @property
    def quantized_base(self) -> bool:
        """Whether the frozen base's layer linears are NF4 (qlora)."""
        return self.mode == "qlora"

    @property
    def scaling(self) -> float:
        """The adapter's output scale alpha / r (PEFT LoraLayer.update_layer: lora_alpha / r;
        Bridge LoRALinear: alpha / dim)."""
        return self.lora_alpha / self.lora_rank

    def label(self) -> str:
        """A short label: "" (pretraining), "full SFT", "LoRA r32 (linear_qkv,...)", "QLoRA ..."."""
        if self.mode == "none":
            return ""
        if self.mode == "full":
            return "full SFT" + (", packed" if self.packed_sequences else "")
        name = "LoRA" if self.mode == "lora" else "QLoRA"
        packed = ", packed" if self.packed_sequences else ""
        targets = ",".join(self.lora_targets)
        return f"{name} r{self.lora_rank} a{self.lora_alpha:g} ({targets}){packed}"

    def describe(self) -> dict[str, Any]:
        """The JSON outputs' "finetune" object: mode, label, packing, and with adapters their
        rank, alpha, targets and what the base keeps ("bf16" frozen, "nf4")."""
        out: dict[str, Any] = {"mode": self.mode, "label": self.label(),
                               "packed_sequences": self.packed_sequences}
        if self.has_adapters:
            out.update(lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                       lora_targets=list(self.lora_targets),
                       base_weights="nf4" if self.quantized_base else "bf16")
        return out
