"""The logits and the loss: what the last stage holds while its loss runs, by how the framework
computes the cross-entropy (MemoryOptions.loss_implementation, solver.spec.framework.
LossImplementation; the profile's choice in solver.cost.step.frameworks).

The peak comes at the turn from the last stage's forward to its backward, when every
activation of the micro-batch is still held: the loss's saved tensors and its gradients, then
the LM head's backward, whose first product is the gradient of the head's input (s*b/cp x h,
bf16) beside the bf16 gradient of the logits. Per GPU the logits are T = s*b/cp tokens by
W = V/tp vocabulary entries (Megatron's vocab-parallel LM head), once per output head (the
main head plus each MTP depth):

  eager         T*W*logits_bytes: the framework's unfused loss (Megatron's vocab-parallel
                cross-entropy 6 B, torchtitan's F.cross_entropy 12 B: MemoryOptions)
  compiled      T*W*COMPILED_LOSS_LOGITS_BYTES (4: the bf16 logits saved, the bf16 gradient;
                8 where the model hands the loss fp32 logits, MemoryOptions.
                logits_fp32_from_model)
  chunked       T*W*(4 + 8/CHUNKED_LOSS_NUM_CHUNKS): each chunk's fp32 log-softmax saved,
                one chunk's two fp32 gradients at a time; T*W*(2 + 2/8) with each chunk's
                cross-entropy compiled (MemoryOptions.loss_chunks_compiled)
  fused         T*W*2: the gradient written into the bf16 logits in place
  fused_linear  rows*W*2 + T*h*2: one chunk of `rows` logits and the head's input gradient;
                the full logits never exist
and every implementation but fused_linear at least T*W*2 + T*h*2 (the head's backward).
The LM head's weight gradient is the parameter gradient the grads item counts, in every
implementation; Liger computes it during its forward (not added here [B]). The per-token
fp32 losses (T*4 B, Liger's loss_1d) every implementation keeps are left out, as before.

The step time does not depend on it (TimeConstants.loss_implementation says why).
"""

from __future__ import annotations

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory.options import MemoryOptions
from solver.spec import JobSpec, ModelSpec

BF16_BYTES = 2.0
FP32_BYTES = 4.0

# torch.compile'd loss (torchtitan [compile] components "loss": components/loss.py
# build_cross_entropy_loss wraps cross_entropy_loss, F.cross_entropy(pred.float(), labels), in
# torch.compile, v0.2.2): Inductor fuses the upcast, the log-softmax and the NLL into
# reductions, so neither the fp32 copy nor the log-softmax is materialised; AOTAutograd's
# min-cut partitioner (torch/_functorch/partitioners.py min_cut_rematerialization_partition)
# saves the cheapest tensors, the bf16 logits and each row's log-sum-exp, and the backward's
# fused kernel recomputes the softmax and writes the bf16 gradient: 2 + 2 B per logit [B:
# read from the partitioner's rule, not measured here]. The same bytes as flash-attn's fused
# CrossEntropyLoss without inplace_backward (benchmarks/known_to_run.py
# LLM_FOUNDRY_LOGITS_BYTES). torchtitan#1033 (2025-03-31) measured the compiled loss below the
# eager chunked one: "compiled saved more memory than chunked loss ever could".
COMPILED_LOSS_LOGITS_BYTES = BF16_BYTES + BF16_BYTES

# Chunked cross-entropy, 8 chunks: torchtune CEWithChunkedOutputLoss (modules/loss/
# ce_chunked_output_loss.py, num_output_chunks = 8: "saves memory by only upcasting one chunk
# at a time") and torchtitan's chunked_cross_entropy_loss (components/loss.py @e23bb707,
# #996, num_output_chunks = 8), each chunk's F.cross_entropy(chunk.float()) run eagerly.
CHUNKED_LOSS_NUM_CHUNKS = 8
# Per logit: every chunk's log_softmax keeps its fp32 output for the backward (4 B over all
# chunks once the forward is done); the backward of one chunk adds its fp32 NLL gradient and
# log-softmax gradient (8 B over a chunk); the bf16 logits are freed (torchtitan `del pred`,
# train.py @e23bb707; the upcast saves nothing). 4 + 8/8 = 5 B.
CHUNKED_LOSS_SAVED_BYTES = FP32_BYTES
CHUNKED_LOSS_CHUNK_BYTES = 2 * FP32_BYTES
# The same chunks with each chunk's upcast and cross-entropy compiled (torchtune compile_loss:
# `loss.compute_cross_entropy = torch.compile(loss.compute_cross_entropy)` for
# CEWithChunkedOutputLoss, training/_compile.py @1814feb; the chunking itself stays eager):
# as the compiled loss above, each chunk keeps its bf16 logits (2 B per logit over all chunks)
# and one chunk's backward writes its bf16 gradient (2 B over a chunk). 2 + 2/8 = 2.25 B.
COMPILED_CHUNK_SAVED_BYTES = BF16_BYTES
COMPILED_CHUNK_GRAD_BYTES = BF16_BYTES

