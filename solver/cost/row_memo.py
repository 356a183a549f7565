"""Per-row answers of a pure, vectorised cost function, kept and reused across calls.

The search costs the same degree tuples many times per problem: its first pass, the even
splits, the ranking, each layout's coefficients and the plans all work out the layer terms
(solver.cost.layers.layer_time) of the distinct (tp, cp, ep, etp, micro-batch) tuples among their
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


# Each name's values get codes 0, 1, ... as they first appear; a row's key packs its codes
# in digits of 63 // len(names) bits (10 degrees: 6 bits, 64 values of each).
KEY_BITS = 63


@dataclass
class _Kept:
    specs: tuple[Any, ...]
    value: Any
    names: tuple[str, ...]
    codes: list[np.ndarray] = field(default_factory=list)  # per name: value -> code
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # sorted
    at: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # their rows
    answers: dict[Any, np.ndarray] = field(default_factory=dict)

    def holds(self, specs: tuple[Any, ...], value: Any, names: tuple[str, ...]) -> bool:
        return (self.names == names and len(self.specs) == len(specs)
                and all(a is b for a, b in zip(self.specs, specs)) and self.value == value)

    def pack(self, rows: dict[str, np.ndarray]) -> np.ndarray | None:
        """Each row's key: its values of `names` as codes, one digit each; None where a name
        has more values than a digit holds (or a value is negative)."""
        if not self.codes:
            self.codes = [np.zeros(0, dtype=np.int64) for _ in self.names]
        radix = 1 << (KEY_BITS // len(self.names))
        key = np.zeros(len(rows[self.names[0]]), dtype=np.int64)
        for position, name in enumerate(self.names):
            column = np.asarray(rows[name], dtype=np.int64)
            if column.min() < 0:
                return None
            table = self.codes[position]  # value -> code, -1 where not seen yet
            if column.max() >= len(table):
                grown = np.full(int(column.max()) + 1, -1, dtype=np.int64)
                grown[:len(table)] = table
                self.codes[position] = table = grown
            codes = table[column]
            if (codes < 0).any():
                new = np.unique(column[codes < 0])
                table[new] = int(table.max(initial=-1)) + 1 + np.arange(len(new))
                codes = table[column]
            if int(table.max(initial=-1)) >= radix:
                return None
            key = key * radix + codes
        return key

    def find(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(whether each key is kept, where its sorted copy sits)."""
        place = np.searchsorted(self.keys, key)
        inside = np.minimum(place, max(len(self.keys) - 1, 0))
        found = (place < len(self.keys)) & (self.keys[inside] == key) if len(self.keys) \
            else np.zeros(len(key), dtype=bool)
        return found, inside


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
        key = kept.pack(rows) if len(rows[names[0]]) else None
        if key is None:  # no rows, or more values of a name than the keys hold: not kept
            return compute(rows)
        found, _ = kept.find(key)
        if not found.all():
            missing = np.flatnonzero(~found)
            new_keys, first = np.unique(key[missing], return_index=True)
            index = missing[first]
            fresh = compute({n: v[index] for n, v in rows.items()})
            start = len(kept.at)
            kept.answers = {name: np.concatenate([kept.answers[name], value])
                            if kept.answers else value for name, value in fresh.items()}
            keys = np.concatenate([kept.keys, new_keys])
            at = np.concatenate([kept.at, start + np.arange(len(new_keys))])
            order = np.argsort(keys, kind="stable")
            kept.keys, kept.at = keys[order], at[order]
        _, inside = kept.find(key)
        at = kept.at[inside]
        return {name: value[at] for name, value in kept.answers.items()}
