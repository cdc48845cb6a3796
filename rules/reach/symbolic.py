"""Batched reachability of ReLU networks over boxes: symbolic intervals or interval arithmetic.

Every neuron carries a lower and an upper linear function of the input (ReluVal / Neurify
style); a crossing ReLU gets the chord as upper relaxation and, as lower one, 0 or the identity,
whichever loses less area (the CROWN choice). All branches of a batch are
propagated together with one matrix product per layer. Weights may be intervals
``W +- R`` (an interval neural network): the extra term is bounded by ``R |h|``. The spec
rows are also bounded backwards (CROWN-style back-substitution through the same
relaxations) and the tighter of the two bounds is kept: the backward bound keeps the signs
of the later layers' products, where the forward one widens by |W| at each layer, which
matters most for the weight errors of interval networks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from vigil.rules.reach.backward import relu_relaxation, times
from vigil.rules.reach.network import Network

METHODS = ("symbolic", "interval")


@dataclass(frozen=True)
class LayerInput:
    """Bounds of one layer's input for a batch: equations (B, d+1, n), concrete (B, n); the
    bounds (B, n) of the pre-activations it is the ReLU of (the box itself for the network
    input); and, over an interval network, the equation bounding the weight error of the layer
    it feeds (B, d+1, m), else an empty (B, 0, 0)."""

    low: np.ndarray
    up: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    pre_lo: np.ndarray
    pre_hi: np.ndarray
    error: np.ndarray

    def take(self, index: np.ndarray) -> LayerInput:
        return LayerInput(*(getattr(self, name)[index] for name in LAYER_FIELDS))


LAYER_FIELDS = ("low", "up", "lo", "hi", "pre_lo", "pre_hi", "error")


@dataclass(frozen=True)
class Reach:
    """Result of propagating a batch of boxes: upper bounds of every spec row, (B, k)."""

    upper: np.ndarray  # max over the box of c_j . f(x), per branch and row
    centre_upper: np.ndarray  # the same for the interval network's centre weights alone
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
    return LayerInput(eq, eq, lo, hi, lo, hi, _no_error(batch))


def reach(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    C: np.ndarray,
    *,
    radius: list[tuple[np.ndarray, np.ndarray]] | None = None,
    start: int = 0,
    cached: list[LayerInput] | None = None,
    method: str = "symbolic",
    d: np.ndarray | None = None,
) -> Reach:
    """Upper bounds of C f(x) over each box, from layer ``start`` on (``cached``: the inputs
    of layers 0..start, computed over the same boxes and the same earlier layers).

    With ``d``, rows the forward bound already keeps at most d are not bounded backwards.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    centre, half = (lo + hi) / 2, (hi - lo) / 2
    if start == 0:
        prefix = [input_layer(lo, hi)]
    elif cached is None or len(cached) != start + 1:
        raise ValueError("a start layer above 0 needs the cached inputs of layers 0..start")
    else:
        prefix = list(cached)
    state = prefix.pop()
    inputs = []
    last = len(network.weights) - 1
    for i in range(start, last + 1):
        w, b = network.weights[i], network.biases[i]
        wp, wn = np.maximum(w, 0.0).T, np.minimum(w, 0.0).T
        low = times(state.low, wp) + times(state.up, wn)
        up = times(state.up, wp) + times(state.low, wn)
        low[:, -1, :] += b
        up[:, -1, :] += b
        error = _no_error(lo.shape[0])
        if radius is not None:
            # (W + E) h with |E| <= R: for h >= 0 (after a ReLU), |E h| <= R h <= R up(h)
            r_w, r_b = radius[i]
            if i > 0:
                error = times(state.up, r_w.T)
            else:
                error = np.zeros_like(up)
                error[:, -1, :] = np.maximum(np.abs(state.lo), np.abs(state.hi)) @ r_w.T
            error[:, -1, :] += r_b
            low -= error
            up += error
        inputs.append(replace(state, error=error))
        if i == last:
            break
        ranges = (*bounds(low, centre, half), *bounds(up, centre, half))
        state = _relu(low, up, ranges, method)
    cp, cn = np.maximum(C, 0.0).T, np.minimum(C, 0.0).T
    rows = times(up, cp) + times(low, cn)  # (B, d+1, k): upper equations of every spec row
    _, upper = bounds(rows, centre, half)
    gradient = np.abs(rows[:, :-1, :]).sum(axis=2) * (hi - lo)
    if method == "symbolic":
        open_ = upper > d if d is not None else np.ones(upper.shape, dtype=bool)
        boxes = np.flatnonzero(open_.any(axis=1))
        rows_ = np.flatnonzero(open_.any(axis=0))
        if boxes.size:
            layers, box_c, box_h = prefix + inputs, centre, half
            if boxes.size < lo.shape[0]:
                layers = [s.take(boxes) for s in layers]
                box_c, box_h = centre[boxes], half[boxes]
            backward, centre_backward, eq = _back_substitute(
                network, C[rows_], layers, box_c, box_h
            )
            block = np.ix_(boxes, rows_)
            centre_upper = upper.copy()
            upper[block] = np.minimum(upper[block], backward)
            centre_upper[block] = np.minimum(centre_upper[block], centre_backward)
            gradient[boxes] = np.abs(eq[:, :-1, :]).sum(axis=2) * (hi - lo)[boxes]
            return Reach(upper, centre_upper, gradient, inputs)
    return Reach(upper, upper, gradient, inputs)


