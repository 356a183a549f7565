"""Megatron's --pipeline-model-parallel-layout syntax (solver/spec/layout_syntax.py), pinned to
the examples of NVIDIA/Megatron-LM (main, commit d98e8a64, 2026): the grammar of
megatron/core/transformer/pipeline_parallel_layer_layout.py, the user guide
docs/user-guide/features/pipeline_parallel_layout.md, and the layouts its own tests run."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from solver.errors import InputError
from solver.spec import PipelineLayout, VirtualStage
from solver.spec.layout_syntax import (
    parse_layout_stages,
    parse_pipeline_layout,
    render_pipeline_layout,
)

# (source in Megatron-LM, text, pp, --num-layers, --mtp-num-layers, the vpp it implies)
MEGATRON_LAYOUTS = [
    ("tests/functional_tests/test_cases/moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_selective_recompute_"
     "experimental/model_config.yaml", "Et*3|(tt|)*6tmL", 2, 16, 1, 4),
    ("tests/functional_tests/test_cases/moe/gpt3_moe_mcore_te_tp2_pp2_ep4_etp1_no_mtp_no_a2a_"
     "ovlp_fine_grained_offloading/model_config.yaml", "Et*3|(tt|)*6L", 2, 15, 0, 4),
    ("tests/functional_tests/test_cases/moe/gpt3_moe_mcore_te_tp4_ep2_etp2_pp2_scoped_cudagraph/"
     "model_config.yaml", "Et|(tt|)*6mL", 2, 13, 1, 4),
    ("tests/functional_tests/test_cases/mixtral/deepseekv3_proxy_flex_tp1pp4emp16etp1cp1_release/"
     "model_config.yaml", "Et*2|(tt|)*5t|tmL", 4, 14, 1, 2),
    ("tests/functional_tests/test_cases/mixtral/deepseekv3_proxy_flex_tp2pp2emp16etp1cp1_gb_200_"
     "release/model_config.yaml", "Et*7|t*7mL", 2, 14, 1, 1),
    ("tests/unit_tests/pipeline_parallel/test_pipeline_layout.py ('mtp in the last stage')",
     "E|t*3|(t|)*5mL", 4, 8, 1, 2),
    # TransformerConfig.pipeline_model_parallel_layout's docstring; its rank table has pp 4 and
    # vpp 2 (the line above the table says pp = 2, vpp = 4, which 8 stages also fit).
    ("megatron/core/transformer/transformer_config.py", "E|(tt|)*2,(t|)*4,mL", 4, 8, 1, 2),
]


def bad(text: str, pp: int, vpp: int, num_layers: int, num_mtp_layers: int = 0) -> str:
    """The one-line message parse_pipeline_layout refuses `text` with."""
    with pytest.raises(InputError) as caught:
        parse_pipeline_layout(text, pp, vpp, num_layers, num_mtp_layers)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"--layout {text!r}: "), message
    return message


def test_expansion_is_megatrons_parse_str_to_list() -> None:
    """parse_str_to_list's docstring: "Ettt|(tt|)*29,m|L" -> [["E","t","t","t"]] +
    [["t","t"]]*29 + [["m"],["L"]]; commas are cosmetic, (X)*N repeats X, c*N repeats c."""
    assert parse_layout_stages("Ettt|(tt|)*29,m|L", 1000) == ["Ettt"] + ["tt"] * 29 + ["m", "L"]
    # its comment "xy(ab|cd|ef)*2,pq -> xyab|cd|efab|cd|efpq": a group's stages run on into
    # what stands before and after it
    assert parse_layout_stages("E(tt|m|t)*2,L", 100) == ["Ett", "m", "ttt", "m", "tL"]
    assert parse_layout_stages("E,t*4|t*4,L", 100) == parse_layout_stages("Et*4|ttttL", 100)


@pytest.mark.parametrize("source,text,pp,num_layers,num_mtp,vpp", MEGATRON_LAYOUTS,
                         ids=[row[1] for row in MEGATRON_LAYOUTS])
def test_megatrons_own_layouts_parse_and_round_trip(source: str, text: str, pp: int,
                                                    num_layers: int, num_mtp: int,
                                                    vpp: int) -> None:
    layout = parse_pipeline_layout(text, pp, vpp, num_layers, num_mtp)
    assert layout.num_layers == num_layers and layout.stages[-1].mtp_layers == num_mtp
    assert all(stage.recompute_layers == 0 for stage in layout.stages)
    rendered = render_pipeline_layout(layout)
    assert parse_pipeline_layout(rendered, pp, vpp, num_layers, num_mtp) == layout
    assert render_pipeline_layout(parse_pipeline_layout(rendered, pp, vpp, num_layers,
                                                        num_mtp)) == rendered


def test_a_functional_test_layout_stage_by_stage() -> None:
    """deepseekv3_proxy_flex_tp1pp4...: "Et*2|(tt|)*5t|tmL" with pp 4, 14 layers, 1 MTP layer:
    8 virtual stages; rank 0 holds chunks 0 and 4, rank 3 chunks 3 and 7."""
    layout = parse_pipeline_layout("Et*2|(tt|)*5t|tmL", 4, 2, 14, 1)
    assert [s.layers for s in layout.stages] == [2, 2, 2, 2, 2, 2, 1, 1]
    assert layout.stages[0].embedding and layout.stages[-1].loss
    assert layout.stages[-1].mtp_layers == 1
    assert [layout.layers_of_stage(rank) for rank in range(4)] == [4, 4, 3, 3]
    assert render_pipeline_layout(layout) == "Ett|(tt|)*5,t|tmL"


def test_the_user_guide_example_is_megatrons_standalone_mtp() -> None:
    """docs/user-guide/features/pipeline_parallel_layout.md: "Et*3|(tt|)*29,m|L", pp 16, 61
    layers and one MTP layer; its table puts the MTP layer alone on PP rank 14, VPP rank 1.
    parplan keeps the MTP layers with the loss, so it names the stage and refuses."""
    stages = parse_layout_stages("Et*3|(tt|)*29,m|L", 1000)
    assert len(stages) == 32 and stages[30] == "m" and 30 % 16 == 14 and 30 // 16 == 1
    message = bad("Et*3|(tt|)*29,m|L", 16, 2, 61, 1)
    assert "virtual stage 30" in message and "last virtual stage (31)" in message
    # test_pipeline_layout.py: "mtp in the second last stage with a decoder layer"
    assert "virtual stage 6" in bad("E|t*3|(t|)*4tm|L", 4, 2, 8, 1)


def test_empty_stages_megatron_allows_are_refused() -> None:
    """The user guide: "Empty stages are allowed, for example E||t|L"; a parplan layout gives
    every virtual stage a decoder layer, the embedding or the loss."""
    assert parse_layout_stages("E||t|L", 100) == ["E", "", "t", "L"]
    assert "virtual stage 1 is empty" in bad("E||t|L", 2, 2, 1)


@pytest.mark.parametrize("text,pp,vpp,num_layers,num_mtp,fragment", [
    # PipelineParallelLayerLayout.__init__: the stage count is pp x vpp (a multiple of pp)
    ("Et*4|t*4,L", 4, 1, 8, 0, "it has 2 virtual stages; pp 4 x vpp 1 needs 4"),
    ("Et*2|(t*2|)*2,t*2,L", 2, 1, 8, 0, "needs 2 (Megatron would read it as vpp 2)"),
    # validate_layer_layout: "The first layer must be embedding", "The last layer must be loss"
    ("tE|t*6,L", 2, 1, 7, 0, "the first layer must be E (embedding), not t"),
    ("Et*4|t*3,Lt", 2, 1, 8, 0, "the last layer must be L (loss), not t"),
    # "Embedding must be specified exactly once", "Loss must be specified exactly once"
    ("Et*4|Et*4,L", 2, 1, 8, 0, "E (embedding) appears 2 times"),
    ("Et*4,L|t*4,L", 2, 1, 8, 0, "L (loss) appears 2 times"),
    # "Number of decoder layers ... must match num_layers"
    ("Et*4|t*3,L", 2, 1, 8, 0, "it holds 7 decoder layers (t); the model has 8"),
    # "Number of mtp layers in layout must match mtp_num_layers"
    ("Et*4|t*4,L", 2, 1, 8, 1, "it holds 0 MTP layers (m); the model has 1"),
    # "decoder layers must be placed before MTP layers"
    ("Et*4|t*3,mtL", 2, 1, 8, 1, "a decoder layer (t) follows an MTP layer (m)"),
    # parse_str_to_list: "Invalid layer character"
    ("Et*4|T*4,L", 2, 1, 8, 0, "unknown character 'T' in virtual stage 1"),
    ("E(t|)t*3,L", 2, 1, 4, 0, "unknown character '('"),
    ("E|t*99999999999999|L", 3, 1, 4, 0, "expands to more than"),
])
def test_bad_layouts_are_one_line_naming_the_rule(text: str, pp: int, vpp: int,
                                                  num_layers: int, num_mtp: int,
                                                  fragment: str) -> None:
    assert fragment in bad(text, pp, vpp, num_layers, num_mtp)


def test_render_groups_only_what_it_shortens() -> None:
    """Llama-3.1-405B, 126 layers, pp 16 x vpp 8: the embedding and the loss each take a
    virtual stage of their own."""
    layout = PipelineLayout(pp=16, vpp=8, stages=(
        VirtualStage(layers=0, embedding=True), *[VirtualStage(layers=1)] * 126,
        VirtualStage(layers=0, loss=True)))
    assert render_pipeline_layout(layout) == "E|(t|)*126,L"
    even = parse_pipeline_layout("Et*8|t*8|t*8|t*8L", 4, 1, 32, 0)
    assert render_pipeline_layout(even) == "Et*8|t*8|t*8|t*8,L"  # a group is no shorter
    assert render_pipeline_layout(parse_pipeline_layout("EL", 1, 1, 0, 0)) == "EL"


@st.composite
def layouts(draw: st.DrawFn) -> PipelineLayout:
    pp = draw(st.integers(1, 5))
    vpp = draw(st.integers(1, 4))
    count = pp * vpp
    layers = draw(st.lists(st.integers(0, 4), min_size=count, max_size=count))
    mtp = draw(st.integers(0, 2))
    stages = []
    for v, n in enumerate(layers):
        edge = v in (0, count - 1)
        stages.append(VirtualStage(layers=n if n or edge else 1, embedding=v == 0,
                                   loss=v == count - 1, mtp_layers=mtp if v == count - 1 else 0))
    return PipelineLayout(pp=pp, vpp=vpp, stages=tuple(stages))


@given(layouts())
def test_parse_of_render_is_the_layout(layout: PipelineLayout) -> None:
    text = render_pipeline_layout(layout)
    parsed = parse_pipeline_layout(text, layout.pp, layout.vpp, layout.num_layers,
                                   layout.stages[-1].mtp_layers)
    assert parsed == layout
    assert render_pipeline_layout(parsed) == text


@given(layouts(), st.data())
def test_any_spelling_of_the_stages_parses_to_the_same_layout(layout: PipelineLayout,
                                                              data: st.DataObject) -> None:
    """Flat stages, each decoder run written out or as t*N, with stray commas."""
    stages = []
    for stage in layout.stages:
        run = "t" * stage.layers
        if stage.layers > 1 and data.draw(st.booleans()):
            run = f"t*{stage.layers}"
        comma = "," if data.draw(st.booleans()) else ""
        stages.append(("E" + comma if stage.embedding else "") + run + comma
                      + "m" * stage.mtp_layers + ("L" if stage.loss else ""))
    text = "|".join(stages)
    assert parse_pipeline_layout(text, layout.pp, layout.vpp, layout.num_layers,
                                 layout.stages[-1].mtp_layers) == layout
