"""The MoE dispatcher's own buffers (issue 17: "Token dispatcher buffers (all-to-all, DeepEP,
HybridEP)"): DeepEP's `deep_ep.Buffer`, sized by Megatron's fused_a2a.get_buffer as the larger
of the dispatch and combine configs' hints (deepseek-ai/DeepEP csrc/config.hpp,
deep_ep/buffer.py; solver.cost.memory.dispatcher); HybridEP's `HybridEPBuffer`, sized for every
token of the group (deepseek-ai/DeepEP branch hybrid-ep @94a9f8f csrc/hybrid_ep/buffer/
intranode.cu, internode_doca.cu, extension/allgather.cu, config.cuh); the all-gather
dispatcher's global buffer (Megatron-LM @d98e8a6 tensor_parallel/mappings.py). They are
allocated outside PyTorch's caching allocator (the global buffer is counted the same way), so
the fragmentation does not grow with them."""

from __future__ import annotations

import pytest

from solver.catalog import load_model_spec
from solver.cost.candidates import Candidates
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import estimate_memory
from solver.cost.memory.dispatcher import (
    estimate_deepep_buffer_bytes,
    estimate_dispatcher_bytes,
    estimate_hybridep_buffer_bytes,
)
from solver.cost.memory.options import MemoryOptions
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


def test_the_flex_dispatchers_add_the_item_and_the_allocator_does_not_see_it() -> None:
    """The all-to-all dispatcher keeps nothing of its own (its copies are activations)."""
    alltoall = _items("alltoall")
    assert alltoall["dispatcher"] == 0.0
    for name, expected in (("deepep", 0.746e9), ("hybridep", 5.232e9)):
        flex = _items(name)
        assert flex["dispatcher"] == pytest.approx(expected, rel=1e-3)
        assert flex["fragmentation"] == alltoall["fragmentation"]
        assert sum(flex.values()) - sum(alltoall.values()) == pytest.approx(flex["dispatcher"])


def test_hybridep_deepseek_v3_at_ep_64() -> None:
    """HybridEP @94a9f8f, bf16, 4,096 tokens a rank, 64 ranks in 8 NVLink domains of 8, 4 local
    experts of 256: NVLink buffers (intranode.cu allocate_combine_buffers, shared with dispatch)
    4,096 x 64 x (2 x 7,168 tokens + 4 x 4 x 8 probabilities + 4 x 56 scales); the routing map
    gathered (allgather.cu allocate_ag_buffer) 256 x 4,096 x 64 bools; RDMA
    (internode_doca.cu allocate_dispatch_buffers / allocate_combine_buffers) 4,096 x (14,336 +
    4 x 4 x 64 + 224) and 7 x 4,096 x (3 x 14,336 + 3 x 128 + 224): 5.232 GB."""
    nvl = 4096 * 64 * (14_336 + 128 + 224)
    gather = 256 * 4096 * 64
    rdma = 4096 * (14_336 + 1024 + 224) + 7 * 4096 * (3 * 14_336 + 3 * 128 + 224)
    assert estimate_hybridep_buffer_bytes(7168, 4096, 64, 256, 4) == nvl + gather + rdma
    assert nvl + gather + rdma == 5_231_869_952


def test_hybridep_sizes_at_least_512_tokens_in_64_token_chunks_and_none_alone() -> None:
    """config.cuh Configurer: max(max_num_of_tokens_per_rank, 512) padded to
    NUM_OF_TOKENS_PER_CHUNK_COMBINE_API (64); one domain has no RDMA buffers."""
    small = estimate_hybridep_buffer_bytes(4096, 100, 8, 64, 8)
    assert small == 512 * 8 * (2 * 4096 + 4 * 8 * 8 + 4 * 32) + 512 * 8 * 64
    assert estimate_hybridep_buffer_bytes(4096, 1000, 8, 64, 8) == \
        estimate_hybridep_buffer_bytes(4096, 1024, 8, 64, 8)
    assert estimate_hybridep_buffer_bytes(4096, 4096, 1, 64, 64) == 0


