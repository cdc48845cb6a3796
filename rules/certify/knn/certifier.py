"""Algorithm 1 end to end: learn the concrete K and the abstract KSet once per training set,
then certify inputs under one of three fairness variants."""

from __future__ import annotations

import copy
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vigil.rules.certify.knn.encoding import Encoder
from vigil.rules.certify.knn.enumeration import Enumerator
from vigil.rules.certify.knn.errors import KnnInputError
from vigil.rules.certify.knn.knn import KnnModel, metric_power
from vigil.rules.certify.knn.learning import AbstractLearning, abstract_learn
from vigil.rules.certify.knn.prediction import distance_bounds, same_label
from vigil.rules.certify.knn.table import Table

VARIANTS = ("label", "individual", "epsilon")
"""label: n label flips only; individual: plus any protected values; epsilon: plus an eps box
around the unprotected numeric attributes."""

DEFAULT_FOLDS = 5
CANDIDATE_FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0)
MAX_PROTECTED_VALUES = 64
"""Protected value combinations enumerated one by one; beyond this the paper's interval bound
over all values is used instead."""


def default_candidates(n: int, size: int, folds: int = DEFAULT_FOLDS) -> list[int]:
    """Odd candidate K: k0 = max(sqrt(size), 4n + 1) (the usual sqrt rule, kept clear of the
    flips) times 1, 1.5, 2, 3, 4, capped by a training fold's size. A candidate k <= 2n could
    never be certified (n flips overturn any k <= 2n votes) and, having LB_k = 0, would always
    be in KSet, making every input unknown."""
    cap = size - -(-size // folds)
    k0 = max(math.ceil(math.sqrt(size)), 4 * n + 1)
    top = cap if cap % 2 else cap - 1
    return sorted({min(top, int(k0 * f) // 2 * 2 + 1) for f in CANDIDATE_FACTORS if top >= 1})


@dataclass(frozen=True)
class Certificate:
    """One input's answer: the concrete label (code), certified or unknown, the first K of
    KSet that failed, and the certification time."""

    label: int
    certified: bool
    failed_k: int | None
    seconds: float


class FairKnnCertifier:
    """A KNN trained on an encoded table, with its KSet under n flips."""

    def __init__(
        self,
        encoder: Encoder,
        x: np.ndarray,
        labels: np.ndarray,
        flips: int,
        ks: Sequence[int] | None = None,
        folds: int = DEFAULT_FOLDS,
        metric: str = "euclidean",
    ) -> None:
        if isinstance(flips, bool) or not isinstance(flips, int | np.integer) or flips < 0:
            raise KnnInputError(f"flips must be an integer >= 0, got {flips!r}")
        if isinstance(folds, bool) or not isinstance(folds, int | np.integer) or folds < 2:
            raise KnnInputError(f"folds must be an integer >= 2, got {folds!r}")
        self.encoder = encoder
        self.flips = int(flips)
        self.power = metric_power(metric)
        started = time.perf_counter()
        ks = list(ks) if ks is not None else default_candidates(self.flips, len(x), folds)
        self.model = KnnModel.fit(x, labels, ks, folds, metric)
        if self.model.q < 2:
            raise KnnInputError("the training labels must take at least two values")
        self.learning: AbstractLearning = abstract_learn(self.model, self.flips)
        self.prot_mask = encoder.protected_mask
        self.prot_lo, self.prot_hi = encoder.protected_bounds(x, self.power)
        self._free = np.ascontiguousarray(x[:, ~self.prot_mask])
        self._norm = (
            float((x * x).sum(1).max()) if self.power == 2 else float(np.abs(x).sum(1).max())
        )
        self.learn_seconds = time.perf_counter() - started

    @classmethod
    def from_table(
        cls,
        table: Table,
        labels: np.ndarray,
        protected: Sequence[str],
        flips: int,
        categorical: Sequence[str] = (),
        ks: Sequence[int] | None = None,
        folds: int = DEFAULT_FOLDS,
        metric: str = "euclidean",
        scaling: str = "minmax",
    ) -> FairKnnCertifier:
        """Fit the encoding on a raw feature table and train."""
        if not protected:
            raise KnnInputError("protected: name at least one protected attribute")
        encoder = Encoder.fit(table, protected, categorical, scaling)
        return cls(encoder, encoder.transform(table), labels, flips, ks, folds, metric)

    @property
    def k(self) -> int:
        """The concretely learned K."""
        return self.model.k

    def label_value(self, code: int) -> object:
        """The original label of a code, as a plain (JSON-serialisable) value."""
        value = self.model.classes[code]
        return value.item() if isinstance(value, np.generic) else value

    @property
    def kset(self) -> np.ndarray:
        """Every K that cross-validation could pick under the flips."""
        return self.learning.kset

    def with_protected(self, protected: Sequence[str]) -> FairKnnCertifier:
        """The same trained model (learning does not depend on the protected attributes) with
        another protected attribute list."""
        other = copy.copy(self)
        other.encoder = self.encoder.with_protected(protected)
        other.prot_mask = other.encoder.protected_mask
        other.prot_lo, other.prot_hi = other.encoder.protected_bounds(self.model.x, self.power)
        other._free = np.ascontiguousarray(self.model.x[:, ~other.prot_mask])
        return other

    def certify(
        self,
        x: np.ndarray,
        variant: str,
        eps: float | Sequence[float] = 0.0,
        protected_mode: str = "enumerate",
    ) -> list[Certificate]:
        """Certify encoded inputs (rows) under a variant; ``eps`` (fraction of each numeric
        attribute's range) is used by the epsilon variant only. ``protected_mode``
        "enumerate" checks each combination of protected values separately (exact in the
        protected attributes, used up to MAX_PROTECTED_VALUES combinations); "bound" is the
        paper's single interval bound over all protected values."""
        if variant not in VARIANTS:
            raise KnnInputError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")
        if protected_mode not in ("enumerate", "bound"):
            raise KnnInputError(
                f"protected_mode: expected enumerate or bound, got {protected_mode!r}"
            )
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        width = self.model.x.shape[1]
        if x.shape[1] != width:
            raise KnnInputError(f"inputs have {x.shape[1]} encoded columns, training data {width}")
        labels = self.model.predict_codes(x)
        box = np.zeros(width)
        if variant == "epsilon":
            box = self.encoder.eps_vector(self.model.x, eps)
        if variant != "label" and (
            protected_mode == "bound" or self._combinations() > MAX_PROTECTED_VALUES
        ):
            free = ~self.prot_mask
            return [
                self._check([row[free]], self._free, box[free], self.prot_lo, self.prot_hi, y)
                for row, y in zip(x, labels, strict=True)
            ]
        out = []
        for row, y in zip(x, labels, strict=True):
            points = [row] if variant == "label" else self.protected_variants(row)
            out.append(self._check(points, self.model.x, box, 0.0, 0.0, y))
        return out

    def _combinations(self) -> int:
        return math.prod(
            len(c.levels) if c.kind != "numeric" else len(c.domain)
            for c in self.encoder.codes
            if c.protected
        )

    def _check(
        self,
        points: Sequence[np.ndarray],
        train: np.ndarray,
        box: np.ndarray,
        lo: np.ndarray | float,
        hi: np.ndarray | float,
        y: int,
    ) -> Certificate:
        """Algorithm 2 for each point's box; certified only if every point is."""
        started = time.perf_counter()
        failed = None
        for xr in points:
            lb, ub = distance_bounds(xr, train, box, lo, hi, self.power)
            scale = self._norm + float(np.abs(xr).sum() ** self.power) + float(np.max(hi))
            ok, failed = same_label(
                lb,
                ub,
                self.model.y,
                self.model.q,
                self.kset,
                int(y),
                self.flips,
                1e-9 * (1 + scale),
            )
            if not ok:
                break
        return Certificate(int(y), failed is None, failed, time.perf_counter() - started)

    def protected_variants(self, row: np.ndarray) -> np.ndarray:
        """The encoded input and its copies with every combination of protected values seen in
        training."""
        blocks = []
        for c in self.encoder.codes:
            if not c.protected:
                continue
            vals = np.eye(len(c.levels)) if c.kind == "onehot" else c.domain[:, None]
            blocks.append((c.start, c.stop, vals))
        out = [row]
        for combo in itertools.product(*[range(len(v)) for _, _, v in blocks]):
            r = row.copy()
            for (start, stop, vals), i in zip(blocks, combo, strict=True):
                r[start:stop] = vals[i]
            out.append(r)
        return np.unique(np.array(out), axis=0)

    def ground_truth(
        self, x: np.ndarray, variant: str, enumerator: Enumerator | None = None
    ) -> list[bool]:
        """Naive enumeration (label or individual variant): is each input's prediction the same
        on every flipped training set (and for every protected value)?"""
        if variant not in ("label", "individual"):
            raise KnnInputError(
                f"enumeration covers the label and individual variants, not {variant!r}"
            )
        enumerator = enumerator or Enumerator(self.model, self.flips)
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        labels = self.model.predict_codes(x)
        out = []
        for row, y in zip(x, labels, strict=True):
            variants = row[None, :] if variant == "label" else self.protected_variants(row)
            out.append(enumerator.truth(variants, int(y)))
        return out
