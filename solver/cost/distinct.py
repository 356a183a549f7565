"""Distinct values of a long integer key array and where each element's value sits among them.

Candidate arrays repeat a few values of a key (a (stride, degree) pair, a (pp, vpp, stage)
triple) hundreds of thousands of times; the cost functions that depend on such a key only work
on its distinct values and index back. `np.unique(..., return_inverse=True)` argsorts the whole
array; a plain sort and a binary search are several times faster on these arrays (575,000
keys with 91 distinct values: 30 ms against 99 ms).
"""

from __future__ import annotations

import numpy as np


# Integer keys below this (or below 4 x their count) are counted, not sorted.
COUNTING_BELOW = 1 << 16


def distinct_inverse(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct sorted keys, index of each key among them): distinct[inverse] == keys."""
    keys = np.asarray(keys).reshape(-1)
    if keys.size and keys.dtype.kind in "iu":
        low, high = int(keys.min()), int(keys.max())
        if low >= 0 and high < max(4 * keys.size, COUNTING_BELOW):
            # Small non-negative integers: count them instead of sorting (linear time).
            present = np.bincount(keys, minlength=high + 1) > 0
            rank = np.cumsum(present) - 1
            return np.flatnonzero(present).astype(keys.dtype), rank[keys]
    ordered = np.sort(keys)
    first = np.ones(len(ordered), dtype=bool)
    first[1:] = ordered[1:] != ordered[:-1]
    distinct = ordered[first]
    return distinct, np.searchsorted(distinct, keys)


def distinct_rows(d: dict[str, np.ndarray], names: tuple[str, ...]
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(one row of each distinct tuple of d[names], the distinct tuple of every row): a cost
    that depends on those arrays only is worked out on the first and indexed by the second."""
    key = np.zeros(len(d[names[0]]), dtype=np.int64)
    for name in names:
        values, index = distinct_inverse(d[name])
        key = key * len(values) + index
    distinct, back = distinct_inverse(key)
    first = np.zeros(len(distinct), dtype=np.int64)
    first[back[::-1]] = np.arange(len(key))[::-1]
    return first, back
