"""Zero-computation experts: the field of ModelSpec that describes them and the expert count
a token visits; their costs are the routed experts' own, at that count (solver.cost).

LongCat-Flash (Meituan 2025, arXiv:2509.01322 §2.1; HF config `zero_expert_num`) routes each
token to its top `num_experts_per_tok` of `num_experts` FFN experts **and** `num_zero_experts`
identity experts, which return their input scaled by the routing weight: no parameters, no
FLOPs and, in the engines, no dispatch (transformers LongcatFlashExperts: `identity_expert` for
indices >= n_routed_experts; vLLM computes them next to the router, zero_experts_compute). The
router scores all of them (classifier hidden -> num_experts + num_zero_experts).

How many FFN experts a token visits depends on the token. With the load balanced over all
E + Z experts, as LongCat-Flash's expert bias keeps it, each of the k picks is an FFN expert
with probability E / (E + Z): k E / (E + Z) FFN experts on average. LongCat-Flash
(k 12, E 512, Z 256): 8, which gives the card's "27B activated on average" (18.6B with no
FFN expert, 31.3B with 12).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from solver.spec.strict import MAX_EXPERTS, InputSpec


class ZeroExpertFields(InputSpec):
    """`num_zero_experts` (HF zero_expert_num): identity experts next to the routed ones."""

    num_zero_experts: Annotated[int, MAX_EXPERTS] = Field(default=0, ge=0)

    def _check_zero_experts(self, num_experts: int) -> None:
        if self.num_zero_experts and not num_experts:
            raise ValueError("num_zero_experts needs num_experts > 0 (routed FFN experts)")

    @property
    def experts_per_token(self) -> float:
        """Routed FFN experts a token visits (ModelSpec's num_experts, num_experts_per_tok):
        num_experts_per_tok, fewer on average with zero experts."""
        return self.experts_per_token_of(self.num_experts,  # type: ignore[attr-defined]
                                         self.num_experts_per_tok)  # type: ignore[attr-defined]

    def experts_per_token_of(self, num_experts: int, top_k: int) -> float:
        """FFN experts a token visits on average: top_k E / (E + Z) (module docstring); top_k
        without zero experts. LongCat-Flash: 12 x 512 / 768 = 8."""
        if not self.num_zero_experts:
            return float(top_k)
        return top_k * num_experts / (num_experts + self.num_zero_experts)
