"""``grid``: a hashed eps-grid planned from the data, searched a whole batch at a time.

Two observations make most real streams cheap:

* A feature whose distinct values are all more than eps apart (one-hot columns, codes,
  coarse ordinal scales) can only match exactly inside an eps-ball, for every supported
  metric (each coordinate difference is at most the L-inf, L2 and L1 distance). Such
  *key* features partition the search exactly.
* On the remaining features, cells of width ``2 * eps`` on a few well-chosen *grid*
  features mean a neighbour lies in one of at most two cells per grid feature.

Each stored row is hashed from (key values, grid cells, label) into sorted uint64
arrays (a main run and a run of recent rows, merged once it has grown, so that a small
batch's insert does not copy the whole table); a query probes the hashes of its candidate
cells under every other label with ``searchsorted``. Hash collisions only add candidates,
which the exact check removes. The plan (which features are keys, which are grid
features) is chosen greedily by probing a sample, and re-made when new data breaks a key
feature's spacing or a grid feature's magnitude bound. When the history has grown fourfold
it is planned again, one sample probe per batch (a probe takes a few milliseconds, a whole
planning tens); if the plan changed, the new plan's table is then filled a slice of the
history per batch and takes over once it holds every row.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

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
_FEW_VALUES = 8
"""A key feature with at most this many values seen is checked for new ones by comparing
with each (one-hot columns, codes, small ordinal scales)."""
_PLAN_SAMPLE = 2048
_FIRST_PLAN = 256
_ROWS_PER_PROBE = 512
"""Planning again takes one sample probe per this many rows of a batch (one at least): a
small batch (a steady stream) waits a few milliseconds, while a backlog's large batches
finish the planning in one or two, before the history outgrows the plan being replaced."""
_FILL_ROWS = 4096
"""Rows a batch hashes into a new plan's table (eight times the batch's own rows, if more,
so the filling always catches up with the rows arriving): a table of 100,000 rows fills
over about 25 small batches."""
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


def _columns(x: np.ndarray, features: tuple[int, ...] | list[int]) -> np.ndarray:
    """A contiguous copy of some columns, with -0.0 made 0.0 (equal values, equal bits).
    ``take`` copies row-major rows five times faster than ``x[:, features]``, whose result
    is column-major."""
    out = np.take(x, list(features), axis=1)
    out += 0.0
    return out


def _weights(first: int, count: int) -> np.ndarray:
    """Odd multipliers for hash components ``first .. first + count - 1``."""
    return _mix(np.full(count, _SEED), np.arange(first, first + count, dtype=np.uint64)) | 1


def _term(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Components' contributions to a row hash: each value mixed, times its multiplier."""
    with np.errstate(over="ignore"):
        return _mix(values, weights) * weights


def _key_sums(key_values: np.ndarray) -> np.ndarray:
    """The key part of each row's hash, from the rows' key columns (``_columns``): it
    depends on the keys alone, so plans that differ in grid features share it."""
    bits = key_values.view(np.uint64)
    return _term(bits, _weights(0, bits.shape[1])).sum(axis=1, dtype=np.uint64)


