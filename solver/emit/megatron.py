"""`launch --format megatron`: Megatron-LM command-line arguments for a plan.

The target is Megatron-LM core_v0.16 (VERSION; `launch --validate` runs its parse_args and
validate_args when a checkout is importable). Flag names are those of
megatron/training/arguments.py (NVIDIA/Megatron-LM core_v0.16.1):
_add_distributed_args (--tensor-model-parallel-size, --pipeline-model-parallel-size,
--overlap-grad-reduce, --overlap-param-gather,
--num-layers-per-virtual-pipeline-stage, --pipeline-model-parallel-layout,
--context-parallel-size, --use-distributed-optimizer, --use-megatron-fsdp,
--data-parallel-sharding-strategy, --use-tp-pp-dp-mapping), _add_moe_args
(--expert-model-parallel-size, --expert-tensor-parallel-size), _add_training_args
(--micro-batch-size, --global-batch-size, --sequence-parallel, --recompute-granularity
{full,selective}, --recompute-method {uniform,block}, --recompute-num-layers,
--no-gradient-accumulation-fusion), _add_data_args (--seq-length), _add_mixed_precision_args
(--bf16), _add_checkpointing_args (--ckpt-format) and _add_transformer_engine_args
(--fp8-format {e4m3,hybrid}). There is no --virtual-pipeline-model-parallel-size any more.
The framework profile's features (solver.cost.frameworks) go out as TransformerConfig flags
(_feature_flags: --moe-token-dispatcher-type, --moe-flex-dispatcher-backend,
--moe-grouped-gemm, --cuda-graph-impl, --cuda-graph-scope, --tp-comm-overlap,
--overlap-moe-expert-parallel-comm). The model's architecture goes out in full
(_architecture_flags: layers, widths, heads and query groups, vocabulary, norm, position
embedding, biases, MoE and MLA shapes, MTP layers), as TransformerConfig fields that
ArgumentGroupFactory turns into flags (--num-layers, --hidden-size, --ffn-hidden-size,
--num-attention-heads, --num-query-groups, --kv-channels, --normalization, --num-moe-experts
as --num-experts, --moe-router-topk, --moe-ffn-hidden-size, --moe-shared-expert-intermediate-size,
--moe-layer-freq, --multi-latent-attention, --q-lora-rank, --kv-lora-rank, --qk-head-dim,
--qk-pos-emb-head-dim, --v-head-dim, --mtp-num-layers) and _add_network_size_args flags.

Mappings: ZeRO 1 is the distributed optimizer; ZeRO 2 and 3 are Megatron-FSDP with sharding
strategy optim_grads / optim_grads_params, which validate_args requires to checkpoint as
fsdp_dtensor (Megatron-Core docs, "Megatron FSDP": --use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads_params --no-gradient-accumulation-fusion
--use-distributed-optimizer).

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

import shlex

import numpy as np

from solver.cost.time_constants import framework_time_constants
from solver.emit.layout import build_rank_layout
from solver.emit.target import Emitted, LaunchTarget
from solver.errors import InputError
from solver.spec import PipelineLayout
from solver.spec.layout_syntax import render_pipeline_layout

VERSION = "core_v0.16"
# Megatron-LM builds its groups in one of two orders (parallel_state.initialize_model_parallel).
MEGATRON_ORDERS = {"tp-cp-ep-dp-pp": (), "tp-cp-ep-pp-dp": ("--use-tp-pp-dp-mapping",)}
FSDP_STRATEGIES = {2: "optim_grads", 3: "optim_grads_params"}


def _order_flags(target: LaunchTarget) -> tuple[list[str], list[str]]:
    """The flag that selects the target's rank order, or a warning when Megatron has none."""
    config, layout = target.config, target.layout
    is_moe = layout.expert is not None
    for order, flags in MEGATRON_ORDERS.items():
        try:
            theirs = build_rank_layout(config, is_moe, order).groups()
        except InputError:  # Megatron refuses that order for this plan too
            continue
        if all(np.array_equal(theirs[name], rows) for name, rows in layout.groups().items()):
            return list(flags), []
    return [], [f"Megatron-LM builds its groups in order tp-cp-ep-dp-pp (or tp-cp-ep-pp-dp with "
                f"--use-tp-pp-dp-mapping), not {'-'.join(layout.order)}: its groups will differ "
                "from `--format groups`"]


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


def _split_flags(layers: list[int], pp: int, vpp: int) -> list[tuple[str, ...]] | None:
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


