"""Every decision seen so far, in stream order, in the space where d_in is measured."""

from __future__ import annotations

import numpy as np

from vigil.rules.ior.spec import MonitorSpec, OutputKind


class History:
    """Append-only columns (inputs, outputs, external ids) with O(1) growth per row.

    The columns double when full, but the rows are not all copied at that moment: once the
    columns are half full, the doubled ones are allocated and every append also copies
    earlier rows into them, three for each new row, so they hold every row by the time
    they take over. A monitor that checks each batch as it arrives thus never stops to
    copy its whole history (at 100,000 decisions of 30 features, 24 MB). Columns that
    already have room for ``limit`` rows (a monitor's ``history_limit``) are not doubled
    ahead of time."""

    def __init__(self, spec: MonitorSpec, capacity: int = 1024) -> None:
        self.spec = spec
        self.size = 0
        self._x = np.empty((capacity, spec.view_dim), dtype=np.float64)
        out_shape = (capacity,) if spec.output is OutputKind.LABEL else (capacity, spec.output_dim)
        out_dtype = np.int64 if spec.output is OutputKind.LABEL else np.float64
        self._y = np.empty(out_shape, dtype=out_dtype)
        self._next: tuple[np.ndarray, np.ndarray] | None = None  # the doubled columns
        self._copied = 0  # rows the doubled columns hold
        self.ids: list = []
        self.column_max_abs = np.zeros(spec.view_dim)
        """Per feature, the largest magnitude seen."""

    @property
    def x(self) -> np.ndarray:
        return self._x[: self.size]

    @property
    def y(self) -> np.ndarray:
        return self._y[: self.size]

    @property
    def max_abs(self) -> float:
        """The largest magnitude of any coordinate seen."""
        return float(self.column_max_abs.max(initial=0.0))

    def append(
        self, x: np.ndarray, y: np.ndarray, ids: list, limit: int | None = None
    ) -> tuple[int, int]:
        """Append rows; return their positions as ``range(start, stop)``. ``limit``: the
        most rows the history is to hold (more only for a batch larger than that)."""
        start, stop = self.size, self.size + len(x)
        if stop > len(self._x):
            self._take_over(stop, limit)
        self._x[start:stop] = x
        self._y[start:stop] = y
        self.ids.extend(ids)
        self.size = stop
        if len(x):
            np.maximum(self.column_max_abs, np.abs(x).max(axis=0), out=self.column_max_abs)
            self._copy_ahead(3 * len(x), limit)
        return start, stop

    def clear(self) -> None:
        """Forget every row (the columns are kept, to be filled again)."""
        self.size = self._copied = 0
        self._next = None
        self.ids = []
        self.column_max_abs[:] = 0.0

    def _copy_ahead(self, rows: int, limit: int | None) -> None:
        capacity = len(self._x)
        if self._next is None:
            grown = _grown(capacity, self.size, limit)
            if 2 * self.size < capacity or grown <= capacity:  # not half full, or at the limit
                return
            self._next = (_resized(self._x, grown), _resized(self._y, grown))
            self._copied = 0
        end = min(self.size, self._copied + rows)
        for old, new in zip((self._x, self._y), self._next, strict=True):
            new[self._copied : end] = old[self._copied : end]
        self._copied = end

    def _take_over(self, stop: int, limit: int | None) -> None:
        """Switch to columns with room for ``stop`` rows (the doubled ones, if large enough),
        copying whatever rows they lack."""
        capacity = _grown(len(self._x), stop, limit)
        if self._next is None or len(self._next[0]) < capacity:
            self._next = (_resized(self._x, capacity), _resized(self._y, capacity))
            self._copied = 0
        for old, new in zip((self._x, self._y), self._next, strict=True):
            new[self._copied : self.size] = old[self._copied : self.size]
        self._x, self._y = self._next
        self._next = None


def _grown(capacity: int, rows: int, limit: int | None) -> int:
    """The next capacity: doubled, at least ``rows``, at most ``limit`` (unless ``rows``
    is more)."""
    grown = 2 * capacity if limit is None else min(2 * capacity, limit)
    return max(grown, rows)


def _resized(a: np.ndarray, capacity: int) -> np.ndarray:
    """An uninitialised array like ``a`` with ``capacity`` rows."""
    return np.empty((capacity, *a.shape[1:]), dtype=a.dtype)
