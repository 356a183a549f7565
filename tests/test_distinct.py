"""solver.cost.distinct: the distinct keys, sorted, and an inverse that rebuilds the array."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from solver.cost.distinct import distinct_inverse


@given(st.lists(st.integers(-2**40, 2**40), max_size=200))
def test_distinct_inverse_matches_numpy_unique(values: list[int]) -> None:
    keys = np.array(values, dtype=np.int64)
    distinct, inverse = distinct_inverse(keys)
    expected, expected_inverse = np.unique(keys, return_inverse=True)
    np.testing.assert_array_equal(distinct, expected)
    np.testing.assert_array_equal(inverse, expected_inverse.reshape(-1))
    np.testing.assert_array_equal(distinct[inverse], keys)
