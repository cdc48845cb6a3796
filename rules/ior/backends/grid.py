"""``grid``: a hashed eps-grid planned from the data, searched a whole batch at a time.

Two observations make most real streams cheap:

* A feature whose distinct values are all more than eps apart (one-hot columns, codes,
  coarse ordinal scales) can only match exactly inside an eps-ball, for every supported
  metric (each coordinate difference is at most the L-inf, L2 and L1 distance). Such
  *key* features partition the search exactly.
* On the remaining features, cells of width ``2 * eps`` on a few well-chosen *grid*
  features mean a neighbour lies in one of at most two cells per grid feature.

Each stored row is hashed from (key values, grid cells, label) into one sorted uint64
array; a query probes the hashes of its candidate cells under every other label with
``searchsorted``. Hash collisions only add candidates, which the exact check removes.
The plan (which features are keys, which are grid features) is chosen greedily by
probing a sample, and re-made when the history has grown fourfold or when new data
breaks a key feature's spacing or a grid feature's magnitude bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil.rules.ior.backends.base import Backend, Pairs, expand_ranges
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import MonitorSpec, OutputKind

_SEED = np.uint64(0x243F6A8885A308D3)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)

_MARGIN = 1e-9
"""Relative slack on eps when deciding cells and key spacing (covers float64 rounding)."""
_MAX_CELLS = 1e6
"""A grid feature's magnitude bound in units of eps, beyond which rounding could misplace
a neighbour's cell; larger values make the feature ineligible for the grid."""
_MAX_GRID = 6
_PLAN_SAMPLE = 2048
_FIRST_PLAN = 256
_COST_PER_CANDIDATE = 40.0
_COST_PER_PROBE = 60.0


@dataclass(frozen=True)
class Plan:
    keys: tuple[int, ...]
    grid: tuple[int, ...]
    by_label: bool


