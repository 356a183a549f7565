"""The zoo's newer models, counted against their checkpoints from config.json alone, and the
windows of the windowed ones.

- Llama 4 Scout: the card's 109B counts the vision encoder; the zoo file is the text model.
  Text + vision, each counted from the checkpoint's config.json, is the checkpoint's exact
  size, which pins the text model's count to the parameter.
- Kimi K2: the card says 1T; the checkpoint holds 1026.5B parameters, its block-FP8 scale
  tensors included, which the count reproduces.
- Qwen3-Next: its one MTP layer.
- A window no shorter than the sequence is full attention (ModelSpec.at_length), to the bit.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog.clusters import load_cluster_spec
from solver.catalog.hf import model_spec_from_hf_config
from solver.catalog.zoo import load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.layout_terms import estimate_layout_coefficients
from solver.cost.memory import estimate_memory_total
from solver.cost.step.steptime import estimate_step_seconds
from solver.spec import JobSpec, ModelSpec, ParallelConfig

CONFIG_DIR = Path(__file__).resolve().parent / "data" / "hf_configs"


def load_config(name: str) -> dict:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text(encoding="utf-8"))


# ---- Llama 4 Scout: text model + vision encoder = the checkpoint ------------------------------


def count_llama4_text(text: dict) -> int:
    """Llama4ForCausalLM by hand (transformers models/llama4/modeling_llama4.py): embedding
    and untied LM head, final RMSNorm; per layer two RMSNorms, bias-free q/k/v/o (the q/k L2
    norm has no weights) and, every layer being MoE here (interleave_moe_layer_step 1), a
    bias-free router, num_local_experts SwiGLU experts and one shared SwiGLU expert, all of
    intermediate_size."""
    h, vocab, experts = text["hidden_size"], text["vocab_size"], text["num_local_experts"]
    q, kv = text["num_attention_heads"] * text["head_dim"], text["num_key_value_heads"] * text[
        "head_dim"]
    assert text["interleave_moe_layer_step"] == 1
    layer = (2 * h + h * (q + 2 * kv) + q * h + experts * h
             + (experts + 1) * 3 * h * text["intermediate_size"])
    return 2 * vocab * h + h + text["num_hidden_layers"] * layer


def count_llama4_vision(vision: dict, text_hidden: int) -> int:
    """Llama4VisionModel and Llama4MultiModalProjector (modeling_llama4.py): the patch
    embedding (Unfold + a bias-free Linear of channels x patch^2), the class embedding, one
    positional embedding per patch and the class token, LayerNorms (weight and bias) before and
    after the encoder; per encoder layer q/k/v/o and fc1/fc2 with biases and two LayerNorms;
    the pixel-shuffle adapter's bias-free MLP2 (fc1 intermediate_size -> projector_input_dim,
    fc2 projector_output_dim -> projector_output_dim); the projector vision_output_dim -> text
    hidden, bias-free."""
    h, inter = vision["hidden_size"], vision["intermediate_size"]
    positions = (vision["image_size"] // vision["patch_size"]) ** 2 + 1
    stem = vision["num_channels"] * vision["patch_size"] ** 2 * h + h + positions * h + 4 * h
    layer = 4 * (h * h + h) + (h * inter + inter) + (inter * h + h) + 4 * h
    adapter = inter * vision["projector_input_dim"] + vision["projector_output_dim"] ** 2
    projector = vision["vision_output_dim"] * text_hidden
    return stem + vision["num_hidden_layers"] * layer + adapter + projector


def test_llama4_scout_text_and_vision_make_the_checkpoint() -> None:
    """https://huggingface.co/meta-llama/Llama-4-Scout-17B-16E: safetensors count
    108,641,793,536 (the card rounds to 109B). The zoo's text model is 107,769,861,120 of it;
    the vision encoder and projector the other 871,932,416."""
    config = load_config("llama-4-scout-17b-16e")
    text, vision = config["text_config"], config["vision_config"]
    spec = load_model_spec("llama4-scout")
    assert spec.total_params == count_llama4_text(text) == 107_769_861_120
    vision_params = count_llama4_vision(vision, text["hidden_size"])
    assert vision_params == 871_932_416
    assert spec.total_params + vision_params == 108_641_793_536
    assert round((spec.total_params + vision_params) / 1e9) == 109  # the card's figure
    imported = model_spec_from_hf_config(config, "llama-4-scout-17b-16e.json")
    assert imported.breakdown() == spec.breakdown()


# ---- Kimi K2: the checkpoint's count includes its FP8 block scales -----------------------------


def count_fp8_block_scales(spec: ModelSpec, block: int = 128) -> int:
    """The float32 weight_scale_inv tensors of a DeepSeek-V3-style block-FP8 checkpoint
    (config.json quantization_config weight_block_size [128, 128]): one per 128 x 128 block
    of every decoder Linear (MLA projections, dense MLP, routed and shared experts); the
    embedding, LM head, router and norms stay bf16."""
    h, heads = spec.hidden_size, spec.num_attention_heads

    def blocks(rows: int, cols: int) -> int:
        return math.ceil(rows / block) * math.ceil(cols / block)

    qk, kv = spec.qk_head_dim, spec.kv_lora_rank or 0
    attention = (blocks(spec.q_lora_rank or 0, h) + blocks(heads * qk, spec.q_lora_rank or 0)
                 + blocks(kv + (spec.qk_rope_head_dim or 0), h)
                 + blocks(heads * ((spec.qk_nope_head_dim or 0) + spec.value_head_dim), kv)
                 + blocks(h, heads * spec.value_head_dim))

    def ffn(width: int) -> int:
        return 2 * blocks(width, h) + blocks(h, width)

    width = spec.moe_intermediate_size or 0
    moe = (spec.num_experts + spec.num_shared_experts) * ffn(width)
    return (spec.num_hidden_layers * attention + spec.num_dense_layers * ffn(
        spec.intermediate_size) + spec.num_moe_layers * moe)


def test_kimi_k2_with_its_fp8_scales_is_the_checkpoint() -> None:
    """Hugging Face lists moonshotai/Kimi-K2-Instruct at 1026.5B parameters (the card: 1T):
    the bf16-equivalent weights, 1,026,408,232,448, plus 62,495,192 FP8 block scales, round
    to it; the weights alone would round to 1026.4B."""
    spec = load_model_spec("kimi-k2")
    assert spec.total_params == 1_026_408_232_448
    scales = count_fp8_block_scales(spec)
    assert scales == 62_495_192
    assert round((spec.total_params + scales) / 1e8) == 10_265
    assert round(spec.total_params / 1e8) != 10_265
    imported = model_spec_from_hf_config(load_config("kimi-k2-instruct"), "kimi.json")
    assert imported.model_type == "kimi_k2" and imported.breakdown() == spec.breakdown()


# ---- Qwen3-Next's MTP layer ---------------------------------------------------------------------


def test_qwen3_next_mtp_layer_is_a_gated_attention_moe_layer_behind_fc() -> None:
    """vLLM qwen3_next_mtp.py, Qwen3NextMultiTokenPredictor: fc (2h -> h, bias-free),
    pre_fc_norm_hidden, pre_fc_norm_embedding and norm (RMSNorms), and one
    Qwen3NextDecoderLayer of full attention with the sparse MoE block; the embedding and LM
    head are the main model's. 1,650,471,424 parameters, counted apart from the 79.67B."""
    spec = load_model_spec("qwen3-next-80b-a3b")
    h = spec.hidden_size
    full_moe = spec.block_kinds.index(("full_attention", "moe"))
    assert spec.num_nextn_predict_layers == 1
    assert spec.mtp_params == spec.kind_params(full_moe) + 2 * h * h + 3 * h == 1_650_471_424
    assert spec.total_params == 79_674_391_296


