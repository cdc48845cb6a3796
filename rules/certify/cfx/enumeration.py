"""Exact enumeration of the non-robust part of a shift box (Appendix B, Algorithm 3).

The delta box is bisected one parameter at a time; interval arithmetic settles each sub-box as
robust (margin lower bound >= 0), non-robust (upper bound < 0: every realisation in it fails)
or unknown, and only unknown boxes are split further. The fractions of the box's volume that
are settled bound the true non-robust fraction from both sides. All boxes of one round are
bounded in a single batched pass, largest (shallowest) first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vigil.rules.certify.cfx.decision import margin_rows
from vigil.rules.certify.cfx.interval import ParameterBox, interval_bounds
from vigil.rules.reach.network import Network


@dataclass(frozen=True)
class Enumeration:
    """Volume fractions of the delta box: settled robust, settled non-robust, still unknown."""

    robust: float
    non_robust: float
    unknown: float
    boxes: int

    @property
    def non_robust_bounds(self) -> tuple[float, float]:
        """The true non-robust fraction lies in this interval."""
        return self.non_robust, self.non_robust + self.unknown


def _flatten(network: Network) -> tuple[np.ndarray, list[tuple[int, tuple[int, ...]]]]:
    parts, layout = [], []
    for w, b in zip(network.weights, network.biases, strict=True):
        parts += [w.ravel(), b]
        layout += [(w.size, w.shape), (b.size, b.shape)]
    return np.concatenate(parts), layout


def _box(lo: np.ndarray, hi: np.ndarray, layout: list[tuple[int, tuple[int, ...]]]) -> ParameterBox:
    arrays_lo, arrays_hi, start = [], [], 0
    for size, shape in layout:
        arrays_lo.append(lo[:, start : start + size].reshape(-1, *shape))
        arrays_hi.append(hi[:, start : start + size].reshape(-1, *shape))
        start += size
    return ParameterBox(arrays_lo[0::2], arrays_hi[0::2], arrays_lo[1::2], arrays_hi[1::2])


def _split_scores(
    box: ParameterBox, x: np.ndarray, pre_hi: list[np.ndarray], rows: np.ndarray
) -> np.ndarray:
    """First-order effect of each parameter's width on the margin's interval.

    Width times the largest magnitude the parameter multiplies (1 for biases) times the
    largest downstream gain of its neuron, so the split goes where the bound is loosest.
    """
    layers = len(box.w_lo)
    n = box.w_lo[0].shape[0]
    gain = np.broadcast_to(np.abs(rows).sum(axis=0), (n, rows.shape[1]))
    w_scores, b_scores = [None] * layers, [None] * layers
    for i in reversed(range(layers)):
        inputs = (
            np.broadcast_to(np.abs(x), (n, x.size)) if i == 0 else np.maximum(pre_hi[i - 1], 0.0)
        )
        width = box.w_hi[i] - box.w_lo[i]
        w_scores[i] = (width * gain[:, :, None] * inputs[:, None, :]).reshape(n, -1)
        b_scores[i] = (box.b_hi[i] - box.b_lo[i]) * gain
        magnitude = np.maximum(np.abs(box.w_lo[i]), np.abs(box.w_hi[i]))
        gain = np.einsum("nk,nkj->nj", gain, magnitude)
    pairs = zip(w_scores, b_scores, strict=True)
    return np.concatenate([s for pair in pairs for s in pair], axis=1)


def enumerate_shifts(
    network: Network,
    x: np.ndarray,
    target: int,
    delta: float,
    max_boxes: int = 200_000,
    batch: int = 4096,
) -> Enumeration:
    """Settle the delta box around ``network`` for counterfactual ``x`` by bisection."""
    if not (delta >= 0 and math.isfinite(delta)):
        raise ValueError(f"delta must be finite and >= 0, got {delta}")
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    rows = margin_rows(network, target)
    theta, layout = _flatten(network)
    lo, hi = (theta - delta)[None], (theta + delta)[None]
    depth = np.zeros(1, dtype=np.int64)
    robust = non_robust = 0.0
    seen = 0
    while lo.shape[0] and seen < max_boxes:
        take = min(batch, lo.shape[0], max_boxes - seen)
        blo, bhi, bdepth = lo[:take], hi[:take], depth[:take]
        lo, hi, depth = lo[take:], hi[take:], depth[take:]
        seen += take
        box = _box(blo, bhi, layout)
        bounds = interval_bounds(box, x, rows)
        volume = np.ldexp(1.0, -bdepth)
        is_robust = bounds.margin_lo >= 0.0
        is_bad = bounds.margin_hi < 0.0
        robust += float(volume[is_robust].sum())
        non_robust += float(volume[is_bad].sum())
        open_ = ~(is_robust | is_bad)
        if not open_.any():
            continue
        olo, ohi = blo[open_], bhi[open_]
        pick = np.argmax(_split_scores(box, x, bounds.pre_hi, rows)[open_], axis=1)
        rows_idx = np.arange(olo.shape[0])
        mid = 0.5 * (olo[rows_idx, pick] + ohi[rows_idx, pick])
        left_hi, right_lo = ohi.copy(), olo.copy()
        left_hi[rows_idx, pick] = mid
        right_lo[rows_idx, pick] = mid
        child_depth = np.repeat(bdepth[open_] + 1, 2)
        lo = np.concatenate([lo, np.stack([olo, right_lo], axis=1).reshape(-1, olo.shape[1])])
        hi = np.concatenate([hi, np.stack([left_hi, ohi], axis=1).reshape(-1, olo.shape[1])])
        depth = np.concatenate([depth, child_depth])
    unknown = float(np.ldexp(1.0, -depth).sum()) if depth.size else 0.0
    return Enumeration(robust, non_robust, unknown, seen)
