"""A plan's pipeline layout in its JSON (solver/spec/plan_json.py, DESIGN.md "Interfaces":
plans[].layout), read back from a plan file (solver/emit/plan_file.py), and as the CLI's
per-stage table (solver/cli/render_plan.py render_layout_rows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solver.cli.render_plan import echo_layout_table, render_layout_rows
from solver.emit.plan_file import load_plan_file
from solver.errors import InputError
from solver.spec import ParallelConfig, PipelineLayout
from solver.spec.layout_syntax import parse_pipeline_layout
from solver.spec.plan import Plan, StageMemory
from solver.spec.plan_json import render_plan_json


def make_plan(layout: PipelineLayout | None, config: ParallelConfig) -> Plan:
    stages = tuple(StageMemory(stage=i, weights_bytes=10e9 + i * 1e9, grads_bytes=0,
                               optimizer_bytes=0, activations_bytes=0, other_bytes={},
                               allocated_bytes=10e9 + i * 1e9, reserved_bytes=10e9 + i * 1e9,
                               observed_reserved_bytes=10e9 + i * 1e9,
                               observed_device_bytes=10e9 + i * 1e9)
                   for i in range(config.pp))
    return Plan(config=config, gpu_memory_bytes=80e9, stages=stages, layout=layout)


def with_recompute(layout: PipelineLayout, counts: list[int]) -> PipelineLayout:
    return PipelineLayout(pp=layout.pp, vpp=layout.vpp, stages=tuple(
        stage.model_copy(update={"recompute_layers": n})
        for stage, n in zip(layout.stages, counts)))


CONFIG = ParallelConfig(pp=4, vpp=2, dp=2, recompute="none")
LAYOUT = with_recompute(parse_pipeline_layout("Et*3|(t*4|)*6,t*3,mL", 4, 2, 30, 1),
                        [3, 4, 2, 2, 2, 2, 2, 1])


def test_plan_json_holds_the_layout() -> None:
    answer = render_plan_json(make_plan(LAYOUT, CONFIG))
    layout = answer["layout"]
    assert (layout["pp"], layout["vpp"], layout["syntax"]) == (4, 2, "Et*3|(t*4|)*6,t*3,mL")
    assert layout["stages"][0] == {"virtual_stage": 0, "stage": 0, "layers": 3,
                                   "recompute_layers": 3, "embedding": True, "loss": False,
                                   "mtp_layers": 0}
    assert layout["stages"][7] == {"virtual_stage": 7, "stage": 3, "layers": 3,
                                   "recompute_layers": 1, "embedding": False, "loss": True,
                                   "mtp_layers": 1}
    assert [s["stage"] for s in layout["stages"]] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert "layout" not in render_plan_json(make_plan(None, CONFIG))
    json.dumps(answer, allow_nan=False)


def write_plans(tmp_path: Path, plan: dict) -> str:
    path = tmp_path / "plans.json"
    path.write_text(json.dumps({"status": "feasible", "plans": [plan]}), encoding="utf-8")
    return str(path)


def test_plan_file_reads_the_layout_back(tmp_path: Path) -> None:
    path = write_plans(tmp_path, render_plan_json(make_plan(LAYOUT, CONFIG)))
    assert load_plan_file(path).layout == LAYOUT
    assert load_plan_file(write_plans(tmp_path, render_plan_json(
        make_plan(None, CONFIG)))).layout is None


@pytest.mark.parametrize("change,fragment", [
    (lambda l: l.update(stages="E|t"), "field 'plans.0.layout.stages': must be a list"),
    (lambda l: l["stages"][2].update(layers=-1), "field 'stages.2.layers'"),
    (lambda l: l["stages"][2].update(stage=0), "'plans.0.layout.stages.2.stage': 0, but"),
    (lambda l: l["stages"][2].update(loss=True), "the LM head and loss belong to the last"),
    (lambda l: l["stages"][2].update(colour="red"), "'stages.2.colour': unknown field"),
    (lambda l: l.update(size=3), "'plans.0.layout.size': unknown field"),
    (lambda l: l.update(pp=2, vpp=4), "pp 2 x vpp 4, but the plan has pp 4 x vpp 2"),
    (lambda l: l.update(syntax="Et*4|(t*4|)*6,tt,mL"), "places the layers otherwise"),
    (lambda l: l.update(syntax="Et*3|t*4,mL"), "'plans.0.layout.syntax': 'Et*3|t*4,mL' "
                                               "places the layers otherwise"),
    (lambda l: l.update(syntax="Et*3|t*4,xL"), "'plans.0.layout.syntax': 'Et*3|t*4,xL': "
                                               "unknown character 'x'"),
])
def test_bad_layouts_in_a_plan_file_are_one_line(tmp_path: Path, change, fragment: str) -> None:
    plan = render_plan_json(make_plan(LAYOUT, CONFIG))
    change(plan["layout"])
    path = write_plans(tmp_path, plan)
    with pytest.raises(InputError) as caught:
        load_plan_file(path)
    message = str(caught.value)
    assert "\n" not in message and path in message and fragment in message, message


def test_layout_rows_per_pipeline_stage(capsys: pytest.CaptureFixture[str]) -> None:
    rows = render_layout_rows(make_plan(LAYOUT, CONFIG))
    assert rows == [(0, "E+3+4", "3+2", 10.0), (1, "4+4", "4+2", 11.0),
                    (2, "4+4", "2+2", 12.0), (3, "4+3+m+L", "2+1", 13.0)]
    flat = make_plan(parse_pipeline_layout("Et*7|t*9|t*8|t*8,L", 4, 1, 32, 0),
                     ParallelConfig(pp=4))
    assert render_layout_rows(flat) == [(0, "E+7", 0, 10.0), (1, "9", 0, 11.0),
                                        (2, "8", 0, 12.0), (3, "8+L", 0, 13.0)]
    alone = make_plan(parse_pipeline_layout("E|t*4|t*4|L", 4, 1, 8, 0), ParallelConfig(pp=4))
    assert [row[1] for row in render_layout_rows(alone)] == ["E", "4", "4", "L"]
    assert render_layout_rows(make_plan(None, CONFIG)) == []
    echo_layout_table(make_plan(None, CONFIG))
    assert capsys.readouterr().out == ""
    echo_layout_table(flat)
    out = capsys.readouterr().out
    assert "pipeline layout, pp 4 x vpp 1" in out and "E+7" in out
    assert "--pipeline-model-parallel-layout Et*7|t*9|t*8|t*8,L" in out
