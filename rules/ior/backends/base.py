"""The backend contract and the exact dense search the backends share."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import faiss
import numpy as np

from vigil.rules.ior.distance import (
    float32_search_radius,
    input_distance,
    output_distance,
    tie_tolerance,
    written_distance,
)
from vigil.rules.ior.history import History
from vigil.rules.ior.spec import InputMetric, MonitorSpec, OutputKind

Pairs = tuple[np.ndarray, np.ndarray]
"""(query positions, candidate positions), int64 arrays of equal length."""

_VERIFY_BLOCK = 1 << 22
"""Elements of the candidate difference matrix checked at once."""
_SCREEN_SAMPLE = 512
"""Candidate pairs whose full differences choose the screening features."""
_SCREEN_FEATURES = 3
_SCREEN_GAIN = 8
"""A feature screens only if it rejects at least one in this many of the sampled pairs
left: a pass over a column costs about a tenth of the full distance."""

FAISS_METRIC = {
    InputMetric.LINF: faiss.METRIC_Linf,
    InputMetric.L2: faiss.METRIC_L2,
    InputMetric.L1: faiss.METRIC_L1,
}

HIGH_DIMENSION = 64
"""Above this many compared features, flat L-inf and L1 scans search in L2 instead."""


class FlatSearch:
    """How a float32 flat scan finds candidates: Faiss metric and radius.

    In high dimension an L2 scan (matrix products) is far faster than an L-inf or L1 scan,
    and it is a superset: ``L-inf <= eps`` implies ``L2 <= sqrt(d) eps``, ``L1 <= eps``
    implies ``L2 <= eps``. Where the stream is spread out, the wider L2 ball still prunes
    almost everything; the exact check removes the rest.
    """

    def __init__(self, spec: MonitorSpec, dim: int) -> None:
        self.metric, self.eps = spec.metric, spec.eps
        if dim > HIGH_DIMENSION and spec.metric is not InputMetric.L2:
            self.metric = InputMetric.L2
            self.eps = spec.eps * (math.sqrt(dim) if spec.metric is InputMetric.LINF else 1.0)
        self.dim = dim

    def index(self) -> faiss.IndexFlat:
        return faiss.IndexFlat(self.dim, FAISS_METRIC[self.metric])

    def radius(self, max_abs: float) -> float:
        return float32_search_radius(self.eps, max_abs, self.dim, self.metric)


class Backend(ABC):
    """Finds witness candidates for new decisions.

    ``advance`` is called after rows ``start..stop-1`` were appended to the history. It
    indexes them and returns candidate pairs ``(q, j)`` with ``j < q`` for every ``q`` in
    that range. The candidates must include every true witness; the monitor drops the rest
    with the exact distance, so a backend may over-approximate but never miss. A new
    backend indexes the history it is given; ``rebuild`` indexes it again after rows were
    appended without ``advance`` (a restore).
    """

    name: ClassVar[str]

    def __init__(self, spec: MonitorSpec, history: History) -> None:
        self.spec = spec
        self.history = history

    @abstractmethod
    def advance(self, start: int, stop: int) -> Pairs: ...

    @abstractmethod
    def rebuild(self) -> None:
        """Index the whole history without querying it (used on restore)."""

    def options(self) -> dict[str, Any]:
        """Constructor keywords that recreate this backend (stored in snapshots)."""
        return {}


def partitions(history: History, rows: np.ndarray) -> list[tuple[int | None, np.ndarray]]:
    """Split rows by label (one group ``None`` for probability outputs); empty groups dropped."""
    if history.spec.output is OutputKind.PROBABILITIES:
        return [(None, rows)] if len(rows) else []
    labels = history.y[rows]
    return [(int(v), rows[labels == v]) for v in np.unique(labels)]


def may_differ(history: History, queries: np.ndarray, label: int | None) -> np.ndarray:
    """Mask of the queries whose output can differ from rows in the partition ``label``."""
    if label is None:
        return np.ones(len(queries), dtype=bool)
    return history.y[queries] != label


def output_groups(history: History, queries: np.ndarray, base: np.ndarray) -> Iterator[Pairs]:
    """Split a search so that, for labels, queries meet only base rows of another label."""
    for label, rows in partitions(history, base):
        q = queries[may_differ(history, queries, label)]
        if len(q):
            yield q, rows


def flat_pairs(history: History, queries: np.ndarray, base: np.ndarray) -> Pairs:
    """Candidates among ``base`` for ``queries`` (position arrays) by a Faiss flat scan:
    every pair within eps with base position < query position, plus float32 near-misses."""
    out_q, out_j = [], []
    x = history.x
    search = FlatSearch(history.spec, x.shape[1])
    radius = search.radius(history.max_abs)
    for q, b in output_groups(history, queries, base):
        index = search.index()
        index.add(x[b].astype(np.float32))
        lims, _, found = index.range_search(x[q].astype(np.float32), radius)
        qq = np.repeat(q, np.diff(lims).astype(np.int64))
        jj = b[found]
        earlier = jj < qq
        out_q.append(qq[earlier])
        out_j.append(jj[earlier])
    return concat_pairs(out_q, out_j)


def expand_ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flatten ranges ``[lo, hi)`` into (range number, slot) pairs without a Python loop."""
    counts = hi - lo
    ends = np.cumsum(counts)
    slots = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64)
    slots += np.repeat(lo - (ends - counts), counts)
    return np.repeat(np.arange(len(lo)), counts), slots