@pytest.mark.parametrize(("update", "layers"), [
    ({}, 1),  # vLLM's default: getattr(config, "num_nextn_predict_layers", 1)
    ({"mtp_num_hidden_layers": 2}, 2),  # Qwen's own key (the Qwen3.5 configs)
    ({"num_nextn_predict_layers": 0}, 0),
])
def test_qwen3_next_reads_its_mtp_depth(update: dict, layers: int) -> None:
    config = {**load_config("qwen3-next-80b-a3b"), **update}
    assert model_spec_from_hf_config(config, "q.json").num_nextn_predict_layers == layers


def test_qwen3_next_mtp_layer_costs_time_and_last_stage_memory() -> None:
    """The MTP layer runs on the last stage (here the only one): it adds time and memory."""
    spec = load_model_spec("qwen3-next-80b-a3b")
    without = spec.model_copy(update={"num_nextn_predict_layers": 0})
    cluster, job = load_cluster_spec("dgx-h100"), JobSpec(seq_len=4096, global_batch=64)
    candidates = Candidates.from_configs([ParallelConfig(tp=2, pp=1, dp=8, ep=8, micro_batch=1,
                                                         zero=1)])
    assert estimate_step_seconds(spec, cluster, job, candidates)[0] > estimate_step_seconds(
        without, cluster, job, candidates)[0]
    assert estimate_memory_total(spec, job, candidates)[0][0] > estimate_memory_total(
        without, job, candidates)[0][0]


