"""What a serving plan is asked for (ServeJob), the constants of the serving model
(ServeConstants), and one serving problem (ServeProblem).

Vocabulary (serving): an **engine** is one `vllm serve` process group: tp x pp GPUs per
data-parallel rank, dp ranks (vLLM's --data-parallel-size). A dense model's DP ranks are
independent copies; a mixture of experts couples them, because vLLM shards the expert layers
over all tp x dp GPUs (expert parallel, or tensor parallel flattened over DP). **replicas** are
independent engines behind a load balancer (MoE only: a dense model scales out with dp).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from solver.cost.kernels.efficiency import ComputeConstants
from solver.cost.memory import MemoryOptions
from solver.cost.serving.engines import EngineRelease, resolve_engine
from solver.spec import ClusterSpec, ModelSpec
from solver.serve.workload import LengthDistribution, ServeLoadSpec
from solver.spec.strict import MAX_SEQ_LEN, GpuCount, InputSpec

SeqLen = Annotated[int, MAX_SEQ_LEN]

WeightPrecision = Literal["bf16", "fp8", "int4", "fp4"]
KvCacheDtype = Literal["auto", "fp8", "fp4"]
ServeObjective = Literal["throughput", "latency", "gpus", "cost", "energy"]
PinnedDegree = Literal["tp", "pp", "dp", "ep", "replicas"]  # SERVE_VARIABLES
PoolDegree = Literal["tp", "pp", "dp", "ep"]  # a disaggregated pool's engine
ContextSource = Literal["given", "model", "fits"]  # --context, the model's length, what fits
NVFP4_KV_BYTES_PER_ELEMENT = 0.5 + 1.0 / 16.0  # fp4 data + one fp8 scale per 16 (ServeJob)


class ServeJob(InputSpec):
    """The serving target: context length (vLLM's --max-model-len), the request shape, the
    weights' precision, the KV-cache dtype, vLLM's --gpu-memory-utilization and the SLOs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    context: SeqLen = Field(gt=0)
    input_len: SeqLen = Field(gt=0)
    output_len: SeqLen = Field(gt=0)
    precision: WeightPrecision = "bf16"
    kv_cache_dtype: KvCacheDtype = "auto"
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)  # vLLM's default
    max_ttft_ms: float | None = Field(default=None, gt=0)
    max_tpot_ms: float | None = Field(default=None, gt=0)
    min_tokens_per_s: float | None = Field(default=None, gt=0)
    objective: ServeObjective = "throughput"
    # The workload (solver.serve.workload): length distributions (None: every request has
    # input_len / output_len tokens; else those are the rounded means), the offered load and
    # the SLO percentile; vLLM's scheduler limits (None: vllm_batch_defaults).
    input_lengths: LengthDistribution | None = None
    output_lengths: LengthDistribution | None = None
    load: ServeLoadSpec = ServeLoadSpec()
    max_num_seqs: int | None = Field(default=None, gt=0, le=MAX_SEQ_LEN.most)
    max_num_batched_tokens: int | None = Field(default=None, gt=0, le=MAX_SEQ_LEN.most)
    # The engine release whose host overhead times the steps and the requests
    # (solver.cost.serving.engines: vllm, vllm@0.6, sglang@0.3, or a generation of
    # solver.cost.serving.overhead) and vLLM V0's --num-scheduler-steps (multi-step
    # scheduling, vLLM 0.6-0.10 only).
    engine: str = "vllm"
    num_scheduler_steps: int = Field(default=1, ge=1, le=256)
    # Where `context` came from: --context, else the model's max_position_embeddings, else
    # the longest that fits (solver.serve.context).
    context_source: ContextSource = "given"

    @model_validator(mode="after")
    def _check_lengths(self) -> ServeJob:
        if self.num_scheduler_steps > 1 and self.engine_release.generation != "vllm-v0":
            raise ValueError(f"num_scheduler_steps ({self.num_scheduler_steps}) is vLLM V0's "
                             f"multi-step scheduling: engine must be vllm-v0, not "
                             f"{self.engine}")
        if self.input_len + self.output_len > self.context:
            raise ValueError(f"input_len ({self.input_len}) + output_len ({self.output_len}) "
                             f"must not exceed the context ({self.context})")
        longest = self.input_distribution.maximum + self.output_distribution.maximum
        if longest > self.context:
            raise ValueError(f"the longest request ({self.input_distribution.maximum} + "
                             f"{self.output_distribution.maximum} tokens) must not exceed the "
                             f"context ({self.context})")
        return self

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        resolve_engine(value)  # raises naming the accepted forms
        return value

    @property
    def engine_release(self) -> EngineRelease:
        """The release `engine` names (solver.cost.serving.engines)."""
        return resolve_engine(self.engine)

    @property
    def input_distribution(self) -> LengthDistribution:
        return self.input_lengths or LengthDistribution.fixed(self.input_len)

    @property
    def output_distribution(self) -> LengthDistribution:
        return self.output_lengths or LengthDistribution.fixed(self.output_len)

    @property
    def kv_bytes_per_element(self) -> float:
        """KV-cache bytes per element: "auto" keeps the model's bf16, fp8 halves it, fp4 is
        vLLM's nvfp4 (its only 4-bit KV layout for GQA/MHA): per head of K or V, head / 2
        bytes of fp4 data and head / 16 of fp8 block scales (vllm 0.33.0
        utils/torch_utils.py nvfp4_kv_cache_full_dim), 9/16 B per element."""
        return {"fp8": 1.0, "fp4": NVFP4_KV_BYTES_PER_ELEMENT}.get(self.kv_cache_dtype, 2.0)


