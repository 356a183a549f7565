"""The block pattern of a decoder: which token mixer and which MLP each layer holds.

Vocabulary (HF's `layer_types` names where HF has one):
  mixer   full_attention     softmax attention over every earlier token
          sliding_attention  attention over the last `sliding_window` tokens (Mistral, Gemma
                             2/3, gpt-oss)
          chunked_attention  attention inside aligned chunks of `attention_chunk_size` tokens
                             (Llama 4's RoPE layers)
          linear_attention   gated DeltaNet (Qwen3-Next; Yang et al. 2024, arXiv:2412.06464)
          mamba              a Mamba-2 mixer (Dao & Gu 2024, arXiv:2405.21060; Nemotron-H)
          none               no mixer (Nemotron-H's MLP-only and MoE-only layers)
  mlp     dense | moe | none
A layer's **kind** is its (mixer, mlp) pair. Kinds 0 and 1 are always (full_attention, dense)
and (full_attention, moe), the two kinds of a plain transformer; other kinds follow in order
of first appearance, so a model without a pattern has exactly today's two kinds.

The names only: what a layer of each kind holds is counted by ModelSpec (its parameters in
solver.spec.model_params, the keys its attention sees in ModelSpec.context_tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

Mixer = Literal["full_attention", "sliding_attention", "chunked_attention", "linear_attention",
                "mamba", "none"]
Mlp = Literal["dense", "moe", "none"]
MIXERS: tuple[str, ...] = ("full_attention", "sliding_attention", "chunked_attention",
                           "linear_attention", "mamba", "none")
ATTENTION_MIXERS = frozenset({"full_attention", "sliding_attention", "chunked_attention"})
BASE_KINDS: tuple[tuple[str, str], ...] = (("full_attention", "dense"), ("full_attention", "moe"))
# One letter per mixer and MLP for `models show` (Nemotron-H's own letters where it has them).
MIXER_LETTERS = {"full_attention": "*", "sliding_attention": "s", "chunked_attention": "c",
                 "linear_attention": "L", "mamba": "M", "none": ""}
MLP_LETTERS = {"dense": "-", "moe": "E", "none": ""}


def render_pattern(mixers: Sequence[str], mlps: Sequence[str]) -> str:
    """The block pattern of layers with these mixers and MLPs (ModelSpec.layer_mixers,
    layer_mlps) in letters, one group per layer: Nemotron-H's own string for its models
    (M mamba, * attention, - MLP, E MoE; a layer with both shows both), s sliding, c chunked
    and L linear attention."""
    return "".join(MIXER_LETTERS[mixer] + MLP_LETTERS[mlp] for mixer, mlp in zip(mixers, mlps))
