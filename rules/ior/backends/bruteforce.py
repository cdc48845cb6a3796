"""Brute force: every new decision against every stored decision of another output.

One Faiss ``IndexFlat`` per label (SIMD float32 range search with a slack radius), so a
query scans only the rows that could be witnesses; the batch's own rows are searched
with a temporary flat index.
"""

from __future__ import annotations

import numpy as np

from vigil.rules.ior.backends.base import (
    Backend,
    FlatSearch,
    Pairs,
    concat_pairs,
    flat_pairs,
    may_differ,
    partitions,
)
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import MonitorSpec


class _Partition:
    """The stored rows of one label (or all rows, for probability outputs)."""

    def __init__(self, search: FlatSearch) -> None:
        self.index = search.index()
        self.positions = np.empty(0, dtype=np.int64)

    def add(self, x: np.ndarray, positions: np.ndarray) -> None:
        self.index.add(x.astype(np.float32))
        self.positions = np.concatenate([self.positions, positions])


class BruteForceBackend(Backend):
    name = "bruteforce"

    def __init__(self, spec: MonitorSpec, history: History) -> None:
        super().__init__(spec, history)
        self.rebuild()

    def rebuild(self) -> None:
        self._search = FlatSearch(self.spec, self.history.x.shape[1])
        self._parts: dict[int | None, _Partition] = {}
        self._add(np.arange(self.history.size))

    def advance(self, start: int, stop: int) -> Pairs:
        h, batch = self.history, np.arange(start, stop)
        radius = self._search.radius(h.max_abs)
        xq = h.x[batch].astype(np.float32)
        qs, js = [], []
        for label, part in self._parts.items():
            mask = may_differ(h, batch, label)
            if mask.any() and part.index.ntotal:
                lims, _, found = part.index.range_search(xq[mask], radius)
                qs.append(np.repeat(batch[mask], np.diff(lims).astype(np.int64)))
                js.append(part.positions[found])
        q, j = flat_pairs(h, batch, batch)
        self._add(batch)
        return concat_pairs([*qs, q], [*js, j])

    def _add(self, rows: np.ndarray) -> None:
        h = self.history
        for label, sel in partitions(h, rows):
            part = self._parts.get(label)
            if part is None:
                part = self._parts[label] = _Partition(self._search)
            part.add(h.x[sel], sel)