def _pipeline_flags(target: LaunchTarget, pipeline: PipelineLayout
                    ) -> tuple[list[tuple[str, ...]], list[str]]:
    """The flags that place the layers, and notes."""
    c = target.config
    if c.pp == 1:
        return [], []
    layers = [stage.layers for stage in pipeline.stages]
    flags = _split_flags(layers, c.pp, c.vpp)
    if flags is not None:
        return flags, []
    notes = ["--pipeline-model-parallel-layout places each virtual stage's layers as planned "
             "(a Megatron-Core of 2025 or later)"]
    mtp = pipeline.stages[-1].mtp_layers
    if mtp:
        notes.append(f"the layout holds {mtp} MTP layer(s) (m): Megatron checks them against "
                     f"--mtp-num-layers {mtp}")
    return [("--pipeline-model-parallel-layout", render_pipeline_layout(pipeline))], notes


def _recompute_flags(target: LaunchTarget, pipeline: PipelineLayout
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


def _feature_flags(target: LaunchTarget) -> list[tuple[str, ...]]:
    """The framework profile's features as Megatron-Core settings (TransformerConfig fields,
    flags by ArgumentGroupFactory): the MoE dispatcher (--moe-token-dispatcher-type
    alltoall | allgather | flex with --moe-flex-dispatcher-backend deepep | hybridep) and
    TE's grouped expert GEMMs (--moe-grouped-gemm), which the profile's kernel counts assume;
    CUDA graphs of attention and MLP, or of attention, router and preprocessing in dropless MoE
    layers (docs/user-guide/features/cuda_graph.md); TP and EP communication overlap; the
    precision-aware optimizer with bf16 main gradients and moments, bf16 gradient reduction
    (arguments.py)."""
    constants = target.time_constants or framework_time_constants("megatron")
    c, is_moe = target.config, target.model_spec.is_moe
    flags: list[tuple[str, ...]] = []
    if is_moe:
        dispatcher = constants.moe_dispatcher
        if dispatcher in ("deepep", "hybridep"):
            flags += [("--moe-token-dispatcher-type", "flex"),
                      ("--moe-flex-dispatcher-backend", dispatcher)]
        else:
            flags.append(("--moe-token-dispatcher-type", dispatcher))
        flags.append(("--moe-grouped-gemm",))
    if constants.cuda_graphs:
        modules = ("attn", "mlp") + (("moe_router", "moe_preprocess") if is_moe else ())
        flags += [("--cuda-graph-impl", "transformer_engine"), ("--cuda-graph-scope", *modules)]
    if constants.tp_comm_overlap and c.tp > 1:
        flags.append(("--tp-comm-overlap",))
    if constants.ep_comm_overlap and is_moe and c.ep > 1:
        flags.append(("--overlap-moe-expert-parallel-comm",))
    if constants.precision_aware_optimizer:
        flags += [("--use-precision-aware-optimizer",), ("--main-grads-dtype", "bf16"),
                  ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if constants.grad_reduce_in_bf16:
        flags.append(("--grad-reduce-in-bf16",))
    if c.recompute == "selective" and constants.recompute_modules != ("core_attn",):
        flags.append(("--recompute-modules", *constants.recompute_modules))
    return flags


def _hybrid_flags(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str]]:
    """A Mamba hybrid's block pattern for Megatron's MambaModel (pretrain_mamba.py;
    megatron/training/arguments.py: --is-hybrid-model, --hybrid-override-pattern with M Mamba,
    * attention, - MLP, E MoE, and the --mamba-* sizes), and what it cannot take."""
    m = target.model_spec
    if "mamba" not in m.layer_mixers:
        return [], []
    from solver.spec.blocks import render_pattern

    flags = [("--is-hybrid-model",), ("--hybrid-override-pattern", render_pattern(m)),
             ("--mamba-num-heads", str(m.mamba_num_heads)),
             ("--mamba-head-dim", str(m.mamba_head_dim)),
             ("--mamba-num-groups", str(m.n_groups)),
             ("--mamba-state-dim", str(m.ssm_state_size))]
    warnings = ["Megatron builds a Mamba hybrid with pretrain_mamba.py (MambaModel), not "
                "pretrain_gpt.py"]
    if target.config.pp > 1:
        warnings.append("Megatron's MambaModel splits the hybrid pattern over pipeline stages "
                        "itself: check its split against the planned layout")
    return flags, warnings


def _architecture_flags(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str]]:
    """The model's shape as Megatron flags (module docstring), and warnings for what Megatron
    cannot build as the model has it."""
    m = target.model_spec
    flags: list[tuple[str, ...]] = [
        ("--num-layers", str(m.num_hidden_layers)),
        ("--hidden-size", str(m.hidden_size)),
        ("--ffn-hidden-size", str(m.intermediate_size)),
        ("--num-attention-heads", str(m.num_attention_heads)),
    ]
    warnings: list[str] = []
    if m.is_mla:
        flags.append(("--multi-latent-attention",))
        if m.q_lora_rank is not None:
            flags.append(("--q-lora-rank", str(m.q_lora_rank)))
        flags += [("--kv-lora-rank", str(m.kv_lora_rank)), ("--qk-head-dim", str(m.qk_nope_head_dim)),
                  ("--qk-pos-emb-head-dim", str(m.qk_rope_head_dim)),
                  ("--v-head-dim", str(m.v_head_dim))]
    else:
        if m.kv_heads != m.num_attention_heads:
            flags += [("--group-query-attention",), ("--num-query-groups", str(m.kv_heads))]
        if m.qk_head_dim * m.num_attention_heads != m.hidden_size:
            flags.append(("--kv-channels", str(m.qk_head_dim)))
    flags += [("--seq-length", str(target.job.seq_len)),
              ("--max-position-embeddings", str(max(m.max_position_embeddings,
                                                    target.job.seq_len))),
              ("--vocab-size", str(m.vocab_size)),
              ("--normalization", "RMSNorm" if m.norm_type == "rmsnorm" else "LayerNorm")]
    position = {"rope": "rope", "learned": "learned_absolute"}.get(m.position_embedding_type)
    if position is None:
        warnings.append(f"Megatron has no {m.position_embedding_type} position embedding: the "
                        "flags ask for rope")
        position = "rope"
    flags.append(("--position-embedding-type", position))
    if m.mlp_type == "gated":
        flags.append(("--swiglu",))
    if not m.tie_word_embeddings:
        flags.append(("--untie-embeddings-and-output-weights",))
    if not (m.qkv_bias or m.o_bias or m.mlp_bias):
        flags.append(("--disable-bias-linear",))
    elif m.qkv_bias and not (m.o_bias or m.mlp_bias):
        flags += [("--disable-bias-linear",), ("--add-qkv-bias",)]
    if m.qk_norm:
        flags.append(("--qk-layernorm",))
    if m.is_moe:
        flags += [("--num-experts", str(m.num_experts)),
                  ("--moe-router-topk", str(m.num_experts_per_tok)),
                  ("--moe-ffn-hidden-size", str(m.moe_intermediate_size))]
        if m.num_shared_experts:
            width = m.shared_expert_intermediate_size or m.moe_intermediate_size
            flags.append(("--moe-shared-expert-intermediate-size",
                          str(width * m.num_shared_experts)))
        if m.first_k_dense_layers or m.moe_layer_freq > 1:
            # moe_freq_type: a Python list expression, 1 for a MoE layer (DeepSeek's rule)
            pattern = [int(i >= m.first_k_dense_layers and i % m.moe_layer_freq == 0)
                       for i in range(m.num_hidden_layers)]
            flags.append(("--moe-layer-freq", _render_pattern(pattern)))
        if m.router_bias:  # aux-loss-free balancing: expert bias needs the sigmoid score
            flags += [("--moe-router-score-function", "sigmoid"),
                      ("--moe-router-enable-expert-bias",)]
    if m.num_nextn_predict_layers:
        flags.append(("--mtp-num-layers", str(m.num_nextn_predict_layers)))
    return flags, warnings


