"""`launch --format megatron-bridge`: Megatron-Bridge recipe overrides for a plan.

The target is Megatron-Bridge 0.3 (VERSION): its scripts/training/run_recipe.py (v0.3.1) loads a
recipe (`--recipe NAME`, a function of megatron.bridge.recipes returning a ConfigContainer) and
applies Hydra overrides `section.field=value` with
training/utils/omegaconf_utils.py process_config_with_overrides, in struct mode, so a key the
ConfigContainer lacks is an error. `launch --validate` runs that function and
ConfigContainer.validate() (solver.emit.check_bridge).

The overrides are the Megatron-LM flags of the same plan (solver.emit.megatron) in Bridge's
names: a model flag is the TransformerConfig field `model.<flag>` (Bridge's model providers are
TransformerConfig dataclasses); the others are mapped in FLAG_KEYS. Every setting the plan
relies on is written out, also where it is the Megatron default (EXPLICIT), since the recipe
carries its own values. What an override cannot set: the activation function (a callable, which
process_config_with_overrides restores from the recipe) and the provider class (MLA or not), so
the recipe is the model's own where Bridge 0.3.1 has one (RECIPES), else one of the same
activation and attention.
"""

from __future__ import annotations

import re
import shlex

from solver.emit.megatron import build_megatron_args
from solver.errors import InputError
from solver.spec.finetune import MEGATRON_TARGETS
from solver.emit.nodes import render_torchrun_prefix
from solver.emit.target import Emitted, LaunchTarget

VERSION = "0.3"
SCRIPT = "scripts/training/run_recipe.py"
# Bridge 0.3.1's pretraining recipes for the zoo's models (megatron/bridge/recipes/*/*.py).
RECIPES = {
    "llama2-7b": "llama2_7b_pretrain_config",
    "llama3.1-8b": "llama31_8b_pretrain_config",
    "llama3.1-70b": "llama31_70b_pretrain_config",
    "llama3.1-405b": "llama31_405b_pretrain_config",
    "llama3.2-1b": "llama32_1b_pretrain_config",
    "llama3.2-3b": "llama32_3b_pretrain_config",
    "qwen2.5-7b": "qwen25_7b_pretrain_config",
    "qwen2.5-14b": "qwen25_14b_pretrain_config",
    "qwen2.5-32b": "qwen25_32b_pretrain_config",
    "qwen2.5-72b": "qwen25_72b_pretrain_config",
    "qwen3-8b": "qwen3_8b_pretrain_config",
    "qwen3-32b": "qwen3_32b_pretrain_config",
    "qwen3-30b-a3b": "qwen3_30b_a3b_pretrain_config",
    "qwen3-235b-a22b": "qwen3_235b_a22b_pretrain_config",
    "gemma2-9b": "gemma2_9b_pretrain_config",
    "gemma2-27b": "gemma2_27b_pretrain_config",
    "deepseek-v2-lite": "deepseek_v2_lite_pretrain_config",
    "deepseek-v2": "deepseek_v2_pretrain_config",
    "deepseek-v3": "deepseek_v3_pretrain_config",
    "gpt3-175b": "gpt3_175b_pretrain_config",
    "gpt-oss-20b": "gpt_oss_20b_pretrain_config",
    "gpt-oss-120b": "gpt_oss_120b_pretrain_config",
    "glm-4.5": "glm45_355b_pretrain_config",
    "nemotron-h-8b": "nemotronh_8b_pretrain_config",
    "nemotron-h-47b": "nemotronh_47b_pretrain_config",
    "nemotron-h-56b": "nemotronh_56b_pretrain_config",
    "nemotron-nano-9b-v2": "nemotron_nano_9b_v2_pretrain_config",
    "nemotron-3-nano-30b-a3b": "nemotron_3_nano_pretrain_config",
}
# Without its own recipe: one whose provider has the model's attention and activation and
# plain RoPE (MLA: DeepSeek-V3's; a gated MoE: Qwen3-30B-A3B's SwiGLU experts; a gated dense
# MLP: Llama 2's SwiGLU, RoPE base 10000 without Llama 3.1's scaling; else GPT-3's GeLU); a
# Mamba hybrid: Nemotron-H 8B's MambaModelProvider.
FALLBACK_RECIPES = {"hybrid": "nemotronh_8b_pretrain_config",
                    "mla": "deepseek_v3_pretrain_config",
                    "gated-moe": "qwen3_30b_a3b_pretrain_config",
                    "gated": "llama2_7b_pretrain_config", "plain": "gpt3_175b_pretrain_config"}
