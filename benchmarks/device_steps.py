"""Repeated step-time and peak-memory measurements of a small Llama-like model on one GPU,
against parplan's predictions (issue 4: the within-sweep ordering needs sweeps measured more
than once, with every setting known; this makes one).

    .venv/bin/python benchmarks/device_steps.py [--device cuda] [--preset dgx-h200]
        [--micro-batches 1 2 4 8] [--recompute none full] [--seq-len 2048] [--repeats 3]
        [--steps 8] [--warmup 3] [--out benchmarks/data/device_steps.csv]

For every micro-batch size x recompute setting (one micro-batch per step: tp = pp = dp = 1),
`--repeats` fresh timings of `--steps` steps after `--warmup` steps; the median step time and
the peak of torch.cuda.max_memory_allocated are kept. Printed: one row per configuration
(measured median, its repeat spread, predicted, ratio; measured and predicted peak memory),
then the Spearman correlation of predicted vs measured step time across configurations and
the ceiling the repeats leave (the Spearman of each repeat against the others' median).

What the harness runs, and the settings the prediction takes from it (not fitted):
- the model: embedding, `--layers` pre-norm blocks (RMSNorm, grouped-query attention through
  torch's scaled_dot_product_attention with its FlashAttention backend on CUDA, SwiGLU MLP),
  final norm, untied LM head; "full" recompute checkpoints every block
  (torch.utils.checkpoint, non-reentrant).
- fp32 parameters, bf16 autocast, fused AdamW: 4 B parameters, 4 B gradients, 8 B Adam
  moments (MemoryOptions); no gradient buckets (no data parallelism), and no CUDA context,
  NCCL or fragmentation reserve, since max_memory_allocated counts tensors only.
- PyTorch's FlashAttention backend is FlashAttention-2 (Ampere's mma.sync): on Hopper it is an
  Ampere-era kernel (TimeConstants.native_attention_kernels off). No data parallelism, so no
  DP traffic.

torch is imported inside main(); `--device cpu` runs the same harness on a tiny model (a smoke
test: the predictions are for the GPU preset and mean nothing on a CPU).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from time_accuracy import spearman

from solver.catalog import load_cluster_spec
from solver.cost.candidates import Candidates
from solver.cost.memory import MemoryOptions, estimate_memory
from solver.cost.step.steptime import TimeConstants, estimate_step_time
from solver.spec import JobSpec, ModelSpec, ParallelConfig

RECOMPUTE = ("none", "full")
HARNESS_MEMORY = MemoryOptions(param_bytes=4.0, grad_bytes=4.0, optimizer_bytes=8.0,
                               comm_bucket_bytes=0.0, cuda_context_gib=0.0, nccl_gib=0.0,
                               fragmentation=0.0)
HARNESS_TIME = TimeConstants(native_attention_kernels=False)


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name=f"harness-h{self.hidden}-l{self.layers}", model_type="llama",
            hidden_size=self.hidden, intermediate_size=self.ffn, num_hidden_layers=self.layers,
            num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            vocab_size=self.vocab, tie_word_embeddings=False, max_position_embeddings=1 << 17,
            mlp_type="gated", norm_type="rmsnorm", position_embedding_type="rope")


# A Llama-3.2-1B-like width with fewer layers: fits one GPU with room for micro-batch 8.
GPU_SHAPE = Shape(hidden=2048, layers=8, heads=32, kv_heads=8, ffn=8192, vocab=32768)
CPU_SHAPE = Shape(hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, vocab=256)


@dataclass(frozen=True)
class Measured:
    micro_batch: int
    recompute: str
    step_s: tuple[float, ...]  # the median step of each repeat
    peak_bytes: int


def build_model(torch, shape: Shape, recompute: str):
    """The harness model (torch modules built here, so that torch stays an optional import)."""
    nn, functional = torch.nn, torch.nn.functional
    head_dim = shape.hidden // shape.heads

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1, self.norm2 = nn.RMSNorm(shape.hidden), nn.RMSNorm(shape.hidden)
            self.qkv = nn.Linear(shape.hidden, (shape.heads + 2 * shape.kv_heads) * head_dim,
                                 bias=False)
            self.out = nn.Linear(shape.heads * head_dim, shape.hidden, bias=False)
            self.gate_up = nn.Linear(shape.hidden, 2 * shape.ffn, bias=False)
            self.down = nn.Linear(shape.ffn, shape.hidden, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).split(
                [shape.heads * head_dim, shape.kv_heads * head_dim,
                 shape.kv_heads * head_dim], dim=-1)
            q = q.view(b, s, shape.heads, head_dim).transpose(1, 2)
            k = k.view(b, s, shape.kv_heads, head_dim).transpose(1, 2)
            v = v.view(b, s, shape.kv_heads, head_dim).transpose(1, 2)
            repeat = shape.heads // shape.kv_heads
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
            attn = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(attn.transpose(1, 2).reshape(b, s, -1))
            gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
            return x + self.down(functional.silu(gate) * up)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(shape.vocab, shape.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(shape.layers))
            self.norm = nn.RMSNorm(shape.hidden)
            self.head = nn.Linear(shape.hidden, shape.vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                if recompute == "full":
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(self.norm(x))

    return Model()


def measure(torch, shape: Shape, device: str, seq_len: int, micro_batch: int, recompute: str,
            repeats: int, steps: int, warmup: int) -> Measured:
    """Median step seconds of each repeat (a fresh model and optimizer each) and the peak."""
    medians: list[float] = []
    peak = 0
    cuda = device.startswith("cuda")
    for _ in range(repeats):
        torch.manual_seed(0)
        model = build_model(torch, shape, recompute).to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
        tokens = torch.randint(0, shape.vocab, (micro_batch, seq_len + 1), device=device)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        times = []
        for step in range(warmup + steps):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
                logits = model(tokens[:, :-1])
                loss = torch.nn.functional.cross_entropy(
                    logits.float().reshape(-1, shape.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize()
            if step >= warmup:
                times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
        if cuda:
            peak = max(peak, int(torch.cuda.max_memory_allocated()))
        del model, optimizer
    return Measured(micro_batch, recompute, tuple(medians), peak)


def predict(shape: Shape, preset: str, seq_len: int, configs: Sequence[tuple[int, str]]
            ) -> tuple[np.ndarray, np.ndarray]:
    """parplan's step seconds and peak bytes for (micro_batch, recompute) on one GPU."""
    model, cluster = shape.spec(), load_cluster_spec(preset)
    parallel = [ParallelConfig(tp=1, pp=1, dp=1, zero=0, micro_batch=mb, recompute=rc)
                for mb, rc in configs]
    step, memory = [], []
    for (mb, _), config in zip(configs, parallel):
        job = JobSpec(seq_len=seq_len, global_batch=mb, precision="bf16")
        c = Candidates.from_configs([config])
        step.append(float(estimate_step_time(model, cluster, job, c, HARNESS_TIME).step_s[0]))
        memory.append(float(estimate_memory(model, job, c, HARNESS_MEMORY).total[0]))
    return np.array(step), np.array(memory)