def _render_pattern(pattern: list[int]) -> str:
    """A 0/1 list as the shortest run-length Python expression: "([0]*3+[1]*58)"."""
    runs: list[tuple[int, int]] = []
    for value in pattern:
        if runs and runs[-1][0] == value:
            runs[-1] = (value, runs[-1][1] + 1)
        else:
            runs.append((value, 1))
    return "(" + "+".join(f"[{value}]*{count}" for value, count in runs) + ")"


def build_megatron_args(target: LaunchTarget) -> tuple[list[tuple[str, ...]], list[str],
                                                         list[str]]:
    """Flags (each a tuple: the flag and its value, if any), warnings and notes."""
    c, job, model_spec = target.config, target.job, target.model_spec
    flags: list[tuple[str, ...]] = [
        ("--tensor-model-parallel-size", str(c.tp)),
        ("--pipeline-model-parallel-size", str(c.pp)),
        ("--context-parallel-size", str(c.cp)),
    ]
    order_flags, warnings = _order_flags(target)
    notes: list[str] = []
    if model_spec.is_moe:
        flags += [("--expert-model-parallel-size", str(c.ep)),
                  ("--expert-tensor-parallel-size", str(c.etp))]
    flags += _feature_flags(target)
    hybrid_flags, hybrid_warnings = _hybrid_flags(target)
    flags += hybrid_flags
    warnings += hybrid_warnings
    pipeline = target.pipeline_layout()
    split_flags, split_notes = _pipeline_flags(target, pipeline)
    flags += split_flags
    notes += split_notes
    if c.vpp > 1 and target.num_micro_batches % c.pp:
        warnings.append(f"the interleaved schedule wants the {target.num_micro_batches} "
                        f"micro-batches per step to be a multiple of pp ({c.pp})")
    if c.sequence_parallel:
        flags.append(("--sequence-parallel",))
    if c.zero >= 1:
        flags.append(("--use-distributed-optimizer",))
    if c.dp * c.cp > 1:
        # The step-time model hides DP traffic behind compute; Megatron does so only when
        # asked (_add_distributed_args: --overlap-grad-reduce, and --overlap-param-gather,
        # which needs the distributed optimizer or Megatron-FSDP).
        flags.append(("--overlap-grad-reduce",))
        if c.zero >= 1:
            flags.append(("--overlap-param-gather",))
    if c.zero >= 2:
        flags += [("--use-megatron-fsdp",),
                  ("--data-parallel-sharding-strategy", FSDP_STRATEGIES[c.zero]),
                  ("--no-gradient-accumulation-fusion",), ("--ckpt-format", "fsdp_dtensor")]
        if c.pp > 1:
            warnings.append("Megatron-FSDP (ZeRO 2/3) does not combine with pipeline "
                            "parallelism")
    flags += [("--micro-batch-size", str(c.micro_batch)),
              ("--global-batch-size", str(job.global_batch))]
    architecture, architecture_warnings = _architecture_flags(target)
    flags += architecture
    warnings += architecture_warnings
    recompute_flags, recompute_warnings, recompute_notes = _recompute_flags(target, pipeline)
    flags += recompute_flags
    warnings += recompute_warnings
    notes += recompute_notes
    flags.append(("--bf16",))
    flags += PRECISION_FLAGS[job.precision]
    flags += [(flag,) for flag in order_flags]
    if c.zero >= 2:
        notes.append("leave CUDA_DEVICE_MAX_CONNECTIONS unset or above 1 (Megatron-FSDP "
                     "asserts it)")
    elif c.tp > 1 or c.cp > 1:
        notes.append("export CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron asserts it with tp or cp "
                     "> 1 on GPUs before Blackwell)")
    return flags, warnings, notes


