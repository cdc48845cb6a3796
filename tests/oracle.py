"""The slow, obviously correct i.o.r. oracle: every decision against every earlier one."""

from __future__ import annotations

import math

import numpy as np


def _pairs(x, y, eps, metric, output_metric, scale, ignore):
    """For each decision n: (d_in, d_out) against every earlier decision, as arrays."""
    x = np.asarray(x, dtype=np.float64)
    if scale is not None:
        x = x * np.asarray(scale, dtype=np.float64)
    x = np.delete(x, list(ignore), axis=1)
    y = np.asarray(y)
    for n in range(len(x)):
        diff = np.abs(x[:n] - x[n])
        if metric == "linf":
            d = diff.max(axis=1, initial=0.0)
        elif metric == "l1":
            d = diff.sum(axis=1)
        else:
            d = np.sqrt((diff**2).sum(axis=1))
        if y.ndim == 1:
            d_out = (y[:n] != y[n]).astype(float)
        else:
            out = np.abs(y[:n] - y[n])
            d_out = {
                "linf": out.max(axis=1, initial=0.0),
                "l1": out.sum(axis=1),
                "tv": out.sum(axis=1) / 2,
            }[output_metric]
        yield d, d_out


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
    """For decision n: the sorted (j, d_in) with j < n, d_in <= eps and d_out > delta."""
    result = []
    for d, d_out in _pairs(x, y, eps, metric, output_metric, scale, ignore):
        hits = np.flatnonzero((d <= eps) & (d_out > delta))
        result.append([(int(j), float(d[j])) for j in hits])
    return result


def largest_ratios(
    x, y, eps, metric="linf", output_metric="linf", scale=None, ignore=()
) -> list[tuple[float, int]]:
    """For decision n: the largest d_out / d_in over j < n with d_in <= eps and d_out > 0
    (inf when d_in = 0), and the earliest j attaining it; (0.0, -1) if there is none."""
    result = []
    for d, d_out in _pairs(x, y, eps, metric, output_metric, scale, ignore):
        best = (0.0, -1)
        for j in range(len(d)):
            if d[j] <= eps and d_out[j] > 0:
                r = math.inf if d[j] == 0 else d_out[j] / d[j]
                if r > best[0]:
                    best = (r, j)
        result.append(best)
    return result


def window_starts(sizes: list[int], limit: int) -> list[int]:
    """Stream position of the oldest decision each decision is compared with under
    ``history_limit = limit``: before a batch that would overflow, the oldest are dropped,
    as many as needed and at least a quarter of the limit."""
    starts, held_from, seen = [], 0, 0
    for n in sizes:
        held = seen - held_from
        if held + n > limit:
            held_from += min(held, max(held + n - limit, -(-limit // 4)))
        starts += [held_from] * n
        seen += n
    return starts
