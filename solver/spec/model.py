"""ModelSpec: a transformer described with Hugging Face `config.json` names.

Only primary quantities are stored; parameter counts and FLOPs are computed here so that the
zoo, the memory model and the step-time model all count the same way.

Vocabulary (used by every module):
  dense layer   a decoder layer whose MLP is one feed-forward block (`intermediate_size`)
  MoE layer     a decoder layer whose MLP is a router, `num_experts` routed experts of width
                `moe_intermediate_size` (each token visits `num_experts_per_tok`) and
                `num_shared_experts` shared experts every token visits
  MLA           DeepSeek's multi-head latent attention (low-rank q and kv projections)
  LatentMoE     routed experts working at `moe_latent_size` instead of hidden_size: a down
                projection before dispatch and an up projection after combine (Nemotron 3
                Super and Ultra; transformers NemotronHMoE fc1_latent_proj/fc2_latent_proj)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from solver.spec.blocks import (
    ATTENTION_MIXERS,
    BASE_KINDS,
    Mixer,
    Mlp,
)
from solver.spec.model_params import ParameterCounts
from solver.spec.rope import RopeScaling
from solver.spec.sparse_attention import SparseAttentionFields
from solver.spec.zero_experts import ZeroExpertFields
from solver.spec.strict import (
    MAX_EXPERTS,
    MAX_SEQ_LEN,
    MAX_VOCAB,
    LayerCount,
    Width,
)


class ModelSpec(SparseAttentionFields, ZeroExpertFields, ParameterCounts):
    """A decoder-only transformer (dense or MoE, MHA/GQA/MQA or MLA); its parameter counts
    come from ParameterCounts (solver.spec.model_params)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    model_type: str = "llama"
    source: str = ""

    hidden_size: Width = Field(gt=0)
    intermediate_size: Width = Field(gt=0)
    num_hidden_layers: LayerCount = Field(gt=0)
    num_attention_heads: Width = Field(gt=0)
    num_key_value_heads: Width | None = Field(default=None, gt=0)
    head_dim: Width | None = Field(default=None, gt=0)
    vocab_size: Annotated[int, MAX_VOCAB] = Field(gt=0)
    tie_word_embeddings: bool = False
    max_position_embeddings: Annotated[int, MAX_SEQ_LEN] = Field(default=4096, gt=0)

    mlp_type: Literal["gated", "plain"] = "gated"
    norm_type: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_bias: bool = True  # LayerNorm's additive bias; MPT and DBRX use LayerNorm without one
    norms_per_layer: int = Field(default=2, ge=0)
    qk_norm: bool = False
    # What the q/k norms normalise: each head (Qwen3, Gemma 3) or the whole q and k
    # projections (OLMoE: RMSNorm(hidden) and RMSNorm(kv heads x head_dim)).
    qk_norm_over: Literal["head", "projection"] = "head"
    embedding_norm: bool = False
    position_embedding_type: Literal["rope", "learned", "alibi"] = "rope"
    # HF `rope_theta`: the rotary base (Megatron --rotary-base); None where the config states
    # none (launch files then keep the framework's default and say so).
    rope_theta: float | None = Field(default=None, gt=0)
    # HF `rope_scaling` where it is YaRN or Llama 3's (solver.spec.rope; no cost reads Llama 3's).
    rope_scaling: RopeScaling | None = None
    # Dropout as the config states it (HF `attention_dropout`; `hidden_dropout` where the
    # family has one): 0 for decoder pretraining configs (LlamaConfig attention_dropout=0.0,
    # and LlamaDecoderLayer has no residual dropout), where Megatron's defaults are 0.1.
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    attention_sinks: bool = False
    # A limited SwiGLU (HF gpt_oss `swiglu_limit`): the gate half clamped above and the linear
    # half on both sides at this value before the GLU (GptOssExperts._apply_gate).
    swiglu_limit: float | None = Field(default=None, gt=0)

    num_experts: Annotated[int, MAX_EXPERTS] = Field(default=0, ge=0)
    num_experts_per_tok: Annotated[int, MAX_EXPERTS] = Field(default=0, ge=0)
    moe_intermediate_size: Width | None = Field(default=None, gt=0)
    num_shared_experts: Annotated[int, MAX_EXPERTS] = Field(default=0, ge=0)
    shared_expert_intermediate_size: Width | None = Field(default=None, gt=0)
    shared_expert_gate: bool = False
    first_k_dense_layers: LayerCount = Field(default=0, ge=0)
    moe_layer_freq: LayerCount = Field(default=1, gt=0)
    router_bias: bool = False
    # Group-limited routing (HF DeepSeek n_group, topk_group): the experts form n_group equal
    # groups and a token's experts come from its topk_group best groups (DeepSeek-V3, arXiv
    # 2412.19437 §2.1.2 node-limited routing, 8 groups, 4 chosen); 1 and 1: no limit.
    n_group: Annotated[int, MAX_EXPERTS] = Field(default=1, gt=0)
    topk_group: Annotated[int, MAX_EXPERTS] = Field(default=1, gt=0)
    # LatentMoE (HF nemotron_h moe_latent_size, Megatron --moe-latent-size): the routed
    # experts' input and output width; router and shared experts keep hidden_size.
    moe_latent_size: Width | None = Field(default=None, gt=0)

    q_lora_rank: Width | None = Field(default=None, gt=0)
    kv_lora_rank: Width | None = Field(default=None, gt=0)
    qk_nope_head_dim: Width | None = Field(default=None, gt=0)
    qk_rope_head_dim: Width | None = Field(default=None, gt=0)
    v_head_dim: Width | None = Field(default=None, gt=0)
    # Multi-token prediction (DeepSeek-V3 arXiv 2412.19437 §2.2; Megatron-Core
    # multi_token_prediction.py). num_nextn_predict_layers: the MTP modules config.json states
    # (HF's key; Qwen's mtp_num_hidden_layers). mtp_num_layers: the depths a run trains
    # (Megatron --mtp-num-layers); absent = one per module. mtp_use_repeated_layer: one module
    # applied at every depth (Megatron-Core >= 0.17 mtp_use_repeated_layer: "only 1 layer is
    # created and applied mtp_num_layers times"), so its parameters count once while its
    # FLOPs and activations count per depth. mtp_loss_scaling_factor: the weight of the depths'
    # mean loss (Megatron's default 0.1, transformer_config.py; each depth's loss is scaled
    # by factor / depths, multi_token_prediction.py process_mtp_loss).
    num_nextn_predict_layers: LayerCount = Field(default=0, ge=0)
    mtp_num_layers: LayerCount | None = Field(default=None, ge=0)
    mtp_use_repeated_layer: bool = False
    mtp_loss_scaling_factor: float = Field(default=0.1, ge=0.0, le=1e3)

    # The block pattern (solver.spec.blocks): per-layer mixer and MLP; absent = every layer
    # full attention, MLPs by first_k_dense_layers / moe_layer_freq.
    layer_types: tuple[Mixer, ...] | None = None
    mlp_layer_types: tuple[Mlp, ...] | None = None
    sliding_window: Width | None = Field(default=None, gt=0)
    attention_chunk_size: Width | None = Field(default=None, gt=0)
    attention_output_gate: bool = False  # Qwen3-Next: q_proj also yields a sigmoid gate
    # Mamba-2 (HF nemotron_h names): heads, head dim, groups, state size, conv width, chunk
    mamba_num_heads: Width | None = Field(default=None, gt=0)
    mamba_head_dim: Width | None = Field(default=None, gt=0)
    n_groups: Width | None = Field(default=None, gt=0)
    ssm_state_size: Width | None = Field(default=None, gt=0)
    conv_kernel: Width = Field(default=4, gt=0)
    chunk_size: Width = Field(default=128, gt=0)
    mamba_proj_bias: bool = False
    use_conv_bias: bool = True
    # Gated DeltaNet (HF qwen3_next names)
    linear_num_key_heads: Width | None = Field(default=None, gt=0)
    linear_num_value_heads: Width | None = Field(default=None, gt=0)
    linear_key_head_dim: Width | None = Field(default=None, gt=0)
    linear_value_head_dim: Width | None = Field(default=None, gt=0)
    linear_conv_kernel_dim: Width = Field(default=4, gt=0)

    @field_validator("name", "source")
    @classmethod
    def _check_not_option_like(cls, value: str) -> str:
        # The model id is a command-line token of the launch lines (`vllm serve MODEL`,
        # solver.spec.model_ref): a leading '-' would make the engine's parser read it as an
        # option (a name `--trust-remote-code` serves the default model with remote code).
        if value.startswith("-"):
            raise ValueError(f"must not start with '-' (found '{value}'): launch lines pass "
                             "it to an engine's command line, which would read it as an "
                             "option")
        return value

    @model_validator(mode="after")
    def _check_consistency(self) -> ModelSpec:
        heads, kv_heads = self.num_attention_heads, self.kv_heads
        if heads % kv_heads:
            raise ValueError(
                f"num_key_value_heads ({kv_heads}) must divide num_attention_heads ({heads})"
            )
        if self.head_dim is None and not self.is_mla and self.hidden_size % heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) is not a multiple of num_attention_heads "
                f"({heads}); give head_dim explicitly"
            )
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) must be between 1 and "
                    f"num_experts ({self.num_experts})"
                )
            if self.moe_intermediate_size is None:
                raise ValueError("moe_intermediate_size is required when num_experts > 0")
            if self.num_experts % self.n_group or self.topk_group > self.n_group:
                raise ValueError(
                    f"n_group ({self.n_group}) must divide num_experts ({self.num_experts}) "
                    f"and be at least topk_group ({self.topk_group})")
            if self.num_moe_layers == 0:
                raise ValueError(
                    f"first_k_dense_layers ({self.first_k_dense_layers}) leaves no MoE layer "
                    f"out of num_hidden_layers ({self.num_hidden_layers})"
                )
        elif self.num_experts_per_tok or self.num_shared_experts or self.moe_latent_size:
            raise ValueError("num_experts_per_tok / num_shared_experts / moe_latent_size need "
                             "num_experts > 0")
        mla = (self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)
        if any(v is not None for v in mla) and any(v is None for v in mla):
            raise ValueError(
                "multi-head latent attention needs all of kv_lora_rank, qk_nope_head_dim, "
                "qk_rope_head_dim and v_head_dim"
            )
        if self.q_lora_rank is not None and not self.is_mla:
            raise ValueError("q_lora_rank is only meaningful with kv_lora_rank (MLA)")
        self._check_sparse_attention(self.is_mla)
        self._check_zero_experts(self.num_experts)
        self._check_pattern()
        return self

    def _check_pattern(self) -> None:
        """The block pattern's lengths and the sizes each block type needs."""
        layers = self.num_hidden_layers
        for key in ("layer_types", "mlp_layer_types"):
            value = getattr(self, key)
            if value is not None and len(value) != layers:
                raise ValueError(f"{key} has {len(value)} entries but num_hidden_layers is "
                                 f"{layers}")
        mixers, mlps = set(self.layer_mixers), set(self.layer_mlps)
        if "moe" in mlps and not self.is_moe:
            raise ValueError("mlp_layer_types has 'moe' layers but num_experts is 0")
        if self.mlp_layer_types is not None and self.is_moe and "moe" not in mlps:
            raise ValueError("num_experts > 0 but mlp_layer_types has no 'moe' layer")
        if mixers == {"none"} and mlps == {"none"}:
            raise ValueError("every layer has neither a mixer nor an MLP")
        needs = {
            "sliding_attention": ("sliding_window",),
            "chunked_attention": ("attention_chunk_size",),
            "mamba": ("mamba_num_heads", "mamba_head_dim", "n_groups", "ssm_state_size"),
            "linear_attention": ("linear_num_key_heads", "linear_num_value_heads",
                                 "linear_key_head_dim", "linear_value_head_dim"),
        }
        for mixer, keys in needs.items():
            missing = [key for key in keys if getattr(self, key) is None]
            if mixer in mixers and missing:
                raise ValueError(f"layer_types has '{mixer}' layers but {', '.join(missing)} "
                                 f"{'is' if len(missing) == 1 else 'are'} not given")
        if "mamba" in mixers and self.mamba_num_heads % self.n_groups:  # type: ignore[operator]
            raise ValueError(f"n_groups ({self.n_groups}) must divide mamba_num_heads "
                             f"({self.mamba_num_heads})")
        if ("linear_attention" in mixers
                and self.linear_num_value_heads % self.linear_num_key_heads):  # type: ignore[operator]
            raise ValueError(f"linear_num_key_heads ({self.linear_num_key_heads}) must divide "
                             f"linear_num_value_heads ({self.linear_num_value_heads})")

    # ---- shape -------------------------------------------------------------------------------

    @property
    def kv_heads(self) -> int:
        """KV heads (HF default: as many as attention heads)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def rope_attention_factor(self) -> float:
        """The factor on the rotary cos and sin: YaRN's attention factor
        (RopeScaling.yarn_attention_factor), 1 without YaRN scaling."""
        return 1.0 if self.rope_scaling is None else self.rope_scaling.yarn_attention_factor

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query/key vectors."""
        if self.is_mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim  # type: ignore[operator]
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def value_head_dim(self) -> int:
        """Width of one head's value vector."""
        if self.is_mla:
            return self.v_head_dim  # type: ignore[return-value]
        return self.qk_head_dim

    @property
    def moe_token_width(self) -> int:
        """Width of the tokens the routed experts receive, dispatch and combine: the latent
        width under LatentMoE (Megatron-Core MoELayer.preprocess applies fc1_latent_proj before
        dispatch_preprocess; token_dispatcher hidden_dim = moe_latent_size or hidden_size),
        else hidden_size."""
        return self.moe_latent_size or self.hidden_size

    @property
    def num_moe_layers(self) -> int:
        """MoE layers: index i >= first_k_dense_layers with i % moe_layer_freq == 0 (DeepSeek)."""
        if not self.is_moe:
            return 0
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types.count("moe")
        return sum(
            1
            for i in range(self.first_k_dense_layers, self.num_hidden_layers)
            if i % self.moe_layer_freq == 0
        )

    @property
    def num_dense_layers(self) -> int:
        return self.num_hidden_layers - self.num_moe_layers

    # ---- the block pattern (solver.spec.blocks) ---------------------------------------------

    @property
    def is_hybrid(self) -> bool:
        """Whether the model states a block pattern (even one equal to the plain default)."""
        return self.layer_types is not None or self.mlp_layer_types is not None

    @property
    def has_block_kinds(self) -> bool:
        """Whether some layer is of a kind beyond full attention + dense or MoE MLP (the cost
        model then takes the block pattern's paths; otherwise the plain ones, unchanged)."""
        return self.is_hybrid and len(self.block_kinds) > 2

    @property
    def layer_mixers(self) -> tuple[str, ...]:
        return self.layer_types or ("full_attention",) * self.num_hidden_layers

    @property
    def layer_mlps(self) -> tuple[str, ...]:
        if self.mlp_layer_types is not None:
            return self.mlp_layer_types
        moe = {i for i in range(self.first_k_dense_layers, self.num_hidden_layers)
               if self.is_moe and i % self.moe_layer_freq == 0}
        return tuple("moe" if i in moe else "dense" for i in range(self.num_hidden_layers))

    @property
    def block_kinds(self) -> tuple[tuple[str, str], ...]:
        """The (mixer, mlp) kinds: the two plain ones, then the others as they appear."""
        kinds = list(BASE_KINDS)
        for pair in zip(self.layer_mixers, self.layer_mlps):
            if pair not in kinds:
                kinds.append(pair)
        return tuple(kinds)

    @property
    def layer_kind_indices(self) -> tuple[int, ...]:
        """Each layer's index into block_kinds, in model order."""
        kinds = self.block_kinds
        return tuple(kinds.index(pair) for pair in zip(self.layer_mixers, self.layer_mlps))

    def at_length(self, seq_len: int) -> ModelSpec:
        """The model as it runs on sequences of at most `seq_len` tokens. A sliding window or
        an attention chunk no shorter than the sequence masks nothing (every query sees every
        earlier key: context_tokens gives full attention's context and the KV cache
        keeps every token), so such layers are full-attention layers, and a pattern left all
        plain is dropped. Every cost is unchanged (up to the order of float sums); the layout
        program sees fewer kinds of layer (Gemma 2's 4096-token windows at seq_len 4096: a
        plain model)."""
        covered = {"sliding_attention": self.sliding_window,
                   "chunked_attention": self.attention_chunk_size}
        if self.layer_types is None or not any(
                (covered.get(mixer) or 0) >= seq_len for mixer in self.layer_types):
            return self
        mixers = tuple("full_attention" if (covered.get(mixer) or 0) >= seq_len else mixer
                       for mixer in self.layer_types)
        update: dict[str, object] = {"layer_types": mixers}
        plain_mlps = self.mlp_layer_types is None or self.mlp_layer_types == self.model_copy(
            update={"mlp_layer_types": None}).layer_mlps
        if set(mixers) == {"full_attention"} and plain_mlps:
            update = {"layer_types": None, "mlp_layer_types": None}
        return self.model_copy(update=update)

    @property
    def num_attention_layers(self) -> int:
        """Layers with a softmax-attention mixer (full, sliding or chunked)."""
        return sum(1 for mixer in self.layer_mixers if mixer in ATTENTION_MIXERS)

    def context_tokens(self, mixer: str, seq_len: int, causal: bool = True) -> float:
        """Keys a query attends to on average in an attention layer of a sequence of seq_len.

            full      s/2 causal (s otherwise)
            sliding   w - w(w-1)/(2s) for w < s (query i sees min(i, w) keys, the exact
                      mean), never above full attention's s/2
            chunked   c/2 causal inside chunks of c <= s (c otherwise), else as full
        (FlashAttention skips the blocks a window masks out, so its work follows these
        counts.) Worked number: Gemma 3, w = 1024, s = 8192: 1024 - 1024 * 1023 / 16384
        = 960.06."""
        full = seq_len / 2 if causal else float(seq_len)
        if self.is_sparse_attention:  # DSA: the top-k keys (solver.spec.sparse_attention)
            return self.sparse_context_tokens(seq_len, causal)
        if mixer == "sliding_attention" and self.sliding_window and self.sliding_window < seq_len:
            w = self.sliding_window
            return min(full, w - w * (w - 1) / (2.0 * seq_len)) if causal else float(w)
        if (mixer == "chunked_attention" and self.attention_chunk_size
                and self.attention_chunk_size < seq_len):
            c = self.attention_chunk_size
            return c / 2 if causal else float(c)
        return full

    # ---- FLOPs -------------------------------------------------------------------------------

    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs of QK^T and AV for one token, all layers: 2 * ctx * heads *
        (d_qk + d_v) per layer, ctx = seq_len (or seq_len / 2 on average when causal; DSA's
        top-k keys), plus DSA's indexer scores."""
        if self.has_block_kinds:  # each attention layer over its own context (window, chunk)
            width = 2 * self.num_attention_heads * (self.qk_head_dim + self.value_head_dim)
            return sum(width * self.context_tokens(mixer, seq_len, causal)
                       for mixer in self.layer_mixers if mixer in ATTENTION_MIXERS)
        ctx = self.context_tokens("full_attention", seq_len, causal)
        per_layer = 2 * ctx * self.num_attention_heads * (self.qk_head_dim + self.value_head_dim)
        return self.num_hidden_layers * (per_layer
                                         + self.indexer_core_flops_per_token(seq_len, causal))

    def flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Training FLOPs per token (forward + backward = 3x forward, no recompute):
        6 * matmul_params_active + 3 * attention_flops_per_token.

        Worked number (Narayanan et al. 2021, eq. 3, non-causal, GPT-3 175B, s=2048):
        72*b*s*L*h^2*(1 + s/(6h) + V/(12hL)) / (b*s) = 1.076e12 FLOPs per token.
        """
        return 6.0 * self.matmul_params_active + 3.0 * self.attention_flops_per_token(
            seq_len, causal
        )