def repeat_ceiling(results: Sequence[Measured], tokens: Sequence[int]) -> float:
    """The median over repeats of the Spearman of one repeat against the median of the others
    (time per token): how well any prediction of the configuration alone can order these
    measurements."""
    repeats = min(len(r.step_s) for r in results)
    if repeats < 2:
        return float("nan")
    scores = []
    for i in range(repeats):
        one = [r.step_s[i] / n for r, n in zip(results, tokens)]
        rest = [statistics.median(r.step_s[:i] + r.step_s[i + 1:]) / n
                for r, n in zip(results, tokens)]
        scores.append(spearman(one, rest))
    return float(statistics.median(scores))


def write_csv(path: Path, results: Sequence[Measured], predicted_s: np.ndarray,
              predicted_bytes: np.ndarray, context: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*context, "micro_batch", "recompute", "repeat_step_s", "peak_bytes",
                         "predicted_step_s", "predicted_bytes"])
        for r, s, b in zip(results, predicted_s, predicted_bytes):
            writer.writerow([*context.values(), r.micro_batch, r.recompute,
                             " ".join(f"{x:.6f}" for x in r.step_s), r.peak_bytes,
                             f"{s:.6f}", f"{b:.0f}"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="dgx-h200", help="the cluster preset to predict for")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--recompute", nargs="+", choices=RECOMPUTE, default=list(RECOMPUTE))
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/data/device_steps.csv"))
    args = parser.parse_args(argv)

    import torch  # optional: parplan[calibrate]

    shape = GPU_SHAPE if args.device.startswith("cuda") else CPU_SHAPE
    configs = [(mb, rc) for rc in args.recompute for mb in args.micro_batches]
    results = []
    backend = None
    if args.device.startswith("cuda"):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
        backend.__enter__()
    try:
        for mb, rc in configs:
            results.append(measure(torch, shape, args.device, args.seq_len, mb, rc,
                                   args.repeats, args.steps, args.warmup))
    finally:
        if backend is not None:
            backend.__exit__(None, None, None)
    predicted_s, predicted_bytes = predict(shape, args.preset, args.seq_len, configs)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    context = {"device": name, "preset": args.preset, "torch": torch.__version__,
               "shape": f"{shape.hidden}x{shape.layers} heads {shape.heads}/{shape.kv_heads}",
               "seq_len": str(args.seq_len)}
    write_csv(args.out, results, predicted_s, predicted_bytes, context)

    print(f"{name}, torch {torch.__version__}, {context['shape']}, seq {args.seq_len}, "
          f"predicted for {args.preset}")
    print(f"{'mb':>3} {'recompute':>9} {'measured s':>11} {'spread':>7} {'predicted':>10} "
          f"{'pred/meas':>9} {'peak GB':>8} {'pred GB':>8}")
    medians = [statistics.median(r.step_s) for r in results]
    for r, m, s, b in zip(results, medians, predicted_s, predicted_bytes):
        spread = max(r.step_s) / min(r.step_s)
        print(f"{r.micro_batch:>3} {r.recompute:>9} {m:>11.4f} {spread:>7.3f} {s:>10.4f} "
              f"{s / m:>9.2f} {r.peak_bytes / 1e9:>8.2f} {b / 1e9:>8.2f}")
    # Order by time per token: configurations differ in tokens per step.
    tokens = [r.micro_batch * args.seq_len for r in results]
    per_token_measured = [m / n for m, n in zip(medians, tokens)]
    per_token_predicted = [s / n for s, n in zip(predicted_s, tokens)]
    print(f"Spearman of time per token, predicted vs measured: "
          f"{spearman(per_token_predicted, per_token_measured):+.2f} "
          f"(repeat ceiling {repeat_ceiling(results, tokens):+.2f}); written {args.out}")


if __name__ == "__main__":
    main()
