"""What the step time knowingly leaves out, in words, declared once here for every output to
show beside its numbers: `estimate` and `optimize`, as text (a `note:` line) and as JSON (the
answer's `notes`, so a sweep's lines carry them too). Each caveat names the model property that
calls for it, what is not modelled and why, and what the public runs measure of it
(benchmarks/time_accuracy.py; tests/test_caveats.py checks the stated range against them, so
the words cannot drift from the model).

  attention_sinks   gpt-oss's learned per-head softmax offsets (ModelSpec.attention_sinks).
                    The training attention is timed from TensorRT-LLM's forward kernels (the
                    full-attention layers' without sinks; the 128-token windows' with them,
                    solver.cost.kernels.kernels_attention) and FlashAttention-3's backward-over-
                    forward ratio. Training runs something else: Transformer Engine's
                    DotProductAttention with softmax_type "learnable" disables FlashAttention
                    and runs cuDNN's fused attention with a sink token (cuDNN 9.13.1 and
                    later; TE v2.9-v2.13 dot_product_attention/utils.py get_attention_backend,
                    common/fused_attn/fused_attn.cpp), forward and backward, the sinks'
                    gradient included (fused_attn_f16_arbitrary_seqlen.cu set_dsink_token);
                    no table measures it. On Megatron-Bridge's five public gpt-oss-120b runs
                    (64 H100s, BF16, NeMo 25.11-26.04.01) the model predicts 1.06-1.18x their
                    tokens/s: the note says 1.05-1.20x.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from solver.spec import ModelSpec


@dataclass(frozen=True)
class Caveat:
    """One thing the step time leaves out: a stable snake_case name, the models it concerns,
    and the note the outputs show."""

    name: str
    concerns: Callable[[ModelSpec], bool]
    note: str


# Predicted over measured tokens/s on the public runs a caveat's note quotes (module docstring;
# tests/test_caveats.py recomputes them): a statement about those runs, used in no formula.
SINK_RUNS_PREDICTED_OVER_MEASURED = (1.05, 1.20)

CAVEATS = (
    Caveat(
        "attention_sinks",
        lambda model_spec: model_spec.attention_sinks,
        "attention sinks: training attention is timed from TensorRT-LLM's forward kernels and "
        "FlashAttention-3's backward ratio, not from the cuDNN sink attention that Transformer "
        "Engine runs (forward, backward, the sinks' gradient), which no table measures; on "
        "Megatron-Bridge's public gpt-oss-120b runs (64 H100s, BF16) the predicted tokens/s "
        f"are {SINK_RUNS_PREDICTED_OVER_MEASURED[0]:.2f}-"
        f"{SINK_RUNS_PREDICTED_OVER_MEASURED[1]:.2f}x the measured, so step times may be "
        "short by as much"),
)


def list_time_caveats(model_spec: ModelSpec) -> tuple[str, ...]:
    """The notes of the caveats that concern `model_spec`, in CAVEATS' order."""
    return tuple(caveat.note for caveat in CAVEATS if caveat.concerns(model_spec))
