"""The memory tables of the CP-SAT program, filled by the numpy cost model (grids and
lookups: solver.search.grid).

Worst-stage memory (solver.cost.memory), over a few **stage slots**: for each (pp, vpp) the
stages that no other stage dominates (more of every layer kind, micro-batches in flight, the
embedding, the LM head), for every number of micro-batches; the memory of a stage is a sum
of non-negative coefficients times those stage features, so the worst stage is one of them:
    states_s = dense_s(tp, pp, vpp, zero)       weights, grads, optimizer of the dense
               + expert_s(pp, vpp, zero, g)     parameters and of the routed experts (exact:
               + gather_s(tp, pp, vpp, zero[, g])  they shard over different groups), and the
                                                ZeRO-3 gather of the largest layer
    in_flight x dense layers, x MoE layers, x embedding, x (not last)   (pp, vpp, dm) features
    layer_dense(tp, r, recompute), layer_moe(tp, r, recompute, etp), embedding(tp, r),
    stage_output(tp, r)                         activations per layer / per micro-batch in flight
    last_stage(tp, r, recompute, etp)           LM head inputs, MTP, logits
    working_set_s(tp, r, etp, kind_s)           full recompute: the largest layer replayed
    memory_s = (1 + fragmentation) x (states + sum features x activations + [last] last_stage
               + [full] working_set + buckets) + CUDA context + NCCL
All memory tables already carry the (1 + fragmentation) factor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from solver.cost.candidates import Candidates
from solver.cost.memory import estimate_stage_memory
from solver.cost.memory.overheads import estimate_zero3_gather_bytes
from solver.cost.memory.states import estimate_model_states, estimate_stage_params
from solver.cost.memory.activations import (
    estimate_layer_activation_bytes,
    estimate_logits_bytes,
    estimate_stage_activations,
)
from solver.cost.memory.layout import StageLayout, estimate_stage_layout
from solver.search.grid import (
    RECOMPUTE_FULL,
    Lattice,
    Table,
    build_grid,
    divides,
    lookup_values,
    make_candidates,
    rows_of,
    whole,
)
from solver.search.space import Problem

# ---- memory ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class MemoryTables:
    """Memory terms (bytes) per stage slot and shared per-layer activations."""

    slots: int
    states: list[list[Table]]      # per slot: its parts (dense, expert, ZeRO-3 gather)
    features: list[dict[str, Table]]  # per slot: in-flight products, last, kind
    working_set: list[Table]       # per slot
    activations: dict[str, Table]  # layer_dense, layer_moe, embedding, stage_output, last_stage
    fixed_bytes: float
    feature_scale: int             # features are integers in units of 1 / feature_scale


STAGE_FEATURES = ("dense", "moe", "first", "not_last")  # multiplied by micro-batches in flight


def _stage_features(layout: StageLayout, scale: int) -> dict[str, np.ndarray]:
    flight = layout.in_flight
    out = {
        "dense": flight * layout.num_dense_layers,
        "moe": flight * layout.num_moe_layers,
        "first": flight * layout.is_first,
        "not_last": flight * ~layout.is_last,
    }
    out = {k: np.rint(v * scale).astype(np.int64) for k, v in out.items()}
    out["last"] = layout.is_last.astype(np.int64)
    out["kind"] = ((layout.num_dense_layers > 0).astype(np.int64)
                   + 2 * (layout.num_moe_layers > 0).astype(np.int64))
    out["num_dense"] = layout.num_dense_layers.astype(np.int64)
    out["num_moe"] = layout.num_moe_layers.astype(np.int64)
    return out


def _layout(problem: Problem, candidates: Candidates, stage: np.ndarray) -> StageLayout:
    return estimate_stage_layout(problem.model_spec, problem.job, candidates, stage,
                                 problem.memory_options.account_for_embedding_in_pipeline_split)


def select_stage_slots(problem: Problem, lattice: Lattice) -> dict[tuple[int, int], list[int]]:
    """For each (pp, vpp) of the domains, the stages that can be the worst one: those no other
    stage dominates (every feature at least as large) for some number of micro-batches."""
    pps, vpps = lattice.domains["pp"], lattice.domains["vpp"]
    dms = sorted({d * b for d in lattice.domains["dp"] for b in lattice.domains["micro_batch"]})
    rows = [(pp, vpp, dm, s) for pp in pps for vpp in vpps for dm in dms for s in range(pp)]
    if not rows:
        return {}
    pp, vpp, dm, stage = (np.array(col, dtype=np.int64) for col in zip(*rows))
    c = make_candidates(len(pp), pp=pp, vpp=vpp, dp=dm)
    f = _stage_features(_layout(problem, c, stage), 1)
    keys = ("dense", "moe", "first", "not_last", "last", "num_dense", "num_moe")
    matrix = np.stack([f[k] for k in keys] + [f["kind"] & 1, f["kind"] >> 1], axis=1)
    slots: dict[tuple[int, int], set[int]] = {}
    start = 0
    for p in pps:
        earlier = np.tril(np.ones((p, p), bool), -1).T  # earlier[j, i]: j < i
        for v in vpps:
            block = matrix[start:start + p * len(dms)].reshape(len(dms), p, -1)
            start += p * len(dms)
            ge = (block[:, :, None, :] >= block[:, None, :, :]).all(axis=3)  # [d, j, i]: j >= i
            gt = (block[:, :, None, :] > block[:, None, :, :]).any(axis=3)
            dominated = (ge & (gt | earlier)).any(axis=1)  # [d, i]
            slots[(p, v)] = set(np.flatnonzero((~dominated).any(axis=0)).tolist())
    return {key: sorted(v) for key, v in slots.items()}


def first_stage_slots(lattice: Lattice) -> dict[tuple[int, int], list[int]]:
    """One slot, the first stage, for each (pp, vpp) of the domains: any stage's memory is a
    lower bound of the worst stage's, and the first stage (the embedding and the most
    micro-batches in flight) is the first one select_stage_slots keeps on every zoo problem
    of benchmarks/solve_time.py, without the cost of finding the others."""
    return {(pp, vpp): [0] for pp in lattice.domains["pp"] for vpp in lattice.domains["vpp"]}


def build_memory_tables(problem: Problem, lattice: Lattice,
                        slots: Mapping[tuple[int, int], Sequence[int]],
                        feature_scale: int, max_slots: int | None = None) -> MemoryTables:
    """Every memory table of the module docstring, for the first `max_slots` stage slots;
    valid wherever tp x cp x pp x dp equals the GPU count (no other identity is assumed)."""
    m, job, options = problem.model_spec, problem.job, problem.memory_options
    n_gpus = problem.num_gpus
    grow = 1.0 + options.fragmentation
    num_slots = max((len(v) for v in slots.values()), default=1)
    num_slots = min(num_slots, max_slots or num_slots)

    keys = sorted(slots)
    key_pp = np.array([p for p, _ in keys], dtype=np.int64)
    key_vpp = np.array([v for _, v in keys], dtype=np.int64)
    stage_of = np.array([[chosen[k] if k < len(chosen) else chosen[0] for k in range(num_slots)]
                         for chosen in (slots[key] for key in keys)], dtype=np.int64).reshape(
        len(keys), num_slots)

    def slot_stage(pp: np.ndarray, vpp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Stage of slot k for each (pp, vpp), and whether (pp, vpp) is in the domains."""
        match = (pp[:, None] == key_pp[None, :]) & (vpp[:, None] == key_vpp[None, :])
        known = match.any(axis=1)
        stage = np.where(known, stage_of[match.argmax(axis=1), k] if len(keys) else 0, 0)
        return stage.astype(np.int64), known

    def table(name: str, axes: Sequence[str], fill, categories=None) -> Table:
        grid = build_grid(lattice, axes, categories)
        p = grid.points()
        values, reachable = fill(p, grid.size)
        return Table(name, grid, np.asarray(values, float),
                     np.broadcast_to(np.asarray(reachable, bool), (grid.size,)).copy())

    states, features, working = [], [], []
    kind_range = {"kind": (0, 3)}
    for k in range(num_slots):
        def fill_states(kind: str, k: int = k):
            def fill(p, size):
                pp, vpp = whole(p, "pp"), whole(p, "vpp")
                split = whole(p, "g") if kind == "expert" else whole(p, "tp")
                stage, known = slot_stage(pp, vpp, k)
                reachable = known & divides(split * pp, n_gpus)
                rest = np.where(reachable, n_gpus // (split * pp), 1)
                c = (make_candidates(size, pp=pp, dp=rest * split, ep=split, vpp=vpp,
                                     zero=p["zero"]) if kind == "expert" else
                     make_candidates(size, tp=split, pp=pp, dp=rest, vpp=vpp, zero=p["zero"],
                                     ep=whole(p, "g") if "g_num" in p else 1))
                layout = _layout(problem, c, stage)
                params = estimate_stage_params(m, c, layout, options)
                if kind == "gather":
                    return grow * estimate_zero3_gather_bytes(c, params, options), reachable
                states = estimate_model_states(job, c, params, options, (kind,))
                return grow * (states["weights"] + states["grads"] + states["optimizer"]), \
                    reachable
            return fill

        parts = [table(f"states_dense_{k}", ("tp", "pp", "vpp", "zero"), fill_states("dense"))]
        if m.is_moe:
            parts.append(table(f"states_expert_{k}", ("pp", "vpp", "zero", "g"),
                               fill_states("expert")))
        gather_axes = ("tp", "pp", "vpp", "zero", "g") if m.is_moe else ("tp", "pp", "vpp", "zero")
        parts.append(table(f"states_gather_{k}", gather_axes, fill_states("gather")))
        states.append(parts)

        feats: dict[str, Table] = {}
        for key in (*STAGE_FEATURES, "last", "kind"):
            axes = ("pp", "vpp") if key in ("last", "kind") else ("pp", "vpp", "dm")

            def fill_feature(p, size, k=k, key=key, axes=axes):
                pp, vpp = whole(p, "pp"), whole(p, "vpp")
                dm = whole(p, "dm") if "dm" in axes else np.ones(size, dtype=np.int64)
                stage, known = slot_stage(pp, vpp, k)
                c = make_candidates(size, pp=pp, vpp=vpp, dp=dm)
                return _stage_features(_layout(problem, c, stage), feature_scale)[key], known

            feats[key] = table(f"{key}_{k}", axes, fill_feature)
        features.append(feats)

    def layout_of(size: int, dense=0.0, moe_layers=0.0, first=False, last=False, flight=0.0):
        full = np.full(size, 1.0)
        return StageLayout(num_dense_layers=dense * full, num_moe_layers=moe_layers * full,
                           is_first=np.full(size, first), is_last=np.full(size, last),
                           num_microbatches=np.ones(size, dtype=np.int64),
                           in_flight=flight * full)

    def rows(p, size, recompute=0, etp=None):
        return make_candidates(size, tp=whole(p, "tp"), **rows_of(p, "r"), recompute=recompute,
                           etp=1 if etp is None else etp)

    def activations(c: Candidates, layout: StageLayout) -> np.ndarray:
        return estimate_stage_activations(m, job, c, layout, options)

    for k in range(num_slots):
        def fill_working(p, size):
            c = rows(p, size, RECOMPUTE_FULL, whole(p, "etp") if m.is_moe else None)
            kind = p["kind"]
            layout = replace(layout_of(size), num_dense_layers=(kind & 1).astype(float),
                             num_moe_layers=(kind >> 1).astype(float))
            return grow * activations(c, layout), True

        working.append(table(f"working_set_{k}", ("tp", "r", "etp", "kind") if m.is_moe
                             else ("tp", "r", "kind"), fill_working, kind_range))

    shared: dict[str, Table] = {}

    def fill_layer(moe: bool):
        def fill(p, size):
            c = rows(p, size, p["recompute"], whole(p, "etp") if moe else None)
            return grow * estimate_layer_activation_bytes(m, job, c, options, moe=moe), True
        return fill

    shared["layer_dense"] = table("layer_dense", ("tp", "r", "recompute"), fill_layer(False))
    if m.is_moe:
        shared["layer_moe"] = table("layer_moe", ("tp", "r", "recompute", "etp"),
                                    fill_layer(True))

    def fill_output(p, size):
        return grow * activations(rows(p, size), layout_of(size, flight=1.0)), True

    def fill_embedding(p, size):
        c = rows(p, size)
        both = activations(c, layout_of(size, first=True, flight=1.0))
        return grow * (both - activations(c, layout_of(size, flight=1.0))), True

    def fill_last(p, size):
        c = rows(p, size, p["recompute"], whole(p, "etp") if m.is_moe else None)
        layout = layout_of(size, last=True)
        return grow * (activations(c, layout) + estimate_logits_bytes(m, job, c, layout,
                                                                     options)), True

    shared["stage_output"] = table("stage_output", ("tp", "r"), fill_output)
    shared["embedding"] = table("embedding", ("tp", "r"), fill_embedding)
    shared["last_stage"] = table("last_stage", ("tp", "r", "recompute", "etp") if m.is_moe
                                 else ("tp", "r", "recompute"), fill_last)

    one = make_candidates(1)
    items = estimate_stage_memory(m, job, one, 0, options).items
    fixed = grow * items["comm_buckets"][0] + items["cuda_context"][0] + items["nccl"][0]
    return MemoryTables(num_slots, states, features, working, shared, float(fixed),
                        feature_scale)




def compose_memory(problem: Problem, tables: MemoryTables, candidates: Candidates,
                   slots: Sequence[int] | None = None) -> np.ndarray:
    """Worst-stage bytes of each candidate from the tables (the largest of the stage slots),
    composed as cpsat_encoding.add_memory_fits_hbm encodes."""
    full = candidates.recompute == RECOMPUTE_FULL
    uses = {"dense": "layer_dense", "moe": "layer_moe", "first": "embedding",
            "not_last": "stage_output"}
    worst = np.zeros(len(candidates))
    for k in range(tables.slots) if slots is None else slots:
        feats = tables.features[k]
        total = sum(lookup_values(part, candidates) for part in tables.states[k])
        total = total + tables.fixed_bytes
        for key, name in uses.items():
            if name in tables.activations:
                count = lookup_values(feats[key], candidates) / tables.feature_scale
                total = total + count * lookup_values(tables.activations[name], candidates)
        total = total + lookup_values(feats["last"], candidates) * lookup_values(
            tables.activations["last_stage"], candidates)
        kind = lookup_values(feats["kind"], candidates).astype(np.int64)
        working = lookup_values(tables.working_set[k], candidates, {"kind": kind})
        worst = np.maximum(worst, total + np.where(full, working, 0.0))
    return worst
