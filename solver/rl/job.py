"""What an RL step is asked to do (RlJob) and which models run which passes (ALGORITHM_ROLES).

Roles, per algorithm (the passes each model runs every step):

    grpo   the actor generates, recomputes its log-probs (old policy) and trains; a reference
           model's log-probs give the KL loss (Shao et al. 2024, DeepSeekMath, arXiv
           2402.03300, eq. 3: GRPO "directly adds the KL divergence between the trained
           policy and the reference policy to the loss")
    dapo   as GRPO without the reference: DAPO removes the KL term (Yu et al. 2025, arXiv
           2503.14476, §2.3 "Removing KL Divergence")
    ppo    as GRPO (the KL penalty needs the reference), plus a critic that scores values
           (forward) and trains (Ouyang et al. 2022, arXiv 2203.02155, §3.5; verl's
           ppo_trainer.yaml critic section)

A reward model (--reward-model) adds a forward pass to any of them; without one the reward is
a rule (no GPU time). The reference, critic and reward models default to the policy's
architecture (verl initialises the reference and critic from the actor's checkpoint).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from solver.serve.workload import LengthDistribution
from solver.spec.strict import MAX_SEQ_LEN, InputSpec

Algorithm = Literal["grpo", "ppo", "dapo"]
ALGORITHMS = ("grpo", "ppo", "dapo")
# Forward-only roles and trained roles, by algorithm (module docstring); "reward" joins the
# forward roles when a reward model is given.
ALGORITHM_ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "grpo": (("actor", "reference"), ("actor",)),
    "dapo": (("actor",), ("actor",)),
    "ppo": (("actor", "reference", "critic"), ("actor", "critic")),
}
DEFAULT_SAMPLES_PER_PROMPT = {"grpo": 8, "dapo": 8, "ppo": 1}  # a group per prompt; PPO one
MAX_ASYNC_STEPS = 64


class RlJob(InputSpec):
    """One RL step: `prompts_per_step` prompts (verl's data.train_batch_size), each sampled
    `samples_per_prompt` times (actor_rollout_ref.rollout.n), prompt and response lengths,
    the longest response allowed (data.max_response_length), how many steps the rollout may
    run ahead of training (0: on-policy), and optimizer steps per rollout batch (the batch in
    that many mini-batches: train_batch_size / ppo_mini_batch_size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: Algorithm = "grpo"
    prompts_per_step: int = Field(gt=0, le=MAX_SEQ_LEN.most)
    samples_per_prompt: int = Field(gt=0, le=4096)
    prompt_lengths: LengthDistribution
    response_lengths: LengthDistribution
    max_response_len: int = Field(gt=0, le=MAX_SEQ_LEN.most)
    async_steps: int = Field(default=0, ge=0, le=MAX_ASYNC_STEPS)
    optimizer_steps_per_rollout: int = Field(default=1, gt=0, le=MAX_SEQ_LEN.most)
    reward_model: bool = False

    @model_validator(mode="after")
    def _check(self) -> RlJob:
        if self.response_lengths.maximum > self.max_response_len:
            raise ValueError(f"the longest response ({self.response_lengths.maximum:,} "
                             f"tokens) exceeds max_response_len ({self.max_response_len:,}): "
                             "responses stop there")
        if self.prompts_per_step % self.optimizer_steps_per_rollout:
            raise ValueError(f"optimizer_steps_per_rollout ({self.optimizer_steps_per_rollout})"
                             f" must divide prompts_per_step ({self.prompts_per_step}): a "
                             "mini-batch holds whole groups (verl counts it in prompts)")
        return self

    @property
    def num_samples(self) -> int:
        """Sequences generated and trained per step: prompts x samples per prompt."""
        return self.prompts_per_step * self.samples_per_prompt

    @property
    def mini_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.num_samples // self.optimizer_steps_per_rollout

    @property
    def max_sequence(self) -> int:
        """The longest sequence: longest prompt + max_response_len."""
        return self.prompt_lengths.maximum + self.max_response_len

    @property
    def mean_sequence(self) -> float:
        return self.prompt_lengths.mean + self.response_lengths.mean

    @property
    def forward_roles(self) -> tuple[str, ...]:
        roles = ALGORITHM_ROLES[self.algorithm][0]
        return roles + ("reward",) if self.reward_model else roles

    @property
    def trained_roles(self) -> tuple[str, ...]:
        return ALGORITHM_ROLES[self.algorithm][1]


class RlPins(InputSpec):
    """Choices of a plan fixed in advance (None: searched): the placement, the training
    pool's GPUs (split), the rollout engines' tp, the offload, and the training search's pins
    (solver.search.space.VARIABLES: tp, pp, cp, ep, micro_batch, recompute codes ...)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    placement: Literal["colocated", "split"] | None = None
    training_gpus: int | None = Field(default=None, gt=0)
    rollout_tp: int | None = Field(default=None, gt=0)
    offload: Literal["none", "states"] | None = None
    training: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    # The rollout engine's settings where the framework is not verl (None: verl's defaults,
    # solver.rl.rollout): vLLM's max_num_seqs and its share of each GPU's memory.
    rollout_max_num_seqs: int | None = Field(default=None, gt=0, le=MAX_SEQ_LEN.most)
    rollout_gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