def _mix(h: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Combine uint64 hash arrays (splitmix64 finaliser); arithmetic wraps by design."""
    with np.errstate(over="ignore"):
        z = (h ^ v) + _GOLDEN
        z = (z ^ (z >> _S30)) * _M1
        z = (z ^ (z >> _S27)) * _M2
    return z ^ (z >> _S31)


def _key_bits(values: np.ndarray) -> np.ndarray:
    return (values + 0.0).view(np.uint64)


class _Table:
    """The hashed rows of one plan, sorted by hash."""

    def __init__(self, plan: Plan, eps: float) -> None:
        self.plan = plan
        self.eps = eps
        self.width = 2 * eps * (1 + 4 * _MARGIN)
        self.hashes = np.empty(0, dtype=np.uint64)
        self.positions = np.empty(0, dtype=np.int64)

    def _base(self, x: np.ndarray) -> np.ndarray:
        h = np.full(len(x), _SEED, dtype=np.uint64)
        for k in self.plan.keys:
            h = _mix(h, _key_bits(x[:, k]))
        return h

    def row_hashes(self, x: np.ndarray, y: np.ndarray | None) -> np.ndarray:
        h = self._base(x)
        for g in self.plan.grid:
            h = _mix(h, np.floor(x[:, g] / self.width).astype(np.int64).view(np.uint64))
        if self.plan.by_label:
            h = _mix(h, y.astype(np.int64).view(np.uint64))
        return h

    def insert(self, hashes: np.ndarray, positions: np.ndarray) -> None:
        order = np.argsort(hashes, kind="stable")
        hashes, positions = hashes[order], positions[order]
        at = np.searchsorted(self.hashes, hashes, side="right")
        self.hashes = np.insert(self.hashes, at, hashes)
        self.positions = np.insert(self.positions, at, positions)

    def probes(
        self, x: np.ndarray, y: np.ndarray | None, labels: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(query row, probe hash) for every cell (and other label) a neighbour may sit in."""
        base = self._base(x)
        reach = self.eps * (1 + _MARGIN)
        grid = list(self.plan.grid)
        lo = np.floor((x[:, grid] - reach) / self.width).astype(np.int64)
        straddles = np.floor((x[:, grid] + reach) / self.width).astype(np.int64) > lo
        rows_out, hashes_out = [], []
        every = np.arange(len(x))
        for combo in range(1 << len(grid)):
            h, valid = base, np.ones(len(x), dtype=bool)
            for i in range(len(grid)):
                up = (combo >> i) & 1
                if up:
                    valid &= straddles[:, i]
                h = _mix(h, (lo[:, i] + up).view(np.uint64))
            if not self.plan.by_label:
                rows_out.append(every[valid])
                hashes_out.append(h[valid])
                continue
            for label in labels:
                sel = valid & (y != label)
                rows_out.append(every[sel])
                tag = np.full(int(sel.sum()), label, dtype=np.int64).view(np.uint64)
                hashes_out.append(_mix(h[sel], tag))
        return np.concatenate(rows_out), np.concatenate(hashes_out)

    def lookup(self, probe_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.searchsorted(self.hashes, probe_hashes, side="left"),
            np.searchsorted(self.hashes, probe_hashes, side="right"),
        )


class GridBackend(Backend):
    name = "grid"

    def __init__(self, spec: MonitorSpec, history: History) -> None:
        super().__init__(spec, history)
        self.rebuild()

    @property
    def plan(self) -> Plan:
        return self._table.plan

    def rebuild(self) -> None:
        h = self.history
        plan = self._choose_plan(h.size)
        self._table = _Table(plan, self.spec.eps)
        self._labels = self._distinct_labels(np.arange(h.size))
        self._key_values = {k: np.unique(h.x[:, k] + 0.0) for k in plan.keys}
        self._replan_at = max(_FIRST_PLAN, 4 * h.size)
        self._table.insert(self._hashes(np.arange(h.size)), np.arange(h.size, dtype=np.int64))

    def advance(self, start: int, stop: int) -> Pairs:
        h = self.history
        rows = np.arange(start, stop)
        self._labels = np.union1d(self._labels, self._distinct_labels(rows))
        if stop >= self._replan_at or not self._still_valid(rows):
            self.rebuild()
        else:
            self._table.insert(self._hashes(rows), rows)
        x = h.x[start:stop]
        y = h.y[start:stop] if self.spec.output is OutputKind.LABEL else None
        owner, probe = self._table.probes(x, y, self._labels)
        lo, hi = self._table.lookup(probe)
        which, slots = expand_ranges(lo, hi)
        q, j = owner[which] + start, self._table.positions[slots]
        keep = j < q
        return q[keep], j[keep]

    def _hashes(self, rows: np.ndarray) -> np.ndarray:
        h = self.history
        y = h.y[rows] if self.spec.output is OutputKind.LABEL else None
        return self._table.row_hashes(h.x[rows], y)

    def _distinct_labels(self, rows: np.ndarray) -> np.ndarray:
        if self.spec.output is not OutputKind.LABEL:
            return np.empty(0, dtype=np.int64)
        return np.unique(self.history.y[rows])

    def _still_valid(self, rows: np.ndarray) -> bool:
        """Whether new rows keep the key spacing and the grid magnitude bounds."""
        x, eps = self.history.x[rows], self.spec.eps
        for k in self.plan.grid:
            if np.abs(x[:, k]).max(initial=0.0) > _MAX_CELLS * eps:
                return False
        for k, seen in self._key_values.items():
            values = np.unique(x[:, k] + 0.0)
            if np.setdiff1d(values, seen, assume_unique=True).size:
                merged = np.union1d(seen, values)
                if not _spaced(merged, eps):
                    return False
                self._key_values[k] = merged
        return True

    def _choose_plan(self, n: int) -> Plan:
        h, eps = self.history, self.spec.eps
        x = h.x
        keys = tuple(k for k in range(x.shape[1]) if _spaced(np.unique(x[:, k] + 0.0), eps))
        by_label = self.spec.output is OutputKind.LABEL and len(np.unique(h.y)) <= 4
        if eps == 0 or n < _FIRST_PLAN:
            return Plan(keys, (), by_label)
        bound = _MAX_CELLS * eps
        free = [k for k in range(x.shape[1]) if k not in keys and np.abs(x[:, k]).max() <= bound]
        rng = np.random.default_rng(n)
        sample = np.sort(rng.choice(n, size=min(n, _PLAN_SAMPLE), replace=False))
        grid: tuple[int, ...] = ()
        best = self._estimate(Plan(keys, grid, by_label), sample, n)
        while free and len(grid) < _MAX_GRID:
            costs = {k: self._estimate(Plan(keys, (*grid, k), by_label), sample, n) for k in free}
            k = min(costs, key=costs.__getitem__)
            if costs[k] >= 0.9 * best:
                break
            best, grid = costs[k], (*grid, k)
            free.remove(k)
        return Plan(keys, grid, by_label)

    def _estimate(self, plan: Plan, sample: np.ndarray, n: int) -> float:
        """Predicted cost per query at twice the current size, from probing the sample."""
        h = self.history
        table = _Table(plan, self.spec.eps)
        y = h.y[sample] if self.spec.output is OutputKind.LABEL else None
        table.insert(table.row_hashes(h.x[sample], y), sample)
        _, probe = table.probes(h.x[sample], y, self._distinct_labels(sample))
        lo, hi = table.lookup(probe)
        s = len(sample)
        candidates = float((hi - lo).sum()) / s * (2 * n / s)
        cost_per_candidate = _COST_PER_CANDIDATE + h.x.shape[1]
        return candidates * cost_per_candidate + len(probe) / s * _COST_PER_PROBE


def _spaced(sorted_values: np.ndarray, eps: float) -> bool:
    """All distinct values more than eps apart (with a rounding margin)."""
    return bool(np.all(np.diff(sorted_values) > eps * (1 + _MARGIN)))