# ---- a window that covers the sequence is full attention ---------------------------------------

WINDOWED = ["gemma2-9b", "mistral-7b", "phi3-mini", "gpt-oss-20b", "llama4-scout", "gemma3-27b"]


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(WINDOWED), seq_len=st.sampled_from([64, 128, 1024, 2047, 2048,
                                                                4096, 8192, 16384]))
def test_at_length_changes_no_cost(name: str, seq_len: int) -> None:
    """ModelSpec.at_length turns windows >= seq_len into full attention: step time, memory and
    the layout program's coefficients stay the same (up to the order of float sums, 1e-12),
    and a model whose every window covers the sequence becomes a plain model (no pattern)."""
    spec = load_model_spec(name)
    short = spec.at_length(seq_len)
    windows = [w for w in (spec.sliding_window, spec.attention_chunk_size) if w]
    assert (short is spec) == all(w < seq_len for w in windows)
    assert len(short.block_kinds) <= len(spec.block_kinds)
    cluster, job = load_cluster_spec("dgx-h100"), JobSpec(seq_len=seq_len, global_batch=64)
    config = ParallelConfig(tp=2, pp=2, dp=4, ep=2 if spec.is_moe else 1, micro_batch=1,
                            zero=1, recompute="selective")
    candidates = Candidates.from_configs([config])
    same = {"rtol": 1e-12, "atol": 0.0}
    assert np.allclose(estimate_step_seconds(short, cluster, job, candidates),
                       estimate_step_seconds(spec, cluster, job, candidates), **same)
    for left, right in zip(estimate_memory_total(short, job, candidates),
                           estimate_memory_total(spec, job, candidates)):
        assert np.allclose(left, right, **same)
    short_co = estimate_layout_coefficients(short, cluster, job, config)
    spec_co = estimate_layout_coefficients(spec, cluster, job, config)
    # Per layer in model order (the kinds may be numbered apart): the same time and bytes.
    assert np.allclose(short_co.layer_s[short_co.kinds], spec_co.layer_s[spec_co.kinds], **same)
    assert np.allclose(short_co.layer_bytes[:, short_co.kinds],
                       spec_co.layer_bytes[:, spec_co.kinds], **same)
    assert np.allclose(short_co.base_bytes, spec_co.base_bytes, **same)


def test_gemma2_windows_cover_4096_but_not_8192() -> None:
    """Gemma 2 (config.json sliding_window 4096): at 4096 tokens it is exactly the plain
    model it was before its zoo file stated the windows; at 8192 half its layers see 4096."""
    spec = load_model_spec("gemma2-9b")
    assert spec.at_length(4096).layer_types is None
    assert not spec.at_length(4096).is_hybrid
    assert spec.at_length(8192) is spec and spec.has_block_kinds
