"""Floating-point element types, and the error bounds of one operation in them.

A query that declares its tensors ``float32`` asks about the network as it is computed in
float32, not over the reals. Every operation of that computation rounds. The bounds used
here hold for IEEE arithmetic in any summation order, with or without fused multiply-add
(Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, section 3.1):

- an inner product of n terms, ``s = sum_i w_i x_i``, computed in any order, is off by at
  most ``gamma(n) * sum_i |w_i x_i|``, with ``gamma(n) = n u / (1 - n u)`` and ``u`` the
  unit roundoff (2^-24 for float32);
- one addition, multiplication or division is off by at most ``u`` times its result;
- results below the smallest normal number may be rounded or flushed to zero: at most
  ``tiny`` more per operation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Precision:
    """A floating-point element type: its name as VNN-LIB spells it, its unit roundoff and
    its smallest normal number."""

    name: str
    unit: float
    tiny: float
    dtype: type

    def gamma(self, terms: int) -> float:
        """The relative error bound of ``terms`` chained roundings (an inner product of
        that many terms)."""
        nu = terms * self.unit
        if nu >= 0.5:
            raise ValueError(f"{terms} terms in {self.name}: no useful error bound")
        return nu / (1.0 - nu)


PRECISIONS = {
    "float16": Precision("float16", 2.0**-11, 2.0**-14, np.float16),
    "float32": Precision("float32", 2.0**-24, 2.0**-126, np.float32),
    "float64": Precision("float64", 2.0**-53, 2.0**-1022, np.float64),
}
"""The element types whose rounding the bounds account for."""

ONNX_TYPES = {10: "float16", 1: "float32", 11: "float64"}
"""ONNX ``TensorProto`` element types by number."""


class Tracked:
    """A precision while a graph is imported, and per layer the largest magnitude any
    tensor computed in it may reach: ``peak . |h| + offset`` in the magnitudes of the
    layer's neurons ``h`` (an inner product's partial sums included). Bounds that ignore
    overflow hold only while that stays finite (``rounding.rounding_noise`` checks it)."""

    def __init__(self, precision: Precision) -> None:
        self.precision = precision
        self.name, self.unit, self.tiny = precision.name, precision.unit, precision.tiny
        self.dtype = precision.dtype
        self.peaks: list[tuple[np.ndarray, float]] = []
        self._coef: np.ndarray | None = None
        self._offset = 0.0

    def gamma(self, terms: int) -> float:
        return self.precision.gamma(terms)

    def note(self, coef: np.ndarray, offset: np.ndarray) -> None:
        """A computed tensor's magnitude bound: coefficients (n, *shape), offset (shape)."""
        top = coef.reshape(coef.shape[0], -1).max(axis=1, initial=0.0)
        self._coef = top if self._coef is None else np.maximum(self._coef, top)
        self._offset = max(self._offset, float(np.max(offset, initial=0.0)))

    def close(self, neurons: int) -> None:
        """The layer over ``neurons`` neurons is complete: keep its peak, start the next."""
        coef = np.zeros(neurons) if self._coef is None else self._coef
        self.peaks.append((coef, self._offset))
        self._coef, self._offset = None, 0.0
