"""Witness sets of a batch of decisions, stored compactly (CSR)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class Witnesses:
    """For decision ``first + i`` of a batch, its witnesses are the stream positions
    ``index[offsets[i]:offsets[i + 1]]`` (ascending) at input distances ``distance[...]``."""

    first: int
    offsets: np.ndarray
    index: np.ndarray
    distance: np.ndarray
    ratio: np.ndarray | None = None
    """Quantitative mode: per decision, the largest d_out / d_in within eps (0: none)."""
    ratio_witness: np.ndarray | None = None
    """Quantitative mode: the position attaining ``ratio`` (-1: none)."""

    @classmethod
    def from_pairs(
        cls, first: int, size: int, query: np.ndarray, index: np.ndarray, distance: np.ndarray
    ) -> Witnesses:
        """Build from unordered (query position, witness position, distance) triples."""
        order = np.lexsort((index, query))
        counts = np.bincount(query - first, minlength=size)
        offsets = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        return cls(first, offsets, index[order].astype(np.int64), distance[order])

    def with_ratios(self, ratio: np.ndarray, witness: np.ndarray) -> Witnesses:
        return replace(self, ratio=ratio, ratio_witness=witness)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def of(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Witness positions and distances of the batch's i-th decision."""
        lo, hi = self.offsets[i], self.offsets[i + 1]
        return self.index[lo:hi], self.distance[lo:hi]

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def flagged(self) -> np.ndarray:
        """Batch rows with a non-empty witness set."""
        return np.flatnonzero(self.counts)

    @property
    def pairs(self) -> int:
        return int(self.offsets[-1])
