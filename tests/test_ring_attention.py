"""Context parallelism's ring attention (solver.cost.comm.ring_attention), pinned to the code it
models: Transformer Engine's AttnFuncWithCPAndKVP2P (transformer_engine/pytorch/attention/
dot_product_attention/context_parallel.py, TransformerEngine@d0067d0) and PyTorch's
_templated_ring_attention with the all-gather rotater (torch/distributed/tensor/experimental/
_attention.py, pytorch@0123248), torchtitan's default (context_parallel_rotate_method
"allgather", job_config.py v0.2.2)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.catalog import load_cluster_spec, load_model_spec
from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.comm.ring_attention import (
    RingTraffic,
    estimate_ring_exposed_s,
    estimate_ring_traffic,
)
from solver.spec import JobSpec

MS = 1e-3


def _degrees(**values: int) -> dict[str, np.ndarray]:
    base = dict(tp=1, cp=1, pp=1, dp=1, ep=1, etp=1, vpp=1, zero=1, micro_batch=1)
    return {k: np.array([v]) for k, v in {**base, **values}.items()}


def _traffic(ring: str, cp: float, t: float, g: float = 0.0, r: float | None = None,
             merges: tuple[float, float] = (0.0, 0.0)) -> RingTraffic:
    one = np.array([1.0])
    return RingTraffic(ring=ring, cp=one * cp, kv_step_s=one * t, kv_gather_s=one * g,
                       dkv_step_s=one * (t if r is None else r), merge_fwd_s=one * merges[0],
                       merge_bwd_s=one * merges[1])


def test_deepseek_v3_ring_on_h800_at_4k() -> None:
    """DeepSeek-V3, 4,096 tokens, tp 1, cp 2, on H800s (Transformer Engine). A rank holds 2,048
    tokens: K and V 2,048 x 128 heads x (192 + 128) = 83.9M elements, 167.8 MB in bf16, one
    send/recv over NVLink (hgx-h800: 160 GB/s, 1.064 ms). Merges, outside fp8 in the output's
    dtype: forward (4 + 6) x E_out + 4 x E_kv = 10 x 33.55M + 4 x 83.9M = 671.1 MB, backward
    (4 + 6) x (E_q + E_kv) = 10 x (50.3M + 83.9M) = 1,342 MB, at 0.8 x 3,350 GB/s: 0.250 and
    0.501 ms."""
    traffic = estimate_ring_traffic(load_model_spec("deepseek-v3"), load_cluster_spec("hgx-h800"),
                                    JobSpec(seq_len=4096), _degrees(cp=2), "transformer_engine",
                                    ComputeConstants())
    assert traffic.kv_step_s[0] == pytest.approx(1.064 * MS, rel=0.01)
    assert traffic.dkv_step_s[0] == traffic.kv_step_s[0]  # dKV in the KV dtype outside fp8
    assert traffic.kv_gather_s[0] == 0.0
    assert traffic.merge_fwd_s[0] == pytest.approx(671.1e6 / (0.8 * 3350e9), rel=1e-3)
    assert traffic.merge_bwd_s[0] == pytest.approx(1342.2e6 / (0.8 * 3350e9), rel=1e-3)


def test_transformer_engine_hides_each_transfer_behind_one_step() -> None:
    """AttnFuncWithCPAndKVP2P.forward: step i waits for its KV, sends shard i + 1, then
    computes: the cp - 1 transfers each overlap one step of core / cp. DeepSeek-V3's numbers
    above (t = 1.064 ms, MLA core 0.993 ms forward on an H800): 1.064 - 0.993 / 2 = 0.568 ms
    exposed, where the whole ring behind the whole core gave 0.071 ms. Backward: KV at step 0,
    the dKV at step 1 (cp 2), each behind 2.482 / 2 = 1.241 ms: hidden."""
    traffic = _traffic("transformer_engine", 2, 1.064 * MS)
    fwd, bwd = estimate_ring_exposed_s(traffic, np.array([0.993 * MS]), np.array([2.482 * MS]))
    assert fwd[0] == pytest.approx(0.5675 * MS, rel=1e-3)
    assert max(1.064 * MS - 0.993 * MS, 0.0) == pytest.approx(0.071 * MS, rel=1e-3)
    assert bwd[0] == 0.0
    # cp 4, a backward step of 1 ms: KV alone at step 0, KV + dKV at steps 1 and 2 (2 x 0.8 ms),
    # dKV alone at step 3: 0 + 2 x 0.6 + 0 = 1.2 ms.
    traffic = _traffic("transformer_engine", 4, 0.8 * MS)
    _, bwd = estimate_ring_exposed_s(traffic, np.array([1.0 * MS]), np.array([4.0 * MS]))
    assert bwd[0] == pytest.approx(1.2 * MS)


def test_torch_ring_hides_the_gather_behind_the_first_step_only() -> None:
    """_templated_ring_attention: the _AllGatherRotater's all-gather is issued before step 0
    and waited at step 1 (torchtitan: "all-gather all kv shards on ranks after the first
    sub-SDPA computation"). cp 8, g = 7 ms, a core of 32 ms (4 ms a step): 3 ms exposed. The
    backward (12 ms, b = 1.5 ms a step) gathers again behind step 0 (5.5 ms exposed), sends the
    fp32 dKV on after each step, waited after the next (r = 2 ms: 7 x 0.5 ms), and waits for
    the last one whole (2 ms): 11 ms."""
    traffic = _traffic("torch_allgather", 8, 1.0 * MS, g=7.0 * MS, r=2.0 * MS)
    fwd, bwd = estimate_ring_exposed_s(traffic, np.array([32.0 * MS]), np.array([12.0 * MS]))
    assert fwd[0] == pytest.approx(3.0 * MS)
    assert bwd[0] == pytest.approx((5.5 + 7 * 0.5 + 2.0) * MS)


def test_torch_ring_merges_for_llama_8b_at_256k() -> None:
    """The estimate_ring_traffic docstring's worked number: Llama-3.1-8B, 262,144 tokens on cp 8
    (torchtitan's 2024-12 H100 Table 2, FSDP 1 CP 8): a rank's output is 32,768 x 32 x 128 =
    134.2M elements, its K and V 32,768 x 8 x 256 = 67.1M; the eager fp32 merges move
    (12 + 38 x 7) x 134.2M + 4 x 7 x 67.1M = 39.2 GB a layer forward, 20.4 ms at 0.8 x 2.4 TB/s
    (Grand Teton's H100 96 GB); the dKV goes on in fp32, twice the bytes of the KV."""
    traffic = estimate_ring_traffic(load_model_spec("llama3.1-8b"),
                                    load_cluster_spec("grand-teton-h100"),
                                    JobSpec(seq_len=262144), _degrees(cp=8), "torch_allgather",
                                    ComputeConstants())
    e_out, e_kv = 32768 * 32 * 128, 32768 * 8 * 256
    assert (12 + 38 * 7) * e_out + 4 * 7 * e_kv == pytest.approx(39.2e9, rel=1e-3)
    assert traffic.merge_fwd_s[0] == pytest.approx(39.2e9 / (0.8 * 2400e9), rel=1e-3)
    assert traffic.merge_fwd_s[0] == pytest.approx(20.4 * MS, rel=0.01)
    assert traffic.dkv_step_s[0] > 1.9 * traffic.kv_step_s[0]
    assert traffic.kv_gather_s[0] > 6 * traffic.kv_step_s[0]


def test_no_ring_at_cp_1() -> None:
    for ring in ("transformer_engine", "torch_allgather"):
        traffic = estimate_ring_traffic(load_model_spec("llama3.1-8b"),
                                        load_cluster_spec("dgx-h100"), JobSpec(seq_len=8192),
                                        _degrees(cp=1), ring, ComputeConstants())
        fwd, bwd = estimate_ring_exposed_s(traffic, np.array([1.0]), np.array([2.0]))
        assert fwd[0] == bwd[0] == 0.0


steps = st.floats(0.0, 10.0)


@settings(max_examples=200, deadline=None)
@given(cp=st.sampled_from([2, 4, 8, 16]), t=steps, core=st.floats(0.01, 50.0),
       ratio=st.floats(1.0, 4.0), merges=st.tuples(steps, steps))
def test_per_step_overlap_never_hides_more_than_the_whole_ring(cp, t, core, ratio, merges
                                                                ) -> None:
    """Each transfer hides behind one step, so Transformer Engine's exposed forward is never
    below the whole ring behind the whole core (max((cp - 1) t - core, 0), what layer_time
    charged before) nor below its merges; PyTorch's gather of the same cp - 1 shards behind one
    step hides no more than Transformer Engine's ring; more core never exposes more."""
    te = _traffic("transformer_engine", cp, t, merges=merges)
    core_a, bwd_a = np.array([core]), np.array([ratio * core])
    fwd, bwd = estimate_ring_exposed_s(te, core_a, bwd_a)
    assert fwd[0] >= max((cp - 1) * t - core, 0.0) + merges[0] - 1e-12
    assert bwd[0] >= merges[1] - 1e-12
    torch = _traffic("torch_allgather", cp, t, g=(cp - 1) * t, r=2 * t, merges=merges)
    torch_fwd, torch_bwd = estimate_ring_exposed_s(torch, core_a, bwd_a)
    assert torch_fwd[0] >= fwd[0] - 1e-12
    more_fwd, more_bwd = estimate_ring_exposed_s(te, 2 * core_a, 2 * bwd_a)
    assert more_fwd[0] <= fwd[0] + 1e-12 and more_bwd[0] <= bwd[0] + 1e-12
