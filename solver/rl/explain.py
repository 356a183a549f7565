"""Why the best RL plan wins, in optimize's style: one sentence per reason, with the numbers
the table shows (the step by phase, the other placement's best, the rollout's tail, the
memory each phase leaves, what off-policy steps buy)."""

from __future__ import annotations

from collections.abc import Sequence

from solver.rl.result import RlPlan, RlResult

PHASE_LABELS = {"generation": "generation", "log_probs": "log-probs", "training": "training",
                "weight_sync": "weight sync", "host_swap": "host swaps"}


def describe_placement(plan: RlPlan) -> str:
    """"colocated on 64 GPUs" or "split: 16 training + 48 rollout GPUs"."""
    if plan.placement == "colocated":
        return f"colocated on {plan.training_gpus} GPUs"
    return f"split: {plan.training_gpus} training + {plan.rollout_gpus} rollout GPUs"


def describe_training(plan: RlPlan) -> str:
    c = plan.training.config
    text = f"tp {c.tp} pp {c.pp} dp {c.dp}"
    if c.ep > 1:
        text += f" ep {c.ep}"
    if c.cp > 1:
        text += f" cp {c.cp}"
    return text + f" zero {c.zero} mb {c.micro_batch} recompute {c.recompute}"


def format_seconds(seconds: float) -> str:
    """"12.3 s", or "0.04 s" below a second."""
    return f"{seconds:.1f} s" if seconds >= 1.0 else f"{seconds:.2f} s"


def _phases(plan: RlPlan) -> str:
    return ", ".join(f"{PHASE_LABELS[name]} {format_seconds(seconds)}"
                     for name, seconds in plan.phases.items() if seconds > 0.0)


def explain_rl(result: RlResult, ranked: Sequence[RlPlan]) -> tuple[str, ...]:
    """The reasons, best plan first (`ranked`: every plan found, best first)."""
    best = ranked[0]
    job = result.job
    why = [f"Best: {describe_placement(best)}, rollout {best.rollout_layout}, training "
           f"{describe_training(best)}: {best.step_seconds:.1f} s per step "
           f"({_phases(best)})."]
    other = next((p for p in ranked if p.placement != best.placement), None)
    if other is None:
        reason = result.unplaced.get("colocated") if best.placement == "split" else \
            "; ".join(f"{k}: {v}" for k, v in result.unplaced.items())
        why.append(f"No {'colocated' if best.placement == 'split' else 'split'} plan fits"
                   + (f" ({reason})." if reason else "."))
    else:
        gap = other.step_seconds / best.step_seconds - 1.0
        moved = max(best.phases, key=lambda n: abs(other.phases[n] - best.phases[n]))
        why.append(f"The best {other.placement} plan ({describe_placement(other)}) takes "
                   f"{other.step_seconds:.1f} s (+{100 * gap:.0f}%): its {PHASE_LABELS[moved]}"
                   f" is {format_seconds(other.phases[moved])} against "
                   f"{format_seconds(best.phases[moved])}.")
    parts = best.generation_parts
    generation = best.phases["generation"]
    if generation > 0:
        why.append(f"Generation: {best.seqs_per_rank} sequences per engine, {best.rollout_slots}"
                   f" at once; prefill {parts['prefill']:.1f} s, waiting prompts "
                   f"{parts['queued']:.1f} s, and decoding to the end {parts['tail']:.1f} s "
                   f"({100 * parts['tail'] / generation:.0f}%) as the batch shrinks to the "
                   f"longest of {job.num_samples:,} responses (response lengths "
                   f"{job.response_lengths.describe()}, at most {job.max_response_len:,}).")
    if best.placement == "split":
        why.append(f"Idle per step: the rollout pool {best.rollout_idle_seconds:.1f} s, the "
                   f"training pool {best.training_idle_seconds:.1f} s"
                   + (f"; off-policy by {job.async_steps} step(s), generation overlaps "
                      "training" if job.async_steps else
                      "; --async-steps 1 would overlap generation with training") + ".")
    elif job.async_steps:
        why.append("Off-policy steps overlap nothing when colocated: the same GPUs generate "
                   "and train.")
    usable = result.cluster.usable_memory_bytes / 1e9
    why.append("Memory per GPU, every phase within the usable " f"{usable:.1f} GB: "
               + ", ".join(f"{PHASE_LABELS[k]} {v:.1f} GB" for k, v in best.memory_gb.items())
               + (f"; vLLM takes {best.rollout_gpu_memory_utilization:.2f} of it"
                  if best.placement == "colocated" else "") + ".")
    if best.offload == "states":
        kept = next((p for p in ranked if p.placement == best.placement
                     and p.training_gpus == best.training_gpus and p.offload == "none"), None)
        because = ("with every role's states kept on the GPUs no plan of this placement fits"
                   if kept is None else
                   f"keeping them (best {kept.step_seconds:.1f} s) leaves vLLM "
                   f"{kept.rollout_slots} slots an engine against {best.rollout_slots}")
        why.append(f"The training states go to the host while they are not used: "
                   f"{format_seconds(best.phases['host_swap'])} of copies a step; {because}.")
    if job.async_steps > 1:
        why.append(f"--async-steps {job.async_steps}: deeper than 1 step buffers rollouts but "
                   "overlaps no more (the same step as 1).")
    return tuple(why)
