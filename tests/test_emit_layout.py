"""Rank layout and process groups (solver/emit/layout.py): the seed's examples, Megatron-Core's
generator as a slow reference, and the invariants of any layout."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec
from solver.emit.layout import (
    AXES,
    DENSE_GROUPS,
    EXPERT_GROUPS,
    assign_tiers,
    build_rank_layout,
    find_placement_warnings,
)
from solver.errors import InputError
from solver.spec import ParallelConfig


def megatron_reference_groups(degrees: list[int], mask: list[bool]) -> list[list[int]]:
    """Megatron-Core's generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py),
    transcribed: group index and rank-in-group are decomposed by division over the unmasked and
    the masked degrees, innermost first; the ranks are the inner products with the strides."""
    strides = [1, *itertools.accumulate(degrees, lambda a, b: a * b)]

    def decompose(index: int, shape: list[int]) -> list[int]:
        prefix = [1, *itertools.accumulate(shape, lambda a, b: a * b)]
        return [(index // d) % s for s, d in zip(shape, prefix)]

    masked = [i for i, m in enumerate(mask) if m]
    unmasked = [i for i, m in enumerate(mask) if not m]
    group_size = math.prod(degrees[i] for i in masked)
    groups = []
    for group_index in range(math.prod(degrees) // group_size):
        outer = decompose(group_index, [degrees[i] for i in unmasked])
        base = sum(c * strides[i] for c, i in zip(outer, unmasked))
        groups.append([base + sum(c * strides[i] for c, i in
                                  zip(decompose(k, [degrees[i] for i in masked]), masked))
                       for k in range(group_size)])
    return groups


def test_seed_two_dimensional_example() -> None:
    """Seed 000, "Example: TP=2, DP=4 on 8 GPUs": TP {0,1},{2,3},{4,5},{6,7}; DP {0,2,4,6},
    {1,3,5,7}. With two axes every order that puts TP first agrees."""
    groups = build_rank_layout(ParallelConfig(tp=2, dp=4), is_moe=False).groups()
    assert groups["tp"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["dp"].tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_seed_three_dimensional_example_uses_the_tp_pp_dp_order() -> None:
    """Seed 000, "3D Process Groups": TP=8, PP=4, DP=8 on 256 GPUs, "TP varies fastest, then
    PP, then DP": TP {0..7}, PP {0,8,16,24}, DP {0,32,...,224}. That is the order tp-pp-dp
    (Megatron's --use-tp-pp-dp-mapping), selected here explicitly. The seed then says Megatron's
    initialize_model_parallel "sets all this up", but Megatron's default order is
    tp-cp-ep-dp-pp, which puts DP inside PP: see the next test."""
    layout = build_rank_layout(ParallelConfig(tp=8, pp=4, dp=8), is_moe=False, order="tp-pp-dp")
    groups = layout.groups()
    assert groups["tp"][0].tolist() == list(range(8))
    assert groups["pp"][0].tolist() == [0, 8, 16, 24]
    assert groups["dp"][0].tolist() == list(range(0, 256, 32))
    assert layout.order == ("tp", "pp", "dp", "cp", "ep")  # left-out axes go outermost


def test_megatron_default_order_puts_dp_inside_pp() -> None:
    """Megatron-Core's default tp-cp-ep-dp-pp: rank = tp_i + 8 (dp_i + 8 pp_i), so rank 0's PP
    group is {0, 64, 128, 192} and its DP group {0, 8, ..., 56}; each PP stage is 64
    consecutive ranks (8 nodes), and DP gradients stay inside a stage's nodes."""
    groups = build_rank_layout(ParallelConfig(tp=8, pp=4, dp=8), is_moe=False).groups()
    assert groups["tp"][0].tolist() == list(range(8))
    assert groups["pp"][0].tolist() == [0, 64, 128, 192]
    assert groups["dp"][0].tolist() == list(range(0, 64, 8))


def test_megatron_docstring_example() -> None:
    """initialize_model_parallel's docstring: 16 GPUs, tp 2, pp 4 (dp 2): 8 DP groups [g0, g2],
    [g1, g3], [g4, g6], ...; TP [g0, g1], ...; 4 PP groups [g0, g4, g8, g12], ..."""
    groups = build_rank_layout(ParallelConfig(tp=2, pp=4, dp=2), is_moe=False).groups()
    assert groups["dp"].tolist()[:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["tp"].tolist()[:2] == [[0, 1], [2, 3]]
    assert groups["pp"].tolist() == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14],
                                     [3, 7, 11, 15]]


