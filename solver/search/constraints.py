"""Named constraints of the search, each with the variables it reads and a one-line rule.

A constraint checks candidate arrays (numpy, vectorised): `check(values)` takes a dict of the
variables it names and returns a boolean array. The exhaustive oracle applies a constraint as
soon as its variables are bound; the explanation of an infeasible problem names the smallest
set of constraints that cannot hold together. Names are stable snake_case (STYLE.md): they are
printed, asserted by tests and used in JSON (`conflicts`).

Framework rule sets (`--framework`), each from the framework's own documentation or checks:
  megatron    ZeRO 1 is the distributed optimizer; no ZeRO 2; ZeRO 3 only as Megatron-FSDP,
              which does not combine with pipeline parallelism (megatron/training/arguments.py
              validate_args; Megatron-Core FSDP docs). The interleaved schedule needs the
              micro-batches per step to be a multiple of pp (arguments.py: "number of
              microbatches ... divisible by pipeline-model-parallel-size" with
              --num-layers-per-virtual-pipeline-stage). Gated DeltaNet has no context
              parallelism before core_v0.18.0 (_megatron_blocks). Sequence parallelism
              scatters each CP rank's seq_len / cp tokens over TP, so they must divide
              (megatron_sequence_parallel_split); with tp = cp = 1 any seq_len goes.
  torchtitan  FSDP2 data parallelism: no ZeRO 1 (there is no optimizer-only sharding; ZeRO 2 is
              reshard_after_forward=False, ZeRO 3 the default; plain replication is DDP)
              (torchtitan docs/fsdp.md, parallelize_llama). For MoE models, torchtitan 0.3's
              expert parallelism (ParallelismConfig.expert_parallel_degree: "EP borrows ranks
              from FSDP and TP: efsdp = dp_shard * cp * tp / ep"; ParallelDims.build_mesh) has
              no expert tensor parallelism.
  deepspeed   pipeline parallelism works with ZeRO 0/1 only ("ZeRO-2 and ZeRO-3 are
              incompatible with pipeline parallelism", DeepSpeed pipeline docs); tensor
              parallelism (AutoTP training) combines with "ZeRO Optimization ... (Stage 0, 1,
              or 2)" (deepspeed.ai tutorial "Automatic Tensor Parallelism (Training)"); ring
              context parallelism is not DeepSpeed's (it has Ulysses sequence parallelism
              instead); its pipeline engine's schedule (TrainSchedule, 1F1B) has no
              interleaved virtual stages. Expert parallelism is DeepSpeed 0.19's AutoEP
              (ds_config expert_parallel.autoep_size, what `launch --format deepspeed`
              writes): deepspeed/module_inject/auto_ep_folding.py validate_folding_global
              refuses expert tensor parallelism ("expert_tensor_parallel_size ... is not
              supported yet") and AutoEP with AutoTP under pipeline parallelism ("AutoEP+AutoTP
              folding currently supports pp_size=1 only"); its EP groups tile a stage's
              tp x dp ranks (build_folding_spec), so the older deepspeed.moe path's rule that
              ep divide dp (utils/groups.py _create_expert_data_and_model_parallel) does not
              apply.
  generic     no framework rule.

KV heads under TP (tp_kv_heads_compatible, every framework): tp divides num_key_value_heads,
or is a multiple of it with each rank keeping one KV head, as Megatron-Core does from
core_v0.16.0 (transformer_config.py: "num_query_groups ... must be a multiple or divisor of
tensor_model_parallel_size"; attention.py all-gathers linear_qkv's output and slices the
rank's group, PR #2565, priced by solver.cost.layers.layer_time) and vLLM (QKVParallelLinear
replicates KV heads: solver.serve.constraints). torchtitan and DeepSpeed split whole KV heads
only (tp_divides_kv_heads): torchtitan 0.3's apply_tp shards wk and wv column-wise and views
the local shard as heads (models/llama3/model/model.py Attention.forward), DeepSpeed's AutoTP
gives each rank num_kv_heads / tp heads (module_inject/tp_shard.py get_shard_size); neither
replicates.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory import estimate_memory_total
from solver.cost.step.training_states import is_pure
from solver.search.space import VARIABLES, Problem
from solver.spec import JobSpec, ModelSpec

GIB = 2**30
Values = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Constraint:
    """One named rule over some decision variables."""

    name: str
    variables: tuple[str, ...]
    rule: str
    check: Callable[[Values], np.ndarray]


def model_shape_constraints(model_spec: ModelSpec) -> list[Constraint]:
    """The two rules every framework takes from the model's shape (training and serving):
    tp_divides_heads and pp_at_most_layers."""
    heads, layers = model_spec.num_attention_heads, model_spec.num_hidden_layers
    return [
        Constraint("tp_divides_heads", ("tp",),
                   f"tp must divide num_attention_heads ({heads})",
                   lambda v: heads % v["tp"] == 0),
        Constraint("pp_at_most_layers", ("pp",),
                   f"pp must not exceed num_hidden_layers ({layers})",
                   lambda v: v["pp"] <= layers),
        *block_shape_constraints(model_spec),
    ]


def block_shape_constraints(model_spec: ModelSpec) -> list[Constraint]:
    """TP splits of a block pattern's mixers (solver.cost.layers.blocks): Megatron-LM's MambaMixer
    asserts nheads % tp == 0 and ngroups % tp == 0 (megatron/core/ssm/mamba_mixer.py), its
    gated DeltaNet splits the key heads (and with them the value heads) over TP."""
    m, rules = model_spec, []
    mixers = set(m.layer_mixers)
    if "mamba" in mixers:
        groups, heads = m.n_groups, m.mamba_num_heads
        rules.append(Constraint("tp_divides_mamba_groups", ("tp",),
                                f"tp must divide n_groups ({groups}) and mamba_num_heads "
                                f"({heads})",
                                lambda v: (groups % v["tp"] == 0) & (heads % v["tp"] == 0)))
    if "linear_attention" in mixers:
        key_heads = m.linear_num_key_heads
        rules.append(Constraint("tp_divides_linear_heads", ("tp",),
                                f"tp must divide linear_num_key_heads ({key_heads})",
                                lambda v: key_heads % v["tp"] == 0))
    return rules


def block_cp_constraints(model_spec: ModelSpec) -> list[Constraint]:
    """Context parallelism of a pattern's recurrent mixers (solver.cost.layers.blocks): the sequence
    is split over CP, and around the scan an all-to-all regroups each mixer by heads, so each
    CP rank needs whole heads. Megatron's MambaContextParallel asserts that cp divides the
    heads per TP rank, and the groups per TP rank or cp them (core_v0.16.1
    megatron/core/ssm/mamba_context_parallel.py); its gated DeltaNet splits the key and value
    heads per TP rank by cp (core_v0.18.0 megatron/core/ssm/gated_delta_net.py,
    tensor_a2a_cp2hp)."""
    m, rules = model_spec, []
    mixers = set(m.layer_mixers)
    if "mamba" in mixers:
        heads, groups = m.mamba_num_heads or 0, m.n_groups or 0

        def mamba_split(v: Values) -> np.ndarray:
            cp, local_groups = v["cp"], groups // v["tp"]
            whole_groups = (local_groups % cp == 0) | (cp % np.maximum(local_groups, 1) == 0)
            return (cp == 1) | (((heads // v["tp"]) % cp == 0) & whole_groups)

        rules.append(Constraint("cp_splits_mamba_heads", ("tp", "cp"),
                                f"with cp > 1, cp must divide mamba_num_heads ({heads}) / tp, "
                                f"and n_groups ({groups}) / tp or cp the other",
                                mamba_split))
    if "linear_attention" in mixers:
        key_heads = m.linear_num_key_heads or 0
        rules.append(Constraint("cp_splits_linear_heads", ("tp", "cp"),
                                f"with cp > 1, tp x cp must divide linear_num_key_heads "
                                f"({key_heads})",
                                lambda v: (v["cp"] == 1) | (key_heads % (v["tp"] * v["cp"])
                                                            == 0)))
    return rules


def structural_constraints(model_spec: ModelSpec, job: JobSpec, num_gpus: int,
                           nvlink_domain: int | None = None) -> list[Constraint]:
    """The rules every training plan obeys whatever the framework: the GPU split, the model's
    shape, the job's batch and sequence; with `nvlink_domain`, TP and expert-TP inside it.
    `parplan estimate` checks a configuration against the same list (solver.api)."""
    m, n = model_spec, num_gpus
    kv, layers = m.kv_heads, m.num_hidden_layers
    rules = [
        Constraint("gpus_product", ("tp", "cp", "pp", "dp"),
                   f"tp x cp x pp x dp must equal the GPU count ({n})",
                   lambda v: v["tp"] * v["cp"] * v["pp"] * v["dp"] == n),
        *model_shape_constraints(m),
        *block_cp_constraints(m),
        Constraint("vpp_needs_pp", ("pp", "vpp"),
                   "virtual pipeline stages (vpp > 1) need pp > 1",
                   lambda v: (v["vpp"] == 1) | (v["pp"] > 1)),
        Constraint("virtual_stages_fit_layers", ("pp", "vpp"),
                   f"pp x vpp must not exceed num_hidden_layers + 2 ({layers + 2}): every "
                   "virtual stage needs a decoder layer, the embedding or the loss",
                   lambda v: v["pp"] * v["vpp"] <= layers + 2),
        # Only context parallelism splits the sequence: Megatron cuts it in 2 x cp chunks
        # when cp_size > 1 (megatron/training/utils.py get_batch_on_this_cp_rank: val.view(...,
        # 2 * cp_size, val.shape[seq_dim] // (2 * cp_size), ...)); with cp = 1 any length goes.
        Constraint("cp_splits_sequence", ("cp",),
                   f"with cp > 1, seq_len ({job.seq_len}) must be a multiple of 2 x cp "
                   "(load-balanced causal context parallelism cuts each sequence in 2 x cp "
                   "chunks)",
                   lambda v: (v["cp"] == 1) | (job.seq_len % (2 * v["cp"]) == 0)),
        Constraint("batch_divides", ("dp", "micro_batch"),
                   f"global_batch ({job.global_batch}) must be a multiple of dp x micro_batch",
                   lambda v: job.global_batch % (v["dp"] * v["micro_batch"]) == 0),
        Constraint("expert_ranks_fit_stage", ("tp", "cp", "dp", "ep", "etp"),
                   "ep x etp must divide tp x cp x dp (expert layers reuse a stage's ranks)",
                   lambda v: (v["tp"] * v["cp"] * v["dp"]) % (v["ep"] * v["etp"]) == 0),
    ]
    if not m.is_mla:  # the frameworks' stricter rule: tp_divides_kv_heads (_kv_head_split)
        rules.append(Constraint("tp_kv_heads_compatible", ("tp",),
                                f"tp must divide num_key_value_heads ({kv}) or be a multiple "
                                "of it (each rank then keeps one KV head)",
                                lambda v: (kv % v["tp"] == 0) | (v["tp"] % kv == 0)))
    if m.is_moe:
        rules.append(Constraint("ep_divides_experts", ("ep",),
                                f"ep must divide num_experts ({m.num_experts})",
                                lambda v: m.num_experts % v["ep"] == 0))
    else:
        rules.append(Constraint("dense_model_has_no_ep", ("ep", "etp"),
                                f"{m.name} has no experts: ep = etp = 1",
                                lambda v: (v["ep"] == 1) & (v["etp"] == 1)))
    if nvlink_domain is not None:
        domain = nvlink_domain
        rules += [
            Constraint("tp_within_nvlink", ("tp",),
                       f"tp must divide the NVLink domain ({domain} GPUs)",
                       lambda v: domain % v["tp"] == 0),
            Constraint("etp_within_nvlink", ("etp",),
                       f"etp must divide the NVLink domain ({domain} GPUs)",
                       lambda v: domain % v["etp"] == 0),
        ]
    return rules


def _structural(problem: Problem) -> list[Constraint]:
    domain = None if problem.allow_tp_across_nodes else problem.cluster.scale_up_gpus
    return structural_constraints(problem.model_spec, problem.job, problem.num_gpus, domain)


def _framework(problem: Problem) -> list[Constraint]:
    job = problem.job
    if problem.framework == "megatron":
        return [
            Constraint("megatron_zero_stage", ("zero", "pp"),
                       "Megatron: ZeRO 0 or 1 (distributed optimizer), or 3 (Megatron-FSDP) "
                       "without pipeline parallelism",
                       lambda v: (v["zero"] <= 1) | ((v["zero"] == 3) & (v["pp"] == 1))),
            Constraint("megatron_interleave_microbatches", ("pp", "vpp", "dp", "micro_batch"),
                       "Megatron's interleaved schedule needs micro-batches per step to be a "
                       "multiple of pp",
                       lambda v: (v["vpp"] == 1) | (
                           (job.global_batch // (v["dp"] * v["micro_batch"])) % v["pp"] == 0)),
            # Sequence parallelism (on whenever tp > 1) reduce-scatters the embedding output's
            # sequence dimension, each CP rank's seq_len / cp tokens, over TP: megatron/core/
            # tensor_parallel/mappings.py _reduce_scatter_along_first_dim asserts "First
            # dimension of the tensor should be divisible by tensor parallel size".
            Constraint("megatron_sequence_parallel_split", ("tp", "cp"),
                       f"Megatron: with tp > 1 (sequence parallel), seq_len ({job.seq_len}) "
                       "must be a multiple of tp x cp (each CP rank's tokens are scattered "
                       "over TP)",
                       lambda v: (v["tp"] == 1) | (job.seq_len % (v["tp"] * v["cp"]) == 0)),
            *_megatron_blocks(problem.model_spec),
            *build_no_zero_experts(problem.model_spec, "Megatron-Core"),
        ]
    if problem.framework == "torchtitan":
        return [Constraint("torchtitan_zero_stage", ("zero",),
                           "torchtitan (FSDP2): ZeRO 0 (DDP), 2 or 3; no optimizer-only ZeRO 1",
                           lambda v: v["zero"] != 1),
                *_kv_head_split(problem.model_spec, "torchtitan"),
                *_torchtitan_experts(problem.model_spec),
                *build_no_sparse_attention(problem.model_spec, "torchtitan"),
                *build_no_zero_experts(problem.model_spec, "torchtitan")]
    if problem.framework == "deepspeed":
        return [
            Constraint("deepspeed_zero_with_pp", ("zero", "pp"),
                       "DeepSpeed: pipeline parallelism only with ZeRO 0 or 1",
                       lambda v: (v["pp"] == 1) | (v["zero"] <= 1)),
            Constraint("deepspeed_no_cp", ("cp",),
                       "DeepSpeed has no ring context parallelism (cp = 1)",
                       lambda v: v["cp"] == 1),
            Constraint("deepspeed_no_vpp", ("vpp",),
                       "DeepSpeed's pipeline engine runs plain 1F1B: no virtual stages "
                       "(vpp = 1)",
                       lambda v: v["vpp"] == 1),
            Constraint("deepspeed_tp_zero", ("tp", "zero"),
                       "DeepSpeed: tensor parallelism (AutoTP training) only with ZeRO 0, 1 or 2",
                       lambda v: (v["tp"] == 1) | (v["zero"] <= 2)),
            *_kv_head_split(problem.model_spec, "DeepSpeed"),
            *build_no_sparse_attention(problem.model_spec, "DeepSpeed"),
            *build_no_zero_experts(problem.model_spec, "DeepSpeed"),
            *_deepspeed_autoep(problem.model_spec),
            *_deepspeed_bf16_master(problem),
        ]
    return []


def _deepspeed_bf16_master(problem: Problem) -> list[Constraint]:
    """Pure bf16 under DeepSpeed is bf16_master_weights_and_grads, which its engine takes with
    ZeRO 1-3 only (runtime/engine.py: "Bf16_master_weights_and_grads is only supported with
    ZeRO Stage 1, 2, or 3")."""
    if not is_pure(problem.time_constants.training_states):
        return []
    return [Constraint("deepspeed_bf16_master_needs_zero", ("zero",),
                       "DeepSpeed: bf16 master weights (--training-states "
                       f"{problem.time_constants.training_states}) only with ZeRO 1, 2 or 3",
                       lambda v: v["zero"] >= 1)]


def _megatron_blocks(model_spec: ModelSpec) -> list[Constraint]:
    """Megatron-Core 0.16, the version `launch` writes for, runs gated DeltaNet without
    context parallelism (megatron/core/ssm/gated_delta_net.py: "TODO: support CP"; core_v0.18.0
    adds it). Its DSA (core_v0.16.0-0.18.2 dsa.py) trains through `unfused_dsa_fn`: fp32 bmm
    scores over every key under an s x s mask; fused sparse kernels (dsa_tilelang_kernels.py)
    arrive in core_v0.19.0. parplan costs DSA as fused kernels run it, so it refuses it here."""
    rules = []
    if "linear_attention" in model_spec.layer_mixers:
        rules.append(Constraint("megatron_linear_attention_no_cp", ("cp",),
                                "Megatron-Core 0.16 has no context parallelism for gated "
                                "DeltaNet (it arrives in 0.18): cp = 1",
                                lambda v: v["cp"] == 1))
    if model_spec.is_sparse_attention:
        rules.append(Constraint("megatron_sparse_attention_is_unfused", ("tp",),
                                "Megatron-Core up to 0.18 trains DeepSeek Sparse Attention "
                                "through its unfused fp32 reference (dsa.py unfused_dsa_fn), "
                                "which parplan does not cost: plan it with --framework "
                                "generic (fused sparse kernels, as core 0.19 runs them)",
                                lambda v: v["tp"] < 0))
    return rules


def build_no_sparse_attention(model_spec: ModelSpec, framework: str) -> list[Constraint]:
    """torchtitan's deepseek_v3 is dense MLA (models/deepseek_v3/model.py: no indexer) and
    DeepSpeed has no DSA module."""
    if not model_spec.is_sparse_attention:
        return []
    return [Constraint(f"{framework.lower()}_has_no_sparse_attention", ("tp",),
                       f"{framework} has no DeepSeek Sparse Attention (index_topk): plan it "
                       "with --framework megatron or megatron-bridge",
                       lambda v: v["tp"] < 0)]


def build_no_zero_experts(model_spec: ModelSpec, framework: str) -> list[Constraint]:
    """Zero-computation experts (solver.spec.zero_experts) run in vLLM and SGLang; no training
    framework has them (Megatron-LM @d98e8a6, Bridge @067f987, torchtitan, DeepSpeed)."""
    if not model_spec.num_zero_experts:
        return []
    name = framework.lower().replace("-", "_")
    return [Constraint(f"{name}_has_no_zero_experts", ("tp",),
                       f"{framework} has no zero-computation experts (num_zero_experts): plan "
                       "it with --framework generic",
                       lambda v: v["tp"] < 0)]


def _kv_head_split(model_spec: ModelSpec, framework: str) -> list[Constraint]:
    """tp_divides_kv_heads: frameworks that split whole KV heads only (module docstring)."""
    if model_spec.is_mla:
        return []
    kv = model_spec.kv_heads
    return [Constraint("tp_divides_kv_heads", ("tp",),
                       f"{framework} splits whole KV heads over TP: tp must divide "
                       f"num_key_value_heads ({kv})",
                       lambda v: kv % v["tp"] == 0)]


def _torchtitan_experts(model_spec: ModelSpec) -> list[Constraint]:
    """torchtitan 0.3's expert parallelism for a MoE model (module docstring)."""
    if not model_spec.is_moe:
        return []
    return [Constraint(
        "torchtitan_ep_borrows_fsdp_tp", ("ep", "etp", "dp", "cp", "tp", "zero"),
        "torchtitan 0.3: experts borrow FSDP and TP ranks, so ep must divide dp_shard x cp x tp "
        "(dp_shard is dp under ZeRO 2/3, 1 under ZeRO 0), with no expert TP (etp = 1)",
        lambda v: (v["ep"] == 1) | ((v["etp"] == 1) & (
            (np.where(v["zero"] == 0, 1, v["dp"]) * v["cp"] * v["tp"]) % v["ep"] == 0)))]


def _deepspeed_autoep(model_spec: ModelSpec) -> list[Constraint]:
    """DeepSpeed 0.19 AutoEP's rules for a MoE model (module docstring)."""
    if not model_spec.is_moe:
        return []
    return [
        Constraint("deepspeed_autoep_no_etp", ("ep", "etp"),
                   "DeepSpeed AutoEP: no expert tensor parallelism (etp = 1)",
                   lambda v: (v["ep"] == 1) | (v["etp"] == 1)),
        Constraint("deepspeed_autoep_tp_without_pp", ("ep", "tp", "pp"),
                   "DeepSpeed AutoEP with tensor parallelism (AutoTP folding) only without "
                   "pipeline parallelism (pp = 1)",
                   lambda v: (v["ep"] == 1) | (v["tp"] == 1) | (v["pp"] == 1)),
    ]


def _pins(problem: Problem) -> list[Constraint]:
    def pin(name: str, allowed: tuple[int, ...]) -> Constraint:
        values = np.array(sorted(allowed))
        shown = ", ".join(str(x) for x in values)
        return Constraint(f"pin_{name}", (name,), f"{name} pinned to {{{shown}}}",
                          lambda v: np.isin(v[name], values))

    return [pin(name, allowed) for name, allowed in sorted(problem.pins.items())]


MEMORY_CONSTRAINT = "memory_fits_hbm"


def memory_capacity_bytes(problem: Problem) -> float:
    """What the worst stage of a plan may hold: the GPU's memory less the headroom."""
    return problem.cluster.usable_memory_bytes


def _memory(problem: Problem) -> Constraint:
    capacity = memory_capacity_bytes(problem)

    def fits(values: Values) -> np.ndarray:
        candidates = Candidates(**{name: values[name] for name in VARIABLES})
        total = estimate_memory_total(problem.model_spec, problem.job, candidates,
                                problem.memory_options)[0]
        return total <= capacity

    cluster = problem.cluster
    shown = cluster.memory_headroom.describe(cluster.gpu_memory_bytes)
    return Constraint(MEMORY_CONSTRAINT, VARIABLES,
                      f"the worst pipeline stage must fit the GPU's {shown}", fits)


def build_constraints(problem: Problem) -> tuple[Constraint, ...]:
    """Every constraint of the problem: structure, framework rules, pins, memory (last)."""
    return tuple(_structural(problem) + _framework(problem) + _pins(problem)
                 + [_memory(problem)])