def _back_substitute(
    network: Network, C: np.ndarray, layers: list[LayerInput], centre: np.ndarray, half: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Upper bounds of C f(x), the same without weight errors (the centre network), and the
    linear functions of the input behind the first, by back-substitution from the output to
    the input (CROWN-style); ``layers`` holds every layer's input.

    Each ReLU is replaced by the linear bounds its pre-activation bounds allow, chosen per
    coefficient sign. Over an interval network, layer i computes ``W_i h + b_i + e_i`` with
    ``|e_i|`` at most its error equation, so each layer's error enters once, weighted by
    |coefficient|, instead of being widened by |W| at every later layer.
    """
    batch, k = centre.shape[0], C.shape[0]
    lam = np.broadcast_to(C, (batch, k, C.shape[1])).copy()  # coefficients on this layer
    const = np.zeros((batch, k))
    eq = np.zeros((batch, centre.shape[1] + 1, k))
    errors = np.zeros_like(eq)
    for i in range(len(network.weights) - 1, -1, -1):
        state = layers[i]
        const += lam @ network.biases[i]
        if state.error.size:
            errors += state.error @ np.abs(lam).transpose(0, 2, 1)
        lam = times(lam, network.weights[i])
        if i == 0:
            break
        chord, floor, shift = relu_relaxation(state.pre_lo, state.pre_hi)
        positive = lam >= 0
        const += (np.where(positive, lam, 0.0) @ shift[:, :, None])[:, :, 0]
        lam *= np.where(positive, chord[:, None, :], floor[:, None, :])
    eq[:, :-1, :] += lam.transpose(0, 2, 1)  # layer 0's input is the network input itself
    _, centre_upper = bounds(eq, centre, half)
    eq += errors
    _, upper = bounds(eq, centre, half)
    return upper + const, centre_upper + const, eq


def _relu(
    low: np.ndarray,
    up: np.ndarray,
    ranges: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    method: str,
) -> LayerInput:
    """ReLU of neurons whose lower equation ranges over [low_lo, low_hi], upper over
    [up_lo, up_hi]."""
    low_lo, low_hi, up_lo, up_hi = ranges
    if method == "interval":
        lo, hi = np.maximum(low_lo, 0.0), np.maximum(up_hi, 0.0)
        low = np.zeros_like(low)
        up = np.zeros_like(up)
        low[:, -1, :] = lo
        up[:, -1, :] = hi
        return LayerInput(low, up, lo, hi, low_lo, up_hi, _no_error(lo.shape[0]))
    with np.errstate(divide="ignore", invalid="ignore"):
        up_scale = np.where(up_hi <= 0, 0.0, np.where(up_lo >= 0, 1.0, up_hi / (up_hi - up_lo)))
        low_scale = np.where(low_hi <= 0, 0.0, np.where(low_lo >= 0, 1.0, low_hi > -low_lo))
    up_shift = np.where((up_lo < 0) & (up_hi > 0), -up_scale * up_lo, 0.0)
    new_up = up * up_scale[:, None, :]
    new_up[:, -1, :] += up_shift
    new_low = low * low_scale[:, None, :]
    lo, hi = np.maximum(low_lo, 0.0), np.maximum(up_hi, 0.0)
    return LayerInput(new_low, new_up, lo, hi, low_lo, up_hi, _no_error(lo.shape[0]))


def _no_error(batch: int) -> np.ndarray:
    return np.zeros((batch, 0, 0))
