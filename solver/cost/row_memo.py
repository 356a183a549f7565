"""Per-row answers of a pure, vectorised cost function, kept and reused across calls.

The search costs the same degree tuples many times per problem: its first pass, the even
splits, the ranking, each layout's coefficients and the plans all work out the layer terms
(solver.cost.layer_time) of the distinct (tp, cp, ep, etp, micro-batch) tuples among their
candidates, and each recompute module set searched beside the problem (solver.search.
module_variants) works out the same layer compute again. Those functions are pure, and each
row's numbers are computed elementwise whatever else is in the batch, up to the last bit
(numpy takes other code paths for exp, log and powers of arrays of a few elements, and the cost
functions look some values up once per distinct value). So a RowMemo keeps the rows worked
out, per argument set (the model, cluster and job objects, compared by identity: a problem's
specs are the same objects in every call; and a value compared by equality, e.g. the time
constants), for the last few argument sets; a later call takes its rows from it and works out
only the tuples never seen. Each row is worked out once and every later call reads the same
bits, so the phases of a search agree with each other exactly; solver.optimize.solve forgets
everything kept (forget_all) before it starts, so its answer never depends on what was asked
before (tests/test_row_memo.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class _Kept:
    specs: tuple[Any, ...]
    value: Any
    names: tuple[str, ...]
    where: dict[tuple[int, ...], int] = field(default_factory=dict)
    answers: dict[Any, np.ndarray] = field(default_factory=dict)

    def holds(self, specs: tuple[Any, ...], value: Any, names: tuple[str, ...]) -> bool:
        return (self.names == names and len(self.specs) == len(specs)
                and all(a is b for a, b in zip(self.specs, specs)) and self.value == value)


_MEMOS: list[RowMemo] = []


def forget_all() -> None:
    """Forget the rows every RowMemo kept."""
    for memo in _MEMOS:
        memo.clear()


class RowMemo:
    """The rows of `compute`'s answers (a dict of arrays whose first axis is the row) kept for
    the last `keep` argument sets (module docstring)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.kept: list[_Kept] = []
        _MEMOS.append(self)

    def clear(self) -> None:
        self.kept.clear()

    def rows(self, specs: tuple[Any, ...], value: Any, rows: dict[str, np.ndarray],
             names: tuple[str, ...],
             compute: Callable[[dict[str, np.ndarray]], dict[Any, np.ndarray]]
             ) -> dict[Any, np.ndarray]:
        """compute(rows), where the answer depends on the arrays `names` of `rows` only (and
        on `specs` and `value`); rows worked out before are taken from what was kept."""
        kept = next((k for k in self.kept if k.holds(specs, value, names)), None)
        if kept is None:
            kept = _Kept(specs, value, names)
            self.kept.insert(0, kept)
            del self.kept[self.keep:]
        keys = list(zip(*(rows[n].tolist() for n in names)))
        missing = {}
        for i, key in enumerate(keys):
            if key not in kept.where and key not in missing:
                missing[key] = i
        if missing:
            index = list(missing.values())
            fresh = compute({n: v[index] for n, v in rows.items()})
            start = len(kept.where)
            for offset, key in enumerate(missing):
                kept.where[key] = start + offset
            kept.answers = {name: np.concatenate([kept.answers[name], value])
                            if kept.answers else value for name, value in fresh.items()}
        at = np.fromiter((kept.where[key] for key in keys), dtype=np.int64, count=len(keys))
        return {name: value[at] for name, value in kept.answers.items()}
