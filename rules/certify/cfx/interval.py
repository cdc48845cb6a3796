"""Interval arithmetic for interval neural networks (every weight and bias an interval).

Given a fixed input, bounds every pre-activation and the decision margin over all
realisations in a box of parameters. Boxes come in batches (leading axis B) so the exact
enumeration can bound thousands of sub-networks in one pass; the MILP uses the same bounds as
its big-M constants.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vigil.rules.reach.network import Network


@dataclass(frozen=True)
class ParameterBox:
    """Per-parameter bounds of B interval networks: lists over layers of (B, out, in), (B, out)."""

    w_lo: list[np.ndarray]
    w_hi: list[np.ndarray]
    b_lo: list[np.ndarray]
    b_hi: list[np.ndarray]

    @classmethod
    def around(cls, network: Network, delta: float) -> ParameterBox:
        """The single box theta +- delta (the plausible shifts of size delta)."""
        return cls(
            [w[None] - delta for w in network.weights],
            [w[None] + delta for w in network.weights],
            [b[None] - delta for b in network.biases],
            [b[None] + delta for b in network.biases],
        )


@dataclass(frozen=True)
class Bounds:
    """Pre-activation bounds per hidden layer (B, width) and margin bounds (B,)."""

    pre_lo: list[np.ndarray]
    pre_hi: list[np.ndarray]
    margin_lo: np.ndarray
    margin_hi: np.ndarray


def _affine_nonneg(
    w_lo: np.ndarray, w_hi: np.ndarray, h_lo: np.ndarray, h_hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of W h over W in [w_lo, w_hi] and h in [h_lo, h_hi] >= 0 (batched)."""
    lo = np.minimum(w_lo * h_lo[:, None, :], w_lo * h_hi[:, None, :]).sum(axis=2)
    hi = np.maximum(w_hi * h_lo[:, None, :], w_hi * h_hi[:, None, :]).sum(axis=2)
    return lo, hi


def _fold_rows(rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Interval of sum_k c_k v_k for independent v_k in [lo, hi] (works on (B, K, ...))."""
    c = rows.reshape(rows.shape[0], rows.shape[1], *([1] * (lo.ndim - 2)))
    a = c[None] * lo[:, None]
    b = c[None] * hi[:, None]
    return np.minimum(a, b).sum(axis=2), np.maximum(a, b).sum(axis=2)


def interval_bounds(box: ParameterBox, x: np.ndarray, rows: np.ndarray) -> Bounds:
    """Sound bounds of every pre-activation and of min_r (C z)_r over all networks in ``box``."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    layers = len(box.w_lo)
    pre_lo: list[np.ndarray] = []
    pre_hi: list[np.ndarray] = []
    w_lo, w_hi, b_lo, b_hi = box.w_lo, box.w_hi, box.b_lo, box.b_hi
    # Fold the margin rows into the last layer: margin_r = sum_k c_rk (W_k h + b_k).
    last_w = _fold_rows(rows, w_lo[-1], w_hi[-1])
    last_b = _fold_rows(rows, b_lo[-1], b_hi[-1])
    for i in range(layers):
        wl, wh = (w_lo[i], w_hi[i]) if i < layers - 1 else last_w
        bl, bh = (b_lo[i], b_hi[i]) if i < layers - 1 else last_b
        if i == 0:
            lo = np.minimum(wl * x, wh * x).sum(axis=2) + bl
            hi = np.maximum(wl * x, wh * x).sum(axis=2) + bh
        else:
            lo, hi = _affine_nonneg(
                wl, wh, np.maximum(pre_lo[-1], 0.0), np.maximum(pre_hi[-1], 0.0)
            )
            lo, hi = lo + bl, hi + bh
        if i < layers - 1:
            pre_lo.append(lo)
            pre_hi.append(hi)
    return Bounds(pre_lo, pre_hi, lo.min(axis=1), hi.min(axis=1))
