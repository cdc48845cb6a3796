"""Mixed-data preprocessing for KNN: scaled numeric columns, 0/1 binary columns, one-hot
categorical columns, and the protected attributes' value domains.

Distances are taken in the encoded space, so the encoding decides what "near" means: numeric
columns are standard-scaled (as in the paper's preprocessing) or min-max scaled onto [0, 1];
a two-valued column is one 0/1 column; a categorical one is one-hot (0/1 each).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from vigil.rules.certify.knn.errors import KnnInputError
from vigil.rules.certify.knn.table import Table

SCALINGS = ("standard", "minmax")


@dataclass(frozen=True)
class ColumnCode:
    """How one raw attribute becomes encoded columns ``start:stop``."""

    name: str
    kind: str  # "numeric" (scaled), "binary" (one 0/1 column) or "onehot"
    start: int
    stop: int
    protected: bool
    center: float = 0.0
    scale: float = 1.0
    levels: tuple = ()
    domain: np.ndarray = field(default_factory=lambda: np.zeros(0))  # sorted encoded values

    def encode(self, values: Sequence[object]) -> np.ndarray:
        """Encoded block (len(values), stop - start); KnnInputError names unknown values."""
        if self.kind == "numeric":
            return ((_floats(values, self.name) - self.center) / self.scale)[:, None]
        numeric = isinstance(self.levels[0], float)
        index = {v: i for i, v in enumerate(self.levels)}
        codes = np.empty(len(values), dtype=np.int64)
        for r, v in enumerate(values):
            key = _key(v, numeric, self.name)
            if key not in index:
                raise KnnInputError(
                    f"column {self.name!r}: value {v!r} not seen in the training data "
                    f"(known: {', '.join(map(str, self.levels))})"
                )
            codes[r] = index[key]
        if self.kind == "binary":
            return codes[:, None].astype(np.float64)
        return np.eye(len(self.levels))[codes]


def _float(v: object, name: str) -> float:
    """One cell of a numeric column; KnnInputError names the column of a non-numeric or
    non-finite value (nan/inf would break the neighbour ordering)."""
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise KnnInputError(
            f"column {name!r}: non-numeric value {v!r} in a numeric column"
        ) from None
    if not math.isfinite(x):
        raise KnnInputError(f"column {name!r}: value {v!r} is not finite")
    return x


def _key(v: object, numeric: bool, name: str) -> object:
    return _float(v, name) if numeric else str(v)


def _floats(values: Sequence[object], name: str) -> np.ndarray:
    return np.array([_float(v, name) for v in values], dtype=np.float64)


def _is_numeric(values: Sequence[object]) -> bool:
    try:
        for v in values:
            float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


class Encoder:
    """Fitted preprocessing of a training table (see the module docstring)."""

    def __init__(self, codes: list[ColumnCode]) -> None:
        self.codes = codes
        self.width = codes[-1].stop if codes else 0

    @classmethod
    def fit(
        cls,
        table: Table,
        protected: Sequence[str],
        categorical: Sequence[str] = (),
        scaling: str = "minmax",
    ) -> Encoder:
        """Choose each column's encoding from the training values; ``categorical`` forces
        one-hot for numeric-looking columns (e.g. integer codes). ``scaling`` of numeric
        columns: "standard" (zero mean, unit variance) or "minmax" (onto [0, 1], the scale of
        the 0/1 columns)."""
        if scaling not in SCALINGS:
            raise KnnInputError(f"scaling: expected one of {', '.join(SCALINGS)}, got {scaling!r}")
        for name in [*protected, *categorical]:
            table.index(name)
        if not table.rows:
            raise KnnInputError("the training data has no rows")
        codes: list[ColumnCode] = []
        start = 0
        for j, name in enumerate(table.columns):
            values = [r[j] for r in table.rows]
            is_prot = name in protected
            numeric = _is_numeric(values)
            distinct = sorted({_key(v, numeric, name) for v in values})  # type: ignore[type-var]
            if numeric and len(distinct) > 2 and name not in categorical:
                x = _floats(values, name)
                if scaling == "standard":
                    center, scale = float(x.mean()), float(x.std()) or 1.0
                else:
                    center, scale = float(x.min()), float(x.max() - x.min()) or 1.0
                dom = np.unique((x - center) / scale)
                codes.append(
                    ColumnCode(name, "numeric", start, start + 1, is_prot, center, scale, (), dom)
                )
                start += 1
            elif len(distinct) <= 2:
                lv = tuple(distinct)
                dom = np.arange(len(lv), dtype=np.float64)
                codes.append(
                    ColumnCode(name, "binary", start, start + 1, is_prot, levels=lv, domain=dom)
                )
                start += 1
            else:
                lv = tuple(distinct)
                codes.append(ColumnCode(name, "onehot", start, start + len(lv), is_prot, levels=lv))
                start += len(lv)
        return cls(codes)

    def transform(self, table: Table) -> np.ndarray:
        """Encoded matrix (rows, width) of a table with the training feature columns."""
        out = np.empty((len(table.rows), self.width), dtype=np.float64)
        for c in self.codes:
            out[:, c.start : c.stop] = c.encode(table.column(c.name))
        return out

    def with_protected(self, protected: Sequence[str]) -> Encoder:
        """The same encoding with another set of protected attributes."""
        known = {c.name for c in self.codes}
        for name in protected:
            if name not in known:
                raise KnnInputError(f"no column {name!r} (columns: {', '.join(sorted(known))})")
        return Encoder([replace(c, protected=c.name in protected) for c in self.codes])

    @property
    def protected_mask(self) -> np.ndarray:
        """Encoded columns that belong to protected attributes."""
        mask = np.zeros(self.width, dtype=bool)
        for c in self.codes:
            mask[c.start : c.stop] = c.protected
        return mask

    def eps_vector(self, x_train: np.ndarray, eps: float | Sequence[float]) -> np.ndarray:
        """Per encoded column perturbation bound: ``eps`` is a fraction of each unprotected
        numeric attribute's range in the training data (one number, or one per raw column);
        binary, one-hot and protected columns are never perturbed."""
        try:
            values = np.atleast_1d(np.asarray(eps, dtype=np.float64))
        except (TypeError, ValueError):
            raise KnnInputError(f"eps must be a number or a list of numbers, got {eps!r}") from None
        if len(values) not in (1, len(self.codes)):
            raise KnnInputError(f"eps: expected 1 or {len(self.codes)} values, got {len(values)}")
        per_column = np.broadcast_to(values, (len(self.codes),))
        if np.any(per_column < 0) or not np.all(np.isfinite(per_column)):
            raise KnnInputError("eps must be finite and >= 0")
        out = np.zeros(self.width)
        for c, frac in zip(self.codes, per_column, strict=True):
            if c.kind == "numeric" and not c.protected:
                col = x_train[:, c.start]
                out[c.start] = frac * float(col.max() - col.min())
        return out

    def protected_bounds(self, x_train: np.ndarray, power: int) -> tuple[np.ndarray, np.ndarray]:
        """Per training point t, the min and max over all protected values v of the protected
        attributes' share of the distance (sum of |v_i - t_i|^power); attributes vary
        independently, so the shares add up."""
        lo = np.zeros(len(x_train))
        hi = np.zeros(len(x_train))
        for c in self.codes:
            if not c.protected:
                continue
            if c.kind == "onehot":
                # t is a unit vector and so is every value: nearest is t itself, any other differs
                # in two coordinates by 1.
                hi += 2.0 if len(c.levels) > 1 else 0.0
                continue
            t = x_train[:, c.start]
            dom = c.domain
            pos = np.clip(np.searchsorted(dom, t), 1, len(dom) - 1) if len(dom) > 1 else None
            if pos is None:
                near = np.abs(t - dom[0])
            else:
                near = np.minimum(np.abs(t - dom[pos - 1]), np.abs(t - dom[pos]))
            far = np.maximum(np.abs(t - dom[0]), np.abs(t - dom[-1]))
            lo += near**power
            hi += far**power
        return lo, hi

    def protected_values(self) -> list[tuple[str, tuple]]:
        """Each protected attribute with its raw values (numeric: the distinct training values),
        for enumerating all protected variants of an input."""
        out = []
        for c in self.codes:
            if c.protected:
                vals = c.levels if c.kind != "numeric" else tuple(c.domain * c.scale + c.center)
                out.append((c.name, vals))
        return out
