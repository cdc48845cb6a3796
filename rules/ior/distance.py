"""The exact distances every backend's verdict is decided by.

Backends may find candidates any way they like (float32 SIMD, trees, grids) but a pair
is a witness only if these float64 formulas say so, which makes all backends agree bit for
bit and makes the ball closed: ``d_in <= eps``.
"""

from __future__ import annotations

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
