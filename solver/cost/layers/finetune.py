"""Fine-tuning with adapters (issue 42; solver.spec.finetune): the adapters' parameters and
FLOPs, the 4-bit NF4 base of QLoRA and what dequantizing it costs, per decoder layer.

LoRA (Hu et al. 2021) adds to a frozen linear W (in -> out) the path (alpha / r) B A x with
A: r x in, B: out x r, so an adapter holds r (in + out) parameters (PEFT tuners/lora/layer.py
LoraLayer.update_layer: nn.Linear(in_features, r) and nn.Linear(r, out_features), no bias;
Megatron-Bridge peft/lora_layers.py: linear_in and linear_out). Per token it runs two GEMMs of
2 r in and 2 r out FLOPs forward and, training A and B, twice that backward: 6 r (in + out).
The frozen W runs its forward and only its input gradient (no weight-gradient GEMM): 4 FLOPs per
weight instead of 6, the "~2/3 of full training" Megatron-Bridge's LoRA table counts (Llama 3
70B LoRA on 8 H100s: 735 model TFLOP/s at 2,643 tokens/s a GPU = 2.78e11 FLOPs a token, about
4 x 70.6e9 against the SFT row's 710 / 1,638 = 4.33e11, about 6 x; docs/performance-summary.md
at 8f341b04f7b44af14ffc79a0b97a679b4dd633d8).

QLoRA (Dettmers et al. 2023, §3 "Double Quantization"): each weight is 4 bits, each block of 64
weights keeps one absmax, quantized to 8 bits with one fp32 constant per 256 of them:
8/64 + 32/(64 x 256) = 0.127 bits per parameter of constants ("reduces the memory footprint from
32/64 = 0.5 bits per parameter to 8/64 + 32/(64 * 256) = 0.127 bits"), 4.127 bits = 0.5159 B a
weight. bitsandbytes' BitsAndBytesConfig(bnb_4bit_quant_type="nf4", use_double_quant) and
torchao's NF4Tensor (to_nf4: block_size 64, scaler_block_size 256; torchtune's QLoRA) store the
same. The linears of the decoder layers are quantized; the embedding, the LM head and the norms
stay bf16 (transformers' get_keys_to_not_convert keeps the output embedding; torchtune's
lora_llama3 quantizes the layers' linears, FrozenNF4Linear for the ones without adapters, and
builds the output projection as nn.Linear).
Each GEMM dequantizes its weight to bf16 first, in the forward and again for the input gradient
(bitsandbytes autograd/_functions.py MatMul4Bit: forward F.linear(A, dequantize_4bit(B).t()),
backward grad_A = grad_output @ dequantize_4bit(B).t(); torchao LinearNF4,
quantization/quantize_/workflows/nf4/nf4_tensor.py @36027d8: F.linear(input,
weight.to(input.dtype)) forward, grad_output @ weight.to(grad_output.dtype) backward): it reads
0.5159 B and writes 2 B a weight each time, streamed through HBM.

Models modelled: dense decoders with standard attention (no MLA, no routed experts, no block
pattern); the others are refused by check_finetune_supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solver.cost.kernels.efficiency import (
    ComputeConstants,
    estimate_gemm_backward_s,
    estimate_gemm_s,
    estimate_streaming_s,
)
from solver.errors import InputError
from solver.spec import GpuSpec, ModelSpec
from solver.spec.finetune import FinetuneSpec

BF16_BYTES = 2.0
NF4_BITS = 4.0
NF4_BLOCK = 64            # weights per first-level absmax (QLoRA §3; NF4Tensor block_size)
NF4_SCALER_BLOCK = 256    # absmaxes per second-level fp32 constant (NF4Tensor scaler_block_size)
FP8_BITS = 8.0            # the quantized first-level absmax
FP32_BITS = 32.0
# LoRA per token: A then B forward (2 FLOPs a weight each), their input and weight gradients
# backward (4 a weight): 6 a weight. The frozen base: forward and input gradient, 4 a weight.
ADAPTER_FLOPS_PER_PARAM = 6.0
FROZEN_FLOPS_PER_PARAM = 4.0
TRAINED_FLOPS_PER_PARAM = 6.0


def estimate_nf4_constant_bits(block: int = NF4_BLOCK, scaler_block: int = NF4_SCALER_BLOCK
                               ) -> float:
    """Bits per weight of double-quantized NF4 constants: 8 / block + 32 / (block x scaler_block).
    QLoRA §3's worked number: 8/64 + 32/(64 x 256) = 0.127 bits (0.5 without double
    quantization, 32/64)."""
    return FP8_BITS / block + FP32_BITS / (block * scaler_block)


def estimate_nf4_bytes_per_param(block: int = NF4_BLOCK, scaler_block: int = NF4_SCALER_BLOCK
                                 ) -> float:
    """Bytes per NF4 weight: (4 + constants) / 8 = (4 + 0.127) / 8 = 0.5159 B."""
    return (NF4_BITS + estimate_nf4_constant_bits(block, scaler_block)) / 8.0


@dataclass(frozen=True)
class AdapterParams:
    """Adapter parameters of one decoder layer, by the block the adapted linears sit in."""

    attention: float
    mlp: float

    @property
    def total(self) -> float:
        return self.attention + self.mlp


def check_finetune_supported(model_spec: ModelSpec, finetune: FinetuneSpec) -> None:
    """Refuse adapters on what the adapter model does not cover (module docstring), in one line."""
    if not finetune.has_adapters:
        return
    why = ("multi-head latent attention" if model_spec.is_mla
           else "routed experts" if model_spec.is_moe
           else "a block pattern (windowed attention or other mixers)"
           if model_spec.has_block_kinds else None)
    if why:
        raise InputError(f"--finetune {finetune.mode}: {model_spec.name} has {why}; parplan "
                         "models adapters on dense decoders with standard attention only")


def linear_shapes(model_spec: ModelSpec) -> dict[str, tuple[str, int, int]]:
    """Every linear of a dense decoder layer, by the names PEFT and Megatron give it:
    name -> (block, in features, out features). A gated MLP's gate and up are PEFT's
    gate_proj and up_proj and Megatron's one linear_fc1 of 2F outputs; a plain MLP has no
    gate_proj. Llama-3.1-8B: q_proj 4096 -> 4096, k_proj and v_proj 4096 -> 1024,
    linear_qkv 4096 -> 6144, linear_fc1 4096 -> 28672."""
    m = model_spec
    h, heads, kv = m.hidden_size, m.num_attention_heads, m.kv_heads
    q, k, v = heads * m.qk_head_dim, kv * m.qk_head_dim, kv * m.value_head_dim
    o_in, f = heads * m.value_head_dim, m.intermediate_size
    gated = m.mlp_type == "gated"
    shapes = {"q_proj": ("attention", h, q), "k_proj": ("attention", h, k),
              "v_proj": ("attention", h, v), "o_proj": ("attention", o_in, h),
              "up_proj": ("mlp", h, f), "down_proj": ("mlp", f, h),
              "linear_qkv": ("attention", h, q + k + v), "linear_proj": ("attention", o_in, h),
              "linear_fc1": ("mlp", h, (2 if gated else 1) * f), "linear_fc2": ("mlp", f, h)}
    if gated:
        shapes["gate_proj"] = ("mlp", h, f)
    return shapes


def estimate_adapter_params_per_layer(model_spec: ModelSpec, finetune: FinetuneSpec
                                      ) -> AdapterParams:
    """Adapter parameters of one decoder layer: r (in + out) per adapted linear, 0 without
    adapters. Worked number: Llama-3.1-8B, r 16, all seven PEFT linears:
    16 x (8192 + 5120 + 5120 + 8192 + 3 x 18432) = 16 x 81,920 = 1,310,720 a layer, x 32 layers
    = 41,943,040 (0.52% of 8.03e9). Pinned in tests to torchtune's tutorial count: Llama2-7B,
    q_proj and v_proj at r 8: 4,194,304 (docs/source/tutorials/lora_finetune.rst)."""
    if not finetune.has_adapters:
        return AdapterParams(0.0, 0.0)
    shapes = linear_shapes(model_spec)
    parts = {"attention": 0.0, "mlp": 0.0}
    for name in finetune.lora_targets:
        if name in shapes:
            block, d_in, d_out = shapes[name]
            parts[block] += finetune.lora_rank * (d_in + d_out)
    return AdapterParams(**parts)


def estimate_adapter_params(model_spec: ModelSpec, finetune: FinetuneSpec) -> float:
    """Adapter parameters of the model: every decoder layer's."""
    per_layer = estimate_adapter_params_per_layer(model_spec, finetune).total
    return model_spec.num_hidden_layers * per_layer