def test_hybridep_and_deepep_size_by_the_etp_ep_group_and_the_sequence_parallel_share() -> None:
    """Megatron's flex dispatcher communicates over tp_ep_group (etp x ep ranks) with the rank's
    tokens, s b / (tp cp) under sequence parallelism (x.shape[-2] in HybridEPDispatch)."""
    model_spec, job = load_model_spec("deepseek-v3"), JobSpec(seq_len=4096, global_batch=1024)
    config = ParallelConfig(tp=2, cp=2, dp=16, ep=16, etp=2, micro_batch=2)
    candidates = Candidates.from_configs([config])
    hybrid = estimate_dispatcher_bytes(model_spec, job, candidates,
                                       MemoryOptions(moe_dispatcher="hybridep"))[0]
    assert hybrid == estimate_hybridep_buffer_bytes(7168, 4096 * 2 // 4, 32, 256, 16)
    deepep = estimate_dispatcher_bytes(model_spec, job, candidates,
                                       MemoryOptions(moe_dispatcher="deepep"))[0]
    assert deepep == estimate_deepep_buffer_bytes(2 * 7168, 32)


def test_allgather_keeps_the_gathered_tokens_in_megatrons_global_buffer() -> None:
    """MoEAllGatherTokenDispatcher gathers hidden states over tp_ep_group with
    use_global_buffer=True (token_dispatcher.py; mappings.py _gather_along_first_dim): 2 H bytes
    for each of the group's tokens, 4,096 x 8 x 14,336 = 469.8 MB for DeepSeek-V3 at ep 8."""
    config = ParallelConfig(dp=8, ep=8)
    got = estimate_dispatcher_bytes(load_model_spec("deepseek-v3"), JobSpec(seq_len=4096),
                                    Candidates.from_configs([config]),
                                    MemoryOptions(moe_dispatcher="allgather"))[0]
    assert got == 4096 * 8 * 2 * 7168 == 469_762_048


def test_estimate_names_the_dispatcher_buffers_and_counts_them() -> None:
    """`estimate` prints the dispatcher's buffers as an assumption and its breakdown carries
    them; a dispatcher the framework lacks is one line, exit 2."""
    from click.testing import CliRunner

    from solver.cli import cli

    args = ["estimate", "--model", "deepseek-v3", "--cluster", "dgx-h100", "--gpus", "1024",
            "--pp", "16", "--ep", "64", "--recompute", "full"]
    hybrid = CliRunner().invoke(cli, [*args, "--moe-dispatcher", "hybridep"])
    assert hybrid.exit_code == 0, hybrid.output
    assert "MoE dispatcher buffers: HybridEP's buffers" in hybrid.output
    assert "MoE dispatcher buffers" in hybrid.output.split("memory assumptions")[0]
    plain = CliRunner().invoke(cli, args)
    assert "MoE dispatcher buffers: none of their own, all-to-all" in plain.output
    refused = CliRunner().invoke(cli, [*args, "--framework", "deepspeed",
                                       "--moe-dispatcher", "hybridep"])
    assert refused.exit_code == 2
    assert refused.output.strip() == ("error: --moe-dispatcher hybridep: DeepSpeed-MoE dispatches "
                                      "with all-to-all only (--framework deepspeed) "
                                      "[framework_lacks_feature]")


def test_hybridep_in_one_nvlink_domain_keeps_no_rdma_buffers() -> None:
    """HybridEPBuffer takes the ranks per domain from detect_accessible_ranks: on a GB200 NVL72
    the job's 64-GPU segment holds the whole group (64 ranks, one domain), so the NVLink
    buffers carry 4 x 4 x 64 B of probabilities a slot and there is no RDMA coordinator:
    4,096 x 64 x (14,336 + 1,024 + 224) + 4,096 x 64 x 256 = 4.152 GB; on 8-GPU H100 nodes the
    same group needs 5.232 GB (test_hybridep_deepseek_v3_at_ep_64)."""
    from solver.api import estimate
    from solver.spec.features import FrameworkFeatures

    one_domain = 4096 * 64 * (14_336 + 1024 + 224) + 4096 * 64 * 256
    assert estimate_hybridep_buffer_bytes(7168, 4096, 64, 256, 4, 64) == one_domain == 4_152_360_960
    hybrid = FrameworkFeatures(moe_dispatcher="hybridep")
    for cluster, expected in (("gb200-nvl72", one_domain), ("dgx-h100", 5_231_869_952)):
        plan = estimate("deepseek-v3", cluster, 256, seq_len=4096, global_batch=1024, pp=4,
                        ep=64, zero=1, recompute="full", features=hybrid).plan
        assert plan.worst_stage.other_bytes["dispatcher"] == expected
