"""The concrete KNN of the paper (Fig. 2): prediction by majority vote of the K nearest training
points, K learned by p-fold cross-validation over candidate values.

Deterministic tie rules, shared by every consumer so that the abstract analysis, the enumeration
oracle and the concrete model all see the same neighbours:

* neighbours are ordered by (distance, training index): among equally distant points the lower
  index is nearer;
* a vote tie goes to the smallest label code (labels are coded in sorted order);
* a cross-validation tie goes to the smallest candidate k;
* fold f holds the samples whose index i has ``i % p == f``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.spatial.distance import cdist

from vigil.rules.certify.knn.errors import KnnInputError

METRICS = {"euclidean": 2, "manhattan": 1}
"""Metric name -> the power p of the per-attribute terms |x_i - t_i|^p summed in the distance."""

_CHUNK_ELEMENTS = 4_000_000


def metric_power(metric: str) -> int:
    """The term power of a metric name; KnnInputError for an unknown one."""
    try:
        return METRICS[metric]
    except KeyError:
        raise KnnInputError(
            f"metric: expected one of {', '.join(METRICS)}, got {metric!r}"
        ) from None


def _screen(train: np.ndarray, queries: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Fast (queries, train) distances in the order-preserving form (squared for Euclidean,
    by one matrix product) and, per query, a bound on how far each may be from the pairwise
    value."""
    if metric_power(metric) == 1:
        return cdist(queries, train, "cityblock"), np.zeros(len(queries))
    qq = (queries * queries).sum(1)
    tt = (train * train).sum(1)
    d = queries @ train.T
    d *= -2.0
    d += tt[None, :]
    d += qq[:, None]
    np.maximum(d, 0.0, out=d)
    error = 4 * (queries.shape[1] + 2) * np.finfo(np.float64).eps * (qq + tt.max(initial=0.0))
    return d, error


def _pairwise(train: np.ndarray, queries: np.ndarray, metric: str) -> np.ndarray:
    """Row i's distance between queries[i] and train[i], term by term (order-preserving form)."""
    diff = np.abs(queries - train)
    return (diff if metric_power(metric) == 1 else diff * diff).sum(1)


