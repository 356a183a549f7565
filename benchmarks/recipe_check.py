"""The recipe check (issue 17): each published recipe with its settings stated fits in the tool
under the memory features it uses, and the cheapest way the tool finds to fit its
configuration costs no more step time than the recipe's own choice.

    .venv/bin/python benchmarks/recipe_check.py [--json] [--only ID,ID,...]

Data: benchmarks/data/recipes.jsonl, one recipe per line, each naming its source (repository,
commit, file and config name): Megatron-Bridge's performance workload configs for
DeepSeek-V3, Llama 3 8B/70B and Qwen3 30B-A3B/235B-A22B on H100, B200, B300, GB200 and GB300,
and torchtitan's Llama 3 8B and 70B train configs ("a preset for 64 A100 GPUs"; batch_size
is per data-parallel rank with no gradient accumulation, so it is the micro-batch; FSDP over
every GPU the other degrees leave, ZeRO-3), costed under the torchtitan profile's defaults.
A field the config leaves unset takes WorkloadBaseConfig's default (scripts/performance/utils/
utils.py @01b2977: tp = pp = cp = ep = micro-batch 1, no virtual stages); recompute the config
does not set is taken as none (the table marks it "unstated"). Settings every Megatron-Bridge
performance recipe shares, applied to every row:
  bf16 gradient reduction   cfg.ddp.grad_reduce_in_fp32 = False (set_llama3_common_configs,
                            scripts/performance/configs/llama/llama3_llm_pretrain.py @2a0d46e;
                            known_to_run.MEGATRON_BRIDGE_RECIPE_FEATURES for the others)
  distributed optimizer     ZeRO-1 unless the config asks for Megatron-FSDP (ZeRO-3)
  fused cross-entropy       2 B per logit (known_to_run.MEGATRON_BRIDGE_RECIPE_FEATURES:
                            loss_implementation "fused")
  balanced MoE routing      capacity factor 1 (known_to_run.BALANCED_ROUTING_CAPACITY)
  no precision-aware optimizer (not set by the configs)
  fp8 parameters            in fp8 (current scaling) and MXFP8 rows (--fp8-param-gather:
                            megatron/bridge/training/mixed_precision.py
                            bf16_with_fp8_current_scaling_mixed and bf16_with_mxfp8_mixed set
                            fp8_param_gather = True; scripts/performance/utils/precision.py
                            @84fba28 takes them for fp8_cs and fp8_mx)

Per recipe, with its degrees pinned (tp, pp, cp, ep, etp, vpp, ZeRO stage, micro-batch; dp is
the rest), `optimize` is asked twice with the same engine (the layout program places the
layers in both):
  recipe's choice   its recompute level and modules pinned (--recompute-modules): does it fit,
                    and its step time
  tool's cheapest   recompute left to the search (none, the module sets of
                    solver.cost.step.recompute_modules, full recompute per layer) and the offloads
                    to the host (solver.cost.step.offload): its step time
The settings above are Megatron-Bridge's; torchtitan rows take none of them. The check passes
where the recipe's choice fits and the tool's step time is at most the recipe's (ratio <= 1).
A recipe's layer-level CPU offloading (Megatron --cpu-offloading-num-layers: Llama 3 70B on
GB200 with Megatron-FSDP offloads 20 layers) is part of its choice, like its recompute: the
tool's cheapest is searched without it. Settings the tool does not model are listed: the recipe
is costed without them, which can only make it need more memory.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from known_to_run import (  # noqa: E402
    BALANCED_ROUTING_CAPACITY,
    MEGATRON_BRIDGE_RECIPE_FEATURES,
)

from solver.optimize import build_problem, solve  # noqa: E402
from solver.search.space import Problem  # noqa: E402
from solver.spec import RECOMPUTE_LEVELS  # noqa: E402
from solver.spec.features import OFFLOADS, FrameworkFeatures  # noqa: E402
from solver.spec.plan import Plan  # noqa: E402

DATA_PATH = Path(__file__).resolve().parent / "data" / "recipes.jsonl"
PINNED = ("tp", "pp", "cp", "ep", "etp", "vpp", "zero", "micro_batch")
# The precisions whose Megatron-Bridge mixed-precision recipe keeps fp8 parameters.
FP8_PARAM_PRECISIONS = ("fp8", "mxfp8")
# The layout program's wall-time bound per search.
TIME_LIMIT_S = 20.0


@dataclass(frozen=True)
class RecipeVerdict:
    """One recipe: the plan of its own choice and the tool's cheapest plan (None: nothing
    fits)."""

    recipe: dict[str, Any]
    own: Plan | None
    cheapest: Plan | None

    @property
    def ratio(self) -> float | None:
        if self.own is None or self.cheapest is None:
            return None
        assert self.own.time is not None and self.cheapest.time is not None
        return self.cheapest.time.step_seconds / self.own.time.step_seconds

    @property
    def passes(self) -> bool:
        return self.ratio is not None and self.ratio <= 1.0 + 1e-9


def load_recipes(path: Path = DATA_PATH) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def recipe_problem(recipe: dict[str, Any], own: bool) -> Problem:
    """The recipe's problem with its degrees pinned; `own`: its recompute pinned too."""
    pins = {name: (int(recipe[name]),) for name in PINNED}
    framework = recipe.get("framework", "megatron")
    bridge = framework == "megatron"
    features: dict[str, Any] = dict(recipe["features"])
    if bridge:
        features.update(MEGATRON_BRIDGE_RECIPE_FEATURES, precision_aware_optimizer=False,
                        fp8_param_gather=recipe["precision"] in FP8_PARAM_PRECISIONS)
    if own:  # the recipe's memory features only: no offload it does not ask for
        pins["recompute"] = (RECOMPUTE_LEVELS.index(recipe["recompute"]),)
        for name in OFFLOADS:
            features.setdefault(name, False)
        if recipe["recompute"] == "selective" and "recompute_modules" in recipe:
            features["recompute_modules"] = tuple(recipe["recompute_modules"])
    else:  # layer-level CPU offloading is the recipe's memory choice, as its recompute is
        features.pop("cpu_offloading_num_layers", None)
    problem = build_problem(recipe["model"], recipe["cluster"], recipe["gpus"],
                            seq_len=recipe["seq_len"], global_batch=recipe["global_batch"],
                            precision=recipe["precision"], framework=framework, pins=pins,
                            features=FrameworkFeatures(**features))
    if not bridge:  # the framework's own defaults (torchtitan: solver.cost.step.frameworks)
        return problem
    options = problem.memory_options.model_copy(update={
        "moe_capacity_factor": BALANCED_ROUTING_CAPACITY})
    return problem.model_copy(update={"memory_options": options})