class _Table:
    """The hashed rows of one plan, sorted by hash.

    A row's hash is the finalised wrapped sum of one term per component (each key value,
    each grid cell, the label), so a query's probes for every neighbouring cell and other
    label are sums of precomputed terms: a few array operations whatever the plan's size."""

    def __init__(self, plan: Plan, eps: float) -> None:
        self.plan = plan
        self.eps = eps
        self.width = 2 * eps * (1 + 4 * _MARGIN)
        self.hashes = np.empty(0, dtype=np.uint64)
        self.positions = np.empty(0, dtype=np.int64)
        self._recent = (self.hashes, self.positions)  # rows inserted since the last merge
        keys, grid = len(plan.keys), len(plan.grid)
        self._grid_weights = _weights(keys, grid)
        self._label_weight = _weights(keys + grid, 1)

    def _label_terms(self, labels: np.ndarray) -> np.ndarray:
        return _term(labels.astype(np.int64).view(np.uint64), self._label_weight)

    def row_hashes(self, x: np.ndarray, y: np.ndarray | None, key_sum: np.ndarray) -> np.ndarray:
        """The rows' hashes, given their key part (``_key_sums``)."""
        total = key_sum
        if self.plan.grid:
            cells = np.floor(_columns(x, self.plan.grid) / self.width).astype(np.int64)
            total = total + _term(cells.view(np.uint64), self._grid_weights).sum(
                axis=1, dtype=np.uint64
            )
        if self.plan.by_label:
            total = total + self._label_terms(y)
        return _mix(total, _SEED)

    def probes(
        self,
        x: np.ndarray,
        y: np.ndarray | None,
        labels: np.ndarray,
        key_sum: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(query row, probe hash) for every cell (and other label) a neighbour may sit in."""
        n = len(x)
        total = key_sum[:, None]
        valid = np.ones((n, 1), dtype=bool)
        if self.plan.grid:
            grid = list(self.plan.grid)
            reach = self.eps * (1 + _MARGIN)
            values = _columns(x, grid)
            lo = np.floor((values - reach) / self.width).astype(np.int64)
            straddles = np.floor((values + reach) / self.width).astype(np.int64) > lo
            cells = np.stack([lo, lo + 1], axis=2).view(np.uint64)
            terms = _term(cells, self._grid_weights[:, None])  # (row, grid feature, lo/up)
            either = np.stack([np.ones_like(straddles), straddles], axis=2)
            for i in range(len(grid)):
                total = (total[:, :, None] + terms[:, None, i, :]).reshape(n, -1)
                valid = (valid[:, :, None] & either[:, None, i, :]).reshape(n, -1)
        if self.plan.by_label:
            total = (total[:, :, None] + self._label_terms(labels)[None, None, :]).reshape(n, -1)
            other = y[:, None] != labels[None, :]
            valid = (valid[:, :, None] & other[:, None, :]).reshape(n, -1)
        rows, columns = np.nonzero(valid)
        return rows, _mix(total[rows, columns], _SEED)

    def fill(self, hashes: np.ndarray) -> None:
        """Hold rows ``0 .. len(hashes) - 1`` (the table is empty)."""
        order = np.argsort(hashes, kind="stable")
        self.hashes, self.positions = hashes[order], order.astype(np.int64)

    def insert(self, hashes: np.ndarray, positions: np.ndarray) -> None:
        """Add rows to the recent run; it is merged into the main run once it holds about
        sqrt(main rows x batch rows), where a batch's copying of the recent run costs as
        much as its share of the merges (a small batch does not copy the whole table)."""
        order = np.argsort(hashes, kind="stable")
        self._recent = _merged(self._recent, hashes[order], positions[order])
        held = len(self._recent[0])
        if held * held >= len(self.hashes) * len(hashes):
            self.hashes, self.positions = _merged((self.hashes, self.positions), *self._recent)
            self._recent = (self.hashes[:0], self.positions[:0])

    def find(self, probe_hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(probe number, stored row) for every stored row whose hash equals a probe.

        The probes are searched in sorted order, where each search starts at the last one's
        answer (two to four times faster than in their own order on a large table), and
        answered in their own. Most probes find nothing: only those that do are searched
        for the end of their run."""
        order = np.argsort(probe_hashes)
        ordered = probe_hashes[order]
        probes, rows = [], []
        for hashes, positions in ((self.hashes, self.positions), self._recent):
            start = np.searchsorted(hashes, ordered, side="left")
            end = start.copy()
            if len(hashes):
                found = np.flatnonzero(hashes[np.minimum(start, len(hashes) - 1)] == ordered)
                end[found] = np.searchsorted(hashes, ordered[found], side="right")
            lo, hi = np.empty_like(order), np.empty_like(order)
            lo[order], hi[order] = start, end
            which, slots = expand_ranges(lo, hi)
            probes.append(which)
            rows.append(positions[slots])
        return np.concatenate(probes), np.concatenate(rows)


def _merged(
    run: tuple[np.ndarray, np.ndarray], hashes: np.ndarray, positions: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """A sorted run with sorted ``hashes`` (and their positions) merged in."""
    at = np.searchsorted(run[0], hashes, side="right")
    return np.insert(run[0], at, hashes), np.insert(run[1], at, positions)


class GridBackend(Backend):
    name = "grid"

    def __init__(self, spec: MonitorSpec, history: History) -> None:
        super().__init__(spec, history)
        self._planning: Generator[None, None, Plan] | None = None
        self._filling: _Filling | None = None
        self.rebuild()

    @property
    def plan(self) -> Plan:
        return self._table.plan

    def rebuild(self) -> None:
        h, eps = self.history, self.spec.eps
        self._labels = self._distinct_labels(np.arange(h.size))
        values = (np.unique(h.x[:, k] + 0.0) for k in range(h.x.shape[1]))
        self._key_values = {k: v for k, v in enumerate(values) if _spaced(v, eps)}
        self._index_key_values()
        self._sums = _key_sums(_columns(h.x, list(self._key_values)))
        self._planning = None
        self._index(_finish(self._plan(h.size)))

    def _index(self, plan: Plan) -> None:
        size = self.history.size
        self._table = _Table(plan, self.spec.eps)
        self._filling = None
        self._replan_at = max(_FIRST_PLAN, 4 * size)
        self._table.fill(self._hashes(self._table, 0, size))

    def advance(self, start: int, stop: int) -> Pairs:
        h = self.history
        rows = np.arange(start, stop)
        self._labels = np.union1d(self._labels, self._distinct_labels(rows))
        keyed = _columns(h.x[start:stop], self.plan.keys)
        if not self._still_valid(rows, keyed):
            self.rebuild()
        else:
            if stop > len(self._sums):  # room for the new rows' key sums, amortised
                self._sums = np.resize(self._sums, max(stop, 2 * len(self._sums)))
            self._sums[start:stop] = _key_sums(keyed)
            self._table.insert(self._hashes(self._table, start, stop), rows)
            if self._filling is None and (plan := self._plan_steps(start, stop)) is not None:
                self._filling = _Filling(_Table(plan, self.spec.eps))
            if self._filling is not None:
                self._fill(start, stop)
        x = h.x[start:stop]
        y = h.y[start:stop] if self.spec.output is OutputKind.LABEL else None
        owner, probe = self._table.probes(x, y, self._labels, self._sums[start:stop])
        which, j = self._table.find(probe)
        q = owner[which] + start
        keep = j < q
        return q[keep], j[keep]

    def _hashes(self, table: _Table, start: int, stop: int) -> np.ndarray:
        """The hashes of rows ``start .. stop - 1`` under ``table``'s plan (read in place:
        a whole history's inputs are not copied)."""
        h = self.history
        y = h.y[start:stop] if self.spec.output is OutputKind.LABEL else None
        return table.row_hashes(h.x[start:stop], y, self._sums[start:stop])

    def _fill(self, start: int, stop: int) -> None:
        """Hash the next slice of rows into the new plan's table; once it holds every row
        up to ``stop``, it takes over (unless rows that came meanwhile broke the plan's
        grid magnitude bound: then it is dropped and the current table stays)."""
        filling = self._filling
        end = min(stop, filling.rows + max(_FILL_ROWS, 8 * (stop - start)))
        filling.hashes.append(self._hashes(filling.table, filling.rows, end))
        filling.rows = end
        if end < stop:
            return
        self._filling = None
        grid = list(filling.table.plan.grid)
        if (self.history.column_max_abs[grid] <= _MAX_CELLS * self.spec.eps).all():
            filling.table.fill(np.concatenate(filling.hashes))
            self._table = filling.table

    def _distinct_labels(self, rows: np.ndarray) -> np.ndarray:
        if self.spec.output is not OutputKind.LABEL:
            return np.empty(0, dtype=np.int64)
        return np.unique(self.history.y[rows])

    def _still_valid(self, rows: np.ndarray, keyed: np.ndarray) -> bool:
        """Whether new rows (``keyed``: their key columns) keep the key spacing and the grid
        magnitude bounds."""
        x, eps = self.history.x[rows], self.spec.eps
        grid = list(self.plan.grid)
        if grid and np.abs(_columns(x, grid)).max(initial=0.0) > _MAX_CELLS * eps:
            return False
        changed = self._keys_with_new_values(keyed)
        for k in changed:
            merged = np.union1d(self._key_values[k], x[:, k] + 0.0)
            if not _spaced(merged, eps):
                return False
            self._key_values[k] = merged
        if changed:
            self._index_key_values()
        return True

    def _index_key_values(self) -> None:
        """The values seen in each key feature, for one membership test a batch (almost
        every batch brings no new key value): a feature of at most ``_FEW_VALUES`` values is
        compared with each of them (four times faster than a lookup), the others are looked
        up among all values seen in them, with which features each was seen in."""
        values = list(self._key_values.values())
        few = np.array([len(v) <= _FEW_VALUES for v in values], dtype=bool)
        self._few = np.flatnonzero(few)
        width = max([len(values[i]) for i in self._few], default=0) or 1
        self._few_values = np.full((len(self._few), width), np.nan)  # NaN: no value
        for row, i in enumerate(self._few):
            self._few_values[row, : len(values[i])] = values[i]
        self._many = np.flatnonzero(~few)
        many = [values[i] for i in self._many]
        self._seen = np.unique(np.concatenate(many)) if many else np.empty(0)
        self._seen_in = np.zeros((len(self._seen), len(many)), dtype=bool)
        for i, v in enumerate(many):
            self._seen_in[np.searchsorted(self._seen, v), i] = True

    def _keys_with_new_values(self, values: np.ndarray) -> list[int]:
        """The key features in which the rows (``values``: their key columns) bring a value
        not seen before."""
        keys = list(self._key_values)
        if not keys or not len(values):
            return []
        new = np.zeros(len(keys), dtype=bool)
        if len(self._few):
            part, table = values[:, self._few], self._few_values
            known = part == table[:, 0]
            for j in range(1, table.shape[1]):
                known |= part == table[:, j]
            new[self._few] = ~known.all(axis=0)
        if len(self._many):
            part, seen = values[:, self._many], self._seen
            if len(seen):
                at = np.minimum(np.searchsorted(seen, part), len(seen) - 1)
                known = (seen[at] == part) & self._seen_in[at, np.arange(len(self._many))]
                new[self._many] = ~known.all(axis=0)
            else:
                new[self._many] = True
        return [keys[i] for i in np.flatnonzero(new)]

    def _plan_steps(self, start: int, stop: int) -> Plan | None:
        """The steps of planning again (once the history has grown fourfold) that the
        batch of rows ``start .. stop - 1`` pays for: the new plan when the planning ends
        with a different one, else None (the table stays)."""
        if self._planning is None:
            if stop < self._replan_at:
                return None
            self._planning = self._plan(stop)
        try:
            for _ in range(-(-(stop - start) // _ROWS_PER_PROBE)):
                next(self._planning)
            return None
        except StopIteration as done:
            plan = done.value
        self._planning = None
        self._replan_at = 4 * stop
        return None if plan == self.plan else plan

    def _plan(self, n: int) -> Generator[None, None, Plan]:
        """Plan for the first ``n`` rows, pausing after each sample probe. Keys: every
        feature whose values are spaced (known from ``_key_values``: values only lose their
        spacing as rows arrive). Grid features: added greedily while the cost predicted
        from a sample falls by 10% or more."""
        eps = self.spec.eps
        keys = tuple(self._key_values)
        by_label = self.spec.output is OutputKind.LABEL and len(self._labels) <= 4
        if eps == 0 or n < _FIRST_PLAN:
            return Plan(keys, (), by_label)
        fits = self.history.column_max_abs <= _MAX_CELLS * eps
        free = [k for k in range(len(fits)) if k not in keys and fits[k]]
        rng = np.random.default_rng(n)
        sample = np.sort(rng.choice(n, size=min(n, _PLAN_SAMPLE), replace=False))
        grid: tuple[int, ...] = ()
        best = self._estimate(Plan(keys, grid, by_label), sample, n)
        while free and len(grid) < _MAX_GRID:
            costs = {}
            for k in free:
                yield
                costs[k] = self._estimate(Plan(keys, (*grid, k), by_label), sample, n)
            k = min(costs, key=costs.__getitem__)
            if costs[k] >= 0.9 * best:
                break
            best, grid = costs[k], (*grid, k)
            free.remove(k)
        return Plan(keys, grid, by_label)

    def _estimate(self, plan: Plan, sample: np.ndarray, n: int) -> float:
        """Predicted cost per query at twice the current size, from probing the sample."""
        h, sums = self.history, self._sums[sample]
        table = _Table(plan, self.spec.eps)
        y = h.y[sample] if self.spec.output is OutputKind.LABEL else None
        table.insert(table.row_hashes(h.x[sample], y, sums), sample)
        _, probe = table.probes(h.x[sample], y, self._distinct_labels(sample), sums)
        s = len(sample)
        candidates = float(len(table.find(probe)[0])) / s * (2 * n / s)
        cost_per_candidate = _COST_PER_CANDIDATE + h.x.shape[1]
        return candidates * cost_per_candidate + len(probe) / s * _COST_PER_PROBE


@dataclass
class _Filling:
    """A new plan's table being filled, and the hashes of its first ``rows`` rows so far."""

    table: _Table
    rows: int = 0
    hashes: list[np.ndarray] = field(default_factory=list)


def _finish(planning: Generator[None, None, Plan]) -> Plan:
    """Run a planning to its end."""
    while True:
        try:
            next(planning)
        except StopIteration as done:
            return done.value


def _spaced(sorted_values: np.ndarray, eps: float) -> bool:
    """All distinct values more than eps apart (with a rounding margin)."""
    return bool(np.all(np.diff(sorted_values) > eps * (1 + _MARGIN)))
