"""ServeCandidates: N serving configurations as numpy int arrays, one per degree.

Degrees (see solver.serve.job for engine and replica): tp (tensor parallel inside a DP rank),
pp (pipeline stages), dp (vLLM's --data-parallel-size), ep (1, or tp x dp with
--enable-expert-parallel), replicas (independent engines). GPUs = tp x pp x dp x replicas.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

SERVE_VARIABLES = ("tp", "pp", "dp", "ep", "replicas")


@dataclass(frozen=True)
class ServeCandidates:
    """N candidate serving configurations, one int64 array per degree."""

    tp: np.ndarray
    pp: np.ndarray
    dp: np.ndarray
    ep: np.ndarray
    replicas: np.ndarray

    def __post_init__(self) -> None:
        arrays = np.broadcast_arrays(*(
            np.atleast_1d(np.asarray(getattr(self, f.name), dtype=np.int64)) for f in fields(self)
        ))
        for f, array in zip(fields(self), arrays):
            object.__setattr__(self, f.name, np.array(array, dtype=np.int64))

    @classmethod
    def from_values(cls, values: dict[str, np.ndarray]) -> ServeCandidates:
        return cls(**{name: values[name] for name in SERVE_VARIABLES})

    def values(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in SERVE_VARIABLES}

    def take(self, index: np.ndarray) -> ServeCandidates:
        return ServeCandidates(**{n: getattr(self, n)[index] for n in SERVE_VARIABLES})

    def row(self, index: int) -> dict[str, int]:
        return {n: int(getattr(self, n)[index]) for n in SERVE_VARIABLES}

    def __len__(self) -> int:
        return int(self.tp.shape[0])

    @property
    def num_gpus(self) -> np.ndarray:
        return self.tp * self.pp * self.dp * self.replicas

    @property
    def expert_parallel(self) -> np.ndarray:
        return self.ep > 1