class ServeConstants(BaseModel):
    """Physical constants of the serving model, each with its source; none is tuned per row.

    hbm_fraction 0.8        achievable share of the HBM datasheet bandwidth for streaming
                            weights and KV (aiconfigurator mem_bw_empirical_scaling_factor 0.8,
                            notes §4 [S14]).
    attention_peak_fraction 0.5
                            FlashAttention forward reaches 50-73% of the A100 peak (Dao 2023,
                            arXiv 2307.08691 §4.1), ~75% with FA3 on H100: the lower end.
    gemm_peak_fraction      a GPU without a measured MAMF fraction (catalog) gets the median of
                            the measured ones (solver.cost.kernels.efficiency.ComputeConstants).
    cuda_context_gib 1.0    CUDA context and kernels (ml-engineering, notes §3.4; the training
                            model's MemoryOptions value).
    nccl_gib 0.4            NCCL communicators when an engine has more than one GPU:
                            aiconfigurator reserves 342-392 MB (notes §3.6).
    cuda_graph_gib 1.0      vLLM's captured CUDA graphs: "Graph capturing finished ..., took
                            0.31 GiB" / "took 0.96 GiB" (estimated 1.10 GiB) in public vLLM logs
                            (gpu_model_runner.py prints it); the upper end.
    int4_group_size 128     AWQ / GPTQ checkpoints: one fp16 scale and one 4-bit zero point per
                            128 weights, so 0.5 + 2.5 / 128 bytes per weight.
    logits_bytes 4          the sampler holds fp32 logits of every running sequence.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hbm_fraction: float = Field(default=0.8, gt=0, le=1)
    attention_peak_fraction: float = Field(default=0.5, gt=0, le=1)
    gemm_peak_fraction: float = Field(default=ComputeConstants().gemm_peak_fraction, gt=0, le=1)
    cuda_context_gib: float = Field(default=MemoryOptions().cuda_context_gib, ge=0)
    nccl_gib: float = Field(default=0.4, ge=0)
    cuda_graph_gib: float = Field(default=1.0, ge=0)
    int4_group_size: int = Field(default=128, gt=0)
    logits_bytes: float = Field(default=4.0, gt=0)

    def weight_bytes(self, precision: WeightPrecision) -> float:
        """Bytes per quantized weight: bf16 2, fp8 1, int4 0.5 + (2 + 0.5) / group (scale and
        zero point): 0.5195 with groups of 128; fp4 (NVFP4) 0.5 + one E4M3 scale per 16:
        0.5625 (solver.cost.kernels.precision's nvfp4 recipe)."""
        if precision == "fp4":
            from solver.cost.kernels.precision import load_recipe

            return load_recipe("nvfp4").element_bytes
        if precision == "int4":
            return 0.5 + 2.5 / self.int4_group_size
        return {"bf16": 2.0, "fp8": 1.0}[precision]


class ServeProblem(InputSpec):
    """One serving problem: the model, the cluster, the GPUs available and the job."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    model_spec: ModelSpec
    cluster: ClusterSpec
    num_gpus: GpuCount = Field(gt=0)
    job: ServeJob
    constants: ServeConstants = ServeConstants()
    # Degrees pinned as in optimize (--tp 8, --pp 1-4): the values each may take.
    pins: dict[PinnedDegree, tuple[int, ...]] = Field(default_factory=dict)
    # A disaggregated plan's pools pinned apart (--prefill-tp 8, --decode-tp 2-4); `pins`
    # holds both pools.
    pool_pins: dict[Literal["prefill", "decode"], dict[PoolDegree, tuple[int, ...]]] = Field(
        default_factory=dict)


def scheduler_limits(problem: ServeProblem) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) the engine runs with: the job's, else vLLM's
    defaults."""
    tokens, seqs = vllm_batch_defaults(problem.cluster)
    job = problem.job
    return job.max_num_batched_tokens or tokens, job.max_num_seqs or seqs


def vllm_batch_defaults(cluster: ClusterSpec) -> tuple[int, int]:
    """vLLM's defaults for the OpenAI server, (max_num_batched_tokens, max_num_seqs): 8192 and
    1024 on GPUs of at least 70 GiB that are not A100s, else 2048 and 256 (vllm/engine/
    arg_utils.py get_batch_defaults; the A100 exception is vLLM PR #17885)."""
    gpu = cluster.gpu
    if gpu.memory_gib >= 70 and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256
