"""Bounds of linear functions of a ReLU network's outputs over boxes, every layer's
pre-activation bounds computed by back-substitution to the input (CROWN / DeepPoly).

``symbolic.reach`` bounds the intermediate layers by forward symbolic intervals and
back-substitutes only the output rows; here every unstable neuron's bounds are
back-substituted too. Each layer costs a pass through all the layers before it, and the
bounds are far tighter on deep networks: on ACAS Xu property 1 the search closed network
4_5 in 751 boxes, and not in 1.6 million with the forward bounds. Only neurons that
interval arithmetic leaves unstable in some box of the batch are bounded this way; a stable
neuron's relaxation is exact whatever its bounds.

A network with rounding ``noise`` (``Network.with_noise``) is bounded with each bias an
interval ``b ± noise``: the bounds then also hold for the network as computed in its
floating-point type.

A sigmoid or tanh neuron inside the network is passed by two parallel lines around its
function, or stops back-substitution with its interval, whichever bounds a row tighter;
a square or power neuron stops it with its interval (``_back_substitute``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from vigil.rules.reach.network import POWER, SIGMOID, SQUARE, TANH, Network, sigmoid


@dataclass(frozen=True)
class OutputBounds:
    """Upper bounds of the rows of C f(x) per box (B, k); per box and input the width
    times the weight of that input in the bounds of the rows still open (B, d): the inputs
    whose bisection tightens the open bounds most; and per box the neurons its
    pre-activation bounds leave unstable (B,): what an exact MILP of the box must branch
    on; and those bounds, per hidden layer (low, high), each (B, width)."""

    upper: np.ndarray
    gradient: np.ndarray
    unstable: np.ndarray
    pre: list[tuple[np.ndarray, np.ndarray]]


def output_bounds(
    network: Network, lo: np.ndarray, hi: np.ndarray, C: np.ndarray, d: np.ndarray | None = None
) -> OutputBounds:
    """Upper bounds of C f(x) over each box [lo, hi] (B, d), f with its output activation
    (sigmoid or softmax: interval bounds of it from the logits' bounds, so only the
    logits' bounds score the splits); rows with upper bound <= d are left out of the split
    scores."""
    if network.output == "none":
        return _logit_bounds(network, lo, hi, C, d)
    m = network.output_dim
    logits = _logit_bounds(network, lo, hi, np.vstack([np.eye(m), -np.eye(m)]))
    y_low, y_high = activation_bounds(
        network.output, -logits.upper[:, m:], logits.upper[:, :m], network.precision is not None
    )
    upper = np.maximum(C[None] * y_low[:, None, :], C[None] * y_high[:, None, :]).sum(axis=2)
    return OutputBounds(upper, logits.gradient, logits.unstable, logits.pre)


_ROUNDING = 8 * np.finfo(np.float64).eps
_TINY = np.nextafter(0.0, 1.0)
EXP_ERROR = 2.0**-20
"""With a floating-point type, how far the runtime's sigmoid, tanh or softmax may be from
the real one on the same logits, in absolute terms: onnxruntime's float32 kernels compute
exp by a polynomial, off by up to 3.2e-7 on 10^6 logits from -1000 to 1000
(``tests/test_vnnlib_floats.py`` measures it). A float32 Sigmoid over 10^6 logits returned
1.0000001, so sigmoid and tanh bounds are not clipped to their real range. Softmax's are
clipped to [0, 1]: the kernel scales non-negative exponentials e_i by the rounded
reciprocal of their sum S >= e_i (rounding is monotone), and e_i fl(1/S) <= 1 + u rounds
to at most 1."""


def activation_bounds(
    output: str, low: np.ndarray, high: np.ndarray, computed: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of ``sigmoid`` or ``softmax`` of every logit vector z with low <= z <= high
    (B, m). Both are 1 / (1 + e^t): sigmoid with t = -z, softmax output i with t the
    log-sum-exp of z_j - z_i over j != i, smallest with z_i low and every other z_j high.
    ``computed``: bounds of the runtime's floating-point evaluation (``EXP_ERROR``)
    instead of the real function."""
    if output == "sigmoid":
        t_low, t_high = -low, -high
    else:
        others = ~np.eye(low.shape[1], dtype=bool)
        lse = np.logaddexp.reduce  # log-sum-exp, without overflow
        t_low = lse(np.where(others, high[:, None, :] - low[:, :, None], -np.inf), axis=2)
        t_high = lse(np.where(others, low[:, None, :] - high[:, :, None], -np.inf), axis=2)
    # the exponents' own rounding grows with the logits' magnitude (differences of ~1000)
    scale = np.maximum(np.abs(low), np.abs(high)).max(axis=1, keepdims=True)
    y_low, y_high = _reciprocal(t_low, -1.0, scale), _reciprocal(t_high, 1.0, scale)
    if computed:
        y_low, y_high = y_low - EXP_ERROR, y_high + EXP_ERROR
        if output == "softmax":
            y_low, y_high = np.maximum(y_low, 0.0), np.minimum(y_high, 1.0)
    return y_low, y_high


def _reciprocal(t: np.ndarray, side: float, scale: np.ndarray) -> np.ndarray:
    """1 / (1 + e^t), moved by ``side`` (-1 down, 1 up) past its rounding: a few ulps per
    unit of the exponent and of the logits' magnitude ``scale`` that ``t`` was computed
    from, and two of the smallest subnormal where it underflows; in [0, 1]."""
    exponent = np.logaddexp(0.0, t)  # no overflow where e^t would
    y = np.exp(-exponent)
    # the relative factor first: y * _ROUNDING alone underflows for subnormal y
    slack = y * (_ROUNDING * (1.0 + exponent + 4.0 * scale)) + 2 * _TINY
    return np.clip(y + side * slack, 0.0, 1.0)


def _logit_bounds(
    network: Network, lo: np.ndarray, hi: np.ndarray, C: np.ndarray, d: np.ndarray | None = None
) -> OutputBounds:
    """``output_bounds`` of the last layer's values (before the output activation)."""
    centre, radius = (lo + hi) / 2, (hi - lo) / 2
    pre = pre_activation_bounds(network, lo, hi)
    upper, lam = _back_substitute(
        network.weights,
        network.biases,
        pre,
        C,
        centre,
        radius,
        noise=network.noise,
        squash=_squash(network),
    )
    open_ = np.ones(upper.shape, dtype=bool) if d is None else upper > d
    gradient = (np.abs(lam) * open_[:, :, None]).sum(axis=1) * (hi - lo)
    unstable = np.zeros(len(lo), dtype=np.int64)  # stays 0 without hidden layers
    for k, (low, high) in enumerate(pre):
        unstable += ((low < 0) & (high > 0) & network.relus(k)).sum(axis=1)
    return OutputBounds(upper, gradient, unstable, pre)


@dataclass(frozen=True)
class SplitBounds:
    """Bounds of branches that assume the signs of some neurons (``split_bounds``): upper
    bounds of the rows (B, k); their coefficients on the input (B, k, d); each hidden
    layer's pre-activation bounds (low, high), (B, width); per hidden layer what each
    neuron's relaxation adds to each row's bound (B, k, width); the branches whose
    assumptions no input of the box meets (B,); and the optimized relaxation that gave the
    rows' bounds (None without ``slope_steps``): a branch's children start from it."""

    upper: np.ndarray
    coefficients: np.ndarray
    pre: list[tuple[np.ndarray, np.ndarray]]
    intercepts: list[np.ndarray]
    empty: np.ndarray
    relaxation: Relaxation | None = None


def split_bounds(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    signs: list[np.ndarray],
    C: np.ndarray,
    within: list[tuple[np.ndarray, np.ndarray]] | None = None,
    slope_steps: int = 0,
    start: Relaxation | None = None,
) -> SplitBounds:
    """Upper bounds of C f(x) over each box [lo, hi] (B, d) within the branch its ``signs``
    describe and the bounds ``within`` (see ``pre_activation_bounds``); for a ReLU network,
    with ``slope_steps`` steps of ``optimized_slopes`` on the rows, from ``start`` when
    given (a parent branch's relaxation: any is sound, a good one saves steps)."""
    centre, radius = (lo + hi) / 2, (hi - lo) / 2
    pre = pre_activation_bounds(network, lo, hi, signs, within)
    empty = np.zeros(len(lo), dtype=bool)
    for low, high in pre:
        empty |= (low > high).any(axis=1)
    args = (network.weights, network.biases, pre, C, centre, radius)
    squash = _squash(network)
    intercepts: list[np.ndarray] = []
    if slope_steps and squash is None:
        best = optimized_slopes(
            *args, network.noise, slope_steps, signs=signs, start=start, single=True
        )
        upper, lam = _substitute(
            *args, intercepts, network.noise, None, False, best.slopes, cuts=best.cuts
        )
        relaxation = Relaxation(best.slopes, best.multipliers)
        return SplitBounds(upper, lam, pre, intercepts, empty, relaxation)
    upper, lam = _back_substitute(*args, intercepts, network.noise, squash)
    return SplitBounds(upper, lam, pre, intercepts, empty)


SLOPE_RATE, CUT_RATE = 0.1, 0.05
"""Adam's step sizes on the lower slopes (alpha-CROWN's) and on the split constraints'
multipliers (beta-CROWN's)."""


class Relaxation(NamedTuple):
    """Per hidden layer (B, k, width): each row's lower slopes of the crossing ReLUs, and
    the multipliers of the branches' sign assumptions (None without assumptions)."""

    slopes: list[np.ndarray]
    multipliers: list[np.ndarray] | None


class Optimized(NamedTuple):
    """What ``optimized_slopes`` found: per hidden layer (B, k, width) each row's lower
    slopes, multipliers and cuts (``_substitute``'s; both None without sign assumptions),
    and each row's least upper bound (B, k; None when the steps were estimates)."""

    slopes: list[np.ndarray]
    multipliers: list[np.ndarray] | None
    cuts: list[np.ndarray] | None
    upper: np.ndarray | None


def optimized_slopes(
    weights: tuple[np.ndarray, ...],
    biases: tuple[np.ndarray, ...],
    pre: list[tuple[np.ndarray, np.ndarray]],
    rows: np.ndarray,
    centre: np.ndarray,
    radius: np.ndarray,
    noise: tuple[np.ndarray, ...] | None,
    steps: int,
    until: float = np.inf,
    signs: list[np.ndarray] | None = None,
    start: Relaxation | None = None,
    single: bool = False,
) -> Optimized:
    """The lower slopes of the crossing ReLUs of a ReLU network that gave each row its least
    upper bound in ``steps`` steps of projected Adam from CROWN's choice (alpha-CROWN); with
    ``signs`` (per hidden layer (B, width), as ``pre_activation_bounds`` takes them), the
    multipliers of the branches' sign assumptions too, from 0 (beta-CROWN). ``start``: the
    slopes and multipliers to begin from instead (clipped to their ranges). No step after
    the first begins after ``until`` (a ``time.monotonic`` deadline). Any slope in [0, 1]
    and any multiplier >= 0 give a sound bound, so every step's is, and each row keeps its
    least; the pre-activation bounds are fixed, so only the rows' own relaxations move.
    ``single``: the steps in float32 (on mnistfc, 1.4 times the branches a second); their
    bounds are then estimates, so ``upper`` is None and the caller bounds with the slopes
    found."""
    batch, k = centre.shape[0], rows.shape[0]
    real = np.float32 if single else np.float64
    if single:
        weights, biases, rows, centre, radius = _single((weights, biases, rows, centre, radius))
        pre = [(lo.astype(real), hi.astype(real)) for lo, hi in pre]
        noise = None if noise is None else _single(noise)
    if start is None:
        slopes = [
            np.broadcast_to(relu_relaxation(lo, hi)[1][:, None, :], (batch, k, lo.shape[1]))
            for lo, hi in pre
        ]
    else:
        slopes = start.slopes
    slopes = [np.clip(np.asarray(a, dtype=real), 0.0, 1.0) for a in slopes]
    split = None  # the assumed signs, (B, 1, width): the multipliers' only non-zeros
    if signs is not None and any(s.any() for s in signs):
        split = [s[:, None, :].astype(real) for s in signs]
    multipliers: list[np.ndarray] = []  # >= 0
    if split is not None:
        given = None if start is None else start.multipliers
        if given is None:
            multipliers = [np.zeros_like(a) for a in slopes]
        else:
            multipliers = [np.maximum(np.asarray(a, dtype=real), 0.0) for a in given]
    variables = slopes + multipliers
    rates = [SLOPE_RATE] * len(slopes) + [CUT_RATE] * len(multipliers)
    upper_limit = [1.0] * len(slopes) + [np.inf] * len(multipliers)
    best = [a.copy() for a in variables]
    least = np.full((batch, k), np.inf, dtype=real)
    args = (weights, biases, pre, rows, centre, radius)
    moment = [np.zeros_like(a) for a in variables]
    square = [np.zeros_like(a) for a in variables]
    for t in range(1, steps + 1):
        trace: list[tuple[np.ndarray, ...]] = []
        cuts = _cuts(multipliers, split)
        upper, lam = _substitute(*args, None, noise, None, False, slopes, trace, cuts)
        better = upper < least
        least = np.minimum(upper, least)
        for kept, a in zip(best, variables, strict=True):
            kept[better] = a[better]
        if t == steps or time.monotonic() > until:
            break
        grads, on_pre = _slope_gradient(
            weights, biases, pre, trace, lam, centre, radius, noise, slopes
        )
        if split is not None:
            grads += [g * s for g, s in zip(on_pre, split, strict=True)]
        for a, g, m, v, rate, top in zip(
            variables, grads, moment, square, rates, upper_limit, strict=True
        ):
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            step = m / (1 - 0.9**t) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
            np.clip(a - rate * step, 0.0, top, out=a)
    kept = best[len(slopes) :]
    return Optimized(
        best[: len(slopes)],
        kept if split is not None else None,
        _cuts(kept, split),
        None if single else least,
    )


def _single(arrays: tuple) -> tuple:
    """Arrays, and tuples of arrays, in float32."""
    return tuple(_single(a) if isinstance(a, tuple) else a.astype(np.float32) for a in arrays)


def _cuts(multipliers: list[np.ndarray], split: list[np.ndarray] | None) -> list[np.ndarray] | None:
    """``_substitute``'s cuts (B, k, width) from the multipliers and the assumed signs."""
    if split is None:
        return None
    return [beta * s for beta, s in zip(multipliers, split, strict=True)]


def _slope_gradient(
    weights: tuple[np.ndarray, ...],
    biases: tuple[np.ndarray, ...],
    pre: list[tuple[np.ndarray, np.ndarray]],
    trace: list[tuple[np.ndarray, ...]],
    lam: np.ndarray,
    centre: np.ndarray,
    radius: np.ndarray,
    noise: tuple[np.ndarray, ...] | None,
    slopes: list[np.ndarray],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The gradient of each row's upper bound from ``_substitute`` in its lower slopes, and
    in its coefficients on the pre-activations (what a cut moves), per hidden layer (B, k,
    width): the back-substitution run in reverse, from the input's coefficients ``lam``
    (B, k, d) towards the output, carrying each bound's derivative in the coefficients of
    one layer."""
    # d upper / d (coefficients on the current layer's input)
    carried = centre[:, None, :] + np.sign(lam) * radius[:, None, :]
    grads, on_pre = [], []
    for i, (cols, sub, nu) in enumerate(trace):
        lo, hi = pre[i]
        g_nu = times(carried, weights[i].T) + biases[i]  # d upper / d (coefficients on z_i)
        if noise is not None:
            g_nu += np.sign(nu) * noise[i]
        on_pre.append(g_nu)
        g_cols = g_nu[:, :, cols]
        grad = np.zeros_like(g_nu)
        grad[:, :, cols] = np.minimum(sub, 0.0) * g_cols
        grads.append(grad)
        chord, _, shift = relu_relaxation(lo[:, cols], hi[:, cols])
        carried = g_nu * (lo >= 0)[:, None, :]
        carried[:, :, cols] = np.where(
            sub > 0, chord[:, None, :] * g_cols + shift[:, None, :], slopes[i][:, :, cols] * g_cols
        )
    return grads, on_pre


def pre_activation_bounds(
    network: Network,
    lo: np.ndarray,
    hi: np.ndarray,
    signs: list[np.ndarray] | None = None,
    within: list[tuple[np.ndarray, np.ndarray]] | None = None,
    slope_steps: int = 0,
    until: float = np.inf,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each hidden layer's pre-activation bounds (low, high), each (B, width), over the
    boxes: interval arithmetic, then back-substitution for the neurons it leaves unstable.

    ``signs``: per hidden layer (B, width), +1 where a branch assumes the neuron's
    pre-activation >= 0, -1 where <= 0, 0 where free; the bounds of an assumed neuron are
    cut at 0 before the next layers are bounded. Where an assumption contradicts the bounds,
    low > high: no input of the box is in that branch. ``within``: bounds known to hold
    over the boxes (of a box holding them all), each layer's intersected with them before
    the next is bounded (``narrowed``). ``slope_steps``: for a ReLU network, each unstable
    neuron's bounds from that many steps of ``optimized_slopes``, none begun after
    ``until`` (a ``time.monotonic`` deadline)."""
    centre, radius = (lo + hi) / 2, (hi - lo) / 2
    weights, biases, noise = network.weights, network.biases, network.noise
    pre: list[tuple[np.ndarray, np.ndarray]] = []
    post_lo, post_hi = lo, hi
    for k in range(len(weights) - 1):
        w, b = weights[k], biases[k]
        mid = (post_lo + post_hi) / 2 @ w.T + b
        spread = (post_hi - post_lo) / 2 @ np.abs(w).T
        if noise is not None:
            spread = spread + noise[k]
        low, high = mid - spread, mid + spread
        if within is not None:
            low, high = narrowed(low, high, *within[k])
        if k:
            unstable = (low < 0) & (high > 0)
            if network.activations is not None:
                unstable |= network.activations[k] != 0  # any bound of a squashing neuron helps
            unstable = np.flatnonzero(unstable.any(axis=0))
            if unstable.size:
                n = unstable.size
                rows = np.zeros((2 * n, w.shape[0]))
                rows[np.arange(n), unstable] = 1.0
                rows[n + np.arange(n), unstable] = -1.0
                args = (weights[: k + 1], biases[: k + 1], pre, rows, centre, radius)
                below = None if noise is None else noise[: k + 1]
                if slope_steps and _squash(network) is None:
                    optimized = optimized_slopes(*args, below, slope_steps, until)
                    assert optimized.upper is not None
                    upper = optimized.upper
                else:
                    upper, _ = _back_substitute(*args, noise=below, squash=_squash(network))
                low[:, unstable], high[:, unstable] = narrowed(
                    low[:, unstable], high[:, unstable], -upper[:, n:], upper[:, :n]
                )
        if signs is not None:
            low = np.where(signs[k] > 0, np.maximum(low, 0.0), low)
            high = np.where(signs[k] < 0, np.minimum(high, 0.0), high)
        pre.append((low, high))
        post_lo, post_hi = post_activation(network, k, low, high)
    return pre


def narrowed(
    low: np.ndarray, high: np.ndarray, known_low: np.ndarray, known_high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds ``low``, ``high`` intersected with other bounds known to hold, never to an
    empty interval: two sound bounds of the same neuron contradict each other only by
    rounding (of a neuron constant on the box: the interval's bounds and back-substitution's,
    or back-substitution's two), and only a sign assumption may show a branch empty."""
    low, high = (
        np.maximum(low, np.minimum(known_low, high)),
        np.minimum(high, np.maximum(known_high, low)),
    )
    return np.minimum(low, high), np.maximum(low, high)


Squash = tuple[tuple[np.ndarray, ...], float, tuple[np.ndarray, ...] | None] | None
"""Per hidden layer each neuron's activation code, the activations' absolute error, and
the power neurons' exponents; None for a ReLU network."""


def _squash(network: Network) -> Squash:
    if network.relu_only or network.activations is None:
        return None
    error = EXP_ERROR if network.precision is not None else _ROUNDING
    return network.activations, error, network.exponents


def post_activation(
    network: Network, k: int, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Bounds of hidden layer ``k``'s activations from its pre-activation bounds (B, width)."""
    return _post(_squash(network), k, low, high)


def _post(
    squash: Squash, k: int, low: np.ndarray, high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    post_lo, post_hi = np.maximum(low, 0.0), np.maximum(high, 0.0)
    if squash is None or not squash[0][k].any():
        return post_lo, post_hi
    codes, error = squash[0][k], squash[1]
    for code, fn in ((SIGMOID, sigmoid), (TANH, np.tanh)):
        chosen = codes == code
        if chosen.any():
            post_lo[:, chosen] = fn(low[:, chosen]) - error
            post_hi[:, chosen] = fn(high[:, chosen]) + error
    chosen = codes == SQUARE
    if chosen.any():  # z²: the smaller end's square, or 0 where the interval holds 0
        low, high = low[:, chosen], high[:, chosen]
        ends = np.maximum(low**2, high**2)
        least = np.minimum(low**2, high**2) * (1.0 - _ROUNDING)
        post_lo[:, chosen] = np.where((low < 0) & (high > 0), 0.0, least)
        post_hi[:, chosen] = ends * (1.0 + _ROUNDING)
    chosen = codes == POWER
    if chosen.any():  # z^p of max(z, 0), increasing: what onnxruntime computes for z >= 0
        p = squash[2][k][chosen]  # type: ignore[index]
        post_lo[:, chosen] = np.maximum(low[:, chosen], 0.0) ** p * (1.0 - _ROUNDING)
        post_hi[:, chosen] = np.maximum(high[:, chosen], 0.0) ** p * (1.0 + _ROUNDING)
    return post_lo, post_hi


def smooth_relaxation(
    code: int, lo: np.ndarray, hi: np.ndarray, error: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two parallel lines around sigmoid or tanh (``code``) on [lo, hi]: ``a z + below <=
    f(z) <= a z + above``, ``a`` the chord's slope. f(z) - a z is extreme at the ends or
    where f'(z) = a, which both functions' unimodal derivatives give in closed form (at most
    two points); ``error`` is f's own (``_squash``), and the evaluation adds a few ulps of
    the terms."""
    fn = sigmoid if code == SIGMOID else np.tanh
    width = hi - lo
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(width > 1e-12, (fn(hi) - fn(lo)) / width, 0.0)
    a = np.maximum(a, 0.0)
    if code == SIGMOID:  # s (1 - s) = a
        root = np.sqrt(np.maximum(1.0 - 4.0 * np.minimum(a, 0.25), 0.0))
        s = np.clip(np.stack([(1.0 - root) / 2, (1.0 + root) / 2]), 1e-300, 1.0 - 1e-16)
        points = np.log(s) - np.log1p(-s)
    else:  # 1 - t^2 = a
        t = np.sqrt(np.maximum(1.0 - np.minimum(a, 1.0), 0.0))
        points = np.arctanh(np.clip(np.stack([-t, t]), -1.0 + 1e-16, 1.0 - 1e-16))
    inside = (points > lo) & (points < hi) & (a > 0)
    candidates = np.concatenate([lo[None], hi[None], np.where(inside, points, lo)])
    gap = fn(candidates) - a * candidates
    scale = np.abs(candidates).max(axis=0) * a + 1.0
    slack = error + _ROUNDING * scale
    return a, gap.min(axis=0) - slack, gap.max(axis=0) + slack


def times(stack: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``stack`` (B, k, n) @ ``matrix`` (n, m) as one 2-d product: numpy multiplies a stack
    of matrices one by one (six times slower for mnistfc's layers in float32)."""
    batch, rows, _ = stack.shape
    return (stack.reshape(batch * rows, -1) @ matrix).reshape(batch, rows, -1)


def relu_relaxation(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Linear bounds of ReLU on [lo, hi]: the upper one ``chord * z + shift`` (the chord of
    a crossing neuron), the lower one ``floor * z`` (0 or the identity, whichever loses
    less area: the CROWN choice); a stable neuron's both are exact."""
    crossing = (lo < 0) & (hi > 0)
    active = (lo >= 0).astype(lo.dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        chord = np.where(crossing, hi / (hi - lo), active)
    floor = np.where(crossing, (hi > -lo).astype(lo.dtype), active)
    return chord, floor, np.where(crossing, -chord * lo, 0.0)


def _back_substitute(
    weights: tuple[np.ndarray, ...],
    biases: tuple[np.ndarray, ...],
    pre: list[tuple[np.ndarray, np.ndarray]],
    rows: np.ndarray,
    centre: np.ndarray,
    radius: np.ndarray,
    intercepts: list[np.ndarray] | None = None,
    noise: tuple[np.ndarray, ...] | None = None,
    squash: Squash = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``_substitute``; with sigmoid or tanh neurons, both ways (their parallel lines, and
    their intervals), each row taking the tighter: neither is tighter for every row."""
    args = (weights, biases, pre, rows, centre, radius)
    smooth = squash is not None and any(((c == SIGMOID) | (c == TANH)).any() for c in squash[0])
    if not smooth:
        return _substitute(*args, intercepts, noise, squash, lines=False)
    by_lines = [] if intercepts is not None else None
    upper, lam = _substitute(*args, by_lines, noise, squash, lines=True)
    by_intervals = [] if intercepts is not None else None
    other, other_lam = _substitute(*args, by_intervals, noise, squash, lines=False)
    better = other < upper
    if intercepts is not None:
        assert by_lines is not None and by_intervals is not None
        intercepts += [
            np.where(better[:, :, None], b, a) for a, b in zip(by_lines, by_intervals, strict=True)
        ]
    return np.minimum(upper, other), np.where(better[:, :, None], other_lam, lam)


def _substitute(
    weights: tuple[np.ndarray, ...],
    biases: tuple[np.ndarray, ...],
    pre: list[tuple[np.ndarray, np.ndarray]],
    rows: np.ndarray,
    centre: np.ndarray,
    radius: np.ndarray,
    intercepts: list[np.ndarray] | None,
    noise: tuple[np.ndarray, ...] | None,
    squash: Squash,
    lines: bool,
    slopes: list[np.ndarray] | None = None,
    trace: list[tuple[np.ndarray, ...]] | None = None,
    cuts: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Upper bounds over the boxes of ``rows`` (k, n) times the last layer's output, each
    ReLU replaced by the linear bound its pre-activation bounds allow for the sign of its
    coefficient (the chord above; 0 or the identity below, whichever is closer); and the
    coefficients on the input (B, k, d). ``intercepts``, when given, receives per hidden
    layer (first to last) what each neuron's chord adds to each row's bound (B, k, width):
    the looseness a split of that neuron removes. ``noise``, when given, widens each
    layer's bias to ``b ± noise`` (the row's worst case); ``squash`` marks the other
    activations: with ``lines``, sigmoid and tanh pass the rows through two parallel lines
    around them (``smooth_relaxation``); the others, and without ``lines`` these too, give
    the rows their interval. ``slopes``, per hidden layer (B, k, width), replace the lower
    bound's slope of each crossing ReLU, per row; ``trace``, when given, receives per hidden
    layer (first to last) what ``_slope_gradient`` needs. ``cuts``, per hidden layer (B, k,
    width), are added to the rows' coefficients on the pre-activations: ``beta * s`` for a
    neuron a branch assumes of sign ``s``, which adds ``beta * s * z >= 0`` in the branch
    (beta-CROWN's multipliers of the split constraints: any beta >= 0 keeps the bound)."""
    batch, k = centre.shape[0], rows.shape[0]
    last = len(weights) - 1
    const = np.broadcast_to(rows @ biases[last], (batch, k)).copy()
    lam = np.broadcast_to(rows @ weights[last], (batch, k, weights[last].shape[1])).copy()
    if noise is not None:
        const += np.abs(rows) @ noise[last]
    for i in range(last - 1, -1, -1):
        lo, hi = pre[i]
        if squash is not None and squash[0][i].any():
            codes = squash[0][i]
            # sigmoid and tanh by two parallel lines, passed through; the others by their
            # interval, where the rows stop
            for code in (SIGMOID, TANH) if lines else ():
                chosen = codes == code
                if chosen.any():
                    a, below, above = smooth_relaxation(
                        code, lo[:, chosen], hi[:, chosen], squash[1]
                    )
                    part = lam[:, :, chosen]
                    const += np.einsum("bkn,bn->bk", np.maximum(part, 0.0), above)
                    const += np.einsum("bkn,bn->bk", np.minimum(part, 0.0), below)
                    lam[:, :, chosen] = part * a[:, None, :]
            stopped = (codes == SQUARE) | (codes == POWER) if lines else codes != 0
            if stopped.any():
                post_lo, post_hi = _post(squash, i, lo, hi)
                part = lam[:, :, stopped]
                const += np.einsum("bkn,bn->bk", np.maximum(part, 0.0), post_hi[:, stopped])
                const += np.einsum("bkn,bn->bk", np.minimum(part, 0.0), post_lo[:, stopped])
                lam[:, :, stopped] = 0.0
            squashing = codes != 0
            lo, hi = np.where(squashing, 0.0, lo), np.where(squashing, 0.0, hi)  # now inert
        crossing = (lo < 0) & (hi > 0)
        cols = np.flatnonzero(crossing.any(axis=0))  # crossing in some box of the batch
        sub = lam[:, :, cols]
        lam *= (lo >= 0)[:, None, :]  # a stable neuron passes or stops, whatever the sign
        added = np.zeros((batch, k, lo.shape[1])) if intercepts is not None else None
        if cols.size:
            chord, floor, shift = relu_relaxation(lo[:, cols], hi[:, cols])
            up = np.maximum(sub, 0.0)
            const += np.einsum("bkn,bn->bk", up, shift)
            below = floor[:, None, :] if slopes is None else slopes[i][:, :, cols]
            lam[:, :, cols] = up * chord[:, None, :] + (sub - up) * below
            if added is not None:
                added[:, :, cols] = up * shift[:, None, :]
        if cuts is not None:
            lam += cuts[i]
        if trace is not None:
            trace.insert(0, (cols, sub, lam))
        if intercepts is not None:
            intercepts.insert(0, added)
        const += lam @ biases[i]
        if noise is not None:
            const += np.abs(lam) @ noise[i]
        lam = times(lam, weights[i])
    upper = (
        const + np.einsum("bkd,bd->bk", lam, centre) + np.einsum("bkd,bd->bk", np.abs(lam), radius)
    )
    return upper, lam
