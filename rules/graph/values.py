"""What a tensor of an imported ONNX graph is: a constant, or an affine function of the
neurons of the layer being built.

An ``Affine`` value ``v`` with coefficients ``coef`` (n, *shape) and ``offset`` (*shape) is
``v = sum_j h_j coef[j] + offset`` for the n neurons ``h`` of the current layer (the network
input before the first ReLU). Linear operators act on ``coef`` as on a batch of n tensors and
on ``offset`` as on one, which is why every converter is written for arrays with a leading
batch axis.

When the network is to be analysed in a floating-point type, an ``Affine`` also carries
``error``: a bound on how far the computed tensor may be from ``v``, itself affine in the
magnitudes of the neurons, ``|computed - v| <= sum_j |h_j| error.coef[j] + error.offset``
(every entry non-negative; ``precision.py`` has the per-operation bounds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vigil.rules.graph.precision import Precision, Tracked


class UnsupportedModel(ValueError):
    """The ONNX graph holds something the importer cannot turn into a ReLU network."""


@dataclass(frozen=True)
class Affine:
    """A tensor as an affine function of the current layer's neurons."""

    coef: np.ndarray  # (n, *shape)
    offset: np.ndarray  # shape
    error: Affine | None = None  # the rounding bound, when a precision is tracked

    @property
    def shape(self) -> tuple[int, ...]:
        return self.offset.shape

    @property
    def neurons(self) -> int:
        return self.coef.shape[0]


Value = Affine | np.ndarray
"""A graph tensor during import: an ``Affine`` data tensor, or a constant array."""


def linear(value: Value, fn: Callable[[np.ndarray], np.ndarray]) -> Value:
    """``fn`` applied to a value; ``fn`` only moves entries (reshapes, slices,
    transposes), so the computed tensor moves with them and its error bound too."""
    if isinstance(value, Affine):
        error = None if value.error is None else linear(value.error, fn)
        return Affine(fn(value.coef), fn(value.offset[None])[0], error)  # type: ignore[arg-type]
    return fn(value[None])[0]


def broadcast(value: Value, shape: tuple[int, ...]) -> Value:
    """``value`` broadcast to ``shape`` (ONNX/numpy rules): entries are repeated, not
    computed."""
    own = value.shape
    lead = (1,) * (len(shape) - len(own))
    return linear(
        value, lambda t: np.broadcast_to(t.reshape(len(t), *lead, *own), (len(t), *shape)).copy()
    )


def product(
    value: Value,
    fn: Callable[[np.ndarray], np.ndarray],
    magnitude: Callable[[np.ndarray], np.ndarray],
    terms: int,
    precision: Precision | Tracked | None,
) -> Value:
    """``fn`` (a linear map whose outputs are sums of ``terms`` products: a matrix
    product, a convolution, a sum) applied to a value. ``magnitude`` is the same map with
    the absolute values of its weights: it carries the error bound through the map and
    bounds the map's own rounding."""
    out = linear(_exact(value), fn)
    if precision is None:
        return out
    if not isinstance(out, Affine):
        raise ValueError(f"a product of constants computed in {precision.name} in the graph")
    value = lift(value, out.neurons)
    error = _bound(value)
    size = _magnitude(value, error)
    gamma = precision.gamma(terms)
    propagated = linear(error, magnitude)
    made = linear(size, magnitude)
    _note(precision, made)  # bounds every partial sum too
    return Affine(
        out.coef,
        out.offset,
        Affine(
            propagated.coef + gamma * made.coef,
            propagated.offset + gamma * made.offset + 2 * terms * precision.tiny,
        ),
    )


def lift(value: Value, neurons: int) -> Affine:
    """A value as an ``Affine`` of ``neurons`` neurons (a constant has no coefficients)."""
    if isinstance(value, Affine):
        return value
    return Affine(np.zeros((neurons, *value.shape)), np.asarray(value, dtype=np.float64))


def add(a: Value, b: Value, precision: Precision | Tracked | None = None, terms: int = 1) -> Value:
    """a + b with ONNX (numpy) broadcasting, computed with ``terms`` roundings (1 for an
    Add node; a fused bias may be added among the terms of a product)."""
    if not isinstance(a, Affine) and not isinstance(b, Affine):
        return _rounded(a + b, precision)
    neurons = a.neurons if isinstance(a, Affine) else b.neurons  # type: ignore[union-attr]
    a, b = lift(a, neurons), lift(b, neurons)
    offset = a.offset + b.offset
    coef = _coef(a, offset.shape) + _coef(b, offset.shape)
    if precision is None:
        return Affine(coef, offset)
    ea, eb = _bound(a), _bound(b)
    size_a, size_b = _magnitude(a, ea), _magnitude(b, eb)
    gamma = precision.gamma(terms)
    _note(precision, add(size_a, size_b))
    error = Affine(
        _coef(ea, offset.shape)
        + _coef(eb, offset.shape)
        + gamma * (_coef(size_a, offset.shape) + _coef(size_b, offset.shape)),
        ea.offset + eb.offset + gamma * (size_a.offset + size_b.offset) + precision.tiny,
    )
    return Affine(coef, offset, error)


