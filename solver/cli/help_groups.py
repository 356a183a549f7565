"""`--help` with the options in groups (issue 39: `optimize --help` was 148 lines of flat
options): the problem, degrees and pins, the search, framework features, memory features,
output. Click has no option groups; rich-click and click-option-group add them but are not
dependencies of the project, and a group map read by one `format_options` is all it takes,
without moving any option's definition (GroupedCommand). Each option's group comes from the
declarations it sets: the decision variables (solver.search.space.VARIABLES), the framework
features (solver.spec.framework.FEATURES, MEMORY_SAVERS, OFFLOADS)."""

from __future__ import annotations

from typing import Any

import click

from solver.search.space import VARIABLES
from solver.spec.features import FEATURES, MEMORY_SAVERS, OFFLOADS

PINS = "degrees and pins"
JOB = "problem: model, cluster, job"
SERVICE = "load and service targets"
SEARCH = "search"
FRAMEWORK = "framework features"
MEMORY = "memory features"
OUTPUT = "output"
OTHER = "other options"
# The groups in the order --help lists them.
GROUPS = (JOB, SERVICE, PINS, SEARCH, FRAMEWORK, MEMORY, OUTPUT, OTHER)

# Framework features that only change memory (or trade step time for it); the rest of FEATURES
# are framework features.
MEMORY_FEATURES = frozenset(MEMORY_SAVERS + OFFLOADS + ("cpu_offloading_num_layers",
                                                        "recompute_modules"))
# Options by their parameter name, where the declarations above do not say.
NAMED = {
    **{name: JOB for name in ("model", "cluster", "num_gpus", "gpus_per_node", "segment_gpus",
                              "price_per_gpu_hour", "prices",
                              "seq_len", "global_batch", "precision", "token_budget",
                              "calibration", "context", "input_len", "output_len", "finetune",
                              "lora_rank", "lora_alpha", "lora_targets", "packed_sequences",
                              "plan_path", "plan_rank",
                              "plan_line", "models", "clusters", "gpu_counts", "seq_lens",
                              "global_batches", "precisions")},
    **{name: SERVICE for name in ("request_rate", "concurrency", "slo_percentile",
                                  "max_ttft_ms", "max_tpot_ms", "min_tokens_per_s", "client",
                                  "burstiness")},
    # serve's pins: --tp ... --replicas, and --prefill-tp ... --decode-ep per pool.
    **{f"pin_{name}": PINS for name in ("tp", "pp", "dp", "ep", "replicas")},
    **{f"pool_{pool}_{name}": PINS for pool in ("prefill", "decode")
       for name in ("tp", "pp", "dp", "ep")},
    **{name: PINS for name in ("no_tp", "no_pp", "no_cp", "no_ep", "layout",
                               "recompute_num_layers")},
    **{name: SEARCH for name in ("top", "engine", "time_limit", "work_limit", "objective",
                                 "allow_tp_across_nodes", "gpus_for_days", "jobs",
                                 "max_problems", "executor", "address", "disaggregated",
                                 "pareto")},
    **{name: FRAMEWORK for name in ("framework", "max_num_seqs", "max_num_batched_tokens",
                                    "kv_cache_dtype")},
    **{name: MEMORY for name in ("memory_headroom", "min_fit_probability",
                                 "gpu_memory_utilization")},
    **{name: OUTPUT for name in ("as_json", "fail_on_infeasible", "output", "report_dir",
                                 "per_stage", "quiet", "help", "_click_default_help",
                                 "interval_level")},
}


def option_group(name: str | None) -> str:
    """The --help group of the option whose parameter is `name`."""
    if name in VARIABLES:
        return PINS
    if name in MEMORY_FEATURES:
        return MEMORY
    if name in FEATURES:
        return FRAMEWORK
    return NAMED.get(name or "", OTHER)


class GroupedCommand(click.Command):
    """A click command whose --help lists its options under GROUPS (option_group; `groups`:
    this command's own, by parameter name, e.g. serve's --engine is the serving engine)."""

    def __init__(self, *args: Any, groups: dict[str, str] | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups = dict(groups or {})

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        records: dict[str, list[tuple[str, str]]] = {group: [] for group in GROUPS}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                group = self.groups.get(param.name or "") or option_group(param.name)
                records[group].append(record)
        for group in GROUPS:
            if records[group]:
                with formatter.section(group[0].upper() + group[1:]):
                    formatter.write_dl(records[group])
