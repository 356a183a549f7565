"""Comparing a computed parameter count with a published figure ("37B", "124,439,808").

A figure is matched within 1% or within one unit of its last printed digit, whichever is
looser: "37B" may mean anything from 36.5B to 37.5B (rounded) or 37.0B to 38.0B (truncated,
as Qwen's cards do), so a 1% test would reject the right architecture.
"""

from __future__ import annotations

import re
from typing import NamedTuple

RELATIVE_TOLERANCE = 0.01


class Published(NamedTuple):
    """Parameter counts as their makers wrote them ("8.03B", "176,247,271,424"), the source,
    and, where a checkpoint gives it, the exact total."""

    total: str
    active: str | None
    source: str
    exact_total: int | None = None
    # OpenAI (gpt-oss model card Table 1) and DeepSeek leave the input embedding, a lookup, out
    # of "active" parameters; Mistral, Qwen and the others count it.
    active_without_embedding: bool = False
    # The total counts the checkpoint's MTP module with its own copies of the embedding and
    # the LM head, as DeepSeek's cards do ("685B: 671B main model weights and 14B MTP module
    # weights", DeepSeek-V3 README; the MTP layer's embed_tokens and shared_head.head).
    total_with_mtp_checkpoint: bool = False


def parse_published_count(text: str) -> tuple[float, float]:
    """("37B" -> 37e9, 1e9), ("124,439,808" -> 124439808, 1): the value and one unit of its
    last digit."""
    match = re.fullmatch(r"(\d[\d,]*)(?:\.(\d+))?(B?)", text)
    assert match, f"unparsable published count {text!r}"
    whole, fraction, billions = match.groups()
    scale = 1e9 if billions else 1.0
    fraction = fraction or ""
    value = float(whole.replace(",", "") + "." + (fraction or "0")) * scale
    return value, scale * 10.0 ** -len(fraction)


def assert_matches_published(computed: int, published: str, what: str) -> None:
    value, last_digit_unit = parse_published_count(published)
    tolerance = max(RELATIVE_TOLERANCE * value, last_digit_unit)
    error = (computed - value) / value
    assert abs(computed - value) <= tolerance, (
        f"{what}: computed {computed:,} ({computed / 1e9:.3f}B) is {error:+.2%} from the "
        f"published {published}"
    )
