"""The MoE dispatcher's own buffers (issue 17: "Token dispatcher buffers (all-to-all, DeepEP,
HybridEP)"): DeepEP's `deep_ep.Buffer`, sized by Megatron's fused_a2a.get_buffer as the larger
of the dispatch and combine configs' hints (deepseek-ai/DeepEP csrc/config.hpp,
deep_ep/buffer.py; solver.cost.memory.dispatcher). It is allocated outside PyTorch's caching
allocator, so the fragmentation does not grow with it."""

from __future__ import annotations

import pytest

from solver.catalog import load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.frameworks import build_framework_profile
from solver.cost.memory import estimate_memory
from solver.cost.memory.dispatcher import estimate_deepep_buffer_bytes
from solver.spec import JobSpec, ParallelConfig

H_BYTES = 2 * 7168  # DeepSeek-V3's hidden size in bf16


def test_deepseek_v3_at_ep_64() -> None:
    """NVLink: 10 channels x 8 ranks x ((2 x 8 + 3) x 4 + 288 x (14,336 + 2,056)) = 377.7 MB;
    RDMA: 10 x 8 x (144 + 2 x 140 x (14,336 + 2,072)) + 1 MiB = 368.6 MB (140: 128 rounded up
    to the send chunk 28)."""
    assert estimate_deepep_buffer_bytes(H_BYTES, 64) == 377_677_824 + 368_599_296


def test_inside_a_node_there_is_no_rdma_buffer() -> None:
    nvl = 10 * 8 * ((2 * 1 + 3) * 4 + 256 * (H_BYTES + 2056))
    assert estimate_deepep_buffer_bytes(H_BYTES, 8) == -(-nvl // 128) * 128
    assert estimate_deepep_buffer_bytes(H_BYTES, 1) == 0


def test_an_unlisted_group_takes_the_next_listed_config() -> None:
    """DeepEP lists 2, 4, 8, 16, 24, 32, 64, 128, 144 and 160 ranks: 48 takes 64's config
    (288 NVLink receive tokens, 140 RDMA slots) with its own 6 RDMA ranks."""
    def align(value: int) -> int:
        return -(-value // 128) * 128

    nvl = align(10 * 8 * ((2 * 6 + 3) * 4 + 288 * (H_BYTES + 2056)))
    rdma = align(10 * 6 * (144 + 2 * 140 * (H_BYTES + 2072)) + 2**20)
    assert estimate_deepep_buffer_bytes(H_BYTES, 48) == nvl + rdma


def _items(dispatcher: str) -> dict:
    options = build_framework_profile("megatron", {"moe_dispatcher": dispatcher}).memory_options()
    config = ParallelConfig(pp=4, dp=64, ep=64, zero=1, recompute="full")
    breakdown = estimate_memory(load_model_spec("deepseek-v3"),
                                JobSpec(seq_len=4096, global_batch=1024),
                                Candidates.from_configs([config]), options)
    return {name: float(value[0]) for name, value in breakdown.items.items()}


def test_only_deepep_adds_the_item_and_the_allocator_does_not_see_it() -> None:
    deepep, alltoall = _items("deepep"), _items("alltoall")
    assert alltoall["dispatcher"] == 0.0 and _items("hybridep")["dispatcher"] == 0.0
    assert deepep["dispatcher"] == pytest.approx(0.746e9, rel=1e-3)
    assert deepep["fragmentation"] == alltoall["fragmentation"]
    assert sum(deepep.values()) - sum(alltoall.values()) == pytest.approx(deepep["dispatcher"])
