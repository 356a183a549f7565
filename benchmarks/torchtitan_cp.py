"""Context parallelism under torchtitan against its published CP sweeps: predicted and measured
tokens/s per GPU, and the "cp" part of the step (solver.cost.comm.ring_attention).

    .venv/bin/python benchmarks/torchtitan_cp.py

Rows: torchtitan's 2024-12 H100 benchmarks (benchmarks/llama3_h100_202412_torchtitan.md,
pytorch/torchtitan@b5bcd76; runs at torchtitan 9dec370, Grand Teton H100 96 GB at 500 W),
Table 2 (Llama 3.1 8B, 8 GPUs, FSDP x CP = 8, local batch 1, full AC, torch.compile + Float8)
and Table 6 (Llama 3.1 405B, 512 GPUs, TP 8, PP 8 1F1B, FSDP x CP = 8, local batch 8 as 8
micro-batches of 1, full AC, torch.compile + Float8 + AsyncTP); the sequence doubles with CP
(32,768 tokens per CP rank). Settings from the source commit: under CP torchtitan ran SDPA
with [FLASH_ATTENTION, EFFICIENT_ATTENTION] only (torchtitan/utils.py get_train_context,
"TODO: support cuDNN backend"): FlashAttention-2 on Hopper (--attention-kernel flash2); the
rotate method defaulted to "allgather" (config_manager.py
experimental.context_parallel_rotate_method); torch.compile fuses the element-wise ops. Each
row is also given under the native kernel, today's torchtitan default (cuDNN attention since
v0.2.0). Nothing is fitted to these rows.
"""

from __future__ import annotations

from solver.api import estimate
from solver.spec.features import FrameworkFeatures

# (model, cp, measured TPS/GPU): Table 2 (8B) and Table 6 (405B).
ROWS = (("llama3.1-8b", 1, 3890), ("llama3.1-8b", 2, 2540), ("llama3.1-8b", 4, 1071),
        ("llama3.1-8b", 8, 548), ("llama3.1-405b", 1, 76), ("llama3.1-405b", 2, 47),
        ("llama3.1-405b", 4, 31), ("llama3.1-405b", 8, 16))
TOKENS_PER_CP_RANK = 32768


def predict(model: str, cp: int, kernel: str) -> tuple[float, float, float]:
    """(tokens/s per GPU, step seconds, cp seconds) of one row under `kernel`."""
    dp = 8 // cp
    big = model == "llama3.1-405b"
    features = FrameworkFeatures(attention_kernel=kernel, fused_elementwise=True,
                                 tp_comm_overlap=big)
    degrees = dict(tp=8, pp=8) if big else {}
    plan = estimate(model, "grand-teton-h100", 512 if big else 8,
                    seq_len=TOKENS_PER_CP_RANK * cp, global_batch=8 * dp if big else dp,
                    precision="fp8", framework="torchtitan", features=features, cp=cp,
                    zero=3, micro_batch=1, recompute="full", **degrees).plan
    return (plan.time.tokens_per_second_per_gpu, plan.time.step_seconds,
            plan.time.time_seconds["cp"])


def main() -> None:
    print(f"{'model':15s} {'cp':>3s} {'meas':>6s}   {'flash2':>8s} {'ratio':>5s} {'cp s':>6s}"
          f"   {'native':>8s} {'ratio':>5s}")
    for model, cp, measured in ROWS:
        fa2, _, fa2_cp = predict(model, cp, "flash2")
        native, _, _ = predict(model, cp, "native")
        print(f"{model:15s} {cp:3d} {measured:6d}   {fa2:8.1f} {fa2 / measured:5.2f} "
              f"{fa2_cp:6.2f}   {native:8.1f} {native / measured:5.2f}")


if __name__ == "__main__":
    main()
