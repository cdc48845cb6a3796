"""The slow, obviously correct i.o.r. oracle: every decision against every earlier one."""

from __future__ import annotations

import numpy as np


def witness_sets(
    x: np.ndarray,
    y: np.ndarray,
    eps: float,
    metric: str = "linf",
    delta: float = 0.0,
    output_metric: str = "linf",
    scale: np.ndarray | None = None,
    ignore: tuple[int, ...] = (),
) -> list[list[tuple[int, float]]]:
    """For decision n: the sorted (j, d_in) with j < n, d_in <= eps and a different output."""
    x = np.asarray(x, dtype=np.float64)
    if scale is not None:
        x = x * np.asarray(scale, dtype=np.float64)
    x = np.delete(x, list(ignore), axis=1)
    y = np.asarray(y)
    result = []
    for n in range(len(x)):
        diff = np.abs(x[:n] - x[n])
        if metric == "linf":
            d = diff.max(axis=1, initial=0.0)
        elif metric == "l1":
            d = diff.sum(axis=1)
        else:
            d = np.sqrt((diff**2).sum(axis=1))
        if y.ndim == 1:
            differ = y[:n] != y[n]
        else:
            out = np.abs(y[:n] - y[n])
            d_out = {
                "linf": out.max(axis=1, initial=0.0),
                "l1": out.sum(axis=1),
                "tv": out.sum(axis=1) / 2,
            }[output_metric]
            differ = d_out > delta
        hits = np.flatnonzero((d <= eps) & differ)
        result.append([(int(j), float(d[j])) for j in hits])
    return result
