"""Naive ground truth for small data (the paper's baseline): enumerate every training set with
at most n flipped labels, relearn K on each by the same cross-validation, and predict every
protected variant of the input."""

from __future__ import annotations

import itertools
import math

import numpy as np

from vigil.rules.certify.knn.errors import KnnInputError
from vigil.rules.certify.knn.knn import KnnModel, fold_ids, label_counts, nearest, vote

DEFAULT_LIMIT = 250_000
"""Most flipped training sets the oracle will enumerate."""

_CHUNK = 64


def count_flip_sets(size: int, q: int, n: int) -> int:
    """Number of label vectors within n flips of a training set of ``size`` points."""
    return sum(math.comb(size, j) * (q - 1) ** j for j in range(min(n, size) + 1))


def flip_sets(y: np.ndarray, q: int, n: int, limit: int = DEFAULT_LIMIT) -> np.ndarray:
    """All label vectors (M, N) within n flips of y, the original first."""
    total = count_flip_sets(len(y), q, n)
    if total > limit:
        raise KnnInputError(
            f"enumeration needs {total} flipped training sets (limit {limit}): "
            "use smaller data or fewer flips"
        )
    out = np.empty((total, len(y)), dtype=y.dtype)
    out[:] = y
    row = 1
    for j in range(1, min(n, len(y)) + 1):
        for idx in itertools.combinations(range(len(y)), j):
            choices = [[c for c in range(q) if c != y[i]] for i in idx]
            for new in itertools.product(*choices):
                out[row, list(idx)] = new
                row += 1
    return out


class Enumerator:
    """Ground truth for one trained model and flip budget: the K each flipped training set
    would learn is computed once, then ``truth`` checks inputs."""

    def __init__(self, model: KnnModel, n: int, limit: int = DEFAULT_LIMIT) -> None:
        self.model = model
        self.labels = flip_sets(model.y, model.q, n, limit)
        self.k = np.concatenate(
            [self._learn(self.labels[s : s + _CHUNK]) for s in range(0, len(self.labels), _CHUNK)]
        )

    def _learn(self, labels: np.ndarray) -> np.ndarray:
        m = self.model
        counts = label_counts(labels[:, m.cv_nbrs], m.ks, m.q)  # (M, N, C, q)
        wrong = vote(counts) != labels[:, :, None]
        fold = fold_ids(len(m.y), m.p)
        sizes = np.bincount(fold, minlength=m.p)
        rates = np.stack([wrong[:, fold == f].sum(1) / sizes[f] for f in range(m.p)]).mean(0)
        return m.ks[np.argmin(rates, axis=1)]

    def truth(self, variants: np.ndarray, y: int) -> bool:
        """True iff every flipped training set predicts y for every encoded input variant."""
        m = self.model
        kmax = int(self.k.max())
        nbrs = nearest(m.x, variants, kmax, m.metric)  # (V, kmax)
        for s in range(0, len(self.labels), _CHUNK):
            lab = self.labels[s : s + _CHUNK][:, nbrs]  # (M, V, kmax)
            onehot = lab[..., None] == np.arange(m.q)
            cum = np.cumsum(onehot, axis=2)
            k = self.k[s : s + _CHUNK]
            counts = cum[np.arange(len(k)), :, k - 1, :]  # (M, V, q)
            if np.any(vote(counts) != y):
                return False
        return True
