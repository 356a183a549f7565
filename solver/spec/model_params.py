"""The parameter counts of a ModelSpec: per layer kind, per block, summed over the model.

A mixin of ModelSpec (solver.spec.model), kept apart so that the spec's fields and checks and
the arithmetic on them each stay one screenful; every count follows the Hugging Face modeling
code of the families that build the layer (cited at solver.catalog.hf's mappings), and the
zoo tests pin the totals to the model cards.
"""

from __future__ import annotations

from solver.spec.blocks import ATTENTION_MIXERS


class ParameterCounts:
    """Parameter counts, computed from ModelSpec's primary fields (never stored)."""

    # ---- parameter counts (per layer kind) ---------------------------------------------------

    def kind_params(self, kind: int, active: bool = False) -> int:
        """Parameters of one layer of kind `kind` (norms included)."""
        mixer, mlp = self.block_kinds[kind]
        return self.mixer_params(mixer) + self.mlp_params(mlp, active) + self.norm_params_per_layer

    def mixer_params(self, mixer: str) -> int:
        """Parameters of one layer's token mixer (solver.spec.blocks names the mixers)."""
        if mixer in ATTENTION_MIXERS:
            return self.attention_params_per_layer
        if mixer == "mamba":
            return self.mamba_params_per_layer
        if mixer == "linear_attention":
            return self.deltanet_params_per_layer
        return 0

    def mlp_params(self, mlp: str, active: bool = False) -> int:
        """Parameters of one layer's MLP (`active`: the top-k routed experts only)."""
        if mlp == "dense":
            return self.dense_mlp_params_per_layer
        if mlp == "moe":
            routed = self.experts_per_token if active else self.num_experts
            return (self.router_params_per_layer + routed * self.expert_params
                    + self.shared_expert_params_per_layer
                    + self.latent_projection_params_per_layer)
        return 0

    def _norm_params(self, width: int) -> int:
        return width * (2 if self.norm_type == "layernorm" and self.norm_bias else 1)

    @property
    def attention_params_per_layer(self) -> int:
        """Attention projections (+biases, q/k norms, sinks, DSA's indexer) of one layer."""
        h, heads, kv = self.hidden_size, self.num_attention_heads, self.kv_heads
        if self.is_mla:
            q_width = heads * self.qk_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self._norm_params(self.q_lora_rank)
                q += self.q_lora_rank * q_width
            else:
                q = h * q_width
            kv_rank = self.kv_lora_rank or 0
            kv_down = h * (kv_rank + (self.qk_rope_head_dim or 0)) + self._norm_params(kv_rank)
            kv_up = kv_rank * heads * ((self.qk_nope_head_dim or 0) + self.value_head_dim)
            out = heads * self.value_head_dim * h
            indexer = self.indexer_params(h, self.q_lora_rank)  # DSA (spec.sparse_attention)
            return q + kv_down + kv_up + out + (h if self.o_bias else 0) + indexer
        d = self.qk_head_dim
        q_width, kv_width = heads * d, kv * d
        gate = q_width if self.attention_output_gate else 0
        params = h * (q_width + gate + 2 * kv_width) + q_width * h
        if self.qkv_bias:
            params += q_width + 2 * kv_width
        if self.o_bias:
            params += h
        if self.qk_norm and self.qk_norm_over == "projection":
            params += self._norm_params(q_width) + self._norm_params(kv_width)
        elif self.qk_norm:
            params += 2 * self._norm_params(d)
        if self.attention_sinks:
            params += heads
        return params

    @property
    def mamba_params_per_layer(self) -> int:
        """One Mamba-2 mixer (transformers NemotronHMamba2Mixer / Megatron MambaMixer): in_proj
        h -> 2 d_inner + 2 G N + H (z, x, B, C, dt), a depthwise conv1d of width conv_kernel
        over the d_inner + 2 G N channels x, B, C (with bias when use_conv_bias), dt_bias,
        A_log and D per head, the gated RMSNorm over d_inner and out_proj d_inner -> h;
        d_inner = H x P. Nemotron-H-8B (h 4096, H 128, P 64, G 8, N 128, kernel 4):
        76,021,760 + 51,200 + 384 + 8,192 + 33,554,432 = 109,635,968."""
        h, heads = self.hidden_size, self.mamba_num_heads or 0
        inner = heads * (self.mamba_head_dim or 0)
        bc = 2 * (self.n_groups or 0) * (self.ssm_state_size or 0)
        conv_channels = inner + bc
        in_proj = h * (2 * inner + bc + heads) + (2 * inner + bc + heads
                                                  if self.mamba_proj_bias else 0)
        conv = conv_channels * self.conv_kernel + (conv_channels if self.use_conv_bias else 0)
        out_proj = inner * h + (h if self.mamba_proj_bias else 0)
        return in_proj + conv + 3 * heads + inner + out_proj

    @property
    def deltanet_params_per_layer(self) -> int:
        """One gated DeltaNet mixer (transformers Qwen3NextGatedDeltaNet): in_proj_qkvz
        h -> 2 key_dim + 2 value_dim, in_proj_ba h -> 2 value heads, a bias-free depthwise
        conv1d over q, k, v (2 key_dim + value_dim channels), dt_bias and A_log per value head,
        the gated RMSNorm over one value head and out_proj value_dim -> h.
        Qwen3-Next-80B-A3B (h 2048, 16 key / 32 value heads of 128, kernel 4): 25,165,824
        + 131,072 + 32,768 + 64 + 128 + 8,388,608 = 33,718,464."""
        h = self.hidden_size
        key_dim = (self.linear_num_key_heads or 0) * (self.linear_key_head_dim or 0)
        value_heads = self.linear_num_value_heads or 0
        value_dim = value_heads * (self.linear_value_head_dim or 0)
        projections = h * (2 * key_dim + 2 * value_dim) + h * 2 * value_heads
        conv = (2 * key_dim + value_dim) * self.linear_conv_kernel_dim
        return (projections + conv + 2 * value_heads + (self.linear_value_head_dim or 0)
                + value_dim * h)

    def _ffn_params(self, width: int, h: int | None = None) -> int:
        """One feed-forward block h -> width -> h (gated: three matrices); h defaults to
        hidden_size."""
        h = h or self.hidden_size
        matrices = 3 if self.mlp_type == "gated" else 2
        params = matrices * h * width
        if self.mlp_bias:
            params += (matrices - 1) * width + h
        return params

    @property
    def dense_mlp_params_per_layer(self) -> int:
        return self._ffn_params(self.intermediate_size)

    @property
    def expert_params(self) -> int:
        """One routed expert (at moe_token_width: the latent width under LatentMoE)."""
        if not self.is_moe:
            return 0
        return self._ffn_params(self.moe_intermediate_size, self.moe_token_width)

    @property
    def latent_projection_params_per_layer(self) -> int:
        """LatentMoE's fc1_latent_proj h -> latent and fc2_latent_proj latent -> h, biased
        with mlp_bias (transformers NemotronHMoE; Megatron-Core core_v0.16.1
        moe/moe_layer.py MoELayer.__init__). Nemotron 3 Super (h 4096, latent 1024):
        8,388,608."""
        latent = self.moe_latent_size
        if not latent or not self.is_moe:
            return 0
        h = self.hidden_size
        return 2 * h * latent + ((latent + h) if self.mlp_bias else 0)

    @property
    def router_params_per_layer(self) -> int:
        if not self.is_moe:
            return 0
        # The router scores the zero experts too (solver.spec.zero_experts).
        scored = self.num_experts + self.num_zero_experts
        return scored * (self.hidden_size + (1 if self.router_bias else 0))

    @property
    def shared_expert_params_per_layer(self) -> int:
        if not self.num_shared_experts:
            return 0
        width = self.shared_expert_intermediate_size or self.moe_intermediate_size
        gate = self.hidden_size if self.shared_expert_gate else 0
        return self.num_shared_experts * self._ffn_params(width) + gate  # type: ignore[arg-type]

    @property
    def norm_params_per_layer(self) -> int:
        return self.norms_per_layer * self._norm_params(self.hidden_size)

    @property
    def dense_layer_params(self) -> int:
        return (
            self.attention_params_per_layer
            + self.dense_mlp_params_per_layer
            + self.norm_params_per_layer
        )

    @property
    def moe_layer_params(self) -> int:
        """All parameters of one MoE layer (every routed expert included)."""
        if not self.is_moe:
            return 0
        return (
            self.attention_params_per_layer
            + self.router_params_per_layer
            + self.num_experts * self.expert_params
            + self.shared_expert_params_per_layer
            + self.latent_projection_params_per_layer
            + self.norm_params_per_layer
        )

    @property
    def embedding_params(self) -> int:
        """Input side: token embedding, learned positions, embedding norm."""
        h = self.hidden_size
        params = self.vocab_size * h
        if self.position_embedding_type == "learned":
            params += self.max_position_embeddings * h
        if self.embedding_norm:
            params += self._norm_params(h)
        return params

    @property
    def lm_head_params(self) -> int:
        """Output projection; 0 when tied to the token embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def final_norm_params(self) -> int:
        return self._norm_params(self.hidden_size)

    @property
    def mtp_depths(self) -> int:
        """MTP depths a training step runs (Megatron --mtp-num-layers): each adds one MTP
        layer's forward and backward, its activations and one more LM-head pass and loss."""
        return (self.num_nextn_predict_layers if self.mtp_num_layers is None
                else self.mtp_num_layers)

    @property
    def mtp_modules(self) -> int:
        """MTP modules holding weights: one when the depths repeat one module, else one per
        depth (Megatron-Core MultiTokenPredictionBlock._build_layers)."""
        return min(self.mtp_depths, 1) if self.mtp_use_repeated_layer else self.mtp_depths

    @property
    def mtp_loss_scale_per_depth(self) -> float:
        """Each depth's loss weight: mtp_loss_scaling_factor / depths (Megatron-Core
        process_mtp_loss: `mtp_loss_scale = config.mtp_loss_scaling_factor /
        config.mtp_num_layers`); 0 without MTP."""
        depths = self.mtp_depths
        return self.mtp_loss_scaling_factor / depths if depths else 0.0

    @property
    def mtp_module_params(self) -> int:
        """One MTP module: its decoder layer (of the model's MoE kind), eh_proj (2h -> h) and
        three norms (enorm, hnorm, the final norm before the shared LM head)."""
        h = self.hidden_size
        layer = self.moe_layer_params if self.is_moe else self.dense_layer_params
        if "mamba" in self.layer_mixers:
            # One block a layer: the depth's "*E" (or "*-") is two layers, each with its own
            # pre-norm (mtp_hybrid_override_pattern; megatron_hybrid).
            layer += self.norm_params_per_layer
        return layer + 2 * h * h + 3 * self._norm_params(h)

    @property
    def mtp_params(self) -> int:
        """Multi-token-prediction modules (not counted in total_params, as the model cards
        count them apart: DeepSeek-V3's "671B main model weights and 14B MTP module
        weights"); a repeated module counts once whatever the depths."""
        return self.mtp_modules * self.mtp_module_params if self.mtp_modules else 0

    def _pattern_layer_params(self, active: bool) -> int:
        """Every decoder layer's parameters summed over the block pattern."""
        counts: dict[int, int] = {}
        for kind in self.layer_kind_indices:
            counts[kind] = counts.get(kind, 0) + 1
        return sum(n * self.kind_params(kind, active) for kind, n in counts.items())

    @property
    def total_params(self) -> int:
        if self.is_hybrid:
            return (self.embedding_params + self._pattern_layer_params(active=False)
                    + self.final_norm_params + self.lm_head_params)
        return (
            self.embedding_params
            + self.num_dense_layers * self.dense_layer_params
            + self.num_moe_layers * self.moe_layer_params
            + self.final_norm_params
            + self.lm_head_params
        )

    @property
    def active_params(self) -> int:
        """Parameters one token touches (routed experts: top-k of them)."""
        if not self.is_moe:
            return self.total_params
        # On average with zero experts (k E / (E + Z) FFN experts), rounded to a parameter.
        idle = self.num_experts - self.experts_per_token
        return round(self.total_params - self.num_moe_layers * idle * self.expert_params)

    def breakdown(self) -> dict[str, int]:
        """Parameters by kind, summed over the model; the values add up to total_params."""
        moe_layers = self.num_moe_layers
        mixers = self.layer_mixers
        parts = {
            "embedding": self.embedding_params,
            "attention": self.num_attention_layers * self.attention_params_per_layer,
            "dense_mlp": self.num_dense_layers * self.dense_mlp_params_per_layer,
            "router": moe_layers * self.router_params_per_layer,
            "routed_experts": moe_layers * self.num_experts * self.expert_params,
            "shared_experts": moe_layers * self.shared_expert_params_per_layer,
            "norms": self.num_hidden_layers * self.norm_params_per_layer + self.final_norm_params,
            "lm_head": self.lm_head_params,
        }
        if self.is_sparse_attention:  # DSA's lightning indexers, apart from MLA's projections
            indexers = self.num_attention_layers * self.indexer_params(self.hidden_size,
                                                                       self.q_lora_rank)
            parts["attention"] -= indexers
            parts["indexer"] = indexers
        if self.moe_latent_size:
            parts["latent_projections"] = moe_layers * self.latent_projection_params_per_layer
        mlps = self.layer_mlps
        parts["dense_mlp"] = mlps.count("dense") * self.dense_mlp_params_per_layer
        for mixer, key in (("mamba", "mamba"), ("linear_attention", "linear_attention")):
            if mixer in mixers:
                parts[key] = mixers.count(mixer) * self.mixer_params(mixer)
        assert sum(parts.values()) == self.total_params
        return parts

    # ---- what a token multiplies by ----------------------------------------------------------

    @property
    def matmul_params_active(self) -> int:
        """Weights a token multiplies by in one forward pass: every projection it visits plus
        the LM head (also when tied). Embeddings are a lookup and layer norms are not GEMMs, so
        both are left out; biases (a few thousand per layer) stay in."""
        h = self.hidden_size
        norms = self.num_hidden_layers * self.norm_params_per_layer + self.final_norm_params
        lm_head_gemm = self.vocab_size * h
        return self.active_params - self.embedding_params - norms - self.lm_head_params + lm_head_gemm