# The precision recipes (solver.cost.precision) as _add_transformer_engine_args flags: fp8 is
# TE's default delayed per-tensor scaling with E4M3 forward / E5M2 backward ("hybrid"); the
# block-scaled recipes run E4M3 throughout.
PRECISION_FLAGS: dict[str, list[tuple[str, ...]]] = {
    "bf16": [],
    "fp8": [("--fp8-format", "hybrid")],
    "fp8-blockwise": [("--fp8-format", "e4m3"), ("--fp8-recipe", "blockwise")],
    "mxfp8": [("--fp8-format", "e4m3"), ("--fp8-recipe", "mxfp8")],
    "nvfp4": [("--fp4-format", "e2m1"), ("--fp4-recipe", "nvfp4")],
}


def render_megatron(target: LaunchTarget) -> Emitted:
    """The arguments as a shell continuation, one flag per line, every token shell-quoted,
    under a comment naming the plan and the Megatron-LM version."""
    from solver.emit.torchtitan import render_header

    flags, warnings, notes = build_megatron_args(target)
    text = " \\\n".join(" ".join(shlex.quote(token) for token in flag) for flag in flags)
    header = render_header(target, f"Megatron-LM {VERSION}: arguments of pretrain_gpt.py")
    return Emitted(text=header + text + "\n",
                   settings=[token for flag in flags for token in flag],
                   warnings=tuple(warnings), notes=tuple(notes))
