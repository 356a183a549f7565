"""`parplan serve`: TP, PP, DP and EP for serving a model with vLLM, and the command line."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import click

from solver.cli.help_groups import FRAMEWORK, JOB, GroupedCommand
from solver.cli.params import MAX_TOP, BoundedInt, FiniteFloat, PinSpec
from solver.cli.shared_flags import (
    interval_level_option,
    exit_if_infeasible,
    fail_on_infeasible_option,
    memory_headroom_option,
    min_fit_probability_option,
)
from solver.spec.strict import MAX_GPUS, MAX_SEQ_LEN

DEFAULT_OUTPUT_LEN = 512
DEFAULT_INPUT_LEN = 2048


class ContextLength(click.ParamType):
    """A token count for --context: an integer or a number with k / m (x 1024, as context
    lengths are quoted: 32k = 32,768, 128k = 131,072)."""

    name = "TOKENS"
    _suffixes = {"K": 2**10, "M": 2**20}

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().upper()
        scale = self._suffixes.get(text[-1:], 1)
        number = text[:-1] if text[-1:] in self._suffixes else text
        try:
            tokens = float(number) * scale
        except ValueError:
            self.fail(f"{value!r} is not a token count (e.g. 8192, 32k, 128k)", param, ctx)
        if not 1 <= tokens <= MAX_SEQ_LEN.most or tokens != int(tokens):  # also nan, inf
            self.fail(f"{value!r} must be a whole number of tokens between 1 and 16M", param, ctx)
        return int(tokens)


class LengthSpec(click.ParamType):
    """Request lengths: N tokens, LO-HI (uniform) or @FILE (one length per line)."""

    name = "N|LO-HI|@FILE"

    def convert(self, value: object, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        from solver.serve.workload import LengthDistribution, parse_length_distribution

        if isinstance(value, LengthDistribution):
            return value
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a length", param, ctx)
        flag = param.opts[0] if param is not None else "length"
        try:
            return parse_length_distribution(str(value), flag)
        except ValueError as exc:
            self.fail(str(exc).removeprefix(f"{flag} "), param, ctx)


def _request_lengths(context: int, input_len: int | None, output_len: int | None
                     ) -> tuple[int, int]:
    """Defaults: 512 output tokens and 2,048 input tokens, shortened to fit the context."""
    if output_len is None:
        room = context - input_len if input_len is not None else context
        output_len = max(1, min(DEFAULT_OUTPUT_LEN, context // 4, room))
    if input_len is None:
        input_len = max(1, min(DEFAULT_INPUT_LEN, context - output_len))
    return input_len, output_len


def _default_context(model_spec: Any, cluster_spec: Any, num_gpus: int, precision: str,
                     kv_cache_dtype: str, gpu_memory_utilization: float, engine: str,
                     pins: dict[str, tuple[int, ...]]) -> tuple[int, str]:
    """--context not given: the model's length, capped by what fits (solver.serve.context)."""
    from solver.serve import ServeJob, ServeProblem
    from solver.serve.context import fit_default_context

    longest = model_spec.max_position_embeddings
    job = ServeJob(context=longest, input_len=1, output_len=1, precision=precision,
                   kv_cache_dtype=kv_cache_dtype, gpu_memory_utilization=gpu_memory_utilization,
                   engine=engine)
    return fit_default_context(ServeProblem(model_spec=model_spec, cluster=cluster_spec,
                                            num_gpus=num_gpus, job=job, pins=pins))


def _longest(lengths: Any) -> str:
    if lengths.kind == "fixed":
        return str(lengths.maximum)
    return f"up to {lengths.maximum}"


# The degrees `serve` pins (solver.serve.job.PinnedDegree) and what each means in vLLM's terms.
PIN_HELP = {"tp": "tp", "pp": "pp", "dp": "dp (vLLM --data-parallel-size)",
            "ep": "ep (1, or tp x dp with --enable-expert-parallel)",
            "replicas": "the independent engine copies"}
POOLS = ("prefill", "decode")
POOL_DEGREES = ("tp", "pp", "dp", "ep")  # solver.serve.job.PoolDegree


