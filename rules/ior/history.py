"""Every decision seen so far, in stream order, in the space where d_in is measured."""

from __future__ import annotations

import numpy as np

from vigil.rules.ior.spec import MonitorSpec, OutputKind


class History:
    """Append-only columns (inputs, outputs, external ids) with amortised O(1) growth."""

    def __init__(self, spec: MonitorSpec, capacity: int = 1024) -> None:
        self.spec = spec
        self.size = 0
        self._x = np.empty((capacity, spec.view_dim), dtype=np.float64)
        out_shape = (capacity,) if spec.output is OutputKind.LABEL else (capacity, spec.output_dim)
        out_dtype = np.int64 if spec.output is OutputKind.LABEL else np.float64
        self._y = np.empty(out_shape, dtype=out_dtype)
        self.ids: list = []
        self.max_abs = 0.0

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.size]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.size]

    def append(self, x: np.ndarray, y: np.ndarray, ids: list) -> tuple[int, int]:
        """Append rows; return their positions as ``range(start, stop)``."""
        start, stop = self.size, self.size + len(x)
        if stop > len(self._x):
            capacity = max(stop, 2 * len(self._x))
            self._x = _grow(self._x, capacity)
            self._y = _grow(self._y, capacity)
        self._x[start:stop] = x
        self._y[start:stop] = y
        self.ids.extend(ids)
        self.size = stop
        if len(x):
            self.max_abs = max(self.max_abs, float(np.abs(x).max(initial=0.0)))
        return start, stop


def _grow(a: np.ndarray, capacity: int) -> np.ndarray:
    out = np.empty((capacity, *a.shape[1:]), dtype=a.dtype)
    out[: len(a)] = a
    return out
