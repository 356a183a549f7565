"""What eager PyTorch ops save for backward, measured, against solver.cost.memory.eager.

    python benchmarks/eager_saved_bytes.py      (needs torch: parplan[calibrate]; CPU or CUDA)

Each row runs one eager block on a small bf16 input under torch.autograd.graph.
saved_tensors_hooks and sums the distinct storages autograd saves, leaving out the block's
input, its weights and shared buffers (the causal mask, RoPE's frequencies: one copy for every
token and layer). It prints bytes per token (per query-key pair for the attention core) beside
what the memory model counts eager and fused. Nothing here is fitted: the model's numbers come
from the frameworks' code (solver.cost.memory.eager), this script checks them on the PyTorch at
hand. On CPU, nn.RMSNorm runs the composite rms_norm (CUDA dispatches to _fused_rms_norm) and
dropout keeps a bf16 noise tensor (CUDA's native_dropout a 1-byte mask): those rows say so.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from solver.cost.memory.eager import (
    EAGER_SOFTMAX_BYTES,
    PROBABILITIES_BYTES,
    RMSNORM_FP32_COPY_EXTRA_BYTES,
    SILU_OUTPUT_BYTES,
)

HIDDEN, INTERMEDIATE, SEQ, BATCH, HEADS, HEAD_DIM = 512, 1792, 128, 2, 8, 64
TOKENS = SEQ * BATCH


def measure_saved_bytes(torch, block: Callable, *inputs, exclude=()) -> int:
    """Bytes of the distinct storages autograd saves while `block(*inputs)` runs, less those of
    `inputs` and `exclude`."""
    saved: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        block(*inputs)
    for tensor in (*inputs, *exclude):
        saved.pop(tensor.untyped_storage().data_ptr(), None)
    return sum(saved.values())


def measure_rows(torch) -> list[tuple[str, float, float, float]]:
    """(block, measured, model eager, model fused) bytes per token, or per query-key pair."""
    nn, functional = torch.nn, torch.nn.functional
    device = "cuda" if torch.cuda.is_available() else "cpu"
    bf16 = torch.bfloat16
    x = torch.randn(BATCH, SEQ, HIDDEN, device=device, dtype=bf16, requires_grad=True)
    weight = nn.Parameter(torch.ones(HIDDEN, device=device, dtype=bf16))

    def naive_rms_norm(t):  # torchtitan models/norms.py RMSNorm @9dec370
        u = t.float()
        return (u * torch.rsqrt(u.pow(2).mean(-1, keepdim=True) + 1e-6)).type_as(t) * weight

    rstd = 4.0  # one fp32 per token, fused or not
    fused_norm = 2.0 * HIDDEN + rstd
    rows = [("RMSNorm as x.float() ops", measure_saved_bytes(torch, naive_rms_norm, x,
                                                             exclude=(weight,)) / TOKENS,
             fused_norm + RMSNORM_FP32_COPY_EXTRA_BYTES * HIDDEN, fused_norm)]
    native = nn.RMSNorm(HIDDEN, device=device, dtype=bf16)
    rows.append((f"nn.RMSNorm ({device}: "
                 f"{'_fused_rms_norm' if device == 'cuda' else 'composite rms_norm'})",
                 measure_saved_bytes(torch, native, x, exclude=(native.weight,)) / TOKENS,
                 fused_norm, fused_norm))
    w1, w3 = (nn.Linear(HIDDEN, INTERMEDIATE, bias=False, device=device, dtype=bf16)
              for _ in range(2))
    w2 = nn.Linear(INTERMEDIATE, HIDDEN, bias=False, device=device, dtype=bf16)
    swiglu = measure_saved_bytes(torch, lambda t: w2(functional.silu(w1(t)) * w3(t)), x,
                                 exclude=(w1.weight, w2.weight, w3.weight))
    fused_swiglu = 2.0 * 2 * INTERMEDIATE + 2.0 * INTERMEDIATE  # fc1 output, fc2 input
    rows.append(("SwiGLU w2(silu(w1 x) * w3 x)", swiglu / TOKENS,
                 fused_swiglu + SILU_OUTPUT_BYTES * INTERMEDIATE, fused_swiglu))
    q = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, device=device, dtype=bf16, requires_grad=True)
    freqs = torch.polar(torch.ones(SEQ, HEAD_DIM // 2, device=device),
                        torch.randn(SEQ, HEAD_DIM // 2, device=device))

    def rope(t):  # torchtitan common/rope.py apply_rotary_emb (complex)
        c = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
        rotated = c * freqs.view(1, SEQ, 1, HEAD_DIM // 2)
        return torch.view_as_real(rotated).flatten(3).type_as(t)

    rows.append(("RoPE, complex multiply", measure_saved_bytes(torch, rope, q,
                                                               exclude=(freqs,)) / TOKENS,
                 0.0, 0.0))
    rows.extend(_attention_rows(torch, device))
    return rows


def _attention_rows(torch, device: str) -> list[tuple[str, float, float, float]]:
    """Megatron's forward_torch_softmax in fp32 (fused_softmax.py), without and with dropout."""
    bf16, functional = torch.bfloat16, torch.nn.functional
    q, k, v = (torch.randn(BATCH * HEADS, SEQ, HEAD_DIM, device=device, dtype=bf16,
                           requires_grad=True) for _ in range(3))
    mask = torch.triu(torch.ones(SEQ, SEQ, device=device, dtype=torch.bool), 1)
    rows = []
    for dropout in (False, True):
        def core(q, k, v, dropout=dropout):
            scores = torch.bmm(q, k.transpose(1, 2)) * HEAD_DIM ** -0.5
            probs = torch.softmax(scores.float().masked_fill(mask, -10000.0), dim=-1)
            probs = probs.bfloat16()
            if dropout:
                probs = functional.dropout(probs, 0.1)
            return torch.bmm(probs, v)

        pairs = BATCH * HEADS * SEQ * SEQ
        measured = measure_saved_bytes(torch, core, q, k, v, exclude=(mask,)) / pairs
        mask_bytes = 1.0 if device == "cuda" else 2.0  # CPU dropout keeps bf16 noise
        after = mask_bytes + PROBABILITIES_BYTES if dropout else PROBABILITIES_BYTES
        fused = 2.0 + (mask_bytes + 2.0 if dropout else 0.0)
        rows.append((f"unfused attention core, dropout {'on' if dropout else 'off'} "
                     "(per score)", measured, EAGER_SOFTMAX_BYTES + after, fused))
    return rows


def main() -> None:
    try:
        import torch
    except ImportError:
        sys.exit("eager_saved_bytes.py needs torch (pip install parplan[calibrate])")
    print(f"torch {torch.__version__}, {'cuda' if torch.cuda.is_available() else 'cpu'}, "
          f"h {HIDDEN}, F {INTERMEDIATE}, bf16; bytes per token (per score for attention)")
    print(f"{'block':58} {'measured':>9} {'eager':>9} {'fused':>9}")
    for name, measured, eager, fused in measure_rows(torch):
        print(f"{name:58} {measured:>9.1f} {eager:>9.1f} {fused:>9.1f}")


if __name__ == "__main__":
    main()
