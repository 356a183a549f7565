"""`parplan estimate`: memory (stage by stage) and step time of one parallel configuration."""

from __future__ import annotations

from typing import Any

import click

from solver.cli.options import (
    degree_options,
    framework_feature_options,
    framework_option,
    planning_options,
    pop_framework_features,
)
from solver.cli.params import BoundedInt
from solver.cli.shared_flags import memory_headroom_option
from solver.spec.strict import MAX_LAYERS


@click.command()
@planning_options
@degree_options
@click.option("--per-stage", is_flag=True, help="Show every pipeline stage, not only the worst.")
@click.option("--layout", metavar="SPEC", default=None,
              help="Layers per virtual stage in Megatron's --pipeline-model-parallel-layout "
                   "syntax (e.g. 'E|(t|)*126,L': the embedding and the loss in stages of "
                   "their own); default: the even split.")
@click.option("--recompute-num-layers", type=BoundedInt(1, MAX_LAYERS), default=None,
              help="With --recompute full: the layers of each virtual stage that recompute "
                   "(Megatron's block method); default: all.")
@framework_option("Whose timing to assume (kernels, overlaps, recompute semantics, DP "
                  "overlap, gradient reduce dtype); the flags below override single features.")
@framework_feature_options
@memory_headroom_option
def estimate(model: str, cluster: str, num_gpus: int, gpus_per_node: int | None,
             segment_gpus: int | None, seq_len: int,
             global_batch: int, precision: str, token_budget: int | None,
             calibration: str | None, as_json: bool,
             per_stage: bool, layout: str | None, recompute_num_layers: int | None,
             framework: str, memory_headroom: Any, **degrees: Any) -> None:
    """Memory per GPU (and whether it fits) and step time of one configuration; dp is the rest
    of the GPUs."""
    from solver.search.constraints import MEMORY_CONSTRAINT
    from solver.api import estimate as run_estimate
    from solver.cli.render import echo_json
    from solver.cli.render_plan import (
        echo_fixes,
        echo_layout_table,
        echo_memory_table,
        echo_stage_table,
        echo_time_table,
    )
    from solver.cost.caveats import list_time_caveats
    from solver.spec.plan_json import render_memory_views_json, render_plan_json

    features = pop_framework_features(degrees)
    result = run_estimate(
        model, cluster, num_gpus, gpus_per_node=gpus_per_node, seq_len=seq_len, features=features,
        global_batch=global_batch, precision=precision, token_budget=token_budget,
        calibration=calibration, framework=framework, layout=layout,
        recompute_num_layers=recompute_num_layers, segment_gpus=segment_gpus,
        memory_headroom=memory_headroom, **degrees,
    )
    plan = result.plan
    if as_json:
        answer: dict[str, Any] = {
            "status": "feasible" if plan.fits else "infeasible",
            "solve_seconds": 0,
            "model": result.model_spec.name,
            "cluster": result.cluster.name,
            "gpus": result.num_gpus,
            "seq_len": result.job.seq_len,
            "global_batch": result.job.global_batch,
            "precision": result.job.precision,
            "framework": result.profile.name,
            "framework_features": result.profile.features(),
            "plans": [render_plan_json(plan)],
            # What reports each view of a plan's memory (`allocated_gb`, `reserved_gb`,
            # `device_gb`): the view a measured number is compared with.
            "memory_views": render_memory_views_json(),
            "notes": list(list_time_caveats(result.model_spec)),
        }
        if result.blocks:  # a block pattern: time and memory by block kind
            answer["block_kinds"] = [dict(vars(kind)) for kind in result.blocks]
        if not plan.fits:
            answer["conflicts"] = [MEMORY_CONSTRAINT]
            answer["fixes"] = list(result.fixes)
        if result.calibration is not None:
            from solver.cli.render_calibration import render_sources_json

            answer["calibration"] = render_sources_json(result.calibration,
                                                        result.curve_sources)
        echo_json(answer)
        return
    heading = (f"{result.model_spec.name} on {result.num_gpus} x {result.cluster.gpu.name} "
               f"({result.cluster.name}), seq {result.job.seq_len}, global batch "
               f"{result.job.global_batch}, {result.job.precision}")
    states = result.profile.time_constants.training_states
    if states != "mixed":
        heading += f", {states} training states"
    if per_stage:
        echo_stage_table(plan, heading)
    else:
        echo_memory_table(plan, heading)
    echo_time_table(plan)
    for note in list_time_caveats(result.model_spec):
        click.echo(f"note: {note}")
    if result.blocks:
        from solver.cli.render import echo_table

        echo_table("per block kind (seconds per micro-batch; GB on the worst stage)",
                   ["kind", "layers", "s / layer", "recompute s", "share of work",
                    "GB / layer", "on worst stage"],
                   [(k.kind, k.layers, f"{k.seconds_per_layer:.4g}",
                     f"{k.recompute_seconds_per_layer:.4g}", f"{100 * k.work_share:.1f}%",
                     f"{k.bytes_per_layer / 1e9:.3f}", k.layers_on_worst_stage)
                    for k in result.blocks])
    from solver.cli.render_features import render_memory_assumptions

    click.echo("\n".join(render_memory_assumptions(result.profile, result.job.precision,
                                                     plan.config.recompute)))
    if plan.config.pp > 1 or plan.layout is not None and any(
            s.recompute_layers not in (0, s.layers) for s in plan.layout.stages):
        echo_layout_table(plan)
    if result.calibration is not None:
        from solver.cli.render_calibration import echo_sources_table

        echo_sources_table(result.calibration, result.curve_sources)
    if not plan.fits:
        echo_fixes(result.fixes)
