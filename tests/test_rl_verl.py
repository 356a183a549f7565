"""verl's launch settings for RL plans: every key `solver.rl.verl` writes is one verl's own
config has (tests/data/verl: verl commit b178a3cd, the flattened ppo_megatron_trainer config
and the one-step-off-policy config of the split placement); a misspelled key is caught."""

from __future__ import annotations

from pathlib import Path

import pytest

from solver.rl.job import RlJob
from solver.rl.search import plan_rl
from solver.rl.verl import build_verl_overrides, render_verl_command
from solver.serve.workload import LengthDistribution

VERL = Path(__file__).parent / "data" / "verl"


def load_yaml_keys(path: Path) -> set[str]:
    """The dotted keys of a block-style YAML file (verl's generated config: mappings by
    indentation, lists as `- item` lines, quoted keys such as 'n')."""
    keys: set[str] = set()
    stack: list[tuple[int, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.split(" #", 1)[0].rstrip()
        stripped = text.lstrip()
        if not stripped or stripped.startswith(("#", "- ")) or ":" not in stripped:
            continue
        indent = len(text) - len(stripped)
        name = stripped.split(":", 1)[0].strip().strip("'\"")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, name))
        keys.add(".".join(part for _, part in stack))
    return keys


def schema_keys(split: bool) -> set[str]:
    keys = load_yaml_keys(VERL / "_generated_ppo_megatron_trainer.yaml")
    if split:
        keys |= load_yaml_keys(VERL / "one_step_off_ppo_megatron_trainer.yaml")
    return keys


def check_overrides(keys: list[str], split: bool) -> list[str]:
    """The keys verl's config does not have (Hydra refuses them without a `+`)."""
    known = schema_keys(split)
    return [key for key in keys if key not in known]


def test_the_schema_reader_reads_verls_keys() -> None:
    keys = schema_keys(split=True)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" in keys
    assert "actor_rollout_ref.rollout.n" in keys
    assert "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method" in keys
    assert "rollout.n_gpus_per_node" in keys
    assert "rollout.n_gpus_per_node" not in schema_keys(split=False)


def test_a_broken_override_is_rejected() -> None:
    """The deliberately broken file: a misspelt key (vLLM's own flag name, not verl's)."""
    broken = ["actor_rollout_ref.rollout.tensor_parallel_size", "trainer.n_gpus_per_node"]
    assert check_overrides(broken, split=False) == ["actor_rollout_ref.rollout.tensor_parallel_size"]


@pytest.mark.parametrize("algorithm, model, gpus", [("grpo", "llama3.1-8b", 16),
                                                    ("ppo", "llama3.1-8b", 16),
                                                    ("dapo", "qwen3-30b-a3b", 16)])
def test_every_emitted_key_is_in_verls_config(algorithm: str, model: str, gpus: int) -> None:
    job = RlJob(algorithm=algorithm, prompts_per_step=64, samples_per_prompt=4,
                prompt_lengths=LengthDistribution.fixed(256),
                response_lengths=LengthDistribution(kind="uniform", low=64, high=1024),
                max_response_len=1024, optimizer_steps_per_rollout=2)
    result = plan_rl(model, "dgx-h100", gpus, job, top=100)
    for placement in ("colocated", "split"):
        plan = next(p for p in result.plans if p.placement == placement)
        overrides = dict(build_verl_overrides(result, plan))
        assert check_overrides(list(overrides), split=placement == "split") == []
        assert overrides["data.train_batch_size"] == 64
        assert overrides["actor_rollout_ref.rollout.n"] == 4
        assert overrides["actor_rollout_ref.actor.ppo_mini_batch_size"] == 32
        assert overrides["actor_rollout_ref.rollout.tensor_model_parallel_size"] == \
            plan.rollout["tp"]
        assert overrides["trainer.nnodes"] * overrides["trainer.n_gpus_per_node"] == \
            plan.training_gpus
        assert overrides["actor_rollout_ref.actor.use_kl_loss"] is (algorithm == "grpo")
        if placement == "split":
            assert overrides["rollout.nnodes"] * overrides["rollout.n_gpus_per_node"] == \
                plan.rollout_gpus
        command = render_verl_command(result, plan)
        assert command.startswith("python3 -m verl.")
