"""GPU variants (issue 16): a GPU file may state its power limit and memory type; the catalog
holds the 96 GB HBM2e H100 of Meta's Grand Teton and the H20. Each number is pinned to the source
its file cites."""

from __future__ import annotations

import pytest

from solver.catalog import load_cluster_spec, load_gpu_spec
from solver.catalog.tomlfile import validate_spec
from solver.errors import InputError
from solver.spec import GpuSpec


def test_h100_96gb_grand_teton() -> None:
    """torchtitan benchmarks/llama3_h100_202412_torchtitan.md: "96GB HBM2e with 2.4 TB/sec peak
    memory bandwidth", "the default 500W power limit", "8 NVIDIA H100 GPUs fully connected with
    NVLink", "backend RDMA network with 400 Gb/s per GPU". Peaks: the H100 SXM datasheet's
    (989 BF16, 1,979 FP8 dense) as the upper bound torchtitan's footnote names."""
    gpu = load_gpu_spec("h100-96gb")
    assert (gpu.hbm_type, gpu.power_limit_w, gpu.hbm_gb_per_s) == ("HBM2e", 500, 2400)
    assert gpu.memory_gib == pytest.approx(97871 / 1024, abs=0.01)
    assert gpu.peak_tflops_bf16 == load_gpu_spec("h100-sxm").peak_tflops_bf16 == 989
    assert gpu.peak_tflops_fp8 == 1979
    assert gpu.nvlink_gb_per_s == 900 / 2
    assert gpu.mamf_fraction_bf16 is None  # the 700 W SXM's MAMF does not apply at 500 W
    cluster = load_cluster_spec("grand-teton-h100")
    assert cluster.gpu == gpu and cluster.gpus_per_node == 8
    assert [t.bandwidth_gb_per_s for t in cluster.tiers] == [450 * 0.80, 400 / 8 * 0.80]


def test_h20() -> None:
    """H20 spec table (willitrunai.com/es/gpus/h20-96gb; SemiAnalysis Nov 2023): 96 GB HBM3 at
    4.0 TB/s, 148 TFLOP/s FP16/BF16 and 296 FP8 dense, NVLink 900 GB/s bidirectional; nvidia-smi
    of an H20 server: "74W / 500W | 4MiB / 97871MiB"."""
    gpu = load_gpu_spec("h20")
    assert (gpu.hbm_type, gpu.hbm_gb_per_s, gpu.power_limit_w) == ("HBM3", 4000, 500)
    assert gpu.peak_tflops_bf16 == gpu.peak_tflops_fp16 == 148
    assert gpu.peak_tflops_fp8 == 296
    assert gpu.nvlink_gb_per_s == 900 / 2
    assert gpu.memory_gib == pytest.approx(97871 / 1024, abs=0.01)
    assert gpu.num_sms == 78
    cluster = load_cluster_spec("hgx-h20")
    assert cluster.gpu == gpu and cluster.scale_up_gpus == 8
    # NVIDIA/nccl#1244 (H20, 2 nodes, one CX7 NDR per GPU): the 46-47 us floor.
    assert [t.latency_us for t in cluster.tiers] == [15.6, 46.0]


def test_h20_is_bandwidth_rich_and_compute_poor() -> None:
    """The same NVLink and more HBM bandwidth than an H100 SXM (4.0 against 3.35 TB/s) at 15% of
    its dense BF16 peak (148 / 989)."""
    h20, h100 = load_gpu_spec("h20"), load_gpu_spec("h100-sxm")
    assert h20.hbm_gb_per_s > h100.hbm_gb_per_s
    assert h20.peak_tflops_bf16 / h100.peak_tflops_bf16 == pytest.approx(0.15, abs=0.005)


BASE = {"name": "g", "memory_gib": 80.0, "peak_tflops_bf16": 989.0, "peak_tflops_fp16": 989.0,
        "hbm_gb_per_s": 3350.0}


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("power_limit_w", 0, "greater than 0"),
    ("power_limit_w", -500, "greater than 0"),
    ("hbm_type", "HBM4x", "Input should be"),
    ("hbm_type", "hbm3", "Input should be"),
])
def test_bad_variant_fields_name_the_field(field: str, value: object, problem: str) -> None:
    with pytest.raises(InputError, match=rf"^gpu.toml: field '{field}': .*{problem}"):
        validate_spec(GpuSpec, {**BASE, field: value}, "gpu.toml")


def test_variant_fields_are_optional() -> None:
    gpu = validate_spec(GpuSpec, BASE, "gpu.toml")
    assert gpu.power_limit_w is None and gpu.hbm_type is None
