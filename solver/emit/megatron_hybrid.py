"""`launch --format megatron` for a model with a block pattern (solver.spec.blocks): the
windows and gated DeltaNet layers of a GPT model (build_block_flags), and a Mamba hybrid's
pattern and pipeline split (build_mamba_hybrid_flags).

Windows and DeltaNet (Megatron-Core 0.16 TransformerConfig fields and arguments.py):
  sliding   --window-size "(w-1,0)": TE's window of w - 1 earlier keys and none later, as
            Megatron-Bridge converts HF's sliding_window w (src/megatron/bridge/models/
            conversion/utils.py mcore_to_hf_window_size: window_size[0] + 1); with full layers
            too, --window-attn-skip-freq lists the layers, 1 sliding and 0 full
  chunked   no Megatron-Core counterpart: no TransformerConfig field or arguments.py flag
            from core_v0.16.1 to main (d98e8a6, 2026-08); the only "attention_chunk" is
            attention.py's FlashAttention-3 inference call, fixed at 0. Megatron-Bridge
            chunks Llama 4 in its own Llama4SelfAttention (llama4_utils.py: chunkify,
            chunkify_cu_seqlens), on every layer, NoPE ones included, where Hugging Face
            chunks the RoPE layers only. A warning
  linear    --experimental-attention-variant gated_delta_net, --linear-attention-freq (1 a
            DeltaNet layer, 0 softmax attention), the --linear-* head sizes and conv width;
            Qwen3-Next's output gate is --attention-output-gate

Megatron builds a Mamba hybrid with pretrain_mamba.py (MambaModel) from a pattern string with
one symbol per layer (M Mamba-2, * attention, - MLP, E MoE: solver.spec.blocks.render_pattern
for Nemotron-H, whose layers hold one block each) and the --mamba-* sizes. How it splits the
pattern over pipeline stages depends on the version:

  core_v0.16  megatron/core/ssm/mamba_block.py, MambaStack._select_layers_for_pipeline_parallel:
              no virtual stages (it asserts virtual_pipeline_model_parallel_size is None);
              rank r holds num_layers // pp layers from r x that, or, with
              --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers, those
              on the first / last rank and an equal share of the rest elsewhere (validate_args
              and TransformerConfig check the division, as megatron_pipeline.megatron_split
              does). It reads neither --pipeline-model-parallel-layout nor the embedding and
              loss slots.
  core_v0.17  megatron/core/ssm/mamba_hybrid_layer_allocation.py, select_pipeline_segment: `|`
              in --hybrid-layer-pattern cuts the pattern into pp x vpp segments, segment
              vp x pp + rank for virtual stage vp of rank `rank`: any split, virtual stages
              included.

So the planned split goes out as core_v0.16 builds it where it can, else as a `|`-segmented
pattern with a note that it needs Megatron-Core 0.17 or later: either way the launched model
has exactly the planned stages.

Multi-token prediction (Nemotron 3 Super and Ultra): core_v0.16's MambaModel has none; from
core_v0.17 its MTP depths follow the main pattern after `/` (mamba_hybrid_layer_allocation.py
parse_hybrid_pattern: "<main>/<mtp>/<mtp>"; arguments.py turns the older
--mtp-hybrid-override-pattern into it). Each depth is an attention layer and the model's MLP
or MoE layer, "*E" as Nemotron 3's config.json states (mtp_hybrid_override_pattern), which is
the layer ModelSpec.mtp_params counts; such a model always goes out in the core_v0.17 form.
"""

from __future__ import annotations

from solver.emit.megatron_pipeline import megatron_split
from solver.emit.target import LaunchTarget
from solver.spec import ModelSpec, PipelineLayout
from solver.spec.blocks import MIXER_LETTERS, MLP_LETTERS, render_pattern

SEGMENT_SEPARATOR = "|"
MTP_SEPARATOR = "/"


