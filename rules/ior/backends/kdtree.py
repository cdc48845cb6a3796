"""Periodic re-indexing with a SciPy k-d tree as the static index."""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from vigil.rules.ior.backends.base import Pairs
from vigil.rules.ior.backends.periodic import PeriodicBackend
from vigil.rules.ior.spec import InputMetric

_MINKOWSKI_P = {InputMetric.LINF: np.inf, InputMetric.L2: 2.0, InputMetric.L1: 1.0}


class KDTreeBackend(PeriodicBackend):
    name = "kdtree"

    def build(self, rows: np.ndarray) -> cKDTree:
        return cKDTree(self.history.x[rows])

    def query(self, index: cKDTree, queries: np.ndarray) -> Pairs:
        h = self.history
        radius = self.spec.eps * (1 + 1e-9) + 4 * np.spacing(h.max_abs) * h.x.shape[1]
        hits = index.query_ball_point(
            h.x[queries], radius, p=_MINKOWSKI_P[self.spec.metric], return_sorted=False
        )
        counts = np.fromiter(map(len, hits), dtype=np.int64, count=len(hits))
        flat = np.concatenate(hits).astype(np.int64) if counts.any() else counts[:0]
        return np.repeat(queries, counts), flat