# The precision recipes (solver.cost.kernels.precision) as Bridge's mixed-precision presets
# (training/mixed_precision.py: bf16_mixed, bf16_with_fp8_delayed_scaling_mixed, ...), which
# set what Megatron's --bf16 / --fp8-* / --fp4-* flags set.
MIXED_PRECISION = {"bf16": "bf16_mixed", "fp8": "bf16_with_fp8_delayed_scaling_mixed",
                   "fp8-blockwise": "bf16_with_fp8_subchannel_scaling_mixed",
                   "mxfp8": "bf16_with_mxfp8_mixed", "nvfp4": "bf16_with_nvfp4_mixed"}
# FP8 with current scaling (--fp8-recipe tensorwise): fp8 = "hybrid", fp8_recipe = "tensorwise",
# fp8_param_gather = True like the delayed preset (mixed_precision.py v0.3.0).
CURRENT_SCALING_PRESET = "bf16_with_fp8_current_scaling_mixed"
# Megatron flags that are not `model.<flag>`: their ConfigContainer keys (several: all are set)
# and, for a switch, the value it sets.
FLAG_KEYS: dict[str, tuple[tuple[str, ...], object]] = {
    "--num-experts": (("model.num_moe_experts",), None),
    "--swiglu": (("model.gated_linear_unit",), True),
    "--disable-bias-linear": (("model.add_bias_linear",), False),
    "--untie-embeddings-and-output-weights": (("model.share_embeddings_and_output_weights",),
                                              False),
    "--no-gradient-accumulation-fusion": (("model.gradient_accumulation_fusion",), False),
    # GPTModelProvider rope_scaling: bool (Bridge 0.3.1 gpt_provider.py; Llama 3.1's provider
    # sets it True with rope_scaling_factor 8.0, llama_provider.py)
    "--use-rope-scaling": (("model.rope_scaling",), True),
    "--decoder-first-pipeline-num-layers": (("model.num_layers_in_first_pipeline_stage",), None),
    "--decoder-last-pipeline-num-layers": (("model.num_layers_in_last_pipeline_stage",), None),
    "--seq-length": (("model.seq_length", "dataset.sequence_length"), None),
    "--micro-batch-size": (("train.micro_batch_size",), None),
    "--global-batch-size": (("train.global_batch_size",), None),
    "--use-distributed-optimizer": (("ddp.use_distributed_optimizer",
                                     "optimizer.use_distributed_optimizer"), True),
    "--overlap-grad-reduce": (("ddp.overlap_grad_reduce",), True),
    "--overlap-param-gather": (("ddp.overlap_param_gather",), True),
    "--use-megatron-fsdp": (("ddp.use_megatron_fsdp",), True),
    "--data-parallel-sharding-strategy": (("ddp.data_parallel_sharding_strategy",), None),
    "--ckpt-format": (("checkpoint.ckpt_format",), None),
    "--use-tp-pp-dp-mapping": (("dist.use_tp_pp_dp_mapping",), True),
    "--use-precision-aware-optimizer": (("optimizer.use_precision_aware_optimizer",), True),
    "--main-grads-dtype": (("optimizer.main_grads_dtype",), None),
    "--exp-avg-dtype": (("optimizer.exp_avg_dtype",), None),
    "--exp-avg-sq-dtype": (("optimizer.exp_avg_sq_dtype",), None),
    "--optimizer-cpu-offload": (("optimizer.optimizer_cpu_offload",), True),
    "--optimizer-offload-fraction": (("optimizer.optimizer_offload_fraction",), None),
    "--overlap-cpu-optimizer-d2h-h2d": (("optimizer.overlap_cpu_optimizer_d2h_h2d",), True),
}
# Whether each preset keeps the parameters in fp8 (fp8_param_gather: mixed_precision.py lines
# 218, 251 and 371 / 402 of Bridge 0.3.1; bf16_mixed keeps the field's default, False). The
# preset writes it over the overrides, so the plan's --fp8-param-gather cannot be set apart.
PRESET_FP8_PARAMS = {"bf16": False, "fp8": True, "fp8-blockwise": False, "mxfp8": True,
                     "nvfp4": False}