def test_expert_view_follows_etp_ep_edp_pp() -> None:
    """The expert generator of Megatron-Core: tp -> etp, dp -> edp, cp folded away. tp 2, cp 2,
    dp 4, ep 4, etp 1 on 16 ranks: edp = 16 / 4 = 4; an EP group is 4 consecutive ranks."""
    layout = build_rank_layout(ParallelConfig(tp=2, cp=2, dp=4, ep=4, etp=1), is_moe=True)
    assert layout.expert is not None and layout.expert.order == "etp-ep-edp-pp"
    groups = layout.groups()
    assert groups["ep"][:2].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups["edp"][0].tolist() == [0, 4, 8, 12]
    assert groups["dp_cp"][0].tolist() == [0, 2, 4, 6, 8, 10, 12, 14]


def test_strides_are_those_the_step_time_model_charges() -> None:
    """solver/cost/step/steptime.py prices groups by stride under tp-cp-ep-dp-pp: TP 1, CP tp,
    DP tp*cp, PP tp*cp*dp; EP etp, expert-DP etp*ep."""
    c = ParallelConfig(tp=2, cp=3, dp=4, pp=5, ep=2, etp=2)
    layout = build_rank_layout(c, is_moe=True)
    assert [layout.dense.stride(a) for a in ("tp", "cp", "dp", "pp")] == [1, 2, 6, 24]
    assert layout.expert is not None
    assert [layout.expert.stride(a) for a in ("etp", "ep", "edp", "pp")] == [1, 2, 4, 24]
    assert layout.dense.rank_of(tp=1, cp=2, dp=3, pp=4) == 1 + 2 * 2 + 3 * 6 + 4 * 24


