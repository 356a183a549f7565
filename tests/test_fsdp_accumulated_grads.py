"""torchtitan's FSDP2 under pipeline parallelism keeps each stage's gradients unsharded, in the
reduce dtype, until the last micro-batch (solver.cost.memory.states.
estimate_fsdp_accumulated_grad_bytes), pinned to the PyTorch source:

- torch/distributed/pipelining/stage.py (pytorch@0138610): backward_maybe_with_nosync calls
  set_requires_gradient_sync(False) and set_reshard_after_backward(False) on an FSDPModule for
  every micro-batch's backward; _PipelineStageBase._post_backward turns both back on and runs
  each FSDPParamGroup.post_backward once, after the last.
- torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py (pytorch@002a76f) post_backward:
  without reduce_grads it calls FSDPParam.to_accumulated_grad_if_needed on every parameter and
  returns; the next backward's accumulate_unsharded_grad_if_needed adds into it.
- torch/distributed/fsdp/_fully_shard/_fsdp_param.py (pytorch@010ae4a)
  to_accumulated_grad_if_needed: `self.unsharded_accumulated_grad =
  unsharded_grad.to(self.reduce_dtype)`, the unsharded shape in the reduce dtype; init_dtype_attrs
  clamps reduce_dtype to None where it equals param_dtype (the bf16 gradient is kept).
- torchtitan v0.2.2 job_config.py: mixed_precision_reduce: Literal["float32"] = "float32";
  train.py train_step begins with self.optimizers.zero_grad() (the sharded gradients are None
  until _post_backward reduce-scatters).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from solver.catalog import load_model_spec
from solver.cost.step.frameworks import build_framework_profile
from solver.cost.memory import MemoryOptions, estimate_all_stages
from solver.spec import JobSpec, ParallelConfig

LLAMA_405B = "llama3.1-405b"
JOB = JobSpec(seq_len=8192, global_batch=256)


def _first_stage_gb(options: MemoryOptions, **degrees: int) -> dict[str, float]:
    """Items of pipeline stage 0, GB per GPU, Llama-3.1-405B on tp 8 with full recompute."""
    config = ParallelConfig(tp=8, micro_batch=4, recompute="full", **degrees)
    stages = estimate_all_stages(load_model_spec(LLAMA_405B), JOB, config, options)
    return {name: float(values[0]) / 1e9 for name, values in stages.items.items()}


def test_405b_stage_holds_its_fp32_gradients_unsharded() -> None:
    """Worked by hand from the PyTorch source above. Llama-3.1-405B: a decoder layer is
    q, o 16384^2 + k, v 16384 x 1024 each + SwiGLU 3 x 16384 x 53248 + two norms = 3.1877e9
    parameters; the embedding 128256 x 16384 = 2.1013e9. pp 8 splits 126 layers 16 on stage 0
    (with the embedding): 16 x 3.1877e9 + 2.1013e9 = 53.104e9, / tp 8 = 6.638e9 per GPU. FSDP2
    accumulates their unsharded gradients in the reduce dtype, fp32: 6.638e9 x 4 B = 26.55 GB,
    not the 4 / 8 = 3.32 GB shard. Under torchtitan's default PP policy (no reshard after
    forward: parplan's ZeRO-2, solver.emit.torchtitan) the plan was charged 3.32 GB."""
    titan = build_framework_profile("torchtitan").memory_options()
    assert titan.fsdp_unsharded_under_pp and titan.fsdp_reduce_bytes == 4.0
    stage_params = (16 * 3.1877e9 + 2.1013e9) / 8
    assert stage_params * 4 / 1e9 == pytest.approx(26.55, abs=0.01)
    for zero in (1, 2, 3):
        items = _first_stage_gb(titan, pp=8, dp=8, zero=zero)
        assert items["grads"] == pytest.approx(stage_params * 4 / 1e9, rel=1e-3), zero
    # Megatron's ZeRO-2 (no such accumulation) keeps the 1/8 shard.
    megatron = build_framework_profile("megatron").memory_options()
    assert _first_stage_gb(megatron, pp=8, dp=8, zero=2)["grads"] == pytest.approx(
        stage_params * 4 / 8 / 1e9, rel=1e-3)