def scale(
    a: Value, factor: np.ndarray, precision: Precision | Tracked | None = None, terms: int = 1
) -> Value:
    """a * factor (a constant), broadcast, computed with ``terms`` roundings (0 for a
    negation, which is exact)."""
    if not isinstance(a, Affine):
        return _rounded(a * factor, precision)
    offset = a.offset * factor
    out = Affine(_coef(a, offset.shape) * factor, offset)
    if precision is None:
        return out
    error, size = _bound(a), _magnitude(a, _bound(a))
    weight = np.abs(factor)
    gamma = precision.gamma(terms)
    tiny = precision.tiny if terms else 0.0
    _note(precision, scale(size, (1.0 + gamma) * weight))
    return Affine(
        out.coef,
        out.offset,
        Affine(
            _coef(error, offset.shape) * weight + gamma * _coef(size, offset.shape) * weight,
            error.offset * weight + gamma * size.offset * weight + tiny,
        ),
    )


def concatenate(values: list[Value], axis: int) -> Value:
    """The values joined along ``axis`` (ONNX Concat)."""
    affine = [v for v in values if isinstance(v, Affine)]
    if not affine:
        return np.concatenate(values, axis=axis)
    lifted = [lift(v, affine[0].neurons) for v in values]
    error = None
    if any(v.error is not None for v in lifted):
        error = concatenate([_bound(v) for v in lifted], axis)
    return Affine(
        np.concatenate([v.coef for v in lifted], axis=axis + 1),
        np.concatenate([v.offset for v in lifted], axis=axis),
        error,  # type: ignore[arg-type]
    )


def watch(value: Value, precision: Precision | Tracked | None, factor: float) -> None:
    """Count ``value``'s magnitude ``factor`` times towards its layer's peak (a cast to a
    narrower type overflows ``factor`` times sooner than the declared type)."""
    if isinstance(value, Affine):
        error = _bound(value)
        _note(precision, scale(_magnitude(value, error), np.float64(factor)))


def _note(precision: Precision | Tracked | None, size: Value) -> None:
    """Tell a tracked precision the magnitude a computed tensor may reach."""
    if isinstance(precision, Tracked) and isinstance(size, Affine):
        precision.note(size.coef, size.offset)


def select(mask: np.ndarray, a: Value, b: Value) -> Value:
    """``a`` where ``mask`` holds, else ``b``, broadcast (ONNX Where): entries move, nothing
    is computed."""
    if not isinstance(a, Affine) and not isinstance(b, Affine):
        return np.where(mask, a, b)
    neurons = a.neurons if isinstance(a, Affine) else b.neurons  # type: ignore[union-attr]
    a, b = lift(a, neurons), lift(b, neurons)
    shape = np.broadcast_shapes(mask.shape, a.shape, b.shape)
    offset = np.where(mask, a.offset, b.offset)
    offset = np.broadcast_to(offset, shape).copy()
    out = Affine(np.where(mask, _coef(a, shape), _coef(b, shape)), offset)
    if a.error is None and b.error is None:
        return out
    ea, eb = _bound(a), _bound(b)
    error = Affine(
        np.where(mask, _coef(ea, shape), _coef(eb, shape)),
        np.broadcast_to(np.where(mask, ea.offset, eb.offset), shape).copy(),
    )
    return Affine(out.coef, out.offset, error)


def _exact(value: Value) -> Value:
    return Affine(value.coef, value.offset) if isinstance(value, Affine) else value


def _bound(a: Affine) -> Affine:
    """``a``'s error bound (zero where none is tracked)."""
    if a.error is not None:
        return a.error
    return Affine(np.zeros_like(a.coef), np.zeros_like(a.offset))


def _magnitude(a: Affine, error: Affine) -> Affine:
    """A bound of the computed tensor's magnitude, affine in the neurons' magnitudes."""
    return Affine(np.abs(a.coef) + error.coef, np.abs(a.offset) + error.offset)


def _rounded(value: np.ndarray, precision: Precision | Tracked | None) -> np.ndarray:
    """A constant computed in the graph, as the element type holds it: one correctly
    rounded operation (Add, Mul, ...) on constants."""
    if precision is None:
        return value
    return np.asarray(value).astype(precision.dtype).astype(np.float64)


def _coef(a: Affine, shape: tuple[int, ...]) -> np.ndarray:
    """``a``'s coefficients broadcast to a tensor ``shape`` (the neuron axis stays first)."""
    lead = (1,) * (len(shape) - len(a.shape))
    return np.broadcast_to(a.coef.reshape(a.neurons, *lead, *a.shape), (a.neurons, *shape))
