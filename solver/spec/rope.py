"""Rotary position embeddings stretched for long contexts: Hugging Face config.json's
`rope_scaling` table, of which parplan reads YaRN's (the other rope types change no cost).

What a cost reads of it is YaRN's attention factor (`RopeScaling.yarn_attention_factor`): the
factor the rotary cos and sin are multiplied by, so that q.k grows with the stretch. Both
readings of a config agree on it: transformers' `_compute_yarn_parameters`
(modeling_rope_utils.py) and Megatron-Core's `_yarn_get_concentration_factor`
(megatron/core/models/common/embeddings/yarn_rotary_pos_embedding.py, core_r0.15.0-0.18.0):

  attention_factor                                 where the table gives it (transformers)
  mscale(factor, mscale) / mscale(factor, mscale_all_dim)   where it gives both (DeepSeek)
  mscale(factor, 1)                                otherwise (gpt-oss)
  mscale(s, m) = 0.1 m ln(s) + 1 for s > 1, else 1

Worked numbers: gpt-oss (factor 32, neither mscale) 0.1 ln 32 + 1 = 1.3466; DeepSeek-V3
(factor 40, mscale = mscale_all_dim = 1) 1.0.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field

from solver.spec.strict import MAX_SEQ_LEN, InputSpec


class RopeScaling(InputSpec):
    """A YaRN or Llama 3 `rope_scaling` table as config.json writes it (keys and meanings of
    transformers' YaRN and llama3 rope types; beta_fast, beta_slow,
    original_max_position_embeddings, truncate and the llama3 frequency factors are kept as
    read, no cost uses them; launch files write them)."""

    rope_type: Literal["yarn", "llama3"] = "yarn"
    factor: float = Field(gt=0)
    # Llama 3's frequency bands (transformers' _compute_llama3_parameters; Llama 3.1: 1 and 4)
    low_freq_factor: float | None = Field(default=None, gt=0)
    high_freq_factor: float | None = Field(default=None, gt=0)
    original_max_position_embeddings: Annotated[int, MAX_SEQ_LEN] | None = Field(
        default=None, gt=0)
    beta_fast: float | None = Field(default=None, gt=0)
    beta_slow: float | None = Field(default=None, gt=0)
    mscale: float | None = Field(default=None, gt=0)
    mscale_all_dim: float | None = Field(default=None, gt=0)
    attention_factor: float | None = Field(default=None, gt=0)
    truncate: bool | None = None

    @property
    def yarn_attention_factor(self) -> float:
        """The factor on the rotary cos and sin (module docstring); 1 for Llama 3's scaling,
        which stretches the frequencies only (_compute_llama3_parameters returns 1.0)."""
        if self.rope_type == "llama3":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale is not None and self.mscale_all_dim is not None:
            return (_yarn_mscale(self.factor, self.mscale)
                    / _yarn_mscale(self.factor, self.mscale_all_dim))
        return _yarn_mscale(self.factor, 1.0)


def _yarn_mscale(scale: float, mscale: float) -> float:
    """YaRN's get_mscale: 0.1 m ln(s) + 1, and 1 where the context is not stretched."""
    return 0.1 * mscale * math.log(scale) + 1.0 if scale > 1.0 else 1.0