def concat_pairs(qs: list[np.ndarray], js: list[np.ndarray]) -> Pairs:
    if not qs:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    return np.concatenate(qs).astype(np.int64), np.concatenate(js).astype(np.int64)


@dataclass(frozen=True)
class Verified:
    """Candidate pairs that passed the exact check, with both distances."""

    query: np.ndarray
    index: np.ndarray
    d_in: np.ndarray
    d_out: np.ndarray


def verify(
    history: History, q: np.ndarray, j: np.ndarray, min_out: float, eps: float | None = None
) -> Verified:
    """Keep the pairs with ``j < q``, ``d_in <= eps`` (default: the spec's) and
    ``d_out > min_out`` (for labels ``d_out`` is 1 for different labels, else 0)."""
    spec = history.spec
    eps = spec.eps if eps is None else eps
    dim = history.x.shape[1]
    tolerance = tie_tolerance(eps, history.max_abs, dim)
    q, j = _screened(history.x, q, j, eps + 2 * tolerance)
    parts: list[tuple[np.ndarray, ...]] = []
    step = max(1, _VERIFY_BLOCK // max(1, dim))
    for lo in range(0, len(q), step):
        qq, jj = q[lo : lo + step], j[lo : lo + step]
        d = input_distance(history.x[qq], history.x[jj], spec.metric)
        within = d <= eps
        near = np.flatnonzero(np.abs(d - eps) <= tolerance)
        if len(near):  # within rounding of eps: the written values decide
            a, b = history.x[qq[near]], history.x[jj[near]]
            within[near], d[near] = written_distance(a, b, eps, spec.metric)
        out = _output_distance(history, qq, jj)
        ok = within & (jj < qq) & (out > min_out)
        parts.append((qq[ok], jj[ok], d[ok], out[ok]))
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return Verified(empty, empty, np.empty(0), np.empty(0))
    return Verified(*(np.concatenate(col) for col in zip(*parts, strict=True)))


def _screened(x: np.ndarray, q: np.ndarray, j: np.ndarray, bound: float) -> Pairs:
    """The pairs left once those differing by more than ``bound`` in one of a few features
    are dropped. Exact: a pair's distance is at least any one feature's difference (for
    every metric, within rounding far below the tie tolerance in ``bound``), so a dropped
    pair is beyond eps and outside the tie band. The grid's candidates mostly share a cell
    and differ by more than eps elsewhere: one column each rejects most of them, at a
    fraction of the cost of their full rows. The features are those that reject the most
    of a sample of the pairs, chosen greedily."""
    if x.shape[1] < 2 * _SCREEN_FEATURES or len(q) < _SCREEN_SAMPLE:
        return q, j
    far = np.abs(x[q[:_SCREEN_SAMPLE]] - x[j[:_SCREEN_SAMPLE]]) > bound
    left = np.ones(_SCREEN_SAMPLE, dtype=bool)
    for _ in range(_SCREEN_FEATURES):
        rejects = (far & left[:, None]).sum(axis=0)
        feature = int(np.argmax(rejects))
        if _SCREEN_GAIN * rejects[feature] < left.sum():
            break
        left &= ~far[:, feature]
        column = x[:, feature]
        keep = np.abs(column[q] - column[j]) <= bound
        q, j = q[keep], j[keep]
    return q, j


def _output_distance(history: History, q: np.ndarray, j: np.ndarray) -> np.ndarray:
    spec, y = history.spec, history.y
    if spec.output is OutputKind.LABEL:
        return (y[q] != y[j]).astype(np.float64)
    return output_distance(y[q], y[j], spec.output_metric)
