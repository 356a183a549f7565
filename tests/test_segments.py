"""Placement on rack-scale NVLink domains (issue 16): a job is allocated in aligned segments of
an NVLink domain, its ranks fill them in Megatron's order, a group inside one segment talks over
NVLink and a group that straddles segments pays for the share of its traffic that crosses.

Sources: NVIDIA GB200 NVL72 (https://www.nvidia.com/en-us/data-center/gb200-nvl72/: 18 trays of
4 GPUs on one 72-GPU NVLink domain); SLURM topology/block and `--segment`
(https://slurm.schedmd.com/topology.html): a job gets aligned blocks of nodes, 16 trays = 64 GPUs
the usual choice on NVL72; the crossing shares (k-1)/(n-1) and (n-1)/(n-m) of solver.cost.comm.comm
(notes §1.4-1.5: ml-engineering's hierarchical conversion; OCI all-to-all across nodes).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.api import estimate
from solver.catalog import load_cluster_spec, load_gpu_spec
from solver.catalog.clusters import load_cluster_toml
from solver.cli import cli
from solver.cost.comm.comm import estimate_group_link
from solver.emit.layout import assign_tiers, build_rank_layout
from solver.errors import InputError
from solver.optimize import build_problem, solve
from solver.spec import ClusterSpec, ParallelConfig, TierSpec
from solver.spec.features import FrameworkFeatures

GB = 1e9


def nvl72(segment_gpus: int | None = None, fabric_gb_per_s: float = 40.0) -> ClusterSpec:
    """The gb200-nvl72 preset's tiers (720 GB/s NVLink over 72 GPUs, 40 GB/s fabric)."""
    return ClusterSpec(
        name="nvl72", gpu=load_gpu_spec("gb200"), gpus_per_node=4, segment_gpus=segment_gpus,
        tiers=(TierSpec(name="nvlink", kind="nvlink", span_gpus=72, bandwidth_gb_per_s=720,
                        latency_us=25),
               TierSpec(name="fabric", kind="network", bandwidth_gb_per_s=fabric_gb_per_s,
                        latency_us=46)))


# --- the done-when --------------------------------------------------------------------


def test_ep32_all_to_all_on_256_gb200_gpus_runs_on_nvlink() -> None:
    """Issue 16, done-when: MoE on 256 GB200 NVL72 GPUs with ep 32 costs its all-to-all on
    NVLink. The EP group of 32 consecutive ranks (etp 1) lies in one 64-GPU segment, so its
    bus bandwidth is the NVLink tier's 720 GB/s (before segments: the 40 GB/s fabric, since 72
    is not a multiple of 32). With whole 72-GPU racks as segments the block at ranks 64-95
    straddles two racks as 8 + 24, so its all-to-all runs at 40 x 31/24 = 51.7 GB/s."""
    cluster = load_cluster_spec("gb200-nvl72")
    nvlink = cluster.tiers[0].bandwidth_gb_per_s * GB
    link = estimate_group_link(cluster, stride=1, degree=32, all_to_all=True)
    assert float(link.bandwidth_bytes_per_s) == nvlink == 720 * GB
    assert float(link.latency_s) == pytest.approx(cluster.tiers[0].latency_us * 1e-6)
    whole_racks = estimate_group_link(cluster.with_segment_gpus(72), 1, 32, all_to_all=True)
    assert float(whole_racks.bandwidth_bytes_per_s) == pytest.approx(40 * 31 / 24 * GB)
    # The same through `estimate`: the EP time falls by an order of magnitude.
    degrees = {"ep": 32, "pp": 8, "zero": 1}
    segmented = estimate("deepseek-v3", "gb200-nvl72", 256, **degrees).plan.time
    racks = estimate("deepseek-v3", "gb200-nvl72", 256, segment_gpus=72, **degrees).plan.time
    assert segmented is not None and racks is not None
    assert racks.time_seconds["ep"] > 10 * segmented.time_seconds["ep"]
    assert segmented.tokens_per_second_per_gpu > 2 * racks.tokens_per_second_per_gpu