def estimate_num_adapted_linears(model_spec: ModelSpec, finetune: FinetuneSpec) -> int:
    """Adapted linears per decoder layer (each keeps a rank-r intermediate for backward)."""
    if not finetune.has_adapters:
        return 0
    shapes = linear_shapes(model_spec)
    return sum(1 for name in finetune.lora_targets if name in shapes)


def estimate_adapter_activation_bytes_per_token(model_spec: ModelSpec, finetune: FinetuneSpec
                                                ) -> float:
    """Bytes per token per layer the adapters keep for backward beyond the base layer: B's input,
    the rank-r output of A, in bf16 (2 r B per adapted linear). A's input is the base linear's
    input, the same tensor with dropout 0 (PEFT `lora_A(dropout(x))` with nn.Identity), which the
    layer's activations count already. Worked number: r 16, seven linears: 7 x 2 x 16 = 224 B."""
    return estimate_num_adapted_linears(model_spec, finetune) * BF16_BYTES * finetune.lora_rank


def estimate_base_weight_bytes_per_param(finetune: FinetuneSpec, param_bytes: float) -> float:
    """Bytes per weight of a decoder-layer linear of the frozen base: NF4 (0.5159 B) under
    qlora, the framework's param_bytes otherwise."""
    return estimate_nf4_bytes_per_param() if finetune.quantized_base else param_bytes