# A fused cross-entropy kernel that writes the logits' gradient into the logits in place:
# Transformer Engine's parallel_cross_entropy (Megatron --cross-entropy-loss-fusion
# --cross-entropy-fusion-impl te; transformer_engine/pytorch/triton/cross_entropy.py
# cross_entropy_backward_kernel, "performed in-place on the tensor pointed by X_ptr") and
# Liger's LigerCrossEntropyLoss (liger_kernel/ops/cross_entropy.py, the gradient stored into
# X_ptr during the forward): the bf16 logits only.
FUSED_LOSS_LOGITS_BYTES = BF16_BYTES


def estimate_liger_chunk_rows(tokens: np.ndarray, hidden_size: int, vocab_entries: np.ndarray
                              ) -> np.ndarray:
    """Rows of the logits chunk Liger's fused linear cross-entropy materialises: it keeps the
    chunk near the size of the hidden input, inc_factor = ceil(V/H), chunk_size =
    next_power_of_2(ceil(BT / inc_factor)), at most BT (liger_kernel/ops/
    fused_linear_cross_entropy.py fused_linear_cross_entropy_forward).

    Worked number: Llama-3.1-8B, 8192 tokens, V = 128,256, H = 4096: inc_factor 32, chunk 256."""
    tokens = np.asarray(tokens, dtype=float)
    inc_factor = np.ceil(np.asarray(vocab_entries, dtype=float) / hidden_size)
    chunk = 2.0 ** np.ceil(np.log2(np.maximum(np.ceil(tokens / inc_factor), 1.0)))
    return np.minimum(chunk, tokens)


def estimate_compiled_loss_bytes_per_logit(options: MemoryOptions) -> float:
    """Bytes per logit of the compiled loss: the logits it is given, saved, and their gradient
    in the same dtype, 2 x the input's bytes: bf16 logits 2 + 2 = 4 (COMPILED_LOSS_LOGITS_BYTES),
    or fp32 ones 4 + 4 = 8 where the model upcasts them before the loss
    (MemoryOptions.logits_fp32_from_model: torchtune's `self.output(h).float()`). The bf16
    gradient ToCopyBackward then makes (2 B) comes after the fp32 input is freed."""
    return 2.0 * (FP32_BYTES if options.logits_fp32_from_model else BF16_BYTES)


def estimate_chunked_loss_bytes_per_logit(options: MemoryOptions) -> float:
    """Bytes per logit of the chunked loss, CHUNKED_LOSS_NUM_CHUNKS chunks: what every chunk
    keeps for the backward plus one chunk's backward working set,

        eager chunks     4 + 8/8 = 5 B   (fp32 log-softmax kept; fp32 NLL and log-softmax grads)
        compiled chunks  2 + 2/8 = 2.25 B (bf16 chunk kept; its bf16 gradient written)
    compiled where MemoryOptions.loss_chunks_compiled (torchtune compile_loss)."""
    if options.loss_chunks_compiled:
        return COMPILED_CHUNK_SAVED_BYTES + COMPILED_CHUNK_GRAD_BYTES / CHUNKED_LOSS_NUM_CHUNKS
    return CHUNKED_LOSS_SAVED_BYTES + CHUNKED_LOSS_CHUNK_BYTES / CHUNKED_LOSS_NUM_CHUNKS


def estimate_logits_bytes(model_spec: ModelSpec, job: JobSpec, candidates: Candidates,
                          options: MemoryOptions) -> np.ndarray:
    """Logits and cross-entropy buffers held by the last stage at its peak, by
    options.loss_implementation (module docstring: the formula of each), once per output head.

    Worked numbers, Llama-3.1-8B (h 4096, V 128,256), s = 8192, b = 1, tp = 1: 1.05e9 logits;
    eager 12 B (torchtitan) 12.6 GB, eager 6 B (Megatron) 6.3 GB, compiled 4.2 GB, chunked
    5.3 GB, fused 2.1 GB + 0.07 GB of head input gradient = 2.17 GB, fused_linear
    256 x 128,256 x 2 + 8192 x 4096 x 2 = 0.133 GB."""
    heads = 1 + (model_spec.mtp_depths if options.include_mtp else 0)
    tokens = job.seq_len * candidates.micro_batch / candidates.cp
    width = model_spec.vocab_size / candidates.tp
    logits = tokens * width
    head_input_grad = tokens * model_spec.hidden_size * BF16_BYTES
    implementation = options.loss_implementation
    if implementation == "fused_linear":
        rows = estimate_liger_chunk_rows(tokens, model_spec.hidden_size, width)
        return heads * (rows * width * BF16_BYTES + head_input_grad)
    per_logit = {
        "eager": options.logits_bytes,
        "compiled": estimate_compiled_loss_bytes_per_logit(options),
        "chunked": estimate_chunked_loss_bytes_per_logit(options),
        "fused": FUSED_LOSS_LOGITS_BYTES,
    }[implementation]
    head_backward = logits * BF16_BYTES + head_input_grad
    return heads * np.maximum(logits * per_logit, head_backward)
