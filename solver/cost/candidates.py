"""Candidates: N parallel configurations as numpy int arrays, one array per decision variable.

The cost model (memory, step time) and the search take a `Candidates` and return one value
per candidate, so a model written once serves one configuration (the `estimate` command) and
the hundreds of thousands of the exhaustive search.

Fields are the degrees and choices of `ParallelConfig`, each an int64 array of length N:
tp, pp, dp, cp, ep, etp, vpp, zero (0-3), micro_batch, and recompute as a code
(0 none, 1 selective, 2 full: the index in `RECOMPUTE_LEVELS`, so a higher code recomputes
more). dp is the dense data-parallel degree; the expert-data-parallel degree is derived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from solver.spec import RECOMPUTE_LEVELS, ParallelConfig
from solver.spec.strict import MAX_LAYERS

RECOMPUTE_NONE, RECOMPUTE_SELECTIVE, RECOMPUTE_FULL = 0, 1, 2


@dataclass(frozen=True)
class Candidates:
    """N candidate configurations, one int64 array per variable (see the module docstring)."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    vpp: np.ndarray
    zero: np.ndarray
    micro_batch: np.ndarray
    recompute: np.ndarray

    def __post_init__(self) -> None:
        arrays = np.broadcast_arrays(*(
            np.atleast_1d(np.asarray(getattr(self, f.name), dtype=np.int64)) for f in fields(self)
        ))
        for f, array in zip(fields(self), arrays):
            object.__setattr__(self, f.name, np.array(array, dtype=np.int64))
        assert self.tp.ndim == 1, "candidates are a flat list"

    @classmethod
    def from_configs(cls, configs: Sequence[ParallelConfig]) -> Candidates:
        """Stack configurations into arrays (order kept)."""
        columns: dict[str, list[int]] = {f.name: [] for f in fields(cls)}
        for config in configs:
            for name, values in columns.items():
                value = getattr(config, name)
                values.append(RECOMPUTE_LEVELS.index(value) if name == "recompute" else value)
        return cls(**{name: np.array(values, dtype=np.int64) for name, values in columns.items()})

    def to_configs(self) -> list[ParallelConfig]:
        """The inverse of `from_configs`."""
        return [self.config(i) for i in range(len(self))]

    def config(self, index: int) -> ParallelConfig:
        """Candidate `index` as a ParallelConfig."""
        values = {name: int(getattr(self, name)[index]) for name in FIELD_NAMES}
        values["recompute"] = RECOMPUTE_LEVELS[values["recompute"]]
        if (min(values[name] for name in POSITIVE_FIELDS) > 0 and 0 <= values["zero"] <= 3
                and max(values[name] for name in POSITIVE_FIELDS) <= MAX_LAYERS.most):
            # Degrees of the enumerated space, within every limit of ParallelConfig's fields
            # (the least is vpp's, MAX_LAYERS): its checks hold already (a search builds
            # thousands per problem; validation was 5% of its time).
            return ParallelConfig.model_construct(**values)
        return ParallelConfig(**values)

    def take(self, index: np.ndarray | Sequence[int]) -> Candidates:
        """The candidates at `index` (an index array or a boolean mask)."""
        if not isinstance(index, np.ndarray) or index.ndim != 1 or index.dtype.kind not in "iub":
            return Candidates(**{name: getattr(self, name)[index] for name in FIELD_NAMES})
        # The fields are flat int64 arrays already and indexing keeps them so: no re-check
        # (the search takes subsets thousands of times per problem).
        taken = object.__new__(Candidates)
        for name in FIELD_NAMES:
            object.__setattr__(taken, name, getattr(self, name)[index])
        return taken

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @property
    def num_gpus(self) -> np.ndarray:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_dp(self) -> np.ndarray:
        """Expert-data-parallel degree tp*cp*dp / (ep*etp) (Megatron carves ep and etp out of
        the tp*cp*dp ranks of a stage); a float array, integral where ep*etp divides."""
        return self.tp * self.cp * self.dp / (self.ep * self.etp)


FIELD_NAMES = tuple(f.name for f in fields(Candidates))
POSITIVE_FIELDS = tuple(n for n in FIELD_NAMES if n not in ("zero", "recompute"))
