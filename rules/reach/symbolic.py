"""Batched reachability of ReLU networks over boxes: symbolic intervals or interval arithmetic.

Every neuron carries a lower and an upper linear function of the input (ReluVal / Neurify
style); a crossing ReLU gets the chord as upper relaxation and, as lower one, 0 or the identity,
whichever loses less area (the CROWN choice). All branches of a batch are
propagated together with one matrix product per layer. Weights may be intervals
``W +- R`` (an interval neural network): the extra term is bounded by ``R |h|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rules.reach.network import Network

METHODS = ("symbolic", "interval")


@dataclass(frozen=True)
class LayerInput:
    """Bounds of one layer's input for a batch: equations (B, d+1, n), concrete (B, n)."""

    low: np.ndarray
    up: np.ndarray
    lo: np.ndarray
    hi: np.ndarray

    def take(self, index: np.ndarray) -> LayerInput:
        return LayerInput(self.low[index], self.up[index], self.lo[index], self.hi[index])


@dataclass(frozen=True)
class Reach:
    """Result of propagating a batch of boxes: upper bounds of every spec row, (B, k)."""

    upper: np.ndarray  # max over the box of c_j . f(x), per branch and row
    gradient: np.ndarray  # |d(upper eq)/dx| weighted by the box widths, (B, d), for splitting
    inputs: list[LayerInput]  # input bounds of layers start..last (for incremental reuse)


def bounds(eq: np.ndarray, centre: np.ndarray, radius: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Min and max over the boxes (centre +- radius) of linear functions eq (B, d+1, n)."""
    mid = np.matmul(centre[:, None, :], eq[:, :-1, :])[:, 0, :] + eq[:, -1, :]
    spread = np.matmul(radius[:, None, :], np.abs(eq[:, :-1, :]))[:, 0, :]
    return mid - spread, mid + spread


def input_layer(lo: np.ndarray, hi: np.ndarray) -> LayerInput:
    """The identity equations of the network input over boxes [lo, hi] (B, d)."""
    batch, dim = lo.shape
    eq = np.zeros((batch, dim + 1, dim))
    eq[:, np.arange(dim), np.arange(dim)] = 1.0
    return LayerInput(eq, eq, lo, hi)


def reach(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    C: np.ndarray,
    *,
    radius: list[tuple[np.ndarray, np.ndarray]] | None = None,
    start: int = 0,
    cached: LayerInput | None = None,
    method: str = "symbolic",
) -> Reach:
    """Upper bounds of C f(x) over each box, from layer ``start`` on (``cached`` its input)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    state = input_layer(lo, hi) if start == 0 else cached
    if state is None:
        raise ValueError("a start layer above 0 needs the cached input of that layer")
    inputs = [state]
    last = len(network.weights) - 1
    for i in range(start, last + 1):
        w, b = network.weights[i], network.biases[i]
        wp, wn = np.maximum(w, 0.0).T, np.minimum(w, 0.0).T
        low = _apply(state.low, wp) + _apply(state.up, wn)
        up = _apply(state.up, wp) + _apply(state.low, wn)
        low[:, -1, :] += b
        up[:, -1, :] += b
        if radius is not None:
            # (W + E) h with |E| <= R: for h >= 0 (after a ReLU), |E h| <= R h <= R up(h)
            r_w, r_b = radius[i]
            if i > start or start > 0:
                extra = _apply(state.up, r_w.T)
            else:
                extra = np.zeros_like(up)
                extra[:, -1, :] = np.maximum(np.abs(state.lo), np.abs(state.hi)) @ r_w.T
            extra[:, -1, :] += r_b
            low -= extra
            up += extra
        if i == last:
            break
        state = _relu(low, up, centre, half, method)
        inputs.append(state)
    cp, cn = np.maximum(C, 0.0).T, np.minimum(C, 0.0).T
    rows = _apply(up, cp) + _apply(low, cn)  # (B, d+1, k): upper equations of every spec row
    _, upper = bounds(rows, centre, half)
    gradient = np.abs(rows[:, :-1, :]).sum(axis=2) * (hi - lo)
    return Reach(upper, gradient, inputs)


def _apply(eq: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """eq (B, d+1, n) @ matrix (n, m) as one 2-d product."""
    batch, rows, _ = eq.shape
    return (eq.reshape(batch * rows, -1) @ matrix).reshape(batch, rows, -1)


def _relu(
    low: np.ndarray, up: np.ndarray, centre: np.ndarray, half: np.ndarray, method: str
) -> LayerInput:
    low_lo, low_hi = bounds(low, centre, half)
    up_lo, up_hi = bounds(up, centre, half)
    if method == "interval":
        lo, hi = np.maximum(low_lo, 0.0), np.maximum(up_hi, 0.0)
        low = np.zeros_like(low)
        up = np.zeros_like(up)
        low[:, -1, :] = lo
        up[:, -1, :] = hi
        return LayerInput(low, up, lo, hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        up_scale = np.where(up_hi <= 0, 0.0, np.where(up_lo >= 0, 1.0, up_hi / (up_hi - up_lo)))
        low_scale = np.where(low_hi <= 0, 0.0, np.where(low_lo >= 0, 1.0, low_hi > -low_lo))
    up_shift = np.where((up_lo < 0) & (up_hi > 0), -up_scale * up_lo, 0.0)
    new_up = up * up_scale[:, None, :]
    new_up[:, -1, :] += up_shift
    new_low = low * low_scale[:, None, :]
    return LayerInput(new_low, new_up, np.maximum(low_lo, 0.0), np.maximum(up_hi, 0.0))
