"""The exact distances every backend's verdict is decided by.

Backends may find candidates any way they like (float32 SIMD, trees, grids) but a pair
is a witness only if these formulas say so, which makes all backends agree bit for bit and
makes the ball closed: ``d_in <= eps``. A float64 distance decides every pair except those
within rounding of eps; those are decided on the values as written (each float's shortest
decimal form, which is what a CSV or JSON number with up to 15 significant digits reads
back as), exactly, so a pair whose written inputs are exactly eps apart is a witness and one
a hair above is not.
"""

from __future__ import annotations

from decimal import Decimal, localcontext

import numpy as np

from vigil.rules.ior.spec import InputMetric, OutputMetric


def input_distance(a: np.ndarray, b: np.ndarray, metric: InputMetric) -> np.ndarray:
    """Row-wise distance between equally shaped (k, d) float64 arrays."""
    diff = np.abs(a - b)
    if metric is InputMetric.LINF:
        return diff.max(axis=1) if diff.shape[1] else np.zeros(len(diff))
    if metric is InputMetric.L1:
        return diff.sum(axis=1)
    return np.sqrt(np.einsum("ij,ij->i", diff, diff))


def tie_tolerance(eps: float, max_abs: float, dim: int) -> float:
    """How far a float64 input distance can be from the distance of the written values
    (each value within half an ulp of its decimal form, plus the formula's own rounding)."""
    u = float(np.finfo(np.float64).eps)
    return 4 * (dim + 1) * u * (max_abs + eps) + 1e-300


def written_distance(
    a: np.ndarray, b: np.ndarray, eps: float, metric: InputMetric
) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise, whether the rows' written values are within ``eps`` (itself as written),
    decided in exact decimal arithmetic, and that distance (rounded to float64)."""
    bound = Decimal(repr(float(eps)))
    within = np.empty(len(a), dtype=bool)
    distance = np.empty(len(a))
    with localcontext() as exact:
        exact.prec = 100  # products and sums of <= 17-digit decimals stay exact
        for k, (p, q) in enumerate(zip(a.tolist(), b.tolist(), strict=True)):
            diffs = [abs(Decimal(repr(s)) - Decimal(repr(t))) for s, t in zip(p, q, strict=True)]
            if metric is InputMetric.LINF:
                d = max(diffs, default=Decimal(0))
                within[k], distance[k] = d <= bound, float(d)
            elif metric is InputMetric.L1:
                d = sum(diffs, Decimal(0))
                within[k], distance[k] = d <= bound, float(d)
            else:
                squares = sum((d * d for d in diffs), Decimal(0))
                within[k], distance[k] = squares <= bound * bound, float(squares.sqrt())
    return within, distance


def output_distance(a: np.ndarray, b: np.ndarray, metric: OutputMetric) -> np.ndarray:
    """Row-wise distance between equally shaped (k, m) probability vectors."""
    diff = np.abs(a - b)
    if metric is OutputMetric.LINF:
        return diff.max(axis=1)
    total = diff.sum(axis=1)
    return total / 2 if metric is OutputMetric.TV else total


def float32_search_radius(eps: float, max_abs: float, dim: int, metric: InputMetric) -> float:
    """A float32 search radius that cannot miss a float64 neighbour, in the search's own
    units (squared for L2, as Faiss expects).

    ``max_abs`` bounds the magnitude of every coordinate. The slack covers rounding inputs to
    float32 and float32 accumulation; for L2 it also covers the ``|x|^2 + |y|^2 - 2xy``
    expansion Faiss uses for large batches, whose error scales with the norms.
    """
    u = float(np.finfo(np.float32).eps)
    if metric is InputMetric.L2:
        norms = dim * (max_abs + eps) ** 2
        return (eps * (1 + 1e-6)) ** 2 + 16 * u * (norms + dim) + 1e-30
    terms = 1 if metric is InputMetric.LINF else dim
    return (eps + 8 * u * (2 * max_abs + eps) * terms) * (1 + 1e-6) + 1e-30
