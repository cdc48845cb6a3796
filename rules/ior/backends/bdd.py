"""The BDD-based monitor (Clemont, Section 6), L-inf and label outputs.

Every compared feature is encoded as a small integer: a *categorical* feature (distinct
values all more than eps apart) by a code per value, a *real* feature by its bin
``floor(x / w)`` with ``w`` a hair above eps, so eps-close values fall in equal or adjacent
bins. A cell is the vector of codes. Binary decision diagrams (CUDD, through ``dd``) hold:

* ``H_c(x)``: the cells seen so far with label ``c`` (one cube added per new cell);
* ``D(x, y)``: the static adjacency relation: per feature, equal codes (categorical) or
  equal or adjacent bins (real).

For a new decision in cell ``v`` with label ``c``, ``N = D(x, v) & H_c'(x)`` for each other
label ``c'`` gives the candidate cells: (a) ``N`` false: no witness; (b) ``N`` is ``v``
itself: every stored point of that cell with label ``c'`` is a candidate; (c) otherwise the
cells of ``N`` are enumerated. The monitor's exact distance check is the second level that
drops false positives. A feature whose magnitude is too large for exact binning is left
out of the encoding (it only widens the candidate set). The encoding is re-planned from
the history when new data leave its ranges.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np
from dd import cudd

from vigil.rules.ior.backends.base import Backend, Pairs, concat_pairs
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import InputMetric, MonitorSpec, OutputKind

_MARGIN = 1e-9
_MAX_BINS = 1e6
_HEADROOM = 4


class _Encoding:
    """How each feature maps to a code, and the BDD variables of its bits."""

    def __init__(self, x: np.ndarray, eps: float, order: list[int] | None) -> None:
        self.width = eps * (1 + 4 * _MARGIN)
        self.categorical: dict[int, dict[float, int]] = {}
        self.real: dict[int, int] = {}  # feature -> offset of its lowest bin code
        self.bits: dict[int, int] = {}
        for k in range(x.shape[1]):
            values = np.unique(x[:, k] + 0.0)
            if np.all(np.diff(values) > eps * (1 + _MARGIN)):
                self.categorical[k] = {float(v): i for i, v in enumerate(values)}
                self.bits[k] = _bits_for(len(values) + _HEADROOM)
            elif eps > 0 and np.abs(values).max() <= _MAX_BINS * eps:
                bins = np.floor(values / self.width)
                self.real[k] = int(bins.min()) - _HEADROOM
                self.bits[k] = _bits_for(int(bins.max() - bins.min()) + 2 * _HEADROOM + 1)
        self.features = [k for k in (order or range(x.shape[1])) if k in self.bits]

    def codes(self, x: np.ndarray) -> np.ndarray | None:
        """Cell codes (n, features), or None if a value falls outside the encoding."""
        out = np.empty((len(x), len(self.features)), dtype=np.int64)
        for i, k in enumerate(self.features):
            if k in self.real:
                out[:, i] = np.floor(x[:, k] / self.width).astype(np.int64) - self.real[k]
            else:
                table = self.categorical[k]
                try:
                    out[:, i] = [table[float(v)] for v in x[:, k] + 0.0]
                except KeyError:
                    return None
            if (out[:, i] < 0).any() or (out[:, i] >= 1 << self.bits[k]).any():
                return None
        return out


def _bits_for(n: int) -> int:
    return max(1, math.ceil(math.log2(max(n, 2))))


class BDDBackend(Backend):
    """``ordering``: ``"interleaved"`` (each bit of x next to the same bit of y, features in
    ``order``) or ``"blocked"`` (all x bits, then all y bits); ``order`` lists features
    (default: as given); ``reorder`` turns on CUDD's dynamic variable reordering."""

    name = "bdd"

    def __init__(
        self,
        spec: MonitorSpec,
        history: History,
        ordering: str = "interleaved",
        order: list[int] | None = None,
        reorder: bool = False,
    ) -> None:
        if spec.metric is not InputMetric.LINF:
            raise ValueError("the bdd backend supports the L-inf metric only")
        if spec.output is not OutputKind.LABEL:
            raise ValueError("the bdd backend supports label outputs only")
        if ordering not in ("interleaved", "blocked"):
            raise ValueError(f"ordering must be 'interleaved' or 'blocked', got {ordering!r}")
        super().__init__(spec, history)
        self.ordering, self.order, self.reorder = ordering, order, reorder
        self._plan(self.history.size)
        self._insert(0, self.history.size)

    def options(self) -> dict[str, Any]:
        return {"ordering": self.ordering, "order": self.order, "reorder": self.reorder}

    def rebuild(self) -> None:
        self._plan(self.history.size)
        self._insert(0, self.history.size)

    # -- encoding and the static relation ----------------------------------------------

    def _plan(self, upto: int) -> None:
        x = self.history.x[:upto]
        if not len(x):
            x = np.zeros((1, self.history.x.shape[1]))
        self.encoding = enc = _Encoding(x, self.spec.eps, self.order)
        self.bdd = bdd = cudd.BDD()
        if self.reorder:
            bdd.configure(reordering=True)
        xs = {k: [f"x{k}_{b}" for b in range(enc.bits[k])] for k in enc.features}
        ys = {k: [f"y{k}_{b}" for b in range(enc.bits[k])] for k in enc.features}
        if self.ordering == "interleaved":
            names = [
                v
                for k in enc.features
                for b in reversed(range(enc.bits[k]))
                for v in (xs[k][b], ys[k][b])
            ]
        else:
            names = [v for k in enc.features for v in reversed(xs[k])]
            names += [v for k in enc.features for v in reversed(ys[k])]
        bdd.declare(*names)
        self._xs, self._ys = xs, ys
        self._x_vars = [v for k in enc.features for v in xs[k]]
        relation = bdd.true
        for k in enc.features:
            xb = [bdd.var(v) for v in xs[k]]
            yb = [bdd.var(v) for v in ys[k]]
            same = _equal(bdd, xb, yb)
            if k in enc.real:
                same = same | _successor(bdd, xb, yb) | _successor(bdd, yb, xb)
            relation &= same
        self._relation = relation
        self._seen: dict[int, Any] = {}
        self._cells: dict[tuple, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))

    def _assign(self, names: dict[int, list[str]], code: np.ndarray) -> dict[str, bool]:
        return {
            names[k][b]: bool((int(c) >> b) & 1)
            for k, c in zip(self.encoding.features, code, strict=True)
            for b in range(self.encoding.bits[k])
        }

    def _insert(self, start: int, stop: int) -> None:
        codes = self.encoding.codes(self.history.x[start:stop])
        for row, code in enumerate(codes):
            self._add(start + row, code)

    def _add(self, position: int, code: np.ndarray) -> None:
        label = int(self.history.y[position])
        cell = tuple(code.tolist())
        bucket = self._cells[cell]
        if label not in bucket:
            cube = self.bdd.cube(self._assign(self._xs, code))
            self._seen[label] = self._seen.get(label, self.bdd.false) | cube
        bucket[label].append(position)

    # -- queries ----------------------------------------------------------------------

    def advance(self, start: int, stop: int) -> Pairs:
        codes = self.encoding.codes(self.history.x[start:stop])
        if codes is None:  # new data left the encoding's ranges: re-plan with them
            self._plan(stop)
            self._insert(0, start)
            codes = self.encoding.codes(self.history.x[start:stop])
        qs, js = [], []
        for row, code in enumerate(codes):
            position = start + row
            found = self._query(position, code)
            if found:
                qs.append(np.full(len(found), position))
                js.append(np.asarray(found))
            self._add(position, code)
        return concat_pairs(qs, js)

    def _query(self, position: int, code: np.ndarray) -> list[int]:
        label = int(self.history.y[position])
        others = [c for c in self._seen if c != label]
        if not others:
            return []
        bdd = self.bdd
        near = bdd.let(self._assign(self._ys, code), self._relation)
        own = None
        found: list[int] = []
        for other in others:
            candidates = near & self._seen[other]
            if candidates == bdd.false:  # case (a)
                continue
            if own is None:
                own = bdd.cube(self._assign(self._xs, code))
            if candidates == own:  # case (b): only the decision's own cell
                found += self._cells[tuple(code.tolist())][other]
                continue
            for model in bdd.pick_iter(candidates, care_vars=self._x_vars):  # case (c)
                found += self._cells[self._decode(model)].get(other, [])
        return found

    def _decode(self, model: dict[str, bool]) -> tuple:
        return tuple(
            sum(int(model[self._xs[k][b]]) << b for b in range(self.encoding.bits[k]))
            for k in self.encoding.features
        )


def _equal(bdd: cudd.BDD, a: list, b: list):
    out = bdd.true
    for u, v in zip(a, b, strict=True):
        out &= bdd.apply("<=>", u, v)
    return out


def _successor(bdd: cudd.BDD, a: list, b: list):
    """``b == a + 1`` over little-endian bit lists (no wrap-around)."""
    out = bdd.false
    for k in range(len(a)):
        term = ~a[k] & b[k]
        for j in range(k):
            term &= a[j] & ~b[j]
        for j in range(k + 1, len(a)):
            term &= bdd.apply("<=>", a[j], b[j])
        out |= term
    return out