def test_whatever_the_reshard_policy_a_pipelined_stage_holds_the_same() -> None:
    """ZeRO 2 (never reshard after forward) and 3 (always) under PP hold the same bytes: the
    gathered bf16 stage (2 B, in "weights" at ZeRO-3), the fp32 shard and Adam's moments
    (16 B / d), the fp32 unsharded gradients; ZeRO-1 is ZeRO-2 in torchtitan (no
    optimizer-only sharding) and now costs what it runs."""
    titan = build_framework_profile("torchtitan").memory_options()
    totals = {zero: sum(_first_stage_gb(titan, pp=8, dp=8, zero=zero).values())
              for zero in (1, 2, 3)}
    assert totals[1] == pytest.approx(totals[2], rel=1e-9)
    assert totals[2] == pytest.approx(totals[3], rel=1e-9)


def test_without_pipeline_or_sharding_nothing_changes() -> None:
    """pp 1: every micro-batch's backward reduce-scatters (no pipelining schedule): the shard.
    ZeRO 0 is DDP (data_parallel_replicate_degree): its gradients were unsharded already."""
    titan = build_framework_profile("torchtitan").memory_options()
    plain = titan.model_copy(update={"fsdp_unsharded_under_pp": False})
    assert _first_stage_gb(titan, pp=1, dp=64, zero=2) == _first_stage_gb(plain, pp=1, dp=64,
                                                                          zero=2)
    assert _first_stage_gb(titan, pp=8, dp=8, zero=0) == _first_stage_gb(plain, pp=8, dp=8,
                                                                        zero=0)


def test_the_reduce_dtype_sets_the_accumulated_bytes() -> None:
    """The unsharded gradients accumulate in MixedPrecisionPolicy.reduce_dtype: fp32 (4 B) in
    torchtitan; an FSDP2 whose reduce dtype is its param dtype keeps the bf16 gradient (2 B:
    FSDPParam.init_dtype_attrs clamps reduce_dtype to None, to_accumulated_grad_if_needed then
    returns early and autograd accumulates into the bf16 .grad)."""
    titan = build_framework_profile("torchtitan").memory_options()
    assert titan.fsdp_reduce_bytes == 4.0
    bf16 = titan.model_copy(update={"fsdp_reduce_bytes": 2.0})
    four = _first_stage_gb(titan, pp=8, dp=8, zero=2)["grads"]
    two = _first_stage_gb(bf16, pp=8, dp=8, zero=2)["grads"]
    assert two == pytest.approx(four / 2, rel=1e-9)


def test_estimate_of_405b_on_torchtitan_rises_to_what_it_holds() -> None:
    """`parplan estimate` of Llama-3.1-405B, 512 H100s, tp 8 pp 8, torchtitan, ZeRO-2: 50.6 GB
    before (gradients 3.3 GB), 75.0 GB now (26.6 GB); the ZeRO-3 plan 78.5 -> 75.0 GB (its
    sharded gradients were counted beside the unsharded ones). torchtitan runs eager (issue 43:
    solver.cost.memory.eager): the layer recomputed in full holds, per token and GPU, its two
    fp32 RMSNorm copies 2 x 4 x 16384 / 8 (SP) and silu's output 2 x 53248 / 8, 29,696 B x
    32,768 tokens = 0.97 GB, 1.02 GB with fragmentation: 76.0 GB. torch.distributed.pipelining
    keeps, on stage 0, 8 gradient receive buffers and the outputs of its 8 in-flight
    micro-batches (tests/test_pipeline_buffers.py): 16 x 4 x 1,024 x 16,384 x 2 B = 2.15 GB,
    2.25 GB with fragmentation: 78.25 GB."""
    from click.testing import CliRunner

    from solver.cli import cli

    def estimate(zero: int) -> dict:
        args = ["estimate", "--model", LLAMA_405B, "--cluster", "dgx-h100", "--gpus", "512",
                "--tp", "8", "--pp", "8", "--framework", "torchtitan", "--zero", str(zero),
                "--seq-len", "8192", "--global-batch", "256", "--micro-batch", "4",
                "--recompute", "full", "--json"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["plans"][0]["memory_gb"]

    two, three = estimate(2), estimate(3)
    assert two["grads"] == pytest.approx(26.55, abs=0.01)
    assert two["total"] == pytest.approx(three["total"], rel=1e-9)
    pipeline_buffers = 16 * 4 * 1024 * 16384 * 2 * 1.05 / 1e9
    assert np.isclose(two["total"], 74.98 + 29_696 * 32_768 * 1.05 / 1e9 + pipeline_buffers,
                      atol=0.05)