# Megatron's dtype words as torch's names, which Bridge's overrides take (Megatron-LM
# core_v0.16.1 megatron/training/arguments.py line 646: fp8 moments are torch.uint8).
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "uint8"}
DTYPE_FLAGS = {"--main-grads-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"}
# Megatron flags with no key of their own: the provider class says MLA or a Mamba hybrid,
# num_query_groups says GQA, a RoPE model has no position table, the precision is
# MIXED_PRECISION's preset (which also sets the gradient-reduction dtype: below), and vpp is
# model.virtual_pipeline_model_parallel_size.
DROPPED = {"--multi-latent-attention", "--is-hybrid-model", "--group-query-attention",
           "--max-position-embeddings",
           "--bf16", "--fp8-format", "--fp8-recipe", "--fp4-format", "--fp4-recipe",
           "--grad-reduce-in-bf16", "--fp8-param-gather",
           "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
           # Nemotron-H's providers set activation_func = squared_relu themselves
           # (NemotronHModelProvider); a callable is no Hydra override
           "--squared-relu"}
# Megatron's defaults for what the flags leave out, written out over the recipe's values.
EXPLICIT: dict[str, object] = {
    "model.sequence_parallel": False, "model.gated_linear_unit": False,
    "model.add_bias_linear": True, "model.add_qkv_bias": False, "model.qk_layernorm": False,
    "model.share_embeddings_and_output_weights": True,
    "model.virtual_pipeline_model_parallel_size": None,
    "model.pipeline_model_parallel_layout": None,
    "model.num_layers_in_first_pipeline_stage": None,
    "model.num_layers_in_last_pipeline_stage": None,
    "model.account_for_embedding_in_pipeline_split": False,
    "model.account_for_loss_in_pipeline_split": False,
    "model.recompute_granularity": None, "model.recompute_method": None,
    "model.recompute_num_layers": None, "model.recompute_modules": ["core_attn"],
    "model.cuda_graph_impl": "none",
    "model.tp_comm_overlap": False, "model.mtp_num_layers": None,
    # Megatron's unfused cross-entropy unless the plan's loss is fused: Bridge's GPT provider
    # turns the fusion on by default (GPTModelProvider cross_entropy_loss_fusion = True)
    "model.cross_entropy_loss_fusion": False, "model.cross_entropy_fusion_impl": "native",
    # Megatron's MTP loss weight over the Nemotron 3 recipes' 0.3
    # (recipes/nemotronh/h100/nemotron_3_super.py): the model's own goes out as a flag. (Their
    # repeated depths are no default to write out: mtp_use_repeated_layer is Megatron-Core
    # 0.17's, and Bridge 0.3 refuses the key; a model that repeats its MTP module emits it.)
    "model.mtp_loss_scaling_factor": 0.1,
    "ddp.use_distributed_optimizer": False, "optimizer.use_distributed_optimizer": False,
    "ddp.overlap_grad_reduce": False, "ddp.overlap_param_gather": False,
    "ddp.use_megatron_fsdp": False, "ddp.data_parallel_sharding_strategy": "no_shard",
    "dist.use_tp_pp_dp_mapping": False,
    # fp32 gradients and moments unless the profile asks otherwise (deepseek_v3.py's recipe
    # keeps bf16 moments)
    "optimizer.use_precision_aware_optimizer": False, "optimizer.main_grads_dtype": "float32",
    "optimizer.exp_avg_dtype": "float32", "optimizer.exp_avg_sq_dtype": "float32",
    # A recipe's CommOverlapConfig rewrites the model's, DDP's and optimizer's overlap settings
    # at setup, after the overrides (training/comm_overlap.py CommOverlapConfig.setup); without
    # it the flags above stand (model.tp_comm_overlap starts TE's default userbuffers).
    "comm_overlap": None,
}


# The models whose Bridge 0.3.1 recipe has fine-tuning siblings <prefix>_sft_config (full SFT)
# and <prefix>_peft_config (LoRA / DoRA) (recipes/*/*.py of v0.3.1: every prefix below has both).
FINETUNE_PREFIXES = frozenset((
    "llama31_8b", "llama31_70b", "llama31_405b", "llama32_1b", "llama32_3b", "qwen25_7b",
    "qwen25_14b", "qwen25_32b", "qwen25_72b", "qwen3_8b", "qwen3_32b", "qwen3_30b_a3b",
    "qwen3_235b_a22b", "gemma2_9b", "gemma2_27b", "gpt_oss_20b", "gpt_oss_120b", "glm45_355b",
    "nemotronh_8b", "nemotronh_47b", "nemotronh_56b", "nemotron_nano_9b_v2", "nemotron_3_nano"))


