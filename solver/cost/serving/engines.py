"""Serving engine releases (issue 38 item 3): `--engine NAME@RELEASE` picks the release whose
scheduler and frontend time the plan; a bare name is the newest release, and the four engine
generations of solver.cost.serving.overhead stay accepted by name. A release between two
listed ones takes the newest listed release at or below it (vllm@0.12 is vllm@0.8's V1).

Each release names its generation (the per-step host overhead: solver.cost.serving.overhead)
and where the release's behaviour is documented:

  vllm@0.6    vllm-v0        V0 engine with the asynchronous output processor and multi-step
                             scheduling (vLLM 0.6.0 release; RFC #6913, RFC #6854)
  vllm@0.8    vllm-v1-sync   the V1 engine on by default (vLLM 0.8.0 release notes), its
                             scheduler run between steps (before async scheduling)
  vllm@0.21   vllm           V1 with asynchronous scheduling on by default (vLLM PR #27614, the
                             last item of the async scheduling plan, issue #27679; the 0.21.0
                             and 0.23.0 runs of benchmarks/data/serve_published.jsonl use it)
  sglang@0.3  sglang-v0.3    SGLang before the overlap scheduler
  sglang@0.4  sglang         the zero-overhead (overlap) batch scheduler on by default (SGLang
                             v0.4 blog, 2024-12-04)

The release between 0.8 and 0.21 that turned async scheduling on is not pinned here: those
releases resolve to vllm@0.8.
"""

from __future__ import annotations

from dataclasses import dataclass

from solver.cost.serving.overhead import ENGINE_NAMES

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class EngineRelease:
    """One release of a serving engine: its name, release, the generation of
    solver.cost.serving.overhead that times its steps, and the source."""

    engine: str
    release: str
    generation: str
    source: str

    @property
    def label(self) -> str:
        return f"{self.engine}@{self.release}"


RELEASES: tuple[EngineRelease, ...] = (
    EngineRelease("vllm", "0.6", "vllm-v0",
                  "vLLM 0.6.0: V0 with the async output processor (RFC #6913) and multi-step "
                  "scheduling (RFC #6854)"),
    EngineRelease("vllm", "0.8", "vllm-v1-sync",
                  "vLLM 0.8.0 release notes: the V1 engine by default; its scheduler runs "
                  "between the steps"),
    EngineRelease("vllm", "0.21", "vllm",
                  "vLLM PR #27614: async scheduling by default (issue #27679's plan)"),
    EngineRelease("sglang", "0.3", "sglang-v0.3",
                  "SGLang 0.3: no overlap scheduler (SGLang v0.4 blog, 2024-12-04)"),
    EngineRelease("sglang", "0.4", "sglang",
                  "SGLang v0.4 blog, 2024-12-04: the zero-overhead batch scheduler"),
)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def resolve_engine(spec: str) -> EngineRelease:
    """The release `spec` names (module docstring): NAME, NAME@RELEASE or a generation of
    solver.cost.serving.overhead. Raises ValueError naming the accepted forms."""
    name, _, release = spec.partition("@")
    known = ", ".join(r.label for r in RELEASES)
    if not release and spec in ENGINE_NAMES and spec not in ENGINES:
        newest = [r for r in RELEASES if r.generation == spec]
        if newest:
            return newest[-1]
    releases = [r for r in RELEASES if r.engine == name]
    if not releases:
        raise ValueError(f"engine {spec!r} is not one of {', '.join(ENGINES)} (with an "
                         f"optional @RELEASE: {known})")
    if not release:
        return releases[-1]
    try:
        wanted = _version(release)
    except ValueError:
        raise ValueError(f"engine {spec!r}: release {release!r} is not a version like 0.12 "
                         f"(known: {known})") from None
    older = [r for r in releases if _version(r.release) <= wanted]
    if not older:
        raise ValueError(f"engine {spec!r}: the oldest release known is "
                         f"{releases[0].label} (known: {known})")
    return older[-1]