def _best(problem: Problem) -> Plan | None:
    result = solve(problem, top=1, time_limit_s=TIME_LIMIT_S, compare=False)
    return result.plans[0] if result.plans else None


def check_recipe(recipe: dict[str, Any]) -> RecipeVerdict:
    return RecipeVerdict(recipe=recipe, own=_best(recipe_problem(recipe, own=True)),
                         cheapest=_best(recipe_problem(recipe, own=False)))


def _setting(recompute: str, modules: Any) -> str:
    if recompute == "selective" and modules:
        return "selective " + ",".join(modules)
    return recompute


def _plan_setting(plan: Plan | None) -> str:
    if plan is None:
        return "nothing fits"
    label = _setting(plan.config.recompute, plan.recompute_modules)
    if plan.config.recompute == "full" and plan.layout is not None:
        recomputed = sum(s.recompute_layers for s in plan.layout.stages)
        label += f" ({recomputed} layers)"
    if plan.offloads:
        label += " + " + ", ".join(name.replace("_", " ") for name in plan.offloads)
    return label


def summarize(verdicts: list[RecipeVerdict]) -> dict[str, Any]:
    rows = []
    for v in verdicts:
        r = v.recipe
        rows.append({
            "id": r["id"], "source": r["source"], "gpus": r["gpus"], "cluster": r["cluster"],
            "recipe_setting": _setting(r["recompute"], r.get("recompute_modules"))
            + (" (op level)" if r.get("framework") == "torchtitan"
               and r["recompute"] == "selective" else "")
            + ("" if r["recompute"] != "none" or r.get("recompute_modules") is not None
               else " (unstated)")
            + (f" + {r['features']['cpu_offloading_num_layers']} layers CPU-offloaded"
               if r["features"].get("cpu_offloading_num_layers") else ""),
            "not_modelled": r["not_modelled"],
            "recipe_fits": v.own is not None,
            "recipe_gb": None if v.own is None else v.own.worst_stage.total_bytes / 1e9,
            "recipe_step_s": None if v.own is None or v.own.time is None
            else v.own.time.step_seconds,
            "tool_setting": _plan_setting(v.cheapest),
            "tool_gb": None if v.cheapest is None else v.cheapest.worst_stage.total_bytes / 1e9,
            "ratio": v.ratio, "passes": v.passes})
    return {"rows": rows, "num_recipes": len(rows),
            "num_recipe_fits": sum(row["recipe_fits"] for row in rows),
            "num_passes": sum(row["passes"] for row in rows)}


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="Recipes: the recipe's own memory choice against the tool's cheapest fit")
    for column in ("recipe", "GPUs", "recipe's setting", "fits?", "GB", "tool's cheapest",
                   "GB ", "step ratio", "not modelled"):
        table.add_column(column)
    for row in summary["rows"]:
        style = "" if row["passes"] else "bold red"
        table.add_row(row["id"], f"{row['gpus']} {row['cluster']}", row["recipe_setting"],
                      "fits" if row["recipe_fits"] else "no", _number(row["recipe_gb"]),
                      row["tool_setting"], _number(row["tool_gb"]), _number(row["ratio"], 3),
                      ", ".join(row["not_modelled"]) or "", style=style)
    console.print(table)
    sources = Table(title="Sources")
    sources.add_column("recipe")
    sources.add_column("source (repository@commit file config)")
    for row in summary["rows"]:
        sources.add_row(row["id"], row["source"])
    console.print(sources)
    console.print(f"{summary['num_recipe_fits']} of {summary['num_recipes']} recipes fit in the "
                  f"tool with their own memory features; {summary['num_passes']} pass (the "
                  "tool's cheapest fit is no slower than the recipe's choice)")


def main(argv: list[str]) -> None:
    recipes = load_recipes()
    if "--only" in argv:
        wanted = set(argv[argv.index("--only") + 1].split(","))
        recipes = [r for r in recipes if r["id"] in wanted]
    summary = summarize([check_recipe(recipe) for recipe in recipes])
    if "--json" in argv:
        print(json.dumps(summary, indent=2))
        return
    render(summary, Console(width=220))


if __name__ == "__main__":
    main(sys.argv[1:])