def render_layer_pattern(pattern: list[int]) -> str:
    """A 0/1 list as a short Python list expression (arguments.py moe_freq_type,
    la_freq_type): runs of equal values, and its shortest repeating period once:
    "([0]*3+[1]*58)", "([1]*3+[0]*1)*12"."""
    n = len(pattern)
    period = next(p for p in range(1, n + 1)
                  if n % p == 0 and pattern == pattern[:p] * (n // p))
    period = n if period == 1 else period
    runs: list[tuple[int, int]] = []
    for value in pattern[:period]:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    text = "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")"
    return text if period == n else f"{text}*{n // period}"


def layer_symbols(model_spec: ModelSpec) -> list[str]:
    """Each layer's Megatron symbols, in model order (one per block it holds)."""
    return [MIXER_LETTERS[mixer] + MLP_LETTERS[mlp]
            for mixer, mlp in zip(model_spec.layer_mixers, model_spec.layer_mlps)]


def render_segmented_pattern(model_spec: ModelSpec, layers: list[int]) -> str:
    """The pattern cut after each virtual stage's `layers` (in virtual-stage order, which is
    select_pipeline_segment's segment order vp x pp + rank)."""
    symbols, segments, start = layer_symbols(model_spec), [], 0
    for count in layers:
        segments.append("".join(symbols[start:start + count]))
        start += count
    assert start == len(symbols)
    return SEGMENT_SEPARATOR.join(segments)


def mamba_stack_split_flags(layers: list[int], pp: int, vpp: int
                            ) -> list[tuple[str, ...]] | None:
    """The core_v0.16 flags with which MambaStack builds `layers` per pipeline rank (none for
    its even split), or None where it cannot (virtual stages, or an uneven split other than
    first / last rank plus equal middle ranks)."""
    if vpp != 1:
        return None
    num_layers = sum(layers)
    if megatron_split(num_layers, pp, 1) == layers:
        return []
    for first, last in ((layers[0], None), (None, layers[-1]), (layers[0], layers[-1])):
        if megatron_split(num_layers, pp, 1, first=first, last=last) == layers:
            flags: list[tuple[str, ...]] = []
            if first is not None:
                flags.append(("--decoder-first-pipeline-num-layers", str(first)))
            if last is not None:
                flags.append(("--decoder-last-pipeline-num-layers", str(last)))
            return flags
    return None


def build_mamba_hybrid_flags(target: LaunchTarget, pipeline: PipelineLayout
                             ) -> tuple[list[tuple[str, ...]], list[str], list[str]]:
    """Flags, warnings and notes of a Mamba hybrid: the pattern, the --mamba-* sizes and the
    planned pipeline split (module docstring)."""
    m, c = target.model_spec, target.config
    sizes = [("--is-hybrid-model",), ("--mamba-num-heads", str(m.mamba_num_heads)),
             ("--mamba-head-dim", str(m.mamba_head_dim)),
             ("--mamba-num-groups", str(m.n_groups)),
             ("--mamba-state-dim", str(m.ssm_state_size))]
    warnings = ["Megatron builds a Mamba hybrid with pretrain_mamba.py (MambaModel), not "
                "pretrain_gpt.py"]
    if any(len(symbols) != 1 for symbols in layer_symbols(m)):
        warnings.append("a layer holds both a mixer and an MLP: Megatron's pattern has one "
                        "layer per symbol, so --num-layers must count the symbols")
    layers = [stage.layers for stage in pipeline.stages]
    split = mamba_stack_split_flags(layers, c.pp, c.vpp) if c.pp > 1 else []
    mtp = "".join(MTP_SEPARATOR + "*" + ("E" if m.is_moe else "-")
                  for _ in range(m.mtp_depths))
    if split is not None and not mtp:
        pattern = render_pattern(m.layer_mixers, m.layer_mlps)
        return [*sizes, ("--hybrid-override-pattern", pattern), *split], warnings, []
    if split is not None and c.pp == 1:
        note = (f"--hybrid-layer-pattern appends the {m.mtp_depths} MTP "
                "depth(s) after '/': Megatron-Core 0.17 or later (core_v0.16's MambaModel has "
                "no multi-token prediction)")
    else:
        note = (f"--hybrid-layer-pattern cuts the pattern into the planned {c.pp * c.vpp} "
                f"pipeline segments ({'/'.join(map(str, layers))} layers): Megatron-Core 0.17 "
                "or later (select_pipeline_segment); core_v0.16's MambaStack builds no "
                "virtual stages and only even or first/last-rank splits")
    return ([*sizes, ("--hybrid-layer-pattern", render_segmented_pattern(m, layers) + mtp)],
            warnings, [note])


def build_block_flags(model_spec: ModelSpec, cp: int = 1
                      ) -> tuple[list[tuple[str, ...]], list[str]]:
    """The windows and gated DeltaNet layers as Megatron flags, and warnings for what it cannot
    build (module docstring; `cp` the plan's context-parallel degree)."""
    m, flags, warnings = model_spec, [], []
    mixers = m.layer_mixers
    if "sliding_attention" in mixers:
        flags.append(("--window-size", f"({m.sliding_window - 1},0)"))  # type: ignore[operator]
        if set(mixers) != {"sliding_attention"}:
            flags.append(("--window-attn-skip-freq", render_layer_pattern(
                [int(mixer == "sliding_attention") for mixer in mixers])))
    if "chunked_attention" in mixers:
        warnings.append(f"Megatron-Core has no chunked attention: the {mixers.count('chunked_attention')} "
                        f"layers that attend within {m.attention_chunk_size}-token chunks are "
                        "built as full attention (Megatron-Bridge chunks Llama 4 itself)")
    if "linear_attention" in mixers:
        flags += [("--experimental-attention-variant", "gated_delta_net"),
                  ("--linear-attention-freq", render_layer_pattern(
                      [int(mixer == "linear_attention") for mixer in mixers])),
                  ("--linear-conv-kernel-dim", str(m.linear_conv_kernel_dim)),
                  ("--linear-key-head-dim", str(m.linear_key_head_dim)),
                  ("--linear-value-head-dim", str(m.linear_value_head_dim)),
                  ("--linear-num-key-heads", str(m.linear_num_key_heads)),
                  ("--linear-num-value-heads", str(m.linear_num_value_heads))]
        if cp > 1:  # solver.search.constraints megatron_linear_attention_no_cp
            warnings.append(f"Megatron-Core 0.16 runs gated DeltaNet without context "
                            f"parallelism (core_v0.18.0 adds it): cp {cp} needs 0.18 or later")
    if m.attention_output_gate:
        flags.append(("--attention-output-gate",))
    return flags, warnings