def pick_recipe(target: LaunchTarget) -> tuple[str, bool]:
    """The Bridge recipe the overrides go on, and whether it is the model's own: a fine-tuning
    job's (solver.spec.finetune) the model's SFT or PEFT recipe (FINETUNE_PREFIXES), which
    loads the pretrained checkpoint and the SQuAD dataset, packed (llama3.py
    llama31_8b_peft_config: packed_sequence_specs.packed_sequence_size = seq_length)."""
    m = target.model_spec
    mode = target.job.finetune.mode
    if mode in ("full", "lora"):
        prefix = RECIPES.get(m.name, "").removesuffix("_pretrain_config")
        if prefix not in FINETUNE_PREFIXES:
            raise InputError(f"--finetune {mode}: Megatron-Bridge {VERSION} has no SFT or PEFT "
                             f"recipe for {m.name} (recipes/*/*_sft_config, *_peft_config)")
        return prefix + ("_peft_config" if mode == "lora" else "_sft_config"), True
    if m.name in RECIPES:
        return RECIPES[m.name], True
    kind = ("hybrid" if "mamba" in m.layer_mixers else "mla" if m.is_mla else
            "plain" if m.mlp_type != "gated" else
            "gated-moe" if m.is_moe else "gated")
    return FALLBACK_RECIPES[kind], False


def _value(values: list[str]) -> object:
    """A flag's values as one override value: a whole number, a word, or a list of them."""
    typed: list[object] = [int(v) if re.fullmatch(r"-?\d+", v) else v for v in values]
    return typed[0] if len(typed) == 1 else typed


def _layer_freq(expression: str) -> list[int]:
    """Megatron's run-length `--moe-layer-freq` expression ("([0]*3+[1]*58)") as the list."""
    return [int(value) for value, count in re.findall(r"\[(\d)\]\*(\d+)", expression)
            for _ in range(int(count))]


def build_bridge_overrides(target: LaunchTarget) -> tuple[dict[str, object], list[str],
                                                         list[str]]:
    """The overrides (key -> value, None for null), warnings and notes."""
    flags, warnings, notes = build_megatron_args(target)
    # Megatron-LM's words for its own scripts (pretrain_mamba.py): Bridge's recipe says it.
    warnings = [w for w in warnings if "pretrain_mamba.py" not in w]
    overrides: dict[str, object] = {}
    for flag, *values in flags:
        if flag in DROPPED:
            continue
        keys, switch = FLAG_KEYS.get(flag, (("model." + flag[2:].replace("-", "_"),), None))
        value: object = switch if not values and switch is not None else (
            True if not values else _value(values))
        if flag == "--moe-layer-freq":
            value = _layer_freq(values[0])
        elif flag in DTYPE_FLAGS:
            value = DTYPES[values[0]]
        for key in keys:
            overrides[key] = value
    if target.config.vpp > 1:
        overrides["model.virtual_pipeline_model_parallel_size"] = target.config.vpp
    # The preset's setup writes its dtypes (pipeline_dtype among them, which TransformerConfig
    # needs under pp) and ddp.grad_reduce_in_fp32 over the overrides (training/config.py
    # runtime_config_update, mixed_precision.py MixedPrecisionConfig.setup); every bf16
    # preset reduces in fp32.
    overrides["mixed_precision"] = MIXED_PRECISION[target.job.precision]
    given = {flag for flag, *_ in flags}
    if ("--fp8-recipe", "tensorwise") in flags:
        # Current scaling is its own preset (mixed_precision.py v0.3.0), which also keeps the
        # first and last layers in BF16; the performance scripts turn that off
        # (scripts/performance/utils/precision.py: first_last_layers_bf16 = False), and the
        # estimate runs every layer in FP8.
        overrides["mixed_precision"] = CURRENT_SCALING_PRESET
        notes.append(f"Megatron-Bridge's {CURRENT_SCALING_PRESET} preset keeps the first and "
                     "last layers in BF16 (first_last_layers_bf16): the estimate, like "
                     "Bridge's performance scripts, runs them in FP8")
    fp8_params = "--fp8-param-gather" in given
    preset = overrides["mixed_precision"]
    if fp8_params and not PRESET_FP8_PARAMS[target.job.precision]:
        warnings.append(f"Megatron-Bridge's {preset} preset keeps bf16 parameters "
                        "(fp8_param_gather false, set after the overrides): the plan's fp8 "
                        "parameters are not applied, so they take more memory than estimated")
    elif not fp8_params and PRESET_FP8_PARAMS[target.job.precision]:
        notes.append(f"Megatron-Bridge's {preset} preset keeps the parameters in fp8 "
                     "(fp8_param_gather): less parameter memory and traffic than estimated")
    if "--grad-reduce-in-bf16" in given:
        warnings.append("Megatron-Bridge's mixed-precision presets reduce gradients in fp32 "
                        "(ddp.grad_reduce_in_fp32, set by the preset after the overrides): the "
                        "plan's bf16 reduction is not applied: its gradient reduction moves twice "
                        "the bytes the estimate counts")
    for key, value in EXPLICIT.items():
        overrides.setdefault(key, value)
    overrides.update(build_peft_overrides(target))
    recipe, own = pick_recipe(target)
    if target.job.finetune.mode != "none":
        notes.append(f"{recipe} fine-tunes a pretrained checkpoint (checkpoint."
                     "pretrained_checkpoint) on its dataset, SQuAD by default, packed to the "
                     "sequence length: point both at yours")
    if not own:
        notes.append(f"Megatron-Bridge {VERSION} has no recipe for {target.model_spec.name}: "
                     f"the overrides set its whole architecture on {recipe}'s provider (same "
                     "attention and activation)" + (
                         "; its RoPE base and scaling stay the recipe's: check them against "
                         "the model" if "--rotary-base" not in given else
                         ", rotary base and Llama 3 RoPE scaling included; other RoPE "
                         "scaling stays the recipe's"))
    return overrides, warnings, notes