def _pin_options(command):
    """--tp ... --replicas as optimize's pins (a value, a range A-B or a list), and
    --prefill-tp ... --decode-ep for one pool of a disaggregated plan."""
    for pool in reversed(POOLS):
        for name in reversed(POOL_DEGREES):
            command = click.option(f"--{pool}-{name}", f"pool_{pool}_{name}", type=PinSpec(1),
                                   default=None,
                                   help=f"With --disaggregated: pin the {pool} pool's "
                                        f"{name}.")(command)
    for name in reversed(PIN_HELP):
        command = click.option(f"--{name}", f"pin_{name}", type=PinSpec(1), default=None,
                               help=f"Pin {PIN_HELP[name]}: a value, a range A-B or a "
                                    "list.")(command)
    return command


@click.command(cls=GroupedCommand, groups={"engine": FRAMEWORK, "prices": JOB})
@click.option("--model", required=True, metavar="NAME|PATH",
              help="Zoo name, zoo-format TOML or Hugging Face config.json.")
@click.option("--cluster", "clusters", required=True, multiple=True, metavar="NAME|PATH",
              help="Cluster preset name or cluster TOML file; several (--cluster A --cluster "
                   "B) with --objective gpus: the cluster that serves the job on the fewest "
                   "GPUs (the lowest $/h when all are priced), and what each other needs.")
@click.option("--gpus", "num_gpus", required=True, type=BoundedInt(1, MAX_GPUS),
              help="GPUs available (objective gpus: at most this many).")
@click.option("--gpus-per-node", type=BoundedInt(1, MAX_GPUS), default=None,
              help="GPUs per node (overrides the preset).")
@click.option("--context", type=ContextLength(), default=None,
              help="Longest sequence to serve (vLLM --max-model-len), e.g. 32k [default: the "
                   "model's max_position_embeddings, as vLLM's, or the longest any plan's KV "
                   "cache holds if that does not fit; the answer says which].")
@click.option("--input-len", type=LengthSpec(), default=None,
              help="Prompt tokens per request: N, LO-HI (uniform) or @FILE (one length a "
                   "line) [default: 2048, less if the context is short].")
@click.option("--output-len", type=LengthSpec(), default=None,
              help="Generated tokens per request: N, LO-HI or @FILE [default: 512, less if "
                   "the context is short].")
