"""SNN (Chen & Güttel): rows sorted by their projection on the first principal component.

For unit ``v`` and any pair, ``|v.(p - q)| <= ||v||_* d(p, q)`` with the dual norm of the
metric (L2: ``||v||_2 = 1``; L-inf: ``||v||_1``; L1: ``||v||_inf``), so every neighbour of
``q`` lies in the projection window ``[v.q - c eps, v.q + c eps]``, found by binary search.
Used as the static index of Algorithm 1 (periodic re-indexing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil.rules.ior.backends.base import Pairs, expand_ranges
from vigil.rules.ior.backends.periodic import PeriodicBackend
from vigil.rules.ior.spec import InputMetric


@dataclass(frozen=True)
class _Sorted:
    direction: np.ndarray
    keys: np.ndarray
    order: np.ndarray


class SNNBackend(PeriodicBackend):
    name = "snn"

    def build(self, rows: np.ndarray) -> _Sorted:
        x = self.history.x[rows]
        if len(x) > 1:
            centred = x[:: max(1, len(x) // 4096)] - x.mean(axis=0)
            direction = np.linalg.svd(centred, full_matrices=False)[2][0]
        else:
            direction = np.eye(x.shape[1])[0]
        keys = x @ direction
        order = np.argsort(keys, kind="stable")
        return _Sorted(direction, keys[order], order)

    def query(self, index: _Sorted, queries: np.ndarray) -> Pairs:
        h, v = self.history, index.direction
        dual = {
            InputMetric.L2: np.linalg.norm(v),
            InputMetric.LINF: np.abs(v).sum(),
            InputMetric.L1: np.abs(v).max(),
        }[self.spec.metric]
        dim = h.x.shape[1]
        # projections are dot products over dim terms: bound their float64 rounding
        slack = 4 * dim * np.finfo(np.float64).eps * h.max_abs * np.abs(v).sum()
        reach = self.spec.eps * dual * (1 + 1e-9) + 2 * slack
        centre = h.x[queries] @ v
        lo = np.searchsorted(index.keys, centre - reach, side="left")
        hi = np.searchsorted(index.keys, centre + reach, side="right")
        owner, slots = expand_ranges(lo, hi)
        return queries[owner], index.order[slots]
