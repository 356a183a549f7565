"""Where Megatron-LM puts each decoder layer and which layers it recomputes: the flags of
`launch --format megatron` that build a plan's pipeline layout (solver.emit.megatron).

The pipeline layout (LaunchTarget.pipeline_layout) goes out in the plainest flags that build
exactly it (megatron_split gives what each set builds):
  1. Megatron's own even split (pp x vpp divides the layers), with
     --num-layers-per-virtual-pipeline-stage under vpp;
  2. --account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split: the
     embedding and the loss each count as a layer slot of the first / last virtual stage;
  3. --decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers: the first / last
     pipeline rank holds that many (vpp of them in equal chunks), the others share the rest,
     with --num-virtual-stages-per-pipeline-rank under vpp;
  4. else --pipeline-model-parallel-layout (solver.spec.layout_syntax), which excludes the
     other three (validate_args: one of --num-layers-per-virtual-pipeline-stage,
     --num-virtual-stages-per-pipeline-rank, --pipeline-model-parallel-layout;
     TransformerConfig.__post_init__: the layout with none of the others).
Full recompute of the first r layers of every model chunk is --recompute-method block
--recompute-num-layers r (megatron/core/recompute.py: block checkpoints layer i of a chunk when
i < r, so a chunk with fewer than r layers recomputes them all); every layer is --recompute-method
uniform --recompute-num-layers 1.
"""

from __future__ import annotations

from solver.emit.target import LaunchTarget
from solver.spec import PipelineLayout
from solver.spec.layout_syntax import render_pipeline_layout


def megatron_split(num_layers: int, pp: int, vpp: int, embedding_slot: bool = False,
                   loss_slot: bool = False, first: int | None = None,
                   last: int | None = None) -> list[int] | None:
    """Decoder layers of each virtual stage that Megatron-Core builds from these flags, or None
    where its checks refuse them.

    megatron/core/transformer/transformer_block.py get_num_layers_to_build: a rank holds
    (L + the embedding and loss slots) / pp layers, or `first` / `last` on the first / last
    rank and an equal share of the rest elsewhere, cut into vpp equal chunks; the slots come
    off the first and the last chunk. The refusals are those of megatron/training/arguments.py
    validate_args and transformer_config.py __post_init__: the slots do not combine with
    first / last; first and last are > 0 and multiples of vpp; the middle ranks' layers divide
    evenly into ranks and chunks; (L + slots) divides into pp ranks and vpp chunks.
    Worked example (transformer_block.py's comment): 8 layers, pp 2, vpp 4 -> one a chunk.
    """
    if first is not None or last is not None:
        if embedding_slot or loss_slot:
            return None
        ends = [n for n in (first, last) if n is not None]
        if any(n <= 0 or n % vpp for n in ends):
            return None
        middle_ranks, middle_layers = pp - len(ends), num_layers - sum(ends)
        if middle_layers < 0 or (middle_ranks == 0) != (middle_layers == 0):
            return None
        share = middle_layers // middle_ranks if middle_ranks else 0
        if middle_ranks and (middle_layers % middle_ranks or share % vpp):
            return None
        per_rank = [first if rank == 0 and first is not None else
                    last if rank == pp - 1 and last is not None else share
                    for rank in range(pp)]
        return [per_rank[v % pp] // vpp for v in range(pp * vpp)]
    slots = num_layers + embedding_slot + loss_slot
    if slots % pp or (slots // pp) % vpp:
        return None
    counts = [slots // (pp * vpp)] * (pp * vpp)
    counts[0] -= embedding_slot
    counts[-1] -= loss_slot
    return counts if min(counts) >= 0 else None


def split_flags(layers: list[int], pp: int, vpp: int) -> list[tuple[str, ...]] | None:
    """The plainest Megatron flags that build `layers` per virtual stage (module docstring),
    None when only --pipeline-model-parallel-layout does."""
    num_layers = sum(layers)
    for embedding_slot, loss_slot in ((False, False), (True, False), (False, True),
                                      (True, True)):
        if megatron_split(num_layers, pp, vpp, embedding_slot, loss_slot) == layers:
            per_chunk = (num_layers + embedding_slot + loss_slot) // (pp * vpp)
            flags = ([("--num-layers-per-virtual-pipeline-stage", str(per_chunk))]
                     if vpp > 1 else [])
            flags += [("--account-for-embedding-in-pipeline-split",)] if embedding_slot else []
            return flags + ([("--account-for-loss-in-pipeline-split",)] if loss_slot else [])
    first, last = layers[0] * vpp, layers[pp - 1] * vpp
    for ends in ((first, None), (None, last), (first, last)):
        if megatron_split(num_layers, pp, vpp, first=ends[0], last=ends[1]) == layers:
            flags = [("--num-virtual-stages-per-pipeline-rank", str(vpp))] if vpp > 1 else []
            for flag, value in zip(("--decoder-first-pipeline-num-layers",
                                    "--decoder-last-pipeline-num-layers"), ends):
                flags += [(flag, str(value))] if value is not None else []
            return flags
    return None


def pipeline_flags(target: LaunchTarget, pipeline: PipelineLayout
                    ) -> tuple[list[tuple[str, ...]], list[str]]:
    """The flags that place the layers, and notes."""
    c = target.config
    if c.pp == 1:
        return [], []
    layers = [stage.layers for stage in pipeline.stages]
    flags = split_flags(layers, c.pp, c.vpp)
    if flags is not None:
        return flags, []
    notes = ["--pipeline-model-parallel-layout places each virtual stage's layers as planned "
             "(a Megatron-Core of 2025 or later)"]
    mtp = pipeline.stages[-1].mtp_layers
    if mtp:
        notes.append(f"the layout holds {mtp} MTP layer(s) (m): Megatron checks them against "
                     f"--mtp-num-layers {mtp}")
    return [("--pipeline-model-parallel-layout", render_pipeline_layout(pipeline))], notes


def recompute_flags(target: LaunchTarget, pipeline: PipelineLayout
                     ) -> tuple[list[tuple[str, ...]], list[str], list[str]]:
    """Recompute flags for the layout's full-recompute counts, warnings and notes."""
    counts = [stage.recompute_layers for stage in pipeline.stages]
    layers = [stage.layers for stage in pipeline.stages]
    other = target.other_recompute
    if not any(counts):
        return ([("--recompute-granularity", "selective")] if other == "selective" else []), \
            [], []
    if counts == layers:
        return [("--recompute-granularity", "full"), ("--recompute-method", "uniform"),
                ("--recompute-num-layers", "1")], [], []
    most = max(counts)
    flags = [("--recompute-granularity", "full"), ("--recompute-method", "block"),
             ("--recompute-num-layers", str(most))]
    warnings: list[str] = []
    built = [min(most, n) for n in layers]
    if built != counts:
        extra = sum(built) - sum(counts)
        warnings.append(
            f"Megatron recomputes the same number of layers in every model chunk "
            f"(--recompute-num-layers, block method); the plan recomputes "
            f"{'/'.join(str(n) for n in sorted(set(counts)))} per virtual stage, so with "
            f"{most} everywhere {extra} more layer(s) per micro-batch run their forward twice: "
            "less activation memory, more step time than estimated")
    if other == "selective":
        warnings.append("Megatron has one recompute granularity: with full recompute of the "
                        "first layers of each chunk, the other layers keep all their "
                        "activations instead of recomputing selectively (more activation "
                        "memory than planned)")
    notes = (["Megatron does not recompute MTP layers under the block method "
              "(multi_token_prediction.py)"] if pipeline.stages[-1].mtp_layers else [])
    return flags, warnings, notes