def nearest(train: np.ndarray, queries: np.ndarray, k: int, metric: str) -> np.ndarray:
    """Indices (queries, k) of each query's k nearest training points, nearest first, ties by
    training index.

    The ranking is decided on distances taken pair by pair: a matrix product only screens
    the candidates, since BLAS rounds it by the batch's shape, so a query's neighbours would
    otherwise depend on the other queries beside it and exact ties would break at random.
    """
    n = len(train)
    if not 1 <= k <= n:
        raise KnnInputError(f"k={k} needs 1 <= k <= {n} training points")
    out = np.empty((len(queries), k), dtype=np.int64)
    step = max(1, _CHUNK_ELEMENTS // max(n, 1))
    for s in range(0, len(queries), step):
        chunk = queries[s : s + step]
        d, error = _screen(train, chunk, metric)
        kth = np.partition(d, k - 1, axis=1)[:, k - 1]
        # a point within the exact k-th distance is within 2 * error of the screened one
        r, c = np.nonzero(d <= (kth + 2 * error)[:, None])
        exact = _pairwise(train[c], chunk[r], metric)
        order = np.lexsort((c, exact, r))
        r, c = r[order], c[order]
        starts = np.searchsorted(r, np.arange(len(chunk)))
        out[s : s + step] = c[starts[:, None] + np.arange(k)[None, :]]
    return out


def label_counts(nbr_labels: np.ndarray, ks: np.ndarray, q: int) -> np.ndarray:
    """Counts (..., len(ks), q) of each label among the first k of each neighbour list."""
    lead, kmax = nbr_labels.shape[:-1], nbr_labels.shape[-1]
    flat = nbr_labels.reshape(-1, kmax)
    out = np.empty((len(flat), len(ks), q), dtype=np.int32)
    step = max(1, _CHUNK_ELEMENTS // (kmax * q))
    for s in range(0, len(flat), step):
        onehot = flat[s : s + step, :, None] == np.arange(q)
        out[s : s + step] = np.cumsum(onehot, axis=1, dtype=np.int32)[:, ks - 1, :]
    return out.reshape(*lead, len(ks), q)


def vote(counts: np.ndarray) -> np.ndarray:
    """Majority label code per count vector (smallest code on ties)."""
    return np.argmax(counts, axis=-1)


def fold_ids(n: int, p: int) -> np.ndarray:
    """Fold of each training sample."""
    return np.arange(n) % p


def cv_neighbours(x: np.ndarray, p: int, kmax: int, metric: str) -> np.ndarray:
    """For each sample, its kmax nearest neighbours (global indices) among the other folds."""
    n = len(x)
    if p < 2 or p > n:
        raise KnnInputError(f"folds: need 2 <= p <= {n} training points, got {p}")
    fold = fold_ids(n, p)
    out = np.empty((n, kmax), dtype=np.int32)
    for f in range(p):
        held = np.flatnonzero(fold == f)
        rest = np.flatnonzero(fold != f)
        if kmax > len(rest):
            raise KnnInputError(f"k={kmax} exceeds the {len(rest)} points of a training fold")
        out[held] = rest[nearest(x[rest], x[held], kmax, metric)]
    return out


def fold_error_rates(wrong: np.ndarray, fold: np.ndarray, p: int) -> np.ndarray:
    """Mean over folds of each fold's error rate, per column of the (samples, ks) flags."""
    sizes = np.bincount(fold, minlength=p).astype(np.float64)
    per_fold = np.stack([wrong[fold == f].sum(0) for f in range(p)])
    return (per_fold / sizes[:, None]).mean(0)


def learn_k(cv_nbrs: np.ndarray, y: np.ndarray, ks: np.ndarray, p: int, q: int) -> int:
    """KNN_learn: the candidate k with the least cross-validation error."""
    counts = label_counts(y[cv_nbrs], ks, q)
    wrong = vote(counts) != y[:, None]
    err = fold_error_rates(wrong, fold_ids(len(y), p), p)
    return int(ks[int(np.argmin(err))])


def candidate_ks(ks: Sequence[object]) -> np.ndarray:
    """The distinct candidate ks, sorted; KnnInputError unless there is at least one and each
    is a positive integer (an integral float such as 3.0 counts; 3.7, "3" and True do not)."""
    out = []
    for k in ks:
        if (
            isinstance(k, bool)
            or not isinstance(k, int | float | np.integer | np.floating)
            or not float(k).is_integer()
            or k < 1
        ):
            raise KnnInputError(f"k candidates must be positive integers, got {list(ks)!r}")
        out.append(int(k))
    if not out:
        raise KnnInputError("k candidates must be positive integers, got none")
    return np.unique(np.array(out, dtype=np.int64))


@dataclass
class KnnModel:
    """Training data (encoded, label codes), candidate ks, folds and the learned K."""

    x: np.ndarray
    y: np.ndarray
    classes: np.ndarray
    ks: np.ndarray
    p: int
    metric: str
    cv_nbrs: np.ndarray
    k: int

    @classmethod
    def fit(
        cls,
        x: np.ndarray,
        labels: np.ndarray,
        ks: Sequence[int],
        p: int = 5,
        metric: str = "euclidean",
    ) -> KnnModel:
        """Code the labels, find cross-validation neighbours once and learn K."""
        metric_power(metric)
        if len(x) != len(labels):
            raise KnnInputError(f"{len(x)} training rows but {len(labels)} labels")
        ks_arr = candidate_ks(ks)
        classes, y = np.unique(labels, return_inverse=True)
        cv = cv_neighbours(x, p, int(ks_arr[-1]), metric)
        k = learn_k(cv, y, ks_arr, p, len(classes))
        return cls(x, y, classes, ks_arr, p, metric, cv, k)

    @property
    def q(self) -> int:
        """Number of labels."""
        return len(self.classes)

    def predict_codes(self, queries: np.ndarray, k: int | None = None) -> np.ndarray:
        """Predicted label codes of encoded queries with K (default: the learned one)."""
        k = self.k if k is None else k
        nbrs = nearest(self.x, queries, k, self.metric)
        return vote(label_counts(self.y[nbrs], np.array([k]), self.q)[:, 0])
