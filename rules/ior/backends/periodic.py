"""Periodic re-indexing (Clemont, Algorithm 1): a static index over the long-term memory plus
a short-term buffer searched by a flat scan, moved into the index once it holds ``b`` rows.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from typing import Any

import numpy as np

from vigil.rules.ior.backends.base import (
    Backend,
    Pairs,
    concat_pairs,
    flat_pairs,
    may_differ,
    partitions,
)
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import MonitorSpec

BUILD_TO_SCAN_COST = 30.0
"""Cost of one index-build step (per point and log2 level) in units of one buffer scan step
(per point and dimension); measured with ``bench/ior_bench.py`` on the reference machine."""


def optimal_buffer_size(n: int, dim: int) -> int:
    """Minimise the amortised cost ``C_index(n) / b + C_S(b)`` of Algorithm 1 with
    ``C_index(n) ~ n log2 n`` and ``C_S(b) ~ b dim / 2``: ``b* = sqrt(2 C_index(n) / dim)``."""
    n = max(n, 2)
    return max(256, round(math.sqrt(2 * BUILD_TO_SCAN_COST * n * math.log2(n) / dim)))


class PeriodicBackend(Backend):
    """``buffer_size`` fixes the buffer length; ``None`` re-derives it from the amortised
    cost model at every re-index. Subclasses provide the static index."""

    def __init__(self, spec: MonitorSpec, history: History, buffer_size: int | None = None):
        super().__init__(spec, history)
        if buffer_size is not None and buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        self.buffer_size = buffer_size
        self.rebuild()

    def options(self) -> dict[str, Any]:
        return {"buffer_size": self.buffer_size}

    def rebuild(self) -> None:
        h = self.history
        self._long_end = h.size
        self._indexes = [
            (label, self.build(rows), rows) for label, rows in partitions(h, np.arange(h.size))
        ]
        self._limit = self.buffer_size or optimal_buffer_size(h.size, h.x.shape[1])

    def advance(self, start: int, stop: int) -> Pairs:
        h, batch = self.history, np.arange(start, stop)
        qs, js = [], []
        for label, index, rows in self._indexes:
            queries = batch[may_differ(h, batch, label)]
            if len(queries):
                q, local = self.query(index, queries)
                qs.append(q)
                js.append(rows[local])
        q, j = flat_pairs(h, batch, np.arange(self._long_end, stop))
        if stop - self._long_end >= self._limit:
            self.rebuild()
        return concat_pairs([*qs, q], [*js, j])

    @abstractmethod
    def build(self, rows: np.ndarray) -> Any:
        """A static index over the history rows ``rows`` (one output partition)."""

    @abstractmethod
    def query(self, index: Any, queries: np.ndarray) -> Pairs:
        """(query position, index-local row) candidates within eps of each query."""