@pytest.mark.parametrize(("order", "message"), [
    ("tp-xp-dp", "unknown axis 'xp'"),
    ("tp-dp-tp", "axis 'tp' appears twice"),
    ("tp-dp", "leaves out pp, whose degree is 2"),
])
def test_bad_orders_are_input_errors(order: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        build_rank_layout(ParallelConfig(tp=2, pp=2, dp=2), is_moe=False, order=order)


def test_expert_pipeline_groups_must_match() -> None:
    """Megatron refuses an order under which the expert layers' pipeline groups differ from
    the dense layers' (dp 4 but expert dp 2, pp not outermost)."""
    config = ParallelConfig(tp=2, pp=2, dp=4, ep=2, etp=2)
    with pytest.raises(InputError, match="pipeline groups differ"):
        build_rank_layout(config, is_moe=True, order="tp-cp-ep-pp-dp")


def test_tiers_and_warnings_on_a_dgx_h100() -> None:
    """tp 16 on 8-GPU nodes leaves NVLink; pp groups 64 ranks apart run over the fabric."""
    cluster = load_cluster_spec("dgx-h100")
    layout = build_rank_layout(ParallelConfig(tp=16, pp=2, dp=1), is_moe=False)
    groups = layout.groups()
    names = [t.name for t in cluster.tiers]
    assert [names[i] for i in assign_tiers(cluster, groups["tp"])] == ["fabric", "fabric"]
    warnings = find_placement_warnings(layout, cluster)
    assert warnings == ["tp: 2 of 2 groups of 16 ranks leave the NVLink domain (8 GPUs) and run "
                        "over 'fabric'"]
    inside = build_rank_layout(ParallelConfig(tp=8, pp=2, dp=1), is_moe=False)
    assert find_placement_warnings(inside, cluster) == []


CONFIGS = st.builds(
    lambda tp, cp, dp, pp, etp_pick, ep_pick: (tp, cp, dp, pp, etp_pick, ep_pick),
    st.sampled_from([1, 2, 3, 4, 8]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 3, 4, 6]),
    st.sampled_from([1, 2, 3, 4]), st.integers(0, 10), st.integers(0, 10))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def plan_config(drawn: tuple[int, ...]) -> ParallelConfig:
    tp, cp, dp, pp, etp_pick, ep_pick = drawn
    stage = tp * cp * dp
    etp = _divisors(stage)[etp_pick % len(_divisors(stage))]
    ep = _divisors(stage // etp)[ep_pick % len(_divisors(stage // etp))]
    return ParallelConfig(tp=tp, cp=cp, dp=dp, pp=pp, ep=ep, etp=etp)


def _degrees(config: ParallelConfig) -> dict[str, int]:
    c = config
    return {"tp": c.tp, "cp": c.cp, "dp": c.dp, "pp": c.pp, "dp_cp": c.dp * c.cp, "ep": c.ep,
            "etp": c.etp, "edp": c.expert_dp}


@settings(max_examples=80, deadline=None)
@given(CONFIGS, st.permutations(AXES), st.booleans())
def test_groups_partition_the_ranks_with_the_degrees_as_sizes(
        drawn: tuple[int, ...], order: list[str], is_moe: bool) -> None:
    config = plan_config(drawn)
    try:
        layout = build_rank_layout(config, is_moe, "-".join(order))
    except InputError:
        assume(False)
    coordinates = layout.coordinates()
    for name, rows in layout.groups().items():
        size = _degrees(config)[name] if (is_moe or name != "ep") else 1
        assert rows.shape == (config.num_gpus // size, size), name
        assert sorted(rows.ravel().tolist()) == list(range(config.num_gpus)), name
        if name in ("tp", "cp", "dp", "pp", "ep", "etp", "edp") and (is_moe or name != "ep"):
            # members share every other coordinate of their view and take each value once
            view = layout.dense if name in DENSE_GROUPS else layout.expert
            assert view is not None
            for other in view.names:
                values = coordinates[other][rows]
                if other == name:
                    assert (np.sort(values, axis=1) == np.arange(size)).all()
                else:
                    assert (values == values[:, :1]).all()


@settings(max_examples=80, deadline=None)
@given(CONFIGS, st.sampled_from([1, 2, 4, 8, 16, 72]))
def test_tp_innermost_keeps_tp_groups_inside_a_node(drawn: tuple[int, ...],
                                                    node_gpus: int) -> None:
    config = plan_config(drawn)
    assume(node_gpus % config.tp == 0)
    tp_groups = build_rank_layout(config, is_moe=False).groups()["tp"]
    nodes = tp_groups // node_gpus
    assert (nodes == nodes[:, :1]).all()


@settings(max_examples=60, deadline=None)
@given(CONFIGS, st.permutations(AXES))
def test_fast_groups_match_megatrons_generator(drawn: tuple[int, ...],
                                               order: list[str]) -> None:
    config = plan_config(drawn)
    try:
        layout = build_rank_layout(config, True, "-".join(order))
    except InputError:
        assume(False)
    views = [(layout.dense, DENSE_GROUPS), (layout.expert, EXPERT_GROUPS)]
    for view, reported in views:
        assert view is not None
        for axes in [*reported.values(), (view.names[0], view.names[-1]), view.names]:
            mask = [name in axes for name in view.names]
            expected = megatron_reference_groups(list(view.degrees), mask)
            assert view.groups(tuple(axes)).tolist() == expected, (view.order, axes)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from(["dgx-h100", "gb200-nvl72", "l40s-pcie", "mi300x"]))
def test_tiers_agree_with_the_cluster_span_rule(tp: int, cp: int, dp: int, name: str) -> None:
    """For power-of-two groups whose block stride x degree tiles the tier spans, the tier of
    every group is the one ClusterSpec.tier_for_span gives the cost model."""
    cluster = load_cluster_spec(name)
    layout = build_rank_layout(ParallelConfig(tp=tp, cp=cp, dp=dp), is_moe=False)
    spans = [t.span_gpus for t in cluster.tiers if t.span_gpus is not None]
    for axis, degree in (("tp", tp), ("cp", cp), ("dp", dp)):
        block = layout.dense.stride(axis) * degree
        if degree > 1 and all(span % block == 0 or block % span == 0 for span in spans):
            tiers = assign_tiers(cluster, layout.groups()[axis])
            expected = cluster.tiers.index(cluster.tier_for_span(block))
            assert set(tiers.tolist()) == {expected}, (axis, block)
