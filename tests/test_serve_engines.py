"""Serving engine releases and their frontend (issue 38 item 3): `--engine NAME@RELEASE`
resolves to the release at or below it (solver.cost.serving.engines), and every engine's
OpenAI-compatible frontend adds its per-request time to the first token
(solver.cost.serving.overhead.frontend_s), pinned to the vLLM profiles it comes from."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from solver.cli import cli
from solver.cost.serving.engines import RELEASES, resolve_engine
from solver.cost.serving.overhead import (
    ENGINE_NAMES,
    EngineOverhead,
    engine_overhead,
)
from solver.serve import ServeJob
from solver.serve.candidates import ServeCandidates
from solver.serve.timing import build_engine, estimate_ttft_s
from test_serve_load import problem_of


@pytest.mark.parametrize("spec, label, generation", [
    ("vllm", "vllm@0.21", "vllm"), ("vllm@0.23", "vllm@0.21", "vllm"),
    ("vllm@0.12", "vllm@0.8", "vllm-v1-sync"), ("vllm@0.6.3", "vllm@0.6", "vllm-v0"),
    ("vllm@0.7", "vllm@0.6", "vllm-v0"), ("sglang", "sglang@0.4", "sglang"),
    ("sglang@0.3.0", "sglang@0.3", "sglang-v0.3"), ("vllm-v0", "vllm@0.6", "vllm-v0"),
    ("sglang-v0.3", "sglang@0.3", "sglang-v0.3"), ("vllm-v1-sync", "vllm@0.8", "vllm-v1-sync")])
def test_a_release_resolves_to_the_newest_listed_at_or_below_it(spec, label, generation) -> None:
    """A bare name is the newest release; vllm@0.12 falls between vLLM 0.8 (V1 by default)
    and the async-scheduling default, so it is 0.8's V1; the generation names stay."""
    release = resolve_engine(spec)
    assert (release.label, release.generation) == (label, generation)


def test_every_release_has_a_generation_and_a_source() -> None:
    for release in RELEASES:
        assert release.generation in ENGINE_NAMES and release.source
    assert set(ENGINE_NAMES) == {r.generation for r in RELEASES}


@pytest.mark.parametrize("spec, words", [("tgi", "is not one of vllm, sglang"),
                                         ("vllm@new", "is not a version"),
                                         ("vllm@0.5", "oldest release known is vllm@0.6")])
def test_an_unknown_engine_is_refused_naming_the_accepted_forms(spec, words) -> None:
    with pytest.raises(ValueError, match=words):
        resolve_engine(spec)
    result = CliRunner().invoke(cli, ["serve", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "1", "--context", "4096",
                                      "--engine", spec])
    assert result.exit_code == 2
    assert words in result.output and len(result.output.strip().splitlines()) == 1


def test_multi_step_scheduling_needs_a_v0_release() -> None:
    """--num-scheduler-steps is vLLM 0.6's multi-step scheduling (RFC #6854), gone in V1."""
    ServeJob(context=4096, input_len=1024, output_len=128, engine="vllm@0.6",
             num_scheduler_steps=8)
    with pytest.raises(ValidationError, match="engine must be vllm-v0"):
        ServeJob(context=4096, input_len=1024, output_len=128, engine="vllm@0.8",
                 num_scheduler_steps=8)


def test_frontend_time_of_a_prompt_by_hand() -> None:
    """vLLM PR #27407 (Xeon Platinum 8575C + H20): 8.2998 ms through the API server, of which
    _collect_batch, the engine's work, is 4.4449 ms: 3.855 ms of frontend. PR #19334: 100
    prompts of 10,000 tokens in 1.338 s: 1.338 us a token. A 1,024-token prompt: 3.855 +
    1.370 = 5.225 ms."""
    overhead = engine_overhead("vllm")
    assert overhead.request_s == pytest.approx(3.8549e-3, rel=1e-4)
    assert float(overhead.frontend_s(1024)) == pytest.approx(5.2250e-3, rel=1e-4)
    for name in ENGINE_NAMES:  # every engine has an OpenAI-compatible frontend
        assert engine_overhead(name).request_s == overhead.request_s
    assert float(EngineOverhead().frontend_s(1024)) == 0.0


def test_the_frontend_adds_to_the_idle_ttft_once() -> None:
    """One Llama-3.1-8B prompt alone on an H100: the idle TTFT is the chunks plus the
    frontend's 3.855 + 2,048 x 1.338 us = 6.6 ms, whatever the engine generation's steps."""
    problem = problem_of("llama3.1-8b", 1)
    c = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    engine = build_engine(problem, c)
    bare = replace(engine, overhead=replace(engine.overhead, request_s=0.0, prompt_token_s=0.0))
    with_frontend = float(estimate_ttft_s(problem, engine)[0])
    without = float(estimate_ttft_s(problem, bare)[0])
    assert with_frontend - without == pytest.approx(
        float(engine.overhead.frontend_s(problem.job.input_len)), rel=1e-9)


def test_the_workload_line_names_the_engine_release() -> None:
    result = CliRunner().invoke(cli, ["serve", "--model", "llama3.1-8b", "--cluster",
                                      "dgx-h100", "--gpus", "1", "--context", "4096",
                                      "--input-len", "1024", "--output-len", "128",
                                      "--concurrency", "4", "--engine", "vllm@0.12"])
    assert result.exit_code == 0, result.output
    assert "engine vllm@0.8" in result.output


def test_the_frontend_serves_one_request_at_a_time() -> None:
    """GPUStack's 1,000 prompts of 128 + 4 tokens to gpt-oss-120b on one H100 ran at 129.48
    requests/s (docs/performance-lab/gpt-oss-120b/h100.md at 47277d7); the GPU alone would
    take 616 a second, the frontend's 3.855 ms + 128 x 1.338 us = 4.03 ms a request caps it at
    248: the closed loop's rate and the open loop's largest stable rate stay under the cap."""
    from solver.cost.serving.load import largest_stable_rate
    from solver.serve.load import estimate_serving_load
    from tests.test_serve_closed import problem_of as closed_problem

    problem = closed_problem("gpt-oss-120b", "dgx-h100", 1, "fp4", 128, 4, concurrency=1000)
    c = ServeCandidates(tp=1, pp=1, dp=1, ep=1, replicas=1)
    load = estimate_serving_load(problem, c)
    cap = 1.0 / float(engine_overhead("vllm").frontend_s(128))
    assert cap == pytest.approx(248.3, rel=1e-3)
    assert float(load.point.rate_per_s[0]) <= cap * (1 + 1e-6)
    assert float(load.point.rate_per_s[0]) == pytest.approx(cap, rel=0.01)
    assert float(largest_stable_rate(load.curves)[0]) <= cap * (1 + 1e-6)