def test_optimize_deepseek_v3_on_256_gb200_keeps_ep_inside_a_segment() -> None:
    """Issue 16, done-when: `optimize` for DeepSeek-V3 on 256 gb200-nvl72 GPUs ranks plans whose
    EP group (a block of ep x etp ranks) lies inside a 64-GPU segment, and now spreads the
    experts over more than one tray's worth of ranks (ep x etp above 8, the largest block that
    tiled the 72-GPU rack before)."""
    # fp32 gradients and Adam moments (memory savers pinned off) and selective recompute of
    # the attention core only: with the savers or the free moe_act and layernorm recompute a
    # plan of ep 8 fits and wins (tests/test_memory_features.py, test_recompute_modules.py)
    result = solve(build_problem("deepseek-v3", "gb200-nvl72", 256, features=FrameworkFeatures(
        grad_reduce_in_bf16=False, precision_aware_optimizer=False,
        recompute_modules=("core_attn",))), top=5)
    assert result.status == "optimal" and result.plans
    segment = load_cluster_spec("gb200-nvl72").job_segment_gpus
    assert segment == 64
    for plan in result.plans:
        block = plan.config.ep * plan.config.etp
        assert segment % block == 0, plan.config
    assert result.plans[0].config.ep * result.plans[0].config.etp > 8


def test_launch_places_the_ep_groups_where_the_cost_model_does() -> None:
    """`launch`'s tier of every EP group (emit.layout.assign_tiers) follows the segments: no
    placement warning for ep 32 on 256 NVL72 GPUs, whose groups all sit in one segment."""
    cluster = load_cluster_spec("gb200-nvl72")
    layout = build_rank_layout(ParallelConfig(ep=32, dp=256), is_moe=True)
    tiers = assign_tiers(cluster, layout.groups()["ep"])
    assert set(tiers.tolist()) == {0}
    whole_racks = assign_tiers(cluster.with_segment_gpus(72), layout.groups()["ep"])
    assert 1 in whole_racks.tolist()  # ranks 64-95 straddle two racks


# --- crossing a segment boundary --------------------------------------------------------------


def test_groups_that_straddle_segments_pay_for_the_crossing_share() -> None:
    """Worked numbers on 64-GPU segments of a 720 GB/s NVLink domain, 40 GB/s fabric:
    a block of 128 ranks fills two segments (n = 128, m = 64, k = 2): all-to-all
    40 x 127/64 = 79.4 GB/s; all-reduce 40 x 127/1 capped at NVLink, 720. A block of 48 ranks
    (48, 96, ... are not multiples of 64) straddles as 16 + 32 (m = 16, k = 2): all-to-all
    40 x 47/32 = 58.75 GB/s. EP 32 with etp 8 (stride 8, block 256 = 4 segments, m = 8,
    k = 4): all-to-all 40 x 31/24 = 51.7; all-reduce 40 x 31/3 = 413.3."""
    cluster = nvl72()
    cases = [(1, 128, True, 40 * 127 / 64), (1, 128, False, 720), (1, 48, True, 40 * 47 / 32),
             (1, 48, False, 720), (8, 32, True, 40 * 31 / 24), (8, 32, False, 40 * 31 / 3)]
    for stride, degree, all_to_all, expected_gb_per_s in cases:
        link = estimate_group_link(cluster, stride, degree, all_to_all)
        assert float(link.bandwidth_bytes_per_s) == pytest.approx(expected_gb_per_s * GB)
        assert float(link.latency_s) == pytest.approx(46e-6)


SEGMENTS = st.sampled_from([8, 16, 32, 36, 48, 64, 72])


@settings(max_examples=300, deadline=None)
@given(segment=SEGMENTS, stride=st.sampled_from([1, 2, 3, 4, 8, 16, 64, 128]),
       degree=st.integers(1, 72), more=st.integers(2, 8), all_to_all=st.booleans())