@click.option("--request-rate", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Load: requests per second of the deployment (Poisson arrivals).")
@click.option("--concurrency", type=BoundedInt(1, MAX_SEQ_LEN), default=None,
              help="Load: concurrent users of the deployment (closed loop).")
@click.option("--client", type=click.Choice(["closed", "poisson", "gamma"]), default=None,
              help="How the benchmark client sends the load: closed (--concurrency: "
                   "vllm bench serve --max-concurrency, synchronised waves), poisson or gamma "
                   "(--request-rate; gamma with --burstiness) [default: closed with "
                   "--concurrency, poisson with --request-rate].")
@click.option("--burstiness", type=FiniteFloat(min=0, min_open=True), default=None,
              help="--client gamma: vllm bench serve's --burstiness, the gamma shape of the "
                   "gaps between requests (1: Poisson; below 1 burstier) [default: 1].")
@click.option("--slo-percentile", type=click.Choice(["p50", "p90", "p95", "p99"]), default="p90",
              show_default=True, help="Percentile at which TTFT and TPOT meet their limits "
                                      "under a load.")
@click.option("--max-num-seqs", type=BoundedInt(1, MAX_SEQ_LEN), default=None,
              help="vLLM's scheduler: most running sequences [default: vLLM's].")
@click.option("--max-num-batched-tokens", type=BoundedInt(1, MAX_SEQ_LEN), default=None,
              help="vLLM's scheduler: token budget of one step [default: vLLM's].")
@click.option("--engine", default="vllm", show_default=True, metavar="NAME[@RELEASE]",
              help="Serving engine release whose scheduler and frontend time the plan: vllm or "
                   "sglang, @RELEASE picks a release (vllm@0.6: V0; vllm@0.8: V1; vllm@0.21: "
                   "V1 with async scheduling; sglang@0.3; sglang@0.4: the overlap "
                   "scheduler); a bare name is the newest.")
@click.option("--disaggregated", is_flag=True,
              help="Also search prefill and decode pools (KV transfer between them) against "
                   "the best aggregated plan; with two --cluster, prefill on the first and "
                   "decode on the second, sized for --request-rate.")
@click.option("--pareto", is_flag=True,
              help="Also list the tokens/s/user vs tokens/s/GPU front (SLO-feasible marked).")
@click.option("--report", "report_dir", metavar="DIR", default=None,
              help="With --pareto: also draw the front on a report page (DIR/index.html).")
@click.option("--precision", type=click.Choice(["bf16", "fp8", "int4", "fp4"]), default="bf16",
              show_default=True,
              help="Weights (fp8: --quantization fp8; int4: AWQ/GPTQ; fp4: an NVFP4 checkpoint).")
@click.option("--kv-cache-dtype", type=click.Choice(["auto", "fp8", "fp4"]), default="auto",
              show_default=True, help="KV-cache dtype (vLLM --kv-cache-dtype; fp4 is nvfp4).")
@click.option("--gpu-memory-utilization", type=FiniteFloat(0, 1, min_open=True),
              default=0.9, show_default=True, help="vLLM's share of each GPU's memory.")
@click.option("--max-ttft-ms", type=FiniteFloat(min=0, min_open=True), default=None,
              help="SLO: time to first token (one prompt alone; under a load at the SLO "
                   "percentile).")
@click.option("--max-tpot-ms", type=FiniteFloat(min=0, min_open=True), default=None,
              help="SLO: time per output token each user sees (idle; under a load at the "
                   "SLO percentile).")
@click.option("--min-tokens-per-s", type=FiniteFloat(min=0, min_open=True), default=None,
              help="Target: output tokens per second of the deployment.")
@click.option("--objective", type=click.Choice(["throughput", "latency", "gpus", "cost",
                                                "energy"]),
              default="throughput", show_default=True,
              help="Most tokens/s, fastest request, fewest GPUs meeting the targets, or the "
                   "least $ (needs --price-per-gpu-hour) or kWh at board power per output "
                   "token (under a load: per request/s).")
@click.option("--top", type=BoundedInt(1, MAX_TOP), default=5, show_default=True,
              help="How many plans to list.")
@click.option("--calibration", metavar="FILE", default=None,
              help="Fitted bandwidth curves (`parplan calibrate`).")
@click.option("--price-per-gpu-hour", "prices", multiple=True, metavar="PRICE|NAME=PRICE",
              help="$ per GPU-hour (one cluster: PRICE; several: NAME=PRICE per --cluster): "
                   "adds $ per million output and input tokens, and output tokens per joule "
                   "at the GPUs' board power, to every plan and Pareto point.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
@_pin_options
@memory_headroom_option
@min_fit_probability_option
@fail_on_infeasible_option
@interval_level_option
def serve(model: str, clusters: tuple[str, ...], num_gpus: int, gpus_per_node: int | None,
          context: int | None, input_len: Any, output_len: Any, request_rate: float | None,
          concurrency: int | None, client: str | None, burstiness: float | None,
          slo_percentile: str, max_num_seqs: int | None,
          max_num_batched_tokens: int | None, engine: str, disaggregated: bool, pareto: bool,
          report_dir: str | None, precision: str,
          kv_cache_dtype: str, gpu_memory_utilization: float, max_ttft_ms: float | None,
          max_tpot_ms: float | None, min_tokens_per_s: float | None, objective: str, top: int,
          calibration: str | None, prices: tuple[str, ...], as_json: bool,
          memory_headroom: Any, min_fit_probability: float | None,
          fail_on_infeasible: bool, interval_level: float, **pin_values: Any) -> None:
    """Serving plans for vLLM: TP, PP, DP and EP, KV-cache capacity, latency, throughput."""
    from pydantic import ValidationError

    from solver.calibrate.profile import load_calibrated_cluster
    from solver.cli.shared_flags import check_fit_flags
    from solver.cost.uncertainty import build_error_headroom, load_error_model
    from solver.catalog import list_gpu_names, load_gpu_spec, load_model_spec
    from solver.cli.render import echo_json
    from solver.cli.render_serve import echo_serve_result, render_serve_json, write_serve_report
    from solver.errors import InputError, format_validation_error
    from solver.cli.render_serve_clusters import (
        echo_clusters,
        echo_two_clusters,
        render_clusters_json,
        render_two_clusters_json,
    )
    from solver.serve import ServeJob, ServeProblem, solve_serving
    from solver.serve.across import ClusterOption, choose_cluster
    from solver.serve.disagg_across import search_two_clusters
    from solver.serve.workload import ServeLoadSpec

    if request_rate is not None and concurrency is not None:
        raise InputError("--request-rate and --concurrency: give one load, not both")
    try:
        load = ServeLoadSpec(request_rate=request_rate, concurrency=concurrency,
                             slo_percentile=int(slo_percentile[1:]), client=client,
                             burstiness=burstiness)
    except ValidationError as exc:  # the load's own rule, as one line naming the flags
        reason = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise InputError(f"--client / --burstiness: {reason}") from None
    pins = {name.removeprefix("pin_"): values for name, values in pin_values.items()
            if values is not None and name.startswith("pin_")}
    pool_pins: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, values in pin_values.items():
        if values is not None and name.startswith("pool_"):
            pool, degree = name.removeprefix("pool_").split("_")
            if not disaggregated:
                raise InputError(f"--{pool}-{degree}: pins a disaggregated pool; add "
                                 "--disaggregated")
            pool_pins.setdefault(pool, {})[degree] = values
    if len(clusters) > 1 and objective != "gpus":
        raise InputError(f"--cluster given {len(clusters)} times: several clusters are "
                         "compared with --objective gpus")
    if len(set(clusters)) < len(clusters):
        raise InputError("--cluster: each cluster once")
    across = disaggregated and len(clusters) > 1  # prefill on the first, decode on the second
    if across and len(clusters) != 2:
        raise InputError(f"--disaggregated with {len(clusters)} clusters: give two, prefill on "
                         "the first --cluster and decode on the second")
    if across and request_rate is None:
        raise InputError("--disaggregated across two clusters sizes both pools for a load: "
                         "add --request-rate")
    price_of = parse_prices(prices, clusters)
    if objective == "cost" and not price_of:
        raise InputError("--objective cost needs --price-per-gpu-hour (the catalog carries no "
                         "prices)")
    model_spec = load_model_spec(model)
    check_fit_flags(memory_headroom, min_fit_probability)
    cluster_specs = []
    # --memory-headroom; by default none beyond the engine's memory share, which is its own
    # headroom (render_serve_memory_rule says why: the error margin is training's), unless
    # --min-fit-probability asks for the engine's memory error margin at that chance.
    for name in clusters:
        cluster_spec = load_calibrated_cluster(name, gpus_per_node, calibration)
        if min_fit_probability is not None:
            cluster_spec = cluster_spec.with_memory_headroom(
                build_error_headroom(load_error_model(), engine, min_fit_probability))
        elif memory_headroom is not None:
            cluster_spec = cluster_spec.with_memory_headroom(memory_headroom)
        if objective == "energy" and cluster_spec.gpu.power_limit_w is None:
            raise InputError(f"--objective energy: the catalog has no board power for "
                             f"{cluster_spec.gpu.name} (power_limit_w in its GPU entry)")
        cluster_specs.append(cluster_spec)
    context_source = "given"
    if context is None:  # several clusters: the shortest of their defaults, so all serve it
        context, context_source = min(
            _default_context(model_spec, spec, num_gpus, precision, kv_cache_dtype,
                             gpu_memory_utilization, engine, pins) for spec in cluster_specs)
    if report_dir is not None and not pareto:
        raise InputError(f"--report {report_dir}: the page draws the Pareto front; add --pareto")
    inputs, outputs = input_len, output_len
    longest_in = inputs.maximum if inputs is not None else None
    longest_out = outputs.maximum if outputs is not None else None
    if longest_in is not None and longest_out is not None and longest_in + longest_out > context:
        raise InputError(f"--input-len ({_longest(inputs)}) + --output-len ({_longest(outputs)}) "
                         f"must not exceed --context ({context})")
    if longest_in is not None and longest_in >= context:
        raise InputError(f"--input-len ({_longest(inputs)}) must leave room in --context "
                         f"({context}) for at least one output token")
    input_len, output_len = _request_lengths(
        context, None if inputs is None else longest_in,
        None if outputs is None else longest_out)
    if inputs is not None and inputs.kind != "fixed":
        input_len = max(1, round(inputs.mean))
    if outputs is not None and outputs.kind != "fixed":
        output_len = max(1, round(outputs.mean))
    try:
        job = ServeJob(context=context, input_len=input_len, output_len=output_len,
                       precision=precision, kv_cache_dtype=kv_cache_dtype,
                       gpu_memory_utilization=gpu_memory_utilization, max_ttft_ms=max_ttft_ms,
                       max_tpot_ms=max_tpot_ms, min_tokens_per_s=min_tokens_per_s,
                       objective=objective,
                       input_lengths=inputs if inputs is not None and inputs.kind != "fixed"
                       else None,
                       output_lengths=outputs if outputs is not None and outputs.kind != "fixed"
                       else None,
                       load=load, context_source=context_source,
                       max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                       engine=engine)
    except ValidationError as exc:
        raise InputError(format_validation_error("serve options", exc)) from None
    other_gpus = [load_gpu_spec(name) for name in list_gpu_names()]
    options = []
    for name, cluster_spec in zip(clusters, cluster_specs):
        problem = ServeProblem(model_spec=model_spec, cluster=cluster_spec, num_gpus=num_gpus,
                               job=job, pins=pins, pool_pins=pool_pins)
        result = solve_serving(problem, top=top, other_gpus=other_gpus, pareto=pareto,
                               disaggregated=disaggregated and not across)
        options.append(ClusterOption(name, replace(result, price_per_gpu_hour=price_of.get(name)),
                                     price_of.get(name)))
    choice = choose_cluster(options)
    two = None
    if across:
        first, second = (o.result.problem for o in options)
        two = search_two_clusters(first, second, top, *(price_of.get(n) for n in clusters))
    result = choice.result
    if report_dir is not None:
        write_serve_report(result, report_dir)
    if as_json:
        answer = render_serve_json(result, interval_level)
        if len(options) > 1:
            answer["across_clusters"] = render_clusters_json(choice)
        if two is not None:
            answer["disaggregated_across_clusters"] = render_two_clusters_json(two)
        echo_json(answer)
    else:
        if len(options) > 1:
            echo_clusters(choice)
        echo_serve_result(result, interval_level)
        if two is not None:
            echo_two_clusters(two)
    exit_if_infeasible(result.status == "infeasible", fail_on_infeasible)


def parse_prices(values: tuple[str, ...], clusters: tuple[str, ...]) -> dict[str, float]:
    """--price-per-gpu-hour: PRICE for the one cluster, or NAME=PRICE for each cluster
    named (a cluster left out is not priced)."""
    from solver.errors import InputError

    prices: dict[str, float] = {}
    for value in values:
        name, _, number = value.rpartition("=")
        if not name:
            if len(clusters) > 1 or len(values) > 1:
                raise InputError(f"--price-per-gpu-hour {value}: with several clusters give "
                                 "NAME=PRICE for each --cluster")
            name = clusters[0]
        if name not in clusters:
            raise InputError(f"--price-per-gpu-hour {value}: {name!r} is not a --cluster "
                             f"given ({', '.join(clusters)})")
        try:
            price = float(number)
        except ValueError:
            price = float("nan")
        if not math.isfinite(price) or price <= 0:
            raise InputError(f"--price-per-gpu-hour {value}: the price must be a positive "
                             "number of dollars")
        if name in prices:
            raise InputError(f"--price-per-gpu-hour {value}: {name} priced twice")
        prices[name] = price
    return prices