def estimate_dequantize_bytes_per_param(finetune: FinetuneSpec) -> float:
    """HBM bytes per weight one dequantization streams (read NF4, write bf16): 0.5159 + 2 =
    2.5159 B under qlora, 0 otherwise. Each pass over a GEMM pays it (forward, input gradient,
    and a recomputed forward)."""
    if not finetune.quantized_base:
        return 0.0
    return estimate_nf4_bytes_per_param() + BF16_BYTES


# Linears whose input is split over TP (Megatron RowParallelLinear): the adapter's A runs on
# the split input and B on the full output; the others (ColumnParallelLinear) run A on the
# whole input and B on their share of the outputs (Megatron-Bridge peft/utils.py
# ParallelLinearAdapter: linear_in row-parallel when input_is_parallel, linear_out
# column-parallel otherwise).
ROW_PARALLEL = ("o_proj", "down_proj", "linear_proj", "linear_fc2")


def estimate_adapter_gemm_s(model_spec: ModelSpec, gpu: GpuSpec, rows: np.ndarray,
                            tp: np.ndarray, finetune: FinetuneSpec, constants: ComputeConstants
                            ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(forward, backward) seconds per micro-batch of one layer's adapter GEMMs, by block
    ("attention", "mlp"): per adapted linear A (rows x in x r) and B (rows x r x out), split as
    ROW_PARALLEL says, in bf16 (adapters run in the compute dtype); backward their dgrad and
    wgrad (solver.cost.kernels.efficiency.estimate_gemm_backward_s). These GEMMs are thin (r
    columns): the lookup or the roofline's memory bound prices reading the input again.
    Worked number: Llama-3.1-8B, 8192 rows, r 16, q_proj on one H100's datasheet roofline:
    A reads 8192 x 4096 x 2 B = 67 MB, ~25 us at 80% of 3.35 TB/s."""
    zero = np.zeros(np.shape(rows), dtype=float)
    parts = {"attention": (zero, zero), "mlp": (zero, zero)}
    if not finetune.has_adapters:
        return parts
    shapes = linear_shapes(model_spec)
    r = finetune.lora_rank
    for name in finetune.lora_targets:
        if name not in shapes:
            continue
        block, d_in, d_out = shapes[name]
        split_in = name in ROW_PARALLEL
        a = (rows, d_in / tp if split_in else d_in + zero, r + zero)
        b = (rows, r + zero, d_out + zero if split_in else d_out / tp)
        forward = sum(estimate_gemm_s(gpu, "bf16", *shape, constants) for shape in (a, b))
        backward = sum(estimate_gemm_backward_s(gpu, "bf16", *shape, constants)
                       for shape in (a, b))
        parts[block] = (parts[block][0] + forward, parts[block][1] + backward)
    return parts


def estimate_dequantize_s(gpu: GpuSpec, gemm_params_per_gpu: np.ndarray | float,
                          finetune: FinetuneSpec, constants: ComputeConstants) -> np.ndarray:
    """Seconds of one pass's dequantization of the NF4 weights `gemm_params_per_gpu` (module
    docstring): 2.5159 B a weight streamed through HBM, 0 without an NF4 base. Worked number:
    a Llama-3.1-70B layer (856e6 weights in its linears) on an H100 at 80% of 3.35 TB/s:
    856e6 x 2.5159 / 2.68e12 = 0.80 ms a pass, against its forward GEMMs' ~3 ms at 8192
    tokens."""
    return estimate_streaming_s(gpu, gemm_params_per_gpu
                                * estimate_dequantize_bytes_per_param(finetune), constants)


# Frameworks that run no NF4 base, and why (the others, PyTorch with PEFT + bitsandbytes or
# torchtune, and DeepSpeed under Hugging Face's Trainer with bnb_4bit_quant_storage, do).
NO_QLORA = {
    "megatron": "Megatron-Bridge's PEFT has LoRA, DoRA and canonical LoRA over a bf16 or fp8 "
                "base, no 4-bit one (src/megatron/bridge/peft; models/README.md lists QLoRA "
                "under future enhancements)",
    "torchtitan": "torchtitan's LoRA (torchtitan/components/lora.py) adapts a bf16 base only",
}


def check_finetune_framework(framework: str, finetune: FinetuneSpec) -> None:
    """Refuse --finetune qlora under a framework without an NF4 base (NO_QLORA), in one line
    naming the frameworks that have one."""
    if finetune.quantized_base and framework in NO_QLORA:
        raise InputError(f"--finetune qlora with --framework {framework}: {NO_QLORA[framework]}; "
                         "use --framework generic (PEFT + bitsandbytes, torchtune) or deepspeed")