def test_bandwidth_never_rises_when_a_group_grows_across_a_boundary(
        segment: int, stride: int, degree: int, more: int, all_to_all: bool) -> None:
    """A group whose block tiles one segment runs on NVLink; the same group grown `more`-fold
    past the segment's edge never runs faster, nor with less latency."""
    if segment % (stride * degree) or stride * degree * more <= segment:
        return
    cluster = nvl72(segment)
    inside = estimate_group_link(cluster, stride, degree, all_to_all)
    across = estimate_group_link(cluster, stride, degree * more, all_to_all)
    assert float(inside.bandwidth_bytes_per_s) == 720 * GB
    assert across.bandwidth_bytes_per_s <= inside.bandwidth_bytes_per_s
    assert across.latency_s >= inside.latency_s


@settings(max_examples=300, deadline=None)
@given(segment_exp=st.integers(0, 4), stride_exp=st.integers(0, 8), degree_exp=st.integers(0, 8),
       more_exp=st.integers(1, 4), all_to_all=st.booleans())
def test_bandwidth_never_rises_as_a_power_of_two_group_spans_more_segments(
        segment_exp: int, stride_exp: int, degree_exp: int, more_exp: int,
        all_to_all: bool) -> None:
    """Megatron's power-of-two degrees in power-of-two segments: every block is aligned, and a
    group touching more segments (degree doubled or more) is never faster."""
    cluster = nvl72(4 * 2**segment_exp)  # 4 to 64 GPUs: whole trays
    stride, degree = 2**stride_exp, 2**degree_exp
    small = estimate_group_link(cluster, stride, degree, all_to_all)
    large = estimate_group_link(cluster, stride, degree * 2**more_exp, all_to_all)
    assert large.bandwidth_bytes_per_s <= small.bandwidth_bytes_per_s


def test_long_candidate_arrays_see_the_segments_too() -> None:
    """The deduplicated path (more than 256 candidates) gives the same links."""
    cluster = nvl72()
    degree = np.tile([8, 16, 32, 64, 128], 100)
    stride = np.repeat([1, 2, 4, 8, 16], 100)
    whole = estimate_group_link(cluster, stride, degree, all_to_all=True)
    for row in range(0, len(degree), 37):
        alone = estimate_group_link(cluster, stride[row], degree[row], all_to_all=True)
        assert whole.bandwidth_bytes_per_s[row] == float(alone.bandwidth_bytes_per_s)


# --- the segment: default, override, and what stays as it was ---------------------------------


@pytest.mark.parametrize(("name", "segment"), [
    ("gb200-nvl72", 64), ("gb300-nvl72", 64), ("dgx-h100", 8), ("dgx-b200", 8), ("mi300x", 8),
    ("hgx-h20", 8), ("l40s-pcie", 1)])
def test_default_segment_is_the_largest_power_of_two_of_nodes_in_a_domain(
        name: str, segment: int) -> None:
    """16 of NVL72's 18 trays = 64 GPUs; an 8-GPU node is its whole domain; no NVLink: 1."""
    cluster = load_cluster_spec(name)
    assert cluster.segment_gpus is None
    assert cluster.job_segment_gpus == cluster.default_segment_gpus == segment


def test_default_segment_of_other_domains() -> None:
    """NVL36 (9 trays of 4): 8 trays = 32 GPUs; NVL72 read as 36 nodes of 2: 32 x 2 = 64;
    read as one 72-GPU node: the domain."""
    nvl36 = ClusterSpec(name="nvl36", gpu=load_gpu_spec("gb200"), gpus_per_node=4, tiers=(
        TierSpec(name="nvlink", kind="nvlink", span_gpus=36, bandwidth_gb_per_s=720,
                 latency_us=25),
        TierSpec(name="fabric", kind="network", bandwidth_gb_per_s=40, latency_us=46)))
    assert nvl36.job_segment_gpus == 32
    assert nvl36.placement_spans == (32, None)
    rack = load_cluster_spec("gb200-nvl72")
    assert rack.with_gpus_per_node(2).job_segment_gpus == 64
    assert rack.with_gpus_per_node(72).job_segment_gpus == 72