def build_peft_overrides(target: LaunchTarget) -> dict[str, object]:
    """The LoRA settings of a `--finetune lora` plan on the PEFT recipe's LoRA (peft/lora.py
    LoRA: dim, alpha, target_modules, dropout; the recipe sets its own dim and alpha, e.g.
    8 and 16 for Llama 3.1 8B); nothing for other jobs. Bridge names its modules as
    Megatron-Core does: PEFT's names are refused in one line."""
    finetune = target.job.finetune
    if finetune.mode == "qlora":
        raise InputError("--finetune qlora: Megatron-Bridge has no NF4 base "
                         "(solver.cost.layers.finetune.NO_QLORA)")
    if finetune.mode != "lora":
        return {}
    if not set(finetune.lora_targets) <= set(MEGATRON_TARGETS):
        raise InputError(f"--lora-targets {','.join(finetune.lora_targets)}: Megatron-Bridge's "
                         f"LoRA names its modules {','.join(MEGATRON_TARGETS)} (peft/lora.py); "
                         "re-plan with those names")
    alpha = finetune.lora_alpha
    return {"peft.dim": finetune.lora_rank,
            "peft.alpha": int(alpha) if float(alpha).is_integer() else alpha,
            "peft.target_modules": list(finetune.lora_targets), "peft.dropout": 0.0}


def render_override(key: str, value: object) -> str:
    """One Hydra override `key=value`: null, true / false, numbers and plain words bare,
    other text in double quotes (Hydra's quoted string), lists in brackets."""
    return f"{key}={_render_value(value)}"


def _render_value(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ",".join(_render_value(item) for item in value) + "]"
    text = str(value)
    if re.fullmatch(r"[A-Za-z0-9_.\-]+", text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_bridge(target: LaunchTarget) -> Emitted:
    """torchrun, run_recipe.py, the recipe and one override a line, every token shell-quoted,
    under a comment naming the plan and the Megatron-Bridge version."""
    from solver.emit.torchtitan import render_header

    overrides, warnings, notes = build_bridge_overrides(target)
    recipe, _ = pick_recipe(target)
    tokens = [render_override(key, value) for key, value in overrides.items()]
    launcher = " ".join(shlex.quote(token) for token in
                        render_torchrun_prefix(target) + [SCRIPT, "--recipe", recipe])
    text = " \\\n  ".join([launcher, *(shlex.quote(token) for token in tokens)])
    header = render_header(target, f"Megatron-Bridge {VERSION}: a recipe and Hydra overrides "
                                   f"for {SCRIPT} of a Megatron-Bridge checkout")
    return Emitted(text=header + text + "\n", settings={"recipe": recipe, "overrides": tokens},
                   warnings=tuple(warnings), notes=tuple(notes))
