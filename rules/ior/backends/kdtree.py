"""Periodic re-indexing (Clemont, Algorithm 1): a k-d tree over the long-term memory plus a
short-term buffer searched by a flat scan, moved into the tree once it holds ``buffer_size`` rows.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial import cKDTree

from rules.ior.backends.base import (
    Backend,
    Pairs,
    concat_pairs,
    flat_pairs,
    may_differ,
    partitions,
)
from rules.ior.history import History
from rules.ior.spec import InputMetric, MonitorSpec

_MINKOWSKI_P = {InputMetric.LINF: np.inf, InputMetric.L2: 2.0, InputMetric.L1: 1.0}

BUILD_TO_SCAN_COST = 30.0
"""Cost of one tree-build step (per point and log2 level) in units of one buffer scan step
(per point and dimension); measured with ``bench/ior_bench.py`` on the reference machine."""


def optimal_buffer_size(n: int, dim: int) -> int:
    """Minimise the amortised cost ``C_index(n) / b + C_S(b)`` of Algorithm 1 with
    ``C_index(n) ~ n log2 n`` and ``C_S(b) ~ b dim / 2``: ``b* = sqrt(2 C_index(n) / dim)``."""
    n = max(n, 2)
    return max(256, round(math.sqrt(2 * BUILD_TO_SCAN_COST * n * math.log2(n) / dim)))


class KDTreeBackend(Backend):
    """``buffer_size`` fixes the buffer length; ``None`` re-derives it from the amortised
    cost model at every re-index."""

    name = "kdtree"

    def __init__(self, spec: MonitorSpec, history: History, buffer_size: int | None = None):
        super().__init__(spec, history)
        if buffer_size is not None and buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        self.buffer_size = buffer_size
        self.rebuild()

    def options(self) -> dict:
        return {"buffer_size": self.buffer_size}

    def rebuild(self) -> None:
        h = self.history
        self._long_end = h.size
        self._trees = [
            (label, cKDTree(h.x[rows]), rows) for label, rows in partitions(h, np.arange(h.size))
        ]
        self._limit = self.buffer_size or optimal_buffer_size(h.size, h.x.shape[1])

    def advance(self, start: int, stop: int) -> Pairs:
        h, batch = self.history, np.arange(start, stop)
        radius = self.spec.eps * (1 + 1e-9) + 4 * np.spacing(h.max_abs) * h.x.shape[1]
        p = _MINKOWSKI_P[self.spec.metric]
        qs, js = [], []
        for label, tree, rows in self._trees:
            queries = batch[may_differ(h, batch, label)]
            if len(queries):
                hits = tree.query_ball_point(h.x[queries], radius, p=p, return_sorted=False)
                counts = np.fromiter((len(x) for x in hits), dtype=np.int64, count=len(hits))
                flat = np.fromiter(
                    (i for x in hits for i in x), dtype=np.int64, count=int(counts.sum())
                )
                qs.append(np.repeat(queries, counts))
                js.append(rows[flat])
        q, j = flat_pairs(h, batch, np.arange(self._long_end, stop))
        if stop - self._long_end >= self._limit:
            self.rebuild()
        return concat_pairs([*qs, q], [*js, j])