def test_eight_gpu_nodes_are_unchanged() -> None:
    """On 8-GPU nodes the segment is the node, so the placement spans are the tier spans and
    comm.py's worked number holds (dgx-h100: DP 16 with stride 1 touches 2 nodes,
    min(360, 40 x 15/1) = 360 GB/s; with stride 8 it touches 16 nodes: 40 GB/s), as does a
    whole estimate with and without --segment-gpus 8."""
    cluster = load_cluster_spec("dgx-h100")
    assert cluster.placement_spans == tuple(t.span_gpus for t in cluster.tiers) == (8, None)
    assert float(estimate_group_link(cluster, 1, 16).bandwidth_bytes_per_s) == 360 * GB
    assert float(estimate_group_link(cluster, 8, 16).bandwidth_bytes_per_s) == 40 * GB
    degrees = {"tp": 8, "pp": 2, "ep": 8}
    plain = estimate("mixtral-8x7b", "dgx-h100", 64, **degrees).plan
    given_segment = estimate("mixtral-8x7b", "dgx-h100", 64, segment_gpus=8, **degrees).plan
    assert plain == given_segment


def test_a_job_given_whole_racks() -> None:
    """--segment-gpus 72: a DP group of 72 ranks (a 72-GPU job on one rack) is on NVLink; under
    the default 64-GPU segment its ranks 64-71 sit in another rack and the group crosses the
    fabric (its latency; the hierarchical share keeps the bandwidth at NVLink's)."""
    cluster = load_cluster_spec("gb200-nvl72")
    whole = estimate_group_link(cluster.with_segment_gpus(72), 1, 72)
    assert float(whole.bandwidth_bytes_per_s) == 720 * GB
    assert float(estimate_group_link(cluster, 1, 72).latency_s) == pytest.approx(46e-6)


# --- bad values ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("cluster", "value", "rule"), [
    ("gb200-nvl72", "80", r"at most the NVLink domain \(72 GPUs\)"),
    ("gb200-nvl72", "66", r"multiple of 4 GPUs"),
    ("gb200-nvl72", "0", r"greater than 0"),
    ("gb200-nvl72", "-64", r"greater than 0"),
    ("dgx-h100", "4", r"whole NVLink domain \(8 GPUs\)"),
    ("l40s-pcie", "8", r"no NVLink or xGMI domain"),
])
@pytest.mark.parametrize("command", ["estimate", "optimize", "launch"])
def test_bad_segment_is_one_line_naming_the_flag(command: str, cluster: str, value: str,
                                                 rule: str) -> None:
    result = CliRunner().invoke(cli, [command, "--model", "llama3.1-8b", "--cluster", cluster,
                                      "--gpus", "16", f"--segment-gpus={value}"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert lines[0].startswith(f"error: --segment-gpus {value}: field 'segment_gpus': ")
    assert re.search(rule, lines[0])


def test_segment_in_a_cluster_file(tmp_path: Path) -> None:
    """A cluster file may state segment_gpus; a bad one names the file and the field."""
    preset = Path(__file__).parents[1] / "clusters" / "presets" / "gb200-nvl72.toml"
    text = preset.read_text(encoding="utf-8").replace('gpus_per_node = 4\n',
                                                      'gpus_per_node = 4\nsegment_gpus = 72\n')
    good = tmp_path / "racks.toml"
    good.write_text(text, encoding="utf-8")
    assert load_cluster_toml(good).job_segment_gpus == 72
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace("segment_gpus = 72", "segment_gpus = 144"), encoding="utf-8")
    with pytest.raises(InputError, match=r"bad.toml: field 'segment_gpus': segment_gpus \(144\)"):
        load_cluster_toml(bad)


def test_cli_estimate_takes_the_segment() -> None:
    """The flag reaches the cost model: whole racks make the EP-32 plan slower."""
    args = ["estimate", "--model", "deepseek-v3", "--cluster", "gb200-nvl72", "--gpus", "256",
            "--ep", "32", "--pp", "8", "--zero", "1", "--json"]
    runner = CliRunner()
    default = runner.invoke(cli, args)
    racks = runner.invoke(cli, [*args, "--segment-gpus", "72"])
    assert default.exit_code == racks.exit_code == 0, default.output + racks.output
    rate = [json.loads(r.output)["plans"][0]["tokens_per_second_per_gpu"]
            for r in (default, racks)]
    assert rate[0] > 2 * rate[1]
