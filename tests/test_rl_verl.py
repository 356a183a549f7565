"""verl's launch settings for RL plans: every key `solver.rl.verl` writes is one verl's own
config has (tests/data/verl: verl commit b178a3cd, the flattened ppo_megatron_trainer config
and the one-step-off-policy config of the split placement); a misspelled key is caught."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from solver.rl.job import RlJob
from solver.rl.search import plan_rl
from solver.rl.verl import build_verl_overrides, render_verl_command
from solver.serve.workload import LengthDistribution

VERL = Path(__file__).parent / "data" / "verl"
VERSIONS = (VERL, VERL / "0.9.1")  # verl b178a3cd (git) and 0.9.1 (PyPI)


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


def schema_keys(split: bool, folder: Path = VERL) -> set[str]:
    keys = load_yaml_keys(folder / "_generated_ppo_megatron_trainer.yaml")
    if split:
        keys |= load_yaml_keys(folder / "one_step_off_ppo_megatron_trainer.yaml")
    return keys


def check_overrides(keys: list[str], split: bool) -> list[str]:
    """The keys one of the verl versions' config does not have (Hydra refuses them without a
    `+`)."""
    known = set.intersection(*(schema_keys(split, folder) for folder in VERSIONS))
    return [key for key in keys if key not in known]


def test_the_schema_reader_reads_verls_keys() -> None:
    keys = schema_keys(split=True)
    assert "actor_rollout_ref.rollout.tensor_model_parallel_size" in keys
    assert "actor_rollout_ref.rollout.n" in keys
    assert "actor_rollout_ref.actor.megatron.override_transformer_config.recompute_method" in keys
    assert "rollout.n_gpus_per_node" in keys
    assert "rollout.n_gpus_per_node" not in schema_keys(split=False)


def test_keys_verl_renamed_between_versions_are_caught() -> None:
    """verl 0.9.1 dropped actor.megatron.grad_offload, which b178a3cd had."""
    key = "actor_rollout_ref.actor.megatron.grad_offload"
    assert key in schema_keys(False) and key not in schema_keys(False, VERL / "0.9.1")
    assert check_overrides([key], split=False) == [key]


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


def test_verl_itself_composes_the_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's own Hydra config (installed with `pip install --no-deps verl==0.9.1 hydra-core
    omegaconf antlr4-python3-runtime==4.9.3 packaging pyyaml`: nothing of torch or vLLM is
    imported) composes every plan's overrides and refuses a misspelt key. Skips where verl or
    Hydra is not installed."""
    # .ci/run installs verl in a folder of its own (its wheel ships a top-level `tests`).
    if os.environ.get("PARPLAN_VERL"):
        monkeypatch.syspath_prepend(os.environ["PARPLAN_VERL"])
    if importlib.util.find_spec("hydra") is None or importlib.util.find_spec("verl") is None:
        reason = "verl or Hydra is not installed: pip install --no-deps verl==0.9.1 hydra-core"
        if os.environ.get("PARPLAN_REQUIRE_FRAMEWORKS") == "1":  # .ci/run installs them
            pytest.fail(reason)
        pytest.skip(reason)
    import hydra

    spec = importlib.util.find_spec("verl")
    assert spec is not None and spec.submodule_search_locations
    package = Path(spec.submodule_search_locations[0])
    monkeypatch.chdir(package.parent)  # the one-step-off config's searchpath is relative
    job = RlJob(algorithm="ppo", prompts_per_step=64, samples_per_prompt=4,
                prompt_lengths=LengthDistribution.fixed(256),
                response_lengths=LengthDistribution(kind="uniform", low=64, high=1024),
                max_response_len=1024, optimizer_steps_per_rollout=2)
    result = plan_rl("qwen3-30b-a3b", "dgx-h100", 16, job, top=100)
    for placement in ("colocated", "split"):
        plan = next(p for p in result.plans if p.placement == placement)
        folder, name = (("experimental/one_step_off_policy/config",
                         "one_step_off_ppo_megatron_trainer") if placement == "split"
                        else ("trainer/config", "ppo_megatron_trainer"))
        overrides = [f"{k}={v}" for k, v in build_verl_overrides(result, plan)]
        for extra, accepted in (([], True),
                                (["actor_rollout_ref.rollout.tensor_parallel_size=2"], False)):
            with hydra.initialize_config_dir(config_dir=str(package / folder),
                                             version_base=None):
                try:
                    config = hydra.compose(config_name=name, overrides=overrides + extra)
                except Exception as exc:  # noqa: BLE001  (Hydra's composition errors)
                    assert not accepted, f"{placement}: {exc}"
                    continue
            assert accepted, f"{placement}: the misspelt key was accepted"
            assert config.actor_rollout_ref.rollout.tensor_model_parallel_size == \
                plan.rollout["tp"]
